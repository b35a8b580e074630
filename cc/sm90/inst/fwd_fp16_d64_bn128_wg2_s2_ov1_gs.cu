// Forward variant 7: the variant-3 kernel with the two-level key-block walk (groups of 32 blocks).
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 64, 128, 2, 2, true, true>(const FwdParams&, cudaStream_t, const char**);
}
