// Backward variants 16 and 19 (80-row query tiles, d = 128), fp16: its own translation unit.
#define JFM_BWD_ROWS80_INST
// the 64 x 80 wgmma shapes (N = 80: S^T / dP^T / dQ^T) are CuTe's "extended" shapes; only this
// translation unit enables them (the selectors of the other kernels' shapes are unchanged)
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../bwd_kernel.cuh"
namespace jfm::sm90 {
template cudaError_t launch_bwd_rows80<cutlass::half_t>(const BwdParams&, cudaStream_t, const char**);
}
