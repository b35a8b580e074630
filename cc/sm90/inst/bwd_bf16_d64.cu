#include "../bwd_kernel.cuh"
namespace jfm::sm90 {
template cudaError_t launch_bwd<cutlass::bfloat16_t, 64>(const BwdParams&, cudaStream_t, const char**);
}
