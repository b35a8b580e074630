// Forward variant 16: variant 11's kernel (two-level walk, bit-word mask) with the consumers' block
// walk taken from the producer's job slots (FwdTraitsBlockList).
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 256, 64, 2, 2, true, true, true, false, true>(const FwdParams&, cudaStream_t, const char**);
}
