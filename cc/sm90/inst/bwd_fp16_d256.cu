#include "../bwd_d256_kernel.cuh"
namespace jfm::sm90 {
template cudaError_t launch_bwd_d256<cutlass::half_t>(const BwdParams&, cudaStream_t, const char**);
}
