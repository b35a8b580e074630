// Forward variant 10: the variant-3 kernel with the partial blocks' element mask as bit words.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::bfloat16_t, 128, 128, 2, 2, true, false, true>(const FwdParams&, cudaStream_t, const char**);
}
