// Forward variant 13: key blocks of 80 at d = 256.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 256, 80, 2, 2, true>(const FwdParams&, cudaStream_t, const char**);
}
