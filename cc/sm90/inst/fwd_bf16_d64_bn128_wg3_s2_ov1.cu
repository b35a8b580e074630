// Forward variant 12: three consumer warpgroups (192-row query tiles), d = 64.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 64, 128, 3, 2, true>(const FwdParams&, cudaStream_t, const char**);
}
