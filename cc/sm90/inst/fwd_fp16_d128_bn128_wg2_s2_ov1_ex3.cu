// Forward variant 8: the variant-3 kernel with 3 of every 16 softmax exponentials on the FMA pipe.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 128, 128, 2, 2, true, 3>(const FwdParams&, cudaStream_t, const char**);
}
