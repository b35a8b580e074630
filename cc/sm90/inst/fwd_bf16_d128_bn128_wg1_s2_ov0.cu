#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 128, 128, 1, 2, false>(const FwdParams&, cudaStream_t, const char**);
}
