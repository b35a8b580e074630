// XLA FFI handler for the FlashMask sm_90a backward. Errors come back as ffi::Error; the handler
// never synchronizes. Workspaces (dQ fp32 accumulator, row statistics, block metadata) are extra
// results that the Python side discards.
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

int64_t prod_dims(ffi::AnyBuffer::Dimensions d, size_t from, size_t to) {
  int64_t r = 1;
  for (size_t i = from; i < to; ++i) r *= d[i];
  return r;
}

ffi::Error BwdImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer bounds, ffi::AnyBuffer o, ffi::AnyBuffer lse,
                   ffi::AnyBuffer dout, ffi::AnyBuffer dlse, float scale,
                   int32_t deterministic, std::string_view config, int32_t sm_margin,
                   float softcap, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                   ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_accum,
                   ffi::Result<ffi::AnyBuffer> rowstats, ffi::Result<ffi::AnyBuffer> meta,
                   ffi::Result<ffi::AnyBuffer> dq_sem) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             bd = bounds.dimensions();
  const size_t r = qd.size();
  if (r < 4 || kd.size() != r || vd.size() != r || bd.size() != r)
    return ffi::Error::InvalidArgument(
        "flashmask_bwd: expected q [..., Sq, N, d], k/v [..., Sk, K, d], bounds [..., Hm, 4, Sk] "
        "with the same number of leading (batch) axes");
  const int64_t B = prod_dims(qd, 0, r - 3);
  if (prod_dims(kd, 0, r - 3) != B || prod_dims(vd, 0, r - 3) != B || prod_dims(bd, 0, r - 3) != B)
    return ffi::Error::InvalidArgument("flashmask_bwd: batch axes of q, k, v, bounds differ");
  const int64_t Sq = qd[r - 3], N = qd[r - 2], d = qd[r - 1];
  const int64_t Sk = kd[r - 3], K = kd[r - 2];
  const int64_t Hm = bd[r - 3];
  if (kd[r - 1] != d || vd[r - 1] != d || vd[r - 3] != Sk || vd[r - 2] != K)
    return ffi::Error::InvalidArgument("flashmask_bwd: k and v must both be [..., Sk, K, d]");
  if (bd[r - 2] != 4 || bd[r - 1] != Sk)
    return ffi::Error::InvalidArgument("flashmask_bwd: bounds must be [..., Hm, 4, Sk]");
  const auto et = q.element_type();
  if (k.element_type() != et || v.element_type() != et || o.element_type() != et ||
      dout.element_type() != et)
    return ffi::Error::InvalidArgument("flashmask_bwd: q, k, v, out, dout must share one dtype");
  if (o.element_count() != q.element_count() || dout.element_count() != q.element_count())
    return ffi::Error::InvalidArgument("flashmask_bwd: out and dout must match q's shape");
  if (bounds.element_type() != ffi::DataType::S32)
    return ffi::Error::InvalidArgument("flashmask_bwd: bounds must be int32");
  DType dt;
  if (et == ffi::DataType::BF16) dt = DType::kBF16;
  else if (et == ffi::DataType::F16) dt = DType::kFP16;
  else return ffi::Error::InvalidArgument("flashmask_bwd: dtype must be bfloat16 or float16");
  if (lse.element_type() != ffi::DataType::F32 || (int64_t)lse.element_count() != B * Sq * N ||
      dlse.element_type() != ffi::DataType::F32 || (int64_t)dlse.element_count() != B * Sq * N)
    return ffi::Error::InvalidArgument("flashmask_bwd: lse and dlse must be float32 [..., Sq, N]");
  if (dq->element_type() != et || dq->element_count() != q.element_count() ||
      dk->element_type() != et || dk->element_count() != k.element_count() ||
      dv->element_type() != et || dv->element_count() != v.element_count())
    return ffi::Error::InvalidArgument("flashmask_bwd: dq/dk/dv must match q/k/v");
  if (dq_accum->element_type() != ffi::DataType::F32 ||
      rowstats->element_type() != ffi::DataType::F32 || meta->element_type() != ffi::DataType::S32 ||
      (dq_sem->element_type() != ffi::DataType::S32 && dq_sem->element_type() != ffi::DataType::U32))
    return ffi::Error::InvalidArgument("flashmask_bwd: bad workspace dtypes (f32, f32, s32, s32)");
  if (K <= 0 || Hm <= 0 || N % K != 0 || N % Hm != 0)
    return ffi::Error::InvalidArgument(
        "flashmask_bwd: query heads N must be a multiple of kv heads K and of mask heads Hm");
  if (B > INT32_MAX || Sq > INT32_MAX || Sk > INT32_MAX || N > INT32_MAX)
    return ffi::Error::InvalidArgument("flashmask_bwd: dimension too large");

  BwdParams p{};
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.bounds = static_cast<const int32_t*>(bounds.untyped_data());
  p.o = o.untyped_data();
  p.lse = static_cast<const float*>(lse.untyped_data());
  p.dout = dout.untyped_data();
  p.dlse = static_cast<const float*>(dlse.untyped_data());
  p.dq = dq->untyped_data();
  p.dk = dk->untyped_data();
  p.dv = dv->untyped_data();
  p.dq_accum = static_cast<float*>(dq_accum->untyped_data());
  p.dq_accum_capacity = (int64_t)dq_accum->element_count();
  p.rowstats = static_cast<float*>(rowstats->untyped_data());
  p.rowstats_capacity = (int64_t)rowstats->element_count();
  p.meta = static_cast<int32_t*>(meta->untyped_data());
  p.meta_capacity = (int64_t)meta->element_count();
  p.B = (int)B; p.Sq = (int)Sq; p.Sk = (int)Sk; p.N = (int)N; p.K = (int)K; p.Hm = (int)Hm;
  p.d = (int)d;
  p.scale = scale;
  p.dtype = dt;
  if (deterministic != 0 && deterministic != 1)
    return ffi::Error::InvalidArgument("flashmask_bwd: deterministic must be 0 or 1");
  p.deterministic = deterministic;
  p.config = config.data();
  p.config_len = config.size();
  if (sm_margin < 0)
    return ffi::Error::InvalidArgument("flashmask_bwd: sm_margin must be >= 0");
  p.sm_margin = sm_margin;  // persistent configurations only
  p.softcap = softcap;
  p.dq_sem = static_cast<uint32_t*>(dq_sem->untyped_data());
  p.dq_sem_capacity = (int64_t)dq_sem->element_count();

  const char* msg = nullptr;
  cudaError_t e = flashmask_bwd_sm90(p, stream, &msg);
  if (e != cudaSuccess) {
    std::string s = msg ? std::string(msg)
                        : std::string("flashmask_bwd: CUDA error: ") + cudaGetErrorString(e);
    if (e == cudaErrorInvalidValue && msg) return ffi::Error::InvalidArgument(s);
    return ffi::Error::Internal(s);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jfm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfmFlashmaskBwdSm90, jfm::BwdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // bounds
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // dlse
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("deterministic")
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("sm_margin")
                                  .Attr<float>("softcap")  // 0 = none
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>()  // dq fp32 accumulator workspace
                                  .Ret<ffi::AnyBuffer>()  // row statistics workspace
                                  .Ret<ffi::AnyBuffer>()  // block-metadata workspace
                                  .Ret<ffi::AnyBuffer>()  // dQ ordering bits (deterministic)
);
