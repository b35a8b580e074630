// Forward variant 14: variant 3's d = 256 kernel with the tiles handed out in pairs, the second of
// each pair walked from its last key block down (FwdTraitsPaired).
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 256, 64, 2, 2, true, false, false, true>(const FwdParams&, cudaStream_t, const char**);
}
