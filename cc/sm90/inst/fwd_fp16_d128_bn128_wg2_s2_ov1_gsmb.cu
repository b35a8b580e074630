// Forward variant 11: the variant-7 kernel (two-level key-block walk) with variant 10's bit-word mask.
#include "../fwd_kernel.cuh"
#include "../fwd_launch.h"
namespace jfm::sm90 {
template cudaError_t launch_fwd<cutlass::half_t, 128, 128, 2, 2, true, true, true>(const FwdParams&, cudaStream_t, const char**);
}
