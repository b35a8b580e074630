// nanobind module jax_flashmask._flashmask_cuda: exports the FFI handlers as capsules only;
// Python registers them with jax.ffi.register_ffi_target(platform="CUDA").
#include <nanobind/nanobind.h>

#include <cuda_runtime.h>

#include "handlers.h"
#include "../sm90/params.h"

namespace nb = nanobind;

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
}
