// nanobind module jax_flashmask._flashmask_cuda: exports the FFI handlers as capsules (Python
// registers them with jax.ffi.register_ffi_target(platform="CUDA")), and direct launches of the
// kernels on raw device pointers for tools that must run them without XLA
// (benchmarks/sanitize_cases.py under compute-sanitizer).
#include <cstdint>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cuda_runtime.h>

#include "handlers.h"
#include "../sm90/params.h"

namespace nb = nanobind;

namespace {

// Fields of a launch description: device pointers as integers, sizes, the config name.
template <class T>
T field(const nb::dict& d, const char* key) {
  if (!d.contains(key)) throw nb::key_error(key);
  return nb::cast<T>(d[key]);
}
template <class P>
P* pointer(const nb::dict& d, const char* key) {
  return reinterpret_cast<P*>(static_cast<uintptr_t>(field<uint64_t>(d, key)));
}

// Launch on the legacy default stream and wait: "" on success, else the message.
template <class Params, class Launch>
std::string run_sync(const Params& p, Launch launch) {
  const char* msg = nullptr;
  cudaError_t e = launch(p, cudaStream_t{0}, &msg);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return {};
  return msg ? std::string(msg) : std::string(cudaGetErrorString(e));
}

// The fields FwdParams and BwdParams share; `config` keeps the name's storage alive.
template <class Params>
void common_fields(Params& p, const nb::dict& d, std::string& config) {
  p.q = pointer<const void>(d, "q");
  p.k = pointer<const void>(d, "k");
  p.v = pointer<const void>(d, "v");
  p.bounds = pointer<const int32_t>(d, "bounds");
  p.meta_capacity = field<int64_t>(d, "meta_capacity");
  p.B = field<int>(d, "B"); p.Sq = field<int>(d, "Sq"); p.Sk = field<int>(d, "Sk");
  p.N = field<int>(d, "N"); p.K = field<int>(d, "K"); p.Hm = field<int>(d, "Hm");
  p.d = field<int>(d, "d");
  p.scale = field<float>(d, "scale");
  p.dtype = field<std::string>(d, "dtype") == "float16" ? jfm::DType::kFP16 : jfm::DType::kBF16;
  config = field<std::string>(d, "config");
  p.config = config.data();
  p.config_len = config.size();
  p.sm_margin = field<int>(d, "sm_margin");
  p.softcap = field<float>(d, "softcap");
}

std::string launch_forward(const nb::dict& d) {
  jfm::FwdParams p{};
  std::string config;
  common_fields(p, d, config);
  p.o = pointer<void>(d, "o");
  p.lse = pointer<float>(d, "lse");
  p.meta = pointer<int32_t>(d, "meta");
  return run_sync(p, jfm::flashmask_fwd_sm90);
}

std::string launch_backward(const nb::dict& d) {
  jfm::BwdParams p{};
  std::string config;
  common_fields(p, d, config);
  p.o = pointer<const void>(d, "o");
  p.lse = pointer<const float>(d, "lse");
  p.dout = pointer<const void>(d, "dout");
  p.dlse = pointer<const float>(d, "dlse");
  p.dq = pointer<void>(d, "dq");
  p.dk = pointer<void>(d, "dk");
  p.dv = pointer<void>(d, "dv");
  p.dq_accum = pointer<float>(d, "dq_accum");
  p.dq_accum_capacity = field<int64_t>(d, "dq_accum_capacity");
  p.rowstats = pointer<float>(d, "rowstats");
  p.rowstats_capacity = field<int64_t>(d, "rowstats_capacity");
  p.meta = pointer<int32_t>(d, "meta");
  p.deterministic = field<int>(d, "deterministic");
  p.dq_sem = pointer<uint32_t>(d, "dq_sem");
  p.dq_sem_capacity = field<int64_t>(d, "dq_sem_capacity");
  return run_sync(p, jfm::flashmask_bwd_sm90);
}

}  // namespace

NB_MODULE(_flashmask_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["jax_flashmask_fwd_sm90"] = nb::capsule(reinterpret_cast<void*>(&JfmFlashmaskFwdSm90));
    d["jax_flashmask_bwd_sm90"] = nb::capsule(reinterpret_cast<void*>(&JfmFlashmaskBwdSm90));
    return d;
  });
  m.def("cuda_runtime_version", []() {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
  });
  // the kernel configurations compiled in (names of jax_flashmask/backends/cuda/configs.py), each
  // for bf16 and fp16
  m.def("compiled_configs", []() { return nb::str(jfm::compiled_configs()); });
  // One kernel call on device memory the caller owns (pointers as integers, FwdParams /
  // BwdParams fields by name), on the default stream, synchronized: "" or the error. Not used by
  // the JAX path; for running the kernels without XLA (compute-sanitizer).
  m.def("launch_forward", &launch_forward);
  m.def("launch_backward", &launch_backward);
}
