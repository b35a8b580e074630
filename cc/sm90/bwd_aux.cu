// Backward helpers around the main kernel: row statistics (lse in log2 units, D = rowsum(dO * O)
// - dlse) before it, dQ conversion (fp32 workspace * scale -> input dtype) after it, and the
// dispatch over the compiled (dtype, head dim) configurations.
#include <cmath>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include "bwd_launch.cuh"
#include "params.h"

namespace jfm {
namespace sm90 {
namespace {

constexpr int kPrepThreads = 256;  // bwd_prep_kernel (fallback): 8 warps, one row (b, i, h) per warp

template <class Elem>
__global__ void __launch_bounds__(kPrepThreads) bwd_prep_kernel(
    const Elem* __restrict__ o, const Elem* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ dlse, float* __restrict__ lse2, float* __restrict__ delta, int B,
    int Sq, int N, int d, int sq_pad, int32_t* __restrict__ tile_flags, int block_m) {
  const int64_t row = (int64_t)blockIdx.x * (kPrepThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = (int64_t)B * N * sq_pad;
  if (row >= rows) return;
  // output row order [B, N, sq_pad]
  const int i = (int)(row % sq_pad);
  const int64_t bh = row / sq_pad;
  const int h = (int)(bh % N), b = (int)(bh / N);
  if (i >= Sq) {
    if (lane == 0) { lse2[row] = INFINITY; delta[row] = 0.f; }
    return;
  }
  const int64_t src = ((int64_t)b * Sq + i) * N + h;
  const Elem* orow = o + src * d;
  const Elem* grow = dout + src * d;
  float acc = 0.f;
  for (int c = 2 * lane; c < d; c += 64) {
    const cutlass::Array<Elem, 2> x = *reinterpret_cast<const cutlass::Array<Elem, 2>*>(orow + c);
    const cutlass::Array<Elem, 2> y = *reinterpret_cast<const cutlass::Array<Elem, 2>*>(grow + c);
    acc = fmaf(static_cast<float>(x[0]), static_cast<float>(y[0]), acc);
    acc = fmaf(static_cast<float>(x[1]), static_cast<float>(y[1]), acc);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const float l = lse[src];
    const bool empty = l == -INFINITY;
    lse2[row] = empty ? INFINITY : l * 1.4426950408889634f;
    // a fully masked row: D = 0 whatever its dO / dlse hold (they reach nothing: unseen.cuh)
    delta[row] = empty ? 0.f : acc - dlse[src];
    if (empty && tile_flags != nullptr) tile_flags[bh * (sq_pad / block_m) + i / block_m] = 1;
  }
}

// Fused row statistics + dQ-accumulator zeroing (the default path, bwd_prep_sm90). Rows in the
// input order [B, Sq, N] (a block's 32 rows are contiguous in O / dO / lse / dlse), 8 threads per
// row. Thread t of a row loads the 16-byte chunks at columns 8t + 64k (k < D/64) of O and dO and
// its row's lse / dlse before any use, then (while those loads are in flight) stores zeros over
// its grid-stride share of dq_accum[0, zero_floats) and writes the padded rows' (+inf, 0).
// D stays bitwise equal to bwd_prep_kernel's: thread t computes the partial sums of that kernel's
// lanes v = 4t + s (s < 4; lane v sums the pairs at columns 2v + 64k in the same fmaf order),
// then runs the same xor tree: offsets 16, 8, 4 of lane v are offsets 4, 2, 1 of thread t
// (shuffles within the row's 8 threads), offsets 2, 1 are in-thread ((a0 + a2) + (a1 + a3));
// fp addition is commutative, so every lane of bwd_prep_kernel's tree held lane 0's value.
constexpr int kPrepRowThreads = 8;
constexpr int kPrepRowsPerBlock = kPrepThreads / kPrepRowThreads;  // 32

template <class Elem, int D>
__global__ void __launch_bounds__(kPrepThreads) bwd_prep_fused_kernel(
    const Elem* __restrict__ o, const Elem* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ dlse, float* __restrict__ lse2, float* __restrict__ delta,
    float* __restrict__ dq_accum, int64_t zero_floats, int B, int Sq, int N, int sq_pad,
    int32_t* __restrict__ tile_flags, int block_m) {
  static_assert(D % 64 == 0, "16-byte chunks at columns 8t + 64k");
  constexpr int kChunks = D / 64;
  using Chunk = cutlass::AlignedArray<Elem, 8, 16>;
  const int t = threadIdx.x % kPrepRowThreads;
  const int64_t row = (int64_t)blockIdx.x * kPrepRowsPerBlock + threadIdx.x / kPrepRowThreads;
  const bool live = row < (int64_t)B * Sq * N;  // input order: row = (b * Sq + i) * N + h
  Chunk xo[kChunks], xg[kChunks];
  float l = 0.f, dl = 0.f;
  if (live) {
    const Chunk* orow = reinterpret_cast<const Chunk*>(o + row * D);
    const Chunk* grow = reinterpret_cast<const Chunk*>(dout + row * D);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) xo[k] = orow[t + 8 * k];
#pragma unroll
    for (int k = 0; k < kChunks; ++k) xg[k] = grow[t + 8 * k];
    l = lse[row];
    dl = dlse[row];
  } else {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      xo[k].fill(Elem(0.f));
      xg[k].fill(Elem(0.f));
    }
  }
  // zeros of the fp32 dQ accumulator: the byte range of the former cudaMemsetAsync
  const int64_t gtid = (int64_t)blockIdx.x * kPrepThreads + threadIdx.x;
  const int64_t nthreads = (int64_t)gridDim.x * kPrepThreads;
  const int64_t zero4 = zero_floats / 4;
  float4* z4 = reinterpret_cast<float4*>(dq_accum);
  for (int64_t j = gtid; j < zero4; j += nthreads) z4[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t j = zero4 * 4 + gtid; j < zero_floats; j += nthreads) dq_accum[j] = 0.f;
  // padded rows i in [Sq, sq_pad) of every (b, h): (+inf, 0)
  const int pad = sq_pad - Sq;
  if (pad > 0) {
    const int64_t npad = (int64_t)B * N * pad;
    for (int64_t j = gtid; j < npad; j += nthreads) {
      const int64_t out = (j / pad) * sq_pad + Sq + j % pad;
      lse2[out] = INFINITY;
      delta[out] = 0.f;
    }
  }
  float a[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      acc = fmaf(static_cast<float>(xo[k][2 * s]), static_cast<float>(xg[k][2 * s]), acc);
      acc = fmaf(static_cast<float>(xo[k][2 * s + 1]), static_cast<float>(xg[k][2 * s + 1]), acc);
    }
    a[s] = acc;
  }
#pragma unroll
  for (int off = kPrepRowThreads / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int s = 0; s < 4; ++s) a[s] += __shfl_xor_sync(0xffffffffu, a[s], off);
  }
  const float acc = (a[0] + a[2]) + (a[1] + a[3]);
  if (live && t == 0) {
    // output row order [B, N, sq_pad]
    const int h = (int)(row % N);
    const int64_t bi = row / N;
    const int i = (int)(bi % Sq);
    const int64_t b = bi / Sq;
    const int64_t out = (b * N + h) * sq_pad + i;
    const bool empty = l == -INFINITY;
    lse2[out] = empty ? INFINITY : l * 1.4426950408889634f;
    // a fully masked row: D = 0 whatever its dO / dlse hold, and its tile's flag (unseen.cuh)
    delta[out] = empty ? 0.f : acc - dl;
    if (empty && tile_flags != nullptr)
      tile_flags[(b * N + h) * (sq_pad / block_m) + i / block_m] = 1;
  }
}

// Eight dQ floats times the softmax scale in the output type, as one 16-byte store's worth (by
// reference: so the 80-row convert compiles to the same code as with the product written inline).
template <class Elem>
__device__ __forceinline__ cutlass::AlignedArray<Elem, 8, 16> scale8(const float4& x0,
                                                                    const float4& x1, float scale) {
  cutlass::AlignedArray<Elem, 8, 16> y;
  y[0] = static_cast<Elem>(x0.x * scale);
  y[1] = static_cast<Elem>(x0.y * scale);
  y[2] = static_cast<Elem>(x0.z * scale);
  y[3] = static_cast<Elem>(x0.w * scale);
  y[4] = static_cast<Elem>(x1.x * scale);
  y[5] = static_cast<Elem>(x1.y * scale);
  y[6] = static_cast<Elem>(x1.z * scale);
  y[7] = static_cast<Elem>(x1.w * scale);
  return y;
}

// Eight outputs at `out`: one 16-byte store (kVec16), or four 4-byte stores when dq is not 16-byte
// aligned.
template <class Elem, bool kVec16>
__device__ __forceinline__ void store8(Elem* out, const cutlass::AlignedArray<Elem, 8, 16>& y) {
  if constexpr (kVec16) {
    *reinterpret_cast<cutlass::AlignedArray<Elem, 8, 16>*>(out) = y;
  } else {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&y);
#pragma unroll
    for (int k = 0; k < 4; ++k) reinterpret_cast<uint32_t*>(out)[k] = w[k];
  }
}

// The (query row, `cols` columns) unit of thread t in the row-major converts: lanes go row within
// a group of 8 rows fastest, then the row's column blocks, then row groups over (batch, head,
// padded rows). i = the query row, c = its first column, bh = batch * N + head; false for padding
// rows (i >= Sq).
struct ConvertUnit {
  int i, c;
  int64_t bh;
  __device__ int64_t row(int sq_pad) const { return bh * sq_pad + i; }  // workspace / lse2 row
  __device__ int64_t out(int Sq, int N, int d) const {                 // first output in dq
    const int h = (int)(bh % N);
    const int64_t b = bh / N;
    return ((b * Sq + i) * N + h) * d + c;
  }
};
__device__ __forceinline__ bool convert_unit(int64_t t, int cols, int d, int Sq, int sq_pad,
                                             ConvertUnit& u) {
  const int r8 = (int)(t % 8);
  const int64_t q = t / 8;
  u.c = cols * (int)(q % (d / cols));
  const int64_t g = q / (d / cols);  // row group of 8 over (batch, head, padded rows)
  const int rg = (int)(g % (sq_pad / 8));
  u.bh = g / (sq_pad / 8);
  u.i = 8 * rg + r8;
  return u.i < Sq;
}

// The d = 64 / 128 kernels' workspace holds each 64 x d block of query rows in their fragment order
// (BwdTraits::kDqCols): element (r, c) at wq*64*dqc + ((warp*2 + i)*(dqc/8) + kk)*64 + 2*lane + j,
// wq = c / dqc, kk = (c % dqc) / 8, j = c % 2, warp = r / 16, i = (r / 8) % 2,
// lane = 4*(r % 8) + (c % 8) / 2; dqc = d / 2 for d = 128 (the two warpgroups split d), d
// otherwise (d = 256 has the quad order below). 128-row tiles (d = 64: the warpgroups split the
// rows) are two such blocks in a row, so this reader does not depend on the kernel's query-tile
// size.
// Equivalently: each 64-float run is one 8 x 8 sub-tile, row-major (rows 8*(r/8).., columns
// 8*kk.. of slab wq), and the runs go row group by row group, kk fastest:
// wq*64*dqc + ((r/8)*(dqc/8) + kk)*64 + 8*(r % 8) + c % 8.
// dq_frag_run: where row r's 8 floats of columns c .. c + 7 (c a multiple of 8) start.
__device__ __forceinline__ int64_t dq_frag_run(int r, int c, int dqc) {
  const int wq = c / dqc, cc = c % dqc;
  return (int64_t)wq * 64 * dqc + ((r / 8) * (dqc / 8) + cc / 8) * 64 + 8 * (r % 8);
}

// One thread per (query row, 8 columns): it reads the 8 floats (32 contiguous bytes) of its row
// in their 8 x 8 run and writes 8 outputs with one 16-byte store (kVec16; 4-byte stores when dq
// is not 16-byte aligned). Lanes go row within the run fastest, then 4 column groups, so a warp
// reads 4 consecutive runs (1 KB contiguous) and writes 8 rows x 64 bytes (a lane per output
// pair in output order reads 32-byte pieces 256 bytes apart instead: half the DRAM rate).
template <class Elem, bool kVec16>
__global__ void __launch_bounds__(256) bwd_convert_kernel(const float* __restrict__ acc,
                                                          const float* __restrict__ lse2,
                                                          Elem* __restrict__ dq, int64_t units,
                                                          int Sq, int N, int d, int sq_pad,
                                                          float scale) {
  static_assert(kBwdBlockM == 64, "fragment order: 64-row blocks (128-row tiles: two per tile)");
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= units) return;
  const int dqc = d >= 128 ? d / 2 : d;
  ConvertUnit u;
  if (!convert_unit(t, 8, d, Sq, sq_pad, u)) return;
  const int64_t row = u.row(sq_pad);
  const float* src = acc + (row - u.i % 64) * d + dq_frag_run(u.i % 64, u.c, dqc);
  float4 x0 = *reinterpret_cast<const float4*>(src);
  float4 x1 = *reinterpret_cast<const float4*>(src + 4);
  // a fully masked row's dS is 0, but 0 * Inf in a key other rows see is NaN: select, not scale
  if (__ldg(lse2 + row) == INFINITY) x0 = x1 = make_float4(0.f, 0.f, 0.f, 0.f);
  store8<Elem, kVec16>(dq + u.out(Sq, N, d), scale8<Elem>(x0, x1, scale));
}

// The d = 256 kernel's quad order (bwd_d256_kernel.cuh): the fragment order with dqc = 128, but
// each 8 x 16 block (rows 8*(r/8).., 8-column groups 2kp and 2kp + 1 of slab wq) is one 128-float
// run, row-major, and within a row of the block the thread quads go lane by lane: element (r, c)
// at wq*64*128 + ((r/8)*8 + kp)*128 + 16*(r % 8) + 4*((c % 8)/2) + 2*((c/8) % 2) + c % 2,
// kp = (c % 128) / 16. Row r's 16 columns of its block are 64 contiguous bytes.
__device__ __forceinline__ int64_t dq_quad_run(int r, int c) {
  const int wq = c / 128, cc = c % 128;
  return (int64_t)wq * 64 * 128 + ((r / 8) * 8 + cc / 16) * 128 + 16 * (r % 8);
}

// One thread per (query row, 16 columns): four 16-byte loads of the row's 64 contiguous bytes,
// de-interleaved into columns c .. c + 7 and c + 8 .. c + 15, two 16-byte stores (kVec16). Lanes go
// row within the block fastest, then 4 column blocks: a warp reads 2 KB contiguous and writes 8
// rows x 128 bytes.
template <class Elem, bool kVec16>
__global__ void __launch_bounds__(256) bwd_convert_quad_kernel(const float* __restrict__ acc,
                                                               const float* __restrict__ lse2,
                                                               Elem* __restrict__ dq, int64_t units,
                                                               int Sq, int N, int sq_pad,
                                                               float scale) {
  constexpr int d = 256;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= units) return;
  ConvertUnit u;
  if (!convert_unit(t, 16, d, Sq, sq_pad, u)) return;
  const int64_t row = u.row(sq_pad);
  const float4* src = reinterpret_cast<const float4*>(acc + (row - u.i % 64) * d + dq_quad_run(u.i % 64, u.c));
  float4 x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = src[k];  // x[k] = columns 2k, 2k + 1, 2k + 8, 2k + 9
  // a fully masked row's dS is 0, but 0 * Inf in a key other rows see is NaN: select, not scale
  if (__ldg(lse2 + row) == INFINITY) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  Elem* out = dq + u.out(Sq, N, d);
  store8<Elem, kVec16>(out, scale8<Elem>(make_float4(x[0].x, x[0].y, x[1].x, x[1].y),
                                          make_float4(x[2].x, x[2].y, x[3].x, x[3].y), scale));
  store8<Elem, kVec16>(out + 8, scale8<Elem>(make_float4(x[0].z, x[0].w, x[1].z, x[1].w),
                                              make_float4(x[2].z, x[2].w, x[3].z, x[3].w), scale));
}

// 80-row query tiles (d = 128; traits.h kDqTrans): each 80 x 128 tile of the
// workspace holds dQ^T in two slabs of 64 d-rows x 80 query columns (slab wq = d columns
// [64*wq, 64*wq + 64)), each in the fragment order above with (row, col) = (d, query) and 10
// column groups of 8: element (query r, d column c) at wq*64*80 + (((cc/16)*2 + (cc/8)%2)*10 +
// r/8)*64 + 2*(4*(cc%8) + (r%8)/2) + r%2, cc = c % 64.
constexpr int kRows80 = 80, kRows80D = 128, kRows80Pad = kRows80D + 4;

// One CTA per (80-row tile, head, batch): the tile (40 KB, contiguous) is read coalesced into
// shared memory at its (query, d) place (row pitch 132 floats: the scatter of a warp's 64
// consecutive floats hits 32 distinct banks), then each query row is written out as 128
// contiguous outputs. The read phase issues all 20 float2 loads of a thread before its
// shared-memory stores (same smem places as before: only which thread moves which pair changed);
// 5 CTAs per SM as before (smem-bound; __launch_bounds__ keeps 48 registers). The write phase
// converts 8 columns per
// thread and stores them with one 16-byte store (kVec16; 4-byte stores when dq is not 16-byte
// aligned).
constexpr int kConv80Threads = 256;
constexpr int kConv80Pairs = kRows80 * kRows80D / 2 / kConv80Threads;  // 20 float2 per thread
static_assert(kConv80Pairs * 2 * kConv80Threads == kRows80 * kRows80D && kConv80Pairs == 20 &&
                  kRows80 == 80 && kConv80Threads == 256, "the read phase's block split");
template <class Elem, bool kVec16>
__global__ void __launch_bounds__(kConv80Threads, 5) bwd_convert80_kernel(const float* __restrict__ acc,
                                                                       const float* __restrict__ lse2,
                                                                       Elem* __restrict__ dq, int Sq, int N,
                                                                       int sq_pad, float scale) {
  __shared__ float s[kRows80 * kRows80Pad];
  const int mt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t tile = (((int64_t)b * N + h) * sq_pad + (int64_t)mt * kRows80) * kRows80D;
  // Warp w reads the 64-float blocks 20w .. 20w + 19 of the tile (5 KB contiguous; lane l the
  // float pair 2l of each block). Block B = 20w + u holds slab wq = w / 4, row group
  // rg = 2 (w % 4) + u / 10 and column group kk = u % 10 (the formula above with 64-float block
  // wq * 80 + rg * 10 + kk), so its pair lands at s[r * kRows80Pad + c] with r = 8 kk + 2 (l % 4),
  // c = 64 wq + 16 (rg / 2) + 8 (rg % 2) + l / 4: one per-thread base plus a constant of u.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float2* src =
      reinterpret_cast<const float2*>(acc + tile) + (int64_t)warp * kConv80Pairs * 32 + lane;
  float* dst = s + 2 * (lane % 4) * kRows80Pad + (warp / 4) * 64 + (warp % 4) * 16 + lane / 4;
  float2 x[kConv80Pairs];
#pragma unroll
  for (int u = 0; u < kConv80Pairs; ++u) x[u] = src[u * 32];
#pragma unroll
  for (int u = 0; u < kConv80Pairs; ++u) {
    float* d = dst + (u % 10) * 8 * kRows80Pad + (u / 10) * 8;
    d[0] = x[u].x;
    d[kRows80Pad] = x[u].y;
  }
  __syncthreads();
  if constexpr (kVec16) {
    constexpr int kGroups = kRows80D / 8;  // 8-column groups per row
#pragma unroll
    for (int q = 0; q < kRows80 * kGroups / kConv80Threads; ++q) {
      const int p = q * kConv80Threads + threadIdx.x;
      const int r = p / kGroups, c = 8 * (p % kGroups);
      const int i = mt * kRows80 + r;
      if (i >= Sq) break;  // rows ascend with p
      float4 x0 = *reinterpret_cast<const float4*>(&s[r * kRows80Pad + c]);
      float4 x1 = *reinterpret_cast<const float4*>(&s[r * kRows80Pad + c + 4]);
      if (__ldg(lse2 + tile / kRows80D + r) == INFINITY)  // fully masked row: dq = 0 (see above)
        x0 = x1 = make_float4(0.f, 0.f, 0.f, 0.f);
      const auto y = scale8<Elem>(x0, x1, scale);
      *reinterpret_cast<cutlass::AlignedArray<Elem, 8, 16>*>(
          dq + (((int64_t)b * Sq + i) * N + h) * kRows80D + c) = y;
    }
  } else {
    for (int p = threadIdx.x; p < kRows80 * kRows80D / 2; p += kConv80Threads) {
      const int r = p / (kRows80D / 2), c = 2 * (p % (kRows80D / 2));
      const int i = mt * kRows80 + r;
      if (i >= Sq) break;  // rows ascend with p
      float2 x = *reinterpret_cast<const float2*>(&s[r * kRows80Pad + c]);
      if (__ldg(lse2 + tile / kRows80D + r) == INFINITY) x = make_float2(0.f, 0.f);
      cutlass::Array<Elem, 2> y;
      y[0] = static_cast<Elem>(x.x * scale);
      y[1] = static_cast<Elem>(x.y * scale);
      *reinterpret_cast<cutlass::Array<Elem, 2>*>(dq + (((int64_t)b * Sq + i) * N + h) * kRows80D + c) = y;
    }
  }
}

// Persistent-grid scheduler pre-pass. Query tiles of key block n that the kernel does not skip, for one
// mask head: mblk minus the tiles lying entirely inside [LTSmax, LTEmin) or [UTSmax, UTEmin) (the
// skip test of bwd_find_kept). Both are contiguous tile ranges; |R1 u R2| = |R1| + |R2| - |R1 n R2|.
constexpr int kSchedThreads = 1024;
constexpr int kSchedMaxBlocks = 8192;  // key blocks sortable in the 32 KB of smem (Sk <= 1M)

__device__ __forceinline__ void sched_inside(int lo_key, int hi_key, int Sq, int mblk, int& lo,
                                             int& hi) {
  lo = (max(lo_key, 0) + kBwdBlockM - 1) / kBwdBlockM;
  hi = hi_key >= Sq ? mblk - 1 : max(hi_key, 0) / kBwdBlockM - 1;  // last tile ending <= hi_key
}

__global__ void __launch_bounds__(kSchedThreads) bwd_sched_kernel(
    const int32_t* __restrict__ meta, int32_t* __restrict__ sched, int BH, int nblk, int mblk,
    int Sq, int mode) {
  __shared__ int w[kSchedMaxBlocks];
  if (threadIdx.x == 0) sched[0] = 0;  // the item counter of this call
  int32_t* order = sched + 4;
  if (mode != 0) {  // 1: deterministic (descending key block), 2: too many blocks (ascending)
    for (int r = threadIdx.x; r < nblk; r += kSchedThreads) order[r] = mode == 1 ? nblk - 1 - r : r;
    return;
  }
  for (int n = threadIdx.x; n < nblk; n += kSchedThreads) {
    int64_t tot = 0;
    for (int bh = 0; bh < BH; ++bh) {
      const int32_t* mt = meta + (int64_t)bh * 8 * nblk + n;
      int l1, h1, l2, h2;
      sched_inside(mt[1 * nblk], mt[2 * nblk], Sq, mblk, l1, h1);  // LTSmax, LTEmin
      sched_inside(mt[5 * nblk], mt[6 * nblk], Sq, mblk, l2, h2);  // UTSmax, UTEmin
      const int c1 = max(h1 - l1 + 1, 0), c2 = max(h2 - l2 + 1, 0);
      const int c12 = max(min(h1, h2) - max(l1, l2) + 1, 0);
      tot += mblk - (c1 + c2 - c12);
    }
    w[n] = tot > INT_MAX ? INT_MAX : (int)tot;
  }
  __syncthreads();
  for (int n = threadIdx.x; n < nblk; n += kSchedThreads) {
    const int wn = w[n];
    int rank = 0;
    for (int j = 0; j < nblk; ++j) {
      const int wj = w[j];
      rank += (wj > wn) || (wj == wn && j < n);
    }
    order[rank] = n;
  }
}

// Deterministic pre-passes (bwd_det_group80_sm90, bwd_det_order_sm90). Per (batch, mask head,
// key block) item: the kept query tiles (as bwd_sched_kernel counts them) and the first kept tile
// (bwd_find_kept's three jumps over the two skipped ranges; mblk: none). A key block "co-starts"
// when it keeps a tile and its first kept tile is that of the key block above it (documents:
// every key block but a document's top one; causal / sliding window / causal documents: none,
// each starts at its diagonal).
constexpr int kDetGroupThreads = 512;

__device__ __forceinline__ int det_first_kept(int l1, int h1, int l2, int h2) {
  int m = 0;
  if (m >= l1 && m <= h1) m = h1 + 1;
  if (m >= l2 && m <= h2) m = h2 + 1;
  if (m >= l1 && m <= h1) m = h1 + 1;
  return m;
}

// Launch-group pre-pass of the 80-row kernel (bwd_det_group80_sm90): the per-item counts at
// 80-row query tiles, plus the last kept tile (det_last_kept, the mirror of det_first_kept: three jumps
// down over the two skipped ranges; -1: none) and the inverted tiles (det_tally).
constexpr int kDetGroupRows80 = 80;
// The launch group's L2 budget, in 80-row query tiles: G interleaved pairs walk about G * L tiles
// (L = mean kept tiles per live key block), each tile's Q, dO and fp32 dQ rows ~80 KB at d = 128,
// so 300 tiles ~ 24 MB, half the L2. Co-starting chains take G = kDetGroupPairs and the budget
// alone limits it; the co-start test (more than half of the query tiles per key block) keeps
// full / causal-like walks at G = 1 (docs/decisions.md#det-arrival-order).
constexpr unsigned kDetGroupTileBudget = 300;
// G of the inverted-tails branch (causal blockwise; docs/decisions.md#det-arrival-order).
constexpr unsigned kDetGroupInverted = 4;

template <int Rows>
__device__ __forceinline__ void det_skip_rows(const int32_t* mt, int nblk, int Sq, int mblk, int& l1,
                                              int& h1, int& l2, int& h2) {
  // tiles lying entirely inside [lo_key, hi_key) at Rows rows (sched_inside with Bm = Rows)
  const int lts_mx = mt[1 * nblk], lte_mn = mt[2 * nblk];
  const int uts_mx = mt[5 * nblk], ute_mn = mt[6 * nblk];
  l1 = (max(lts_mx, 0) + Rows - 1) / Rows;
  h1 = lte_mn >= Sq ? mblk - 1 : max(lte_mn, 0) / Rows - 1;
  l2 = (max(uts_mx, 0) + Rows - 1) / Rows;
  h2 = ute_mn >= Sq ? mblk - 1 : max(ute_mn, 0) / Rows - 1;
}

// Kept Rows-row query tiles of key block n (the metadata column mt) and its skip ranges.
template <int Rows>
__device__ __forceinline__ int det_kept_rows(const int32_t* mt, int nblk, int Sq, int mblk, int& l1,
                                             int& h1, int& l2, int& h2) {
  det_skip_rows<Rows>(mt, nblk, Sq, mblk, l1, h1, l2, h2);
  const int c1 = max(h1 - l1 + 1, 0), c2 = max(h2 - l2 + 1, 0);
  const int c12 = max(min(h1, h2) - max(l1, l2) + 1, 0);
  return max(mblk - (c1 + c2 - c12), 0);
}

// The deterministic key-block order (the inverted-tails case; the 80-row kernel's launch groups,
// and the d = 64 and d = 256 kernels' launches): the key blocks of each (batch, mask head) in
// windows of kDetOrderWindow consecutive key blocks, the highest window first (descending order
// between windows), inside a window in ascending kept-tile count, ties by descending key block,
// i.e. the order in which their walks reach a tail that all of them share. The window keeps the
// resident CTAs on the rows of ~32K keys' documents (sorting a whole 128K head interleaves every
// document: docs/decisions.md#det-arrival-order). Written position -> key block at order[bh * nblk + i], from the rank of each key
// block in its window (kept counts in smem).
constexpr int kDetPermMaxBlocks = 12000;  // kept counts in dynamic shared memory (under 48 KB)
constexpr int kDetOrderWindow = 256;      // key blocks (32K keys at 128 keys per block)

template <int Rows>
__device__ void det_order_rows(const int32_t* __restrict__ meta, int32_t* __restrict__ order, int BH,
                               int nblk, int mblk, int Sq, int window, int* kept_s) {
  for (int bh = 0; bh < BH; ++bh) {
    for (int n = threadIdx.x; n < nblk; n += blockDim.x) {
      int l1, h1, l2, h2;
      kept_s[n] = det_kept_rows<Rows>(meta + (int64_t)bh * 8 * nblk + n, nblk, Sq, mblk, l1, h1, l2, h2);
    }
    __syncthreads();
    for (int n = threadIdx.x; n < nblk; n += blockDim.x) {
      const int k = kept_s[n];
      const int lo = n / window * window, hi = min(lo + window, nblk);
      int rank = nblk - hi;  // the windows above come first
      for (int u = lo; u < hi; ++u) {
        const int ku = kept_s[u];
        rank += (ku < k || (ku == k && u > n)) ? 1 : 0;
      }
      order[(int64_t)bh * nblk + rank] = n;
    }
    __syncthreads();
  }
}

// The last kept tile (-1: none).
__device__ __forceinline__ int det_last_kept(int l1, int h1, int l2, int h2, int mblk) {
  int m = mblk - 1;
  if (m >= l1 && m <= h1) m = l1 - 1;
  if (m >= l2 && m <= h2) m = l2 - 1;
  if (m >= l1 && m <= h1) m = l1 - 1;
  return m;
}

// The launch's totals over every (batch, mask head, key block) at Rows-row tiles, summed by the
// whole block into tot: kept tiles, key blocks keeping a tile ("live"), co-starting live key
// blocks, inverted tiles. A live key block is "inverted" when it ends on the last kept tile of the
// key block above it but keeps fewer tiles: its walk (ascending) reaches their common tail
// kept(n + 1) - kept(n) tiles earlier than the key block that adds there before it (causal
// blockwise: the top key block of each document below a longer one, on the last document's rows).
struct DetTallies {
  unsigned long long kept, live, costart, inv;
};
template <int Rows>
__device__ void det_tally(const int32_t* __restrict__ meta, int BH, int nblk, int mblk, int Sq,
                          DetTallies* tot) {
  if (threadIdx.x == 0) *tot = DetTallies{0ull, 0ull, 0ull, 0ull};
  __syncthreads();
  unsigned long long kept = 0ull, live = 0ull, costart = 0ull, inv = 0ull;
  for (int bh = 0; bh < BH; ++bh) {
    for (int n = threadIdx.x; n < nblk; n += blockDim.x) {
      const int32_t* mt = meta + (int64_t)bh * 8 * nblk + n;
      int l1, h1, l2, h2;
      const int k = det_kept_rows<Rows>(mt, nblk, Sq, mblk, l1, h1, l2, h2);
      kept += (unsigned long long)k;
      if (k > 0) {
        ++live;
        if (n + 1 < nblk) {
          const int f = det_first_kept(l1, h1, l2, h2);
          const int la = det_last_kept(l1, h1, l2, h2, mblk);
          const int ku = det_kept_rows<Rows>(mt + 1, nblk, Sq, mblk, l1, h1, l2, h2);
          costart += f == det_first_kept(l1, h1, l2, h2) ? 1ull : 0ull;
          if (ku > k && la == det_last_kept(l1, h1, l2, h2, mblk)) inv += (unsigned long long)(ku - k);
        }
      }
    }
  }
  atomicAdd(&tot->kept, kept);
  atomicAdd(&tot->live, live);
  atomicAdd(&tot->costart, costart);
  atomicAdd(&tot->inv, inv);
  __syncthreads();
}
// Co-starting chains (documents, global rows): at least half of the live key blocks co-start.
__device__ __forceinline__ bool det_costarts(const DetTallies& t) { return 2ull * t.costart >= t.live; }
// Otherwise inverted tails worth at least 1/128 of the kept tiles (causal blockwise).
__device__ __forceinline__ bool det_inverted(const DetTallies& t) {
  return t.live > 0ull && !det_costarts(t) && 128ull * t.inv >= t.kept;
}

__global__ void __launch_bounds__(kDetGroupThreads) bwd_det_group80_kernel(
    const int32_t* __restrict__ meta, int32_t* __restrict__ sched, int BH, int nblk, int mblk,
    int Sq, int pairs, int max_group, int perm, int window) {
  __shared__ DetTallies tot;
  __shared__ int use_order;
  extern __shared__ int kept_s[];  // nblk kept counts (perm only)
  const int64_t items = (int64_t)BH * nblk;
  det_tally<kDetGroupRows80>(meta, BH, nblk, mblk, Sq, &tot);
  if (threadIdx.x == 0) {
    const int cap = max(1, min(max_group, pairs));
    // co-starting chains whose key blocks keep on average at most half of the query tiles (not
    // full / causal-like walks over the whole head): G = cap; inverted tails: G =
    // kDetGroupInverted; otherwise G = 1 (the default mode's order). Then the L2 budget: G * (mean
    // kept tiles per live key block) <= kDetGroupTileBudget.
    unsigned long long g = 1ull;
    const bool inverted = det_inverted(tot);
    if (tot.live > 0ull) {
      if (det_costarts(tot)) {
        g = 2ull * tot.kept <= (unsigned long long)mblk * (unsigned long long)items
                ? (unsigned long long)cap : 1ull;
      } else if (inverted) {
        g = (unsigned long long)kDetGroupInverted;
      }
      if (tot.kept > 0ull)
        g = min(g, (unsigned long long)kDetGroupTileBudget * tot.live / tot.kept);
    }
    sched[1] = (int)max(1ull, min(g, (unsigned long long)cap));
    // the inverted tails also get their arrival order (traits.h BwdDetAuto80)
    use_order = perm && inverted && nblk <= kDetPermMaxBlocks ? 1 : 0;
    sched[2] = use_order;
  }
  __syncthreads();
  if (use_order) det_order_rows<kDetGroupRows80>(meta, sched + 4 + nblk, BH, nblk, mblk, Sq, window, kept_s);
}

// The same order for the kernels launched (nblk, K, B) in deterministic mode (d = 64 at 128-row
// tiles, d = 256 at 64): sched[2] = 1 and the order where the tails are
// inverted, else sched[2] = 0 (descending key block).
template <int Rows>
__global__ void __launch_bounds__(kDetGroupThreads) bwd_det_order_kernel(
    const int32_t* __restrict__ meta, int32_t* __restrict__ sched, int BH, int nblk, int mblk,
    int Sq, int window) {
  __shared__ DetTallies tot;
  __shared__ int use_order;
  extern __shared__ int kept_s[];
  det_tally<Rows>(meta, BH, nblk, mblk, Sq, &tot);
  if (threadIdx.x == 0) {
    use_order = det_inverted(tot) && nblk <= kDetPermMaxBlocks ? 1 : 0;
    sched[2] = use_order;
  }
  __syncthreads();
  if (use_order) det_order_rows<Rows>(meta, sched + 4 + nblk, BH, nblk, mblk, Sq, window, kept_s);
}

// The order's kept counts in dynamic smem, rounded up to 4 ints (the rank loop reads kept_s 16
// bytes at a time, its tail included).
size_t det_order_smem(int nblk) {
  return nblk <= kDetPermMaxBlocks ? sizeof(int) * (size_t)((nblk + 3) / 4 * 4) : 0;
}
}  // namespace

cudaError_t bwd_det_group80_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                                 int mblk, int Sq, int pairs, int max_group, bool perm,
                                 cudaStream_t stream) {
  bwd_det_group80_kernel<<<1, kDetGroupThreads, perm ? det_order_smem(nblk) : 0, stream>>>(
      meta, sched, B * Hm, nblk, mblk, Sq, pairs, max_group, perm ? 1 : 0, kDetOrderWindow);
  return cudaGetLastError();
}

cudaError_t bwd_det_order_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                               int mblk, int Sq, int rows, cudaStream_t stream) {
  auto kernel = rows == 128 ? &bwd_det_order_kernel<128> : rows == 64 ? &bwd_det_order_kernel<64> : nullptr;
  if (kernel == nullptr) return cudaErrorInvalidValue;
  kernel<<<1, kDetGroupThreads, det_order_smem(nblk), stream>>>(meta, sched, B * Hm, nblk, mblk, Sq,
                                                                kDetOrderWindow);
  return cudaGetLastError();
}

cudaError_t bwd_sched_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk, int mblk,
                           int Sq, bool deterministic, cudaStream_t stream) {
  const int mode = deterministic ? 1 : (nblk > kSchedMaxBlocks ? 2 : 0);
  bwd_sched_kernel<<<1, kSchedThreads, 0, stream>>>(meta, sched, B * Hm, nblk, mblk, Sq, mode);
  return cudaGetLastError();
}

namespace {
template <class Elem>
cudaError_t bwd_prep_launch(const BwdParams& p, int sq_pad, size_t dq_zero_floats,
                            int32_t* tile_flags, int block_m, cudaStream_t stream) {
  const Elem* o = static_cast<const Elem*>(p.o);
  const Elem* dout = static_cast<const Elem*>(p.dout);
  float* lse2 = p.rowstats;
  float* delta = p.rowstats + (int64_t)p.B * p.N * sq_pad;
  const bool aligned = (reinterpret_cast<uintptr_t>(p.o) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(p.dout) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(p.dq_accum) % 16 == 0);
  const int64_t rows = (int64_t)p.B * p.Sq * p.N;
  const int64_t blocks = (rows + kPrepRowsPerBlock - 1) / kPrepRowsPerBlock;
  if (aligned && (p.d == 64 || p.d == 128 || p.d == 256) && blocks > 0 && blocks <= INT32_MAX) {
    auto kernel = p.d == 64    ? &bwd_prep_fused_kernel<Elem, 64>
                  : p.d == 128 ? &bwd_prep_fused_kernel<Elem, 128>
                               : &bwd_prep_fused_kernel<Elem, 256>;
    kernel<<<(unsigned)blocks, kPrepThreads, 0, stream>>>(o, dout, p.lse, p.dlse, lse2, delta,
                                                          p.dq_accum, (int64_t)dq_zero_floats,
                                                          p.B, p.Sq, p.N, sq_pad, tile_flags,
                                                          block_m);
    return cudaGetLastError();
  }
  // fallback: one warp per padded row, then the driver's memset of the accumulator
  const int64_t prow = (int64_t)p.B * p.N * sq_pad;
  const int64_t pblocks = (prow + kPrepThreads / 32 - 1) / (kPrepThreads / 32);
  if (pblocks > INT32_MAX) return cudaErrorInvalidValue;
  bwd_prep_kernel<Elem><<<(unsigned)pblocks, kPrepThreads, 0, stream>>>(
      o, dout, p.lse, p.dlse, lse2, delta, p.B, p.Sq, p.N, p.d, sq_pad, tile_flags, block_m);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || dq_zero_floats == 0) return e;
  return cudaMemsetAsync(p.dq_accum, 0, sizeof(float) * dq_zero_floats, stream);
}
}  // namespace

cudaError_t bwd_prep_sm90(const BwdParams& p, int sq_pad, size_t dq_zero_floats,
                          int32_t* tile_flags, int block_m, cudaStream_t stream) {
  const int64_t rows = (int64_t)p.B * p.N * sq_pad;
  if (rows == 0) {
    if (dq_zero_floats == 0) return cudaSuccess;
    return cudaMemsetAsync(p.dq_accum, 0, sizeof(float) * dq_zero_floats, stream);
  }
  if (block_m <= 0 || sq_pad % block_m != 0) return cudaErrorInvalidValue;
  if (p.dtype == DType::kBF16)
    return bwd_prep_launch<cutlass::bfloat16_t>(p, sq_pad, dq_zero_floats, tile_flags, block_m, stream);
  return bwd_prep_launch<cutlass::half_t>(p, sq_pad, dq_zero_floats, tile_flags, block_m, stream);
}

namespace {
template <class Elem>
cudaError_t bwd_convert_launch(const BwdParams& p, int sq_pad, int block_m, cudaStream_t stream) {
  const bool vec16 = reinterpret_cast<uintptr_t>(p.dq) % 16 == 0;  // else 4-byte stores
  Elem* dq = static_cast<Elem*>(p.dq);
  if (block_m == kRows80 && p.d == kRows80D) {  // 80-row tiles: the transposed fragment order
    if (sq_pad % kRows80 != 0 || p.N > 65535 || p.B > 65535) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)(sq_pad / kRows80), (unsigned)p.N, (unsigned)p.B);
    auto kernel = vec16 ? &bwd_convert80_kernel<Elem, true> : &bwd_convert80_kernel<Elem, false>;
    kernel<<<grid, kConv80Threads, 0, stream>>>(p.dq_accum, p.rowstats, dq, p.Sq, p.N, sq_pad,
                                                p.scale);
    return cudaGetLastError();
  }
  if (p.d % 8 != 0 || sq_pad % kBwdBlockM != 0) return cudaErrorInvalidValue;
  const int threads = 256;
  if (p.d == 256) {  // the d = 256 kernel's quad order
    const int64_t units = (int64_t)p.B * p.N * sq_pad * (p.d / 16);  // (padded row, 16 columns)
    const int64_t blocks = (units + threads - 1) / threads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    auto kernel = vec16 ? &bwd_convert_quad_kernel<Elem, true> : &bwd_convert_quad_kernel<Elem, false>;
    kernel<<<(unsigned)blocks, threads, 0, stream>>>(p.dq_accum, p.rowstats, dq, units, p.Sq, p.N,
                                                     sq_pad, p.scale);
    return cudaGetLastError();
  }
  const int64_t units = (int64_t)p.B * p.N * sq_pad * (p.d / 8);  // (padded row, 8 columns)
  const int64_t blocks = (units + threads - 1) / threads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  auto kernel = vec16 ? &bwd_convert_kernel<Elem, true> : &bwd_convert_kernel<Elem, false>;
  kernel<<<(unsigned)blocks, threads, 0, stream>>>(p.dq_accum, p.rowstats, dq, units, p.Sq, p.N,
                                                   p.d, sq_pad, p.scale);
  return cudaGetLastError();
}
}  // namespace

cudaError_t bwd_convert_dq_sm90(const BwdParams& p, int sq_pad, int block_m, cudaStream_t stream) {
  if ((int64_t)p.B * p.Sq * p.N * p.d == 0) return cudaSuccess;
  if (p.dtype == DType::kBF16)
    return bwd_convert_launch<cutlass::bfloat16_t>(p, sq_pad, block_m, stream);
  return bwd_convert_launch<cutlass::half_t>(p, sq_pad, block_m, stream);
}

}  // namespace sm90
}  // namespace jfm
