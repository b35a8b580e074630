// Key block 176 (variant 7): wgmma m64n176k16 is one of CUTLASS's "extended" shapes.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 128, 176, 2, 2, true>(const FwdParams&, cudaStream_t, const char**);
}
