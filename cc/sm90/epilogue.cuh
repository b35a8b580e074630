// Epilogues: the forward's O / LSE (fwd_store_o_lse), output rows stored as 16-byte chunks (the
// forward's O, the d = 256 backward's dK / dV), the pp kernel's dK / dV staging through smem, the
// dQ writer (bulk reduce-add of fp32 dQ tiles, ordering bits of the deterministic mode, skip
// marks) and the look-ahead zeroing of the dQ workspace.
// Contract: forward rows with no visible key give O = 0 and LSE = -inf, a NaN in a visible input
//   reaches O and the LSE; dQ tiles land in the workspace in the layout their kernel staged them
//   in (the fragment order, or the d = 256 kernel's quad order), which bwd_aux.cu converts; in
//   deterministic mode a tile's adds happen in descending ordering slot, each key
//   block adding after every slot above it has set its bit (set once its reduce completed, or at
//   CTA start for the tiles it skips).
// Synchronization: bulk-async groups (cp.async.bulk.wait_group), GPU-scope release / acquire on
//   the ordering bits and the zeroing counters; callers own the smem buffer barriers.
// Knobs: none beyond the template sizes.
#pragma once

#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"

namespace jfm::sm90 {

using namespace cute;

// Row half i of a consumer thread's m64 x D accumulator fragment (element pairs e = 4 * kk + 2 * i at
// columns 8 * kk + 2 * (lane % 4)), scaled and converted, stored as 16-byte chunks of 8 columns:
// a 4 x 4 transpose of 4-byte words across the lane quad (two shuffle rounds) gives lane q chunk
// 4 * blk + q of each group of four, so a warp store writes 8 rows x 64 contiguous bytes instead
// of 8 rows x 16 bytes (half a sector) per 4-byte store (the backward pp kernel's dK / dV go
// through smem instead: bwd_stage_rows). The forward's O and the d = 256
// backward's dK / dV use it. All 32 lanes must call it (row == nullptr: a row past the end,
// shuffle only). zero: store zeros (a forward row with no visible key, whose O may hold
// 0 * NaN from a V row other rows of the tile see: a select, not a scale by 0).
template <class Elem, int D, class Frag>
__device__ __forceinline__ void store_row_chunks(Elem* row, Frag const& acc, int i, float scale,
                                                 int lane, bool zero = false) {
  static_assert(sizeof(Elem) == 2 && D % 32 == 0, "groups of four 8-column chunks");
  const int q = lane % 4;
  CUTE_UNROLL
  for (int blk = 0; blk < D / 32; ++blk) {
    uint32_t v[4];  // v[j]: this lane's word of chunk 4 * blk + j
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      cutlass::Array<Elem, 2> p;
      p[0] = static_cast<Elem>(zero ? 0.f : acc(4 * (4 * blk + j) + 2 * i) * scale);
      p[1] = static_cast<Elem>(zero ? 0.f : acc(4 * (4 * blk + j) + 2 * i + 1) * scale);
      v[j] = reinterpret_cast<uint32_t const&>(p);
    }
    // after the xor-1 round lane q holds words (q & ~1, c), (q | 1, c), (q & ~1, c + 2),
    // (q | 1, c + 2) with c = q & 1 ((lane, chunk)); after the xor-2 round words (0..3, q)
    const bool odd = q & 1, high = q & 2;
    uint32_t s0 = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
    uint32_t s1 = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 1);
    if (odd) { v[0] = s0; v[2] = s1; } else { v[1] = s0; v[3] = s1; }
    s0 = __shfl_xor_sync(0xffffffffu, high ? v[0] : v[2], 2);
    s1 = __shfl_xor_sync(0xffffffffu, high ? v[1] : v[3], 2);
    if (high) { v[0] = s0; v[1] = s1; } else { v[2] = s0; v[3] = s1; }
    if (row) *reinterpret_cast<uint4*>(row + 8 * (4 * blk + q)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Forward epilogue of a consumer thread (rows row0 and row0 + 8 of query head h, batch b): the
// row sums of the quad, O / l written in the input dtype, LSE = m * scale_log2 + log2 l in natural
// log. l == 0 only where no key was visible (O = 0, LSE = -inf); a NaN l (NaN in a visible input)
// must reach O and the LSE, so the test is not `!(l > 0)`. Every lane takes part (shuffles); rows
// past Sq store nothing.
template <class Elem, int D, class FragO>
__device__ __forceinline__ void fwd_store_o_lse(const KArgs& a, FragO const& tOrO,
                                                float const (&m_i)[2], float const (&l_i)[2],
                                                float sl2, int row0, int b, int h, int lane) {
  float inv[2], lse[2];
  bool empty[2];
  CUTE_UNROLL
  for (int i = 0; i < 2; ++i) {
    float l = l_i[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    empty[i] = l == 0.f;
    inv[i] = empty[i] ? 0.f : 1.f / l;
    lse[i] = empty[i] ? -INFINITY : (m_i[i] * sl2 + __log2f(l)) * 0.69314718055994530942f;
  }
  Elem* out = reinterpret_cast<Elem*>(a.o);
  CUTE_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + 8 * i;
    store_row_chunks<Elem, D>(r < a.Sq ? out + (((int64_t)b * a.Sq + r) * a.N + h) * D : nullptr,
                              tOrO, i, inv[i], lane, empty[i]);
    if (r < a.Sq && (lane % 4) == 0) a.lse[((int64_t)b * a.Sq + r) * a.N + h] = lse[i];
  }
}

// First uint32 of the ordering bits of query tile m of head h (batch b).
__device__ __forceinline__ int64_t bwd_sem_word(const BwdArgs& a, int b, int h, int m) {
  return (((int64_t)b * a.N + h) * a.mblk + m) * a.sem_words;
}

// Deterministic mode, at CTA start (one warp): set this key block's bit (slot: its position in the
// summation order: n, or its place in the pre-pass's order) in every query tile of the GQA group that it skips, so
// that the key blocks after it never wait for it there. Relaxed: no data is published with these
// bits.
template <int Bm>
__device__ __forceinline__ void bwd_mark_skipped(const BwdArgs& a, int b, int hk, int n, int slot,
                                                 int lane) {
  const uint32_t bit = 1u << (slot % 32);
  for (int g = 0; g < a.heads_per_kv; ++g) {
    const int h = hk * a.heads_per_kv + g;
    const int hm = h / a.heads_per_mask;
    const int32_t* mt = a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)a.nblk + n;
    const int lts_mx = __ldg(mt + 1 * a.nblk), lte_mn = __ldg(mt + 2 * a.nblk);
    const int uts_mx = __ldg(mt + 5 * a.nblk), ute_mn = __ldg(mt + 6 * a.nblk);
    uint32_t* sem = a.dq_sem + bwd_sem_word(a, b, h, 0) + slot / 32;
    for (int m = lane; m < a.mblk; m += 32) {
      const int ms = m * Bm, me = min(ms + Bm, a.Sq);
      const bool skip = (ms >= lts_mx && me <= lte_mn) || (ms >= uts_mx && me <= ute_mn);
      if (skip)
        asm volatile("red.relaxed.gpu.global.or.b32 [%0], %1;" ::"l"(sem + (int64_t)m * a.sem_words),
                     "r"(bit)
                     : "memory");
    }
  }
}

// Bits of the slots slot+1 .. nblk-1 within word w (lanes hold consecutive words).
__device__ __forceinline__ uint32_t bwd_sem_need(const BwdArgs& a, int slot, int w) {
  if (w >= a.sem_words) return 0u;
  const int lo = max(slot + 1 - 32 * w, 0);  // <= 31 for the words the poll visits
  const int hi = min(a.nblk - 32 * w, 32);   // >= 1
  const uint32_t below_hi = hi >= 32 ? ~0u : ((1u << hi) - 1u);
  return below_hi & ~((1u << lo) - 1u);
}

// Deterministic dQ writer (one warp), a tile's order: the first ordering-bit word this lane polls
// (read early, before the tile's dQ is in smem) ...
__device__ __forceinline__ uint32_t bwd_order_first(const BwdArgs& a, int64_t base, int slot,
                                                    int lane) {
  const int w = (slot + 1) / 32 + lane;
  return w < a.sem_words ? ld_acquire_gpu(a.dq_sem + base + w) : 0u;
}
// ... and the wait until every slot after `slot` has added its dQ (or skips the tile), then the
// proxy fence that orders the tile's bulk reduce after it. Acquire loads and no fence.acq_rel.gpu:
// that membar would also wait for this warp's last release (the previous tile's bit) to complete
// (docs/decisions.md#det-ordered-dq).
__device__ __forceinline__ void bwd_wait_order(const BwdArgs& a, int64_t base, int slot, int lane,
                                               uint32_t first) {
  const int w0 = (slot + 1) / 32;
  for (int wc = w0; wc < a.sem_words; wc += 32) {
    const int w = wc + lane;
    const uint32_t need = bwd_sem_need(a, slot, w);
    uint32_t v = wc == w0 ? first : (need ? ld_acquire_gpu(a.dq_sem + base + w) : 0u);
    while (!__all_sync(0xffffffffu, (v & need) == need)) {
      __nanosleep(64);
      if (need) v = ld_acquire_gpu(a.dq_sem + base + w);
    }
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Look-ahead zeroing of the fp32 dQ accumulator (BwdArgs::zero_count set; the pp kernel).
// The CTAs launch in units whose dQ rows are one contiguous range of dq_accum: a (kv head, batch)
// pair (heads_per_kv heads of sq_pad rows), or in deterministic mode a launch group of G pairs.
// At CTA start the idle producer warp 3 of each CTA of unit u zeroes its slice of unit u + 1's
// range and counts itself in zero_count[u + 1] (release); the dQ writer of a CTA of unit u >= 1
// waits before its first reduce until zero_count[u] counts every CTA of unit u - 1 (acquire).
// The prep kernel zeroes unit 0 only. Why: the zeroing pass before the kernel goes away, its
// stores made by warps that are otherwise idle. Not L2 reuse where a unit spans a wave or more
// (long sequences): there the zeros reach DRAM before their first reduce-add and are read back, as
// the prep kernel's are (docs/decisions.md#bwd-zero-ahead). Deadlock-free: a CTA waits only for
// CTAs launched before it.
struct BwdZeroUnit {
  int u;          // this CTA's unit
  int rank;       // its position in the unit's launch range
  int span;       // CTAs in unit u
  int prev_span;  // CTAs in unit u - 1
  int next_pair0, next_pairs;  // pairs of unit u + 1 (next_pairs = 0: none)
};

template <class T>
__device__ __forceinline__ BwdZeroUnit bwd_zero_unit(const BwdArgs& a) {
  BwdZeroUnit z;
  const int pairs = a.K * a.B;
  int G = 1;
  if constexpr (T::kDetGroups) {
    if (a.deterministic) {  // bwd_pp_item's launch groups
      G = a.det_group;
      if (G <= 0) G = __ldg(a.sched + 1);
      const int64_t full_span = (int64_t)a.nblk * G;
      const int64_t x = blockIdx.x;
      z.u = (int)(x / full_span);
      z.rank = (int)(x - z.u * full_span);
      z.span = a.nblk * min(G, pairs - z.u * G);
      z.prev_span = (int)full_span;
      z.next_pair0 = (z.u + 1) * G;
      z.next_pairs = max(0, min(G, pairs - z.next_pair0));
      return z;
    }
  }
  z.u = (int)blockIdx.y + a.K * (int)blockIdx.z;  // pair (kv head, batch); grid (nblk, K, B)
  z.rank = (int)blockIdx.x;
  z.span = a.nblk;
  z.prev_span = a.nblk;
  z.next_pair0 = z.u + 1;
  z.next_pairs = z.u + 1 < pairs ? 1 : 0;
  return z;
}

// Warp 3 at CTA start: zero this CTA's slice of unit u + 1's rows, then count it (every lane's
// stores are ordered before lane 0's release by the warp barrier).
template <int D>
__device__ __forceinline__ void bwd_zero_next_unit(const BwdArgs& a, const BwdZeroUnit& z, int lane) {
  if (z.next_pairs == 0) return;
  const int64_t pair4 = (int64_t)a.heads_per_kv * a.sq_pad * (D / 4);  // float4 per pair
  float4* base = reinterpret_cast<float4*>(a.dq_accum) + z.next_pair0 * pair4;
  const int64_t n4 = z.next_pairs * pair4;
  const int64_t per = (n4 + z.span - 1) / z.span;
  const int64_t lo = min(n4, z.rank * per), hi = min(n4, lo + per);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = lo + lane; i < hi; i += 32) base[i] = zero;
  __syncwarp();
  if (lane == 0)
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.zero_count + z.u + 1) : "memory");
}

// dQ writer warp, before its first reduce: unit u's rows are zero once every CTA of unit u - 1
// has counted itself; the proxy fence orders those (generic) zeros before the async-proxy reduce.
// Every lane polls: with lane 0 alone polling here (a __nanosleep loop; the other lanes parked at
// the reconvergence point) the kernel hung in about half of the calls, for a cause not
// understood (a standalone probe of that shape never hung); the warp-wide wait never hangs
// (docs/decisions.md#bwd-zero-ahead).
__device__ __forceinline__ void bwd_wait_zeroed(const BwdArgs& a, const BwdZeroUnit& z) {
  if (z.u > 0) {
    const uint32_t* c = reinterpret_cast<const uint32_t*>(a.zero_count + z.u);
    while (ld_acquire_gpu(c) < (uint32_t)z.prev_span) __nanosleep(128);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Thread: one cp.reduce.async.bulk add of a Bytes/4-float dQ tile from smem into the workspace.
template <int kFloats>
__device__ __forceinline__ void bwd_issue_dq_reduce(float* gtile, const float* stile) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gtile),
      "r"(cute::cast_smem_ptr_to_uint(stile)), "r"((int)(kFloats * sizeof(float)))
      : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Thread, once a dQ tile's reduce has completed: set the tile's ordering bit (the next key block's
// writer may then add). The proxy fence orders the async-proxy reduce before the release.
__device__ __forceinline__ void bwd_release_order_bit(uint32_t* sem_word, uint32_t bit) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.or.b32 [%0], %1;" ::"l"(sem_word), "r"(bit) : "memory");
}

// Thread, after a dQ tile's reduce was committed: wait until the reduce has read the shared buffer
// and free it (`empty`: the consumers refill it after waiting there); in deterministic mode wait
// until the reduce completed, then free the buffer, then set the tile's ordering bit in `sem_word`
// (the next key block's writer may then add). The buffer is freed before the bit's proxy fence and
// GPU-scope release, whose latency would otherwise sit between this tile's reduce and the
// consumers' store of the next dQ tile.
__device__ __forceinline__ void bwd_finish_dq_reduce(uint32_t* sem_word, uint32_t bit,
                                                     bool deterministic, uint64_t* empty) {
  if (deterministic) {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    pp_arrive(empty);
    bwd_release_order_bit(sem_word, bit);
  } else {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    pp_arrive(empty);
  }
}

// ---------------------------------------------------------------------------------------------
// The pp kernel's dK / dV epilogue. A warp's accumulator fragment (rows k0w + 0..15 of the key
// block, d columns; element pairs at (row_base, 8 * cc + col_base)) goes as Elem 8 x 8 blocks
// with stmatrix into a row-major (key, d) staging tile whose 16-byte chunks are XOR-swizzled by
// key % 8, so that the 8 rows of a block and the 16 chunks of a row hit distinct banks;
// bwd_rows_to_global then writes whole rows with 16-byte stores: storing the fragment pairs
// directly would be 4-byte stores, half a sector each, 4x the L2 requests for the same bytes at the
// end of every CTA. k0w = the warp's first row (64 * warpgroup + 16 * warp).
template <int D>
__device__ __forceinline__ uint32_t bwd_stage_offset(int row, int chunk) {
  static_assert(D / 8 >= 8, "the XOR swizzle needs 8 chunks per row");
  return row * (D * 2) + ((chunk ^ (row & 7)) * 16);
}
template <class Elem, int D, class Frag>
__device__ __forceinline__ void bwd_stage_rows(Elem* stage, Frag const& acc, float scale, int k0w,
                                               int lane) {
  static_assert(sizeof(Elem) == 2 && decltype(size(acc))::value == D / 2, "m64 x D fragment");
  const uint32_t base = cute::cast_smem_ptr_to_uint(stage);
  const int m = lane / 8;  // the block whose row lane % 8 this lane addresses: (row half, chunk)
  const int row = k0w + 8 * (m % 2) + lane % 8;
  auto pack = [&](int e) {
    cutlass::Array<Elem, 2> p;
    p[0] = static_cast<Elem>(acc(e) * scale);
    p[1] = static_cast<Elem>(acc(e + 1) * scale);
    return reinterpret_cast<uint32_t const&>(p);
  };
  CUTE_UNROLL
  for (int cc = 0; cc < D / 8; cc += 2) {  // fragment pair e = 4 * chunk + 2 * row half
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     base + bwd_stage_offset<D>(row, cc + m / 2)),
                 "r"(pack(4 * cc)), "r"(pack(4 * cc + 2)), "r"(pack(4 * cc + 4)), "r"(pack(4 * cc + 6))
                 : "memory");
  }
}
// A warpgroup's 64 staged rows from row r0 of the staging tile to global rows row0 + r * stride
// (in units of D elements; r < rows): 128 threads, 16 bytes each per step, a row per 16 / 8 lanes.
template <class Elem, int D>
__device__ __forceinline__ void bwd_rows_to_global(Elem* g, const Elem* stage, int64_t row0,
                                                   int stride, int rows, int r0, int t) {
  constexpr int kChunks = D / 8;
  const char* s = reinterpret_cast<const char*>(stage);
  CUTE_UNROLL
  for (int i = t; i < 64 * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    if (r < rows) {
      const uint4 v = *reinterpret_cast<const uint4*>(s + bwd_stage_offset<D>(r0 + r, c));
      *reinterpret_cast<uint4*>(g + (row0 + (int64_t)r * stride) * D + 8 * c) = v;
    }
  }
}

// The fp32 dQ rows of query tile m (Bm rows; head h, batch b) in the dq_accum workspace.
template <int Bm, int D>
__device__ __forceinline__ float* bwd_dq_tile(const BwdArgs& a, int b, int h, int m) {
  return a.dq_accum + (((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm) * D;
}

// The dQ-writer warp's part of one tile (query head h, tile m) of a key block: wait for the
// consumers' dQ tile in smem buffer `buf` (dq_full, parity `phase`), in deterministic mode for the
// ordering bits of the slots above `slot`, then lane 0 issues the bulk reduce-add and publishes
// `slot`'s bit / frees the buffer (bwd_finish_dq_reduce).
template <int Bm, int D, class Storage>
__device__ __forceinline__ void bwd_write_dq_tile(const BwdArgs& a, Storage& ss, int b, int h,
                                                  int m, int slot, int lane, int buf, int phase) {
  const int64_t base = bwd_sem_word(a, b, h, m);
  const uint32_t first = a.deterministic ? bwd_order_first(a, base, slot, lane) : 0u;
  float* gtile = bwd_dq_tile<Bm, D>(a, b, h, m);
  cutlass::arch::ClusterTransactionBarrier::wait(&ss.dq_full[buf], phase);
  if (a.deterministic) bwd_wait_order(a, base, slot, lane, first);
  if (lane == 0) {
    bwd_issue_dq_reduce<Bm * D>(gtile, &ss.dq[buf][0]);
    bwd_finish_dq_reduce(a.dq_sem + base + slot / 32, 1u << (slot % 32), a.deterministic,
                         &ss.dq_empty[buf]);
  }
  __syncwarp();
}

}  // namespace jfm::sm90
