// Forward variant 9: the variant-3 kernel with the PV-GEMM wait pinned below the softmax exponentials.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 128, 128, 2, 2, true, 0, true>(const FwdParams&, cudaStream_t, const char**);
}
