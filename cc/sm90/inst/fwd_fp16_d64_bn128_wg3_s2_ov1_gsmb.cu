// Forward variant 17: variant 12 (three consumer warpgroups, d = 64) with variant 11's two-level
// key-block walk and bit-word mask.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 64, 128, 3, 2, true, true, true>(const FwdParams&, cudaStream_t, const char**);
}
