// XLA FFI handler for the FlashMask sm_90a forward kernel. This file (with module.cc) is the only
// code that knows about XLA. Errors come back as ffi::Error; the handler never synchronizes.
#include <cstdint>
#include <string>
#include <string_view>

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"
#include "../sm90/params.h"
#include "handlers.h"

namespace ffi = xla::ffi;

namespace jfm {
namespace {

int64_t prod(ffi::AnyBuffer::Dimensions d, size_t from, size_t to) {
  int64_t r = 1;
  for (size_t i = from; i < to; ++i) r *= d[i];
  return r;
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer bounds, float scale, std::string_view config, int32_t sm_margin,
                   float softcap, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                   ffi::Result<ffi::AnyBuffer> meta) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             bd = bounds.dimensions();
  const size_t r = qd.size();
  if (r < 4 || kd.size() != r || vd.size() != r || bd.size() != r)
    return ffi::Error::InvalidArgument(
        "flashmask_fwd: expected q [..., Sq, N, d], k/v [..., Sk, K, d], bounds [..., Hm, 4, Sk] "
        "with the same number of leading (batch) axes");
  // Leading axes (batch, plus any vmap axes) fold into B.
  const int64_t B = prod(qd, 0, r - 3);
  if (prod(kd, 0, r - 3) != B || prod(vd, 0, r - 3) != B || prod(bd, 0, r - 3) != B)
    return ffi::Error::InvalidArgument("flashmask_fwd: batch axes of q, k, v, bounds differ");
  const int64_t Sq = qd[r - 3], N = qd[r - 2], d = qd[r - 1];
  const int64_t Sk = kd[r - 3], K = kd[r - 2];
  const int64_t Hm = bd[r - 3];
  if (kd[r - 1] != d || vd[r - 1] != d || vd[r - 3] != Sk || vd[r - 2] != K)
    return ffi::Error::InvalidArgument("flashmask_fwd: k and v must both be [..., Sk, K, d]");
  if (bd[r - 2] != 4 || bd[r - 1] != Sk)
    return ffi::Error::InvalidArgument("flashmask_fwd: bounds must be [..., Hm, 4, Sk]");
  if (q.element_type() != k.element_type() || q.element_type() != v.element_type())
    return ffi::Error::InvalidArgument("flashmask_fwd: q, k, v must share one dtype");
  if (bounds.element_type() != ffi::DataType::S32)
    return ffi::Error::InvalidArgument("flashmask_fwd: bounds must be int32");
  DType dt;
  if (q.element_type() == ffi::DataType::BF16) dt = DType::kBF16;
  else if (q.element_type() == ffi::DataType::F16) dt = DType::kFP16;
  else return ffi::Error::InvalidArgument("flashmask_fwd: dtype must be bfloat16 or float16");
  if (o->element_type() != q.element_type() || o->element_count() != q.element_count())
    return ffi::Error::InvalidArgument("flashmask_fwd: output must match q's shape and dtype");
  if (lse->element_type() != ffi::DataType::F32 || (int64_t)lse->element_count() != B * Sq * N)
    return ffi::Error::InvalidArgument("flashmask_fwd: lse must be float32 [..., Sq, N]");
  if (meta->element_type() != ffi::DataType::S32)
    return ffi::Error::InvalidArgument("flashmask_fwd: workspace must be int32");
  if (K <= 0 || Hm <= 0 || N % K != 0 || N % Hm != 0)
    return ffi::Error::InvalidArgument(
        "flashmask_fwd: query heads N must be a multiple of kv heads K and of mask heads Hm");
  if (sm_margin < 0)
    return ffi::Error::InvalidArgument("flashmask_fwd: sm_margin must be >= 0");
  if (B > INT32_MAX || Sq > INT32_MAX || Sk > INT32_MAX || N > INT32_MAX)
    return ffi::Error::InvalidArgument("flashmask_fwd: dimension too large");

  FwdParams p{};
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.bounds = static_cast<const int32_t*>(bounds.untyped_data());
  p.o = o->untyped_data();
  p.lse = static_cast<float*>(lse->untyped_data());
  p.meta = static_cast<int32_t*>(meta->untyped_data());
  p.meta_capacity = (int64_t)meta->element_count();
  p.B = (int)B; p.Sq = (int)Sq; p.Sk = (int)Sk; p.N = (int)N; p.K = (int)K; p.Hm = (int)Hm;
  p.d = (int)d;
  p.scale = scale;
  p.dtype = dt;
  p.config = config.data();
  p.config_len = config.size();
  p.sm_margin = sm_margin;
  p.softcap = softcap;

  const char* msg = nullptr;
  cudaError_t e = flashmask_fwd_sm90(p, stream, &msg);
  if (e != cudaSuccess) {
    std::string s = msg ? std::string(msg)
                        : std::string("flashmask_fwd: CUDA error: ") + cudaGetErrorString(e);
    if (e == cudaErrorInvalidValue && msg) return ffi::Error::InvalidArgument(s);
    return ffi::Error::Internal(s);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jfm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfmFlashmaskFwdSm90, jfm::FwdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // bounds
                                  .Attr<float>("scale")
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("sm_margin")
                                  .Attr<float>("softcap")  // 0 = none
                                  .Ret<ffi::AnyBuffer>()  // o
                                  .Ret<ffi::AnyBuffer>()  // lse
                                  .Ret<ffi::AnyBuffer>()  // block-metadata workspace
);
