// Block metadata kernel: per key block, min and max of the four canonical column vectors, and
// (when asked) the block's unseen columns: one bit per column that every query row masks
// (docs/decisions.md#nan-guarantee-cuda). Used by the forward and the backward kernels.
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

// Column c is unseen iff its masked rows [LTS, LTE) u [UTS, UTE) cover all of [0, Sq) (empty
// ranges never help); the host model is masks._core.columns_fully_masked.
__device__ __forceinline__ bool column_unseen(int lts, int lte, int uts, int ute, int Sq) {
  const bool lo = lts < lte, up = uts < ute;
  return Sq <= 0 || (lo && lts <= 0 && lte >= Sq) || (up && uts <= 0 && ute >= Sq) ||
         (lo && up && lts <= 0 && lte >= uts && ute >= Sq) ||
         (lo && up && uts <= 0 && ute >= lts && lte >= Sq);
}

// grid: (nblk, Hm, B); block: 128 threads. Each thread strides over the block's columns.
// unseen (may be null; else bn <= 128): per (b, hm) at the offset of its block metadata, 4 words per
// block n at 4 * n (half of the 8 * nblk), bit c % 32 of word c / 32 = column n * bn + c is
// unseen; with unseen_any, word 4 * nblk of (b, hm) (zeroed before) is set to 1 where any of its
// blocks has an unseen column. zero / nzero: int32 words stored 0 on the way (the backward's
// per-tile empty-row flags, set later in stream order by the prep kernel).
__global__ void __launch_bounds__(kMetaThreads) block_meta_kernel(const int32_t* __restrict__ bounds,
                                                                  int32_t* __restrict__ meta, int Hm,
                                                                  int Sk, int bn, int nblk, int Sq,
                                                                  uint32_t* __restrict__ unseen,
                                                                  int unseen_any,
                                                                  int32_t* __restrict__ zero,
                                                                  int64_t nzero) {
  const int n = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
  if (zero != nullptr) {
    const int64_t nthreads = (int64_t)gridDim.x * gridDim.y * gridDim.z * kMetaThreads;
    const int64_t cta = ((int64_t)b * gridDim.y + hm) * gridDim.x + n;
    for (int64_t j = cta * kMetaThreads + threadIdx.x; j < nzero; j += nthreads) zero[j] = 0;
  }
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
  if (unseen != nullptr) {  // bn <= kMetaThreads: thread t holds column c0 + t, warp w word w
    const int c = c0 + (int)threadIdx.x;
    bool u = false;
    if (c < c1)
      u = column_unseen(__ldg(base + c), __ldg(base + Sk + c), __ldg(base + 2 * (int64_t)Sk + c),
                        __ldg(base + 3 * (int64_t)Sk + c), Sq);
    const unsigned bits = __ballot_sync(0xffffffffu, u);
    if (lane == 0) unseen[((int64_t)b * Hm + hm) * 8 * nblk + 4 * n + warp] = bits;
    if (unseen_any && lane == 0 && bits != 0u)
      atomicOr(unseen + ((int64_t)b * Hm + hm) * 8 * nblk + 4 * nblk, 1u);
  }
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

// grid: (ngrp, Hm, B); block: 32 threads. Lane l reads block 32 * g + l of the block metadata;
// the group's entry is int4 {LTSmax, LTEmin, UTSmax, UTEmin} at gmeta + (b * Hm + hm) * 8 * nblk
// + 4 * g (the skip test needs only these four).
__global__ void __launch_bounds__(32) group_meta_kernel(const int32_t* __restrict__ meta,
                                                        int32_t* __restrict__ gmeta, int Hm, int nblk) {
  const int g = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
  const int n = 32 * g + (int)threadIdx.x;
  const int64_t row0 = ((int64_t)b * Hm + hm) * 8;
  const bool in = n < nblk;
  const int lts_mx = warp_max(in ? __ldg(meta + (row0 + 1) * nblk + n) : INT_MIN);
  const int lte_mn = warp_min(in ? __ldg(meta + (row0 + 2) * nblk + n) : INT_MAX);
  const int uts_mx = warp_max(in ? __ldg(meta + (row0 + 5) * nblk + n) : INT_MIN);
  const int ute_mn = warp_min(in ? __ldg(meta + (row0 + 6) * nblk + n) : INT_MAX);
  if (threadIdx.x == 0)
    *reinterpret_cast<int4*>(gmeta + row0 * nblk + 4 * (int64_t)g) = make_int4(lts_mx, lte_mn, uts_mx, ute_mn);
}

}  // namespace

cudaError_t group_meta_sm90(const int32_t* meta, int32_t* gmeta, int B, int Hm, int nblk,
                            cudaStream_t stream) {
  const int ngrp = (nblk + 31) / 32;
  if (B == 0 || Hm == 0 || ngrp == 0) return cudaSuccess;
  dim3 grid(ngrp, Hm, B);
  group_meta_kernel<<<grid, 32, 0, stream>>>(meta, gmeta, Hm, nblk);
  return cudaGetLastError();
}

cudaError_t block_meta_sm90(const int32_t* bounds, int32_t* meta, int B, int Hm, int Sk, int bn,
                            cudaStream_t stream, int Sq, uint32_t* unseen, int32_t* zero,
                            int64_t nzero, bool unseen_any) {
  const int nblk = (Sk + bn - 1) / bn;
  if (unseen != nullptr && bn > kMetaThreads) return cudaErrorInvalidValue;
  if (B == 0 || Hm == 0 || nblk == 0) {
    if (zero == nullptr || nzero <= 0) return cudaSuccess;
    return cudaMemsetAsync(zero, 0, sizeof(int32_t) * (size_t)nzero, stream);
  }
  dim3 grid(nblk, Hm, B);
  block_meta_kernel<<<grid, kMetaThreads, 0, stream>>>(bounds, meta, Hm, Sk, bn, nblk, Sq, unseen,
                                                       unseen_any ? 1 : 0, zero, nzero);
  return cudaGetLastError();
}

}  // namespace jfm
