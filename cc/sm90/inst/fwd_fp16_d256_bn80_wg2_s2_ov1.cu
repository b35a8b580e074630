// Forward variant 13: key blocks of 80 at d = 256.
// A 64x80 QK^T needs CuTe's extended GMMA shapes (N = 80): without them ss_op_selector falls back to
// five 64x16 instructions per k-step. Only this translation unit instantiates a Bn = 80 kernel, and
// for every other N the selector's choice is unchanged (the first shape dividing N, largest first).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 256, 80, 2, 2, true>(const FwdParams&, cudaStream_t, const char**);
}
