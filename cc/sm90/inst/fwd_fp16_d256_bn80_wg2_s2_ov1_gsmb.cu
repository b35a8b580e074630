// Forward variant 18: variant 13 (key blocks of 80, d = 256) with variant 11's two-level key-block
// walk and bit-word mask.
// Key blocks of 80 need CuTe's extended GMMA shapes (N = 80; see the variant-13 units).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 256, 80, 2, 2, true, true, true>(const FwdParams&, cudaStream_t, const char**);
}
