// Forward variant 7: the variant-3 kernel with the two-level key-block walk (groups of 32 blocks).
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 256, 64, 2, 2, true, true>(const FwdParams&, cudaStream_t, const char**);
}
