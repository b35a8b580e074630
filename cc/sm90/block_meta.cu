// Block metadata kernel: per key block, min and max of the four canonical column vectors.
// Reused by the forward kernel (tile classification) and, later, the backward kernel.
#include <climits>
#include "params.h"

namespace jfm {

namespace {

constexpr int kMetaThreads = 128;

__device__ __forceinline__ int warp_min(int x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ int warp_max(int x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// grid: (nblk, Hm, B); block: 128 threads. Each thread strides over the block's columns.
__global__ void __launch_bounds__(kMetaThreads) block_meta_kernel(const int32_t* __restrict__ bounds,
                                                                  int32_t* __restrict__ meta, int Hm,
                                                                  int Sk, int bn, int nblk) {
  const int n = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
  const int32_t* base = bounds + ((int64_t)b * Hm + hm) * 4 * (int64_t)Sk;
  int mn[4], mx[4];
#pragma unroll
  for (int v = 0; v < 4; ++v) { mn[v] = INT_MAX; mx[v] = INT_MIN; }
  const int c0 = n * bn, c1 = min(c0 + bn, Sk);
  for (int c = c0 + threadIdx.x; c < c1; c += kMetaThreads) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      int x = __ldg(base + (int64_t)v * Sk + c);
      mn[v] = min(mn[v], x);
      mx[v] = max(mx[v], x);
    }
  }
  __shared__ int red[kMetaThreads / 32][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    int a = warp_min(mn[v]), z = warp_max(mx[v]);
    if (lane == 0) { red[warp][2 * v] = a; red[warp][2 * v + 1] = z; }
  }
  __syncthreads();
  if (threadIdx.x < 8) {
    const int s = threadIdx.x;
    int r = red[0][s];
    for (int w = 1; w < kMetaThreads / 32; ++w) r = (s & 1) ? max(r, red[w][s]) : min(r, red[w][s]);
    meta[(((int64_t)b * Hm + hm) * 8 + s) * nblk + n] = r;
  }
}

}  // namespace

cudaError_t block_meta_sm90(const int32_t* bounds, int32_t* meta, int B, int Hm, int Sk, int bn,
                            cudaStream_t stream) {
  const int nblk = (Sk + bn - 1) / bn;
  if (B == 0 || Hm == 0 || nblk == 0) return cudaSuccess;
  dim3 grid(nblk, Hm, B);
  block_meta_kernel<<<grid, kMetaThreads, 0, stream>>>(bounds, meta, Hm, Sk, bn, nblk);
  return cudaGetLastError();
}

}  // namespace jfm
