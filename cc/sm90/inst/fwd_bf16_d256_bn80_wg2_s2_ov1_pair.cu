// Forward variant 15: variant 13 (key blocks of 80 at d = 256) with variant 14's paired tiles.
// CuTe's extended GMMA shapes for the 64x80 QK^T, as in variant 13's translation units.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 256, 80, 2, 2, true, false, false, true>(const FwdParams&, cudaStream_t, const char**);
}
