// Building blocks of the backward main loops: the producer lane's K / V and row-statistics loads,
// the consumers' GEMM turns (ping-pong), P^T (exp) and P / dS from S and dP, the dV / dK GEMMs of
// a ping-pong tile, the dQ tile's hand-off to the writer warp, and the dS tile's stores to shared
// memory (stmatrix.trans). The loops themselves
// (walk, GEMM issue order) are the kernel bodies in bwd_kernel.cuh / bwd_d256_kernel.cuh.
// Contract: the SmemLayoutdS of traits.h (K-major, 128B swizzle), bit for bit as a CuTe store.
// Synchronization: the caller fences the generic-proxy stores of store_ds_tile before the GEMMs
//   read them; bwd_dkv_pingpong and bwd_put_dq arrive on the barriers named at each.
// Knobs: none.
#pragma once

#include "kernel_args.h"
#include "primitives.cuh"
#include "softmax.cuh"
#include "traits.h"
#include "unseen.cuh"

namespace jfm::sm90 {

using namespace cute;

// A consumer warp's dS^T fragment into the dS tile (queries x keys, K-major, 128B swizzle) with
// stmatrix.trans: Bm / 16 STSM.x4 per thread (5 at 80 rows, 8 at 128) instead of one 16-bit store
// per element; the store sits between the dP wait and the dS barrier, on every tile's critical
// path. The fragment's 8 x 8 blocks (keys x queries; register pair 2 * kk + i = keys 8i..,
// queries 8kk..) are the blocks stmatrix takes, and .trans stores each one as 8 query rows of 8
// contiguous keys (16 bytes: one swizzle chunk, never split by the 128B swizzle). Lane l gives
// the address of stored row l % 8 (a query) of block l / 8 = (key half (l / 8) % 2, query group
// 2p + l / 16). Query groups of 8 are one 8 x 64 swizzle atom (kRows8 bytes) apart: the atoms of
// SmemLayoutdS stack along the query mode first. k0w = the warp's first key row (64 * warpgroup
// + 16 * warp).
template <class Elem, class SdS, class Frag>
__device__ __forceinline__ void store_ds_tile(SdS& sdS, Frag const& tPrdS, int k0w, int lane,
                                              int st) {
  constexpr uint32_t kRows8 = 8 * 64 * sizeof(Elem);
  constexpr int kGroups = decltype(size(tPrdS))::value / 4;  // query groups of 8 (10 at Bm = 80)
  static_assert(kGroups % 2 == 0, "two query groups per stmatrix.x4");
  const uint32_t base =
      cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sdS(lane % 8, k0w + 8 * ((lane / 8) % 2), st))) +
      (lane / 16) * kRows8;
  Tensor r = recast<uint32_t>(tPrdS);  // register pair 2 * kk + i: queries 2c, 2c + 1 (low, high)
  CUTE_UNROLL
  for (int p = 0; p < kGroups / 2; ++p) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     base + 2 * p * kRows8),
                 "r"(r(4 * p)), "r"(r(4 * p + 1)), "r"(r(4 * p + 2)), "r"(r(4 * p + 3))
                 : "memory");
  }
}

// The producer lane's loads, each onto the barrier `bar` whose expected bytes it sets: a work
// item's K and V tiles (key block n of kv head hk, batch b), and a Q / dO tile (tile m of query
// head h) with its row statistics (lse2, D; rows padded to sq_pad: always in bounds, 256-byte
// aligned) into the stage's smem `rs` ([2][Bm]: lse2, then D). `bar` is the consumers' barrier
// (kv_full, full[stage]), or `aux` for a tile the zero warp takes first.
template <class Elem, int Bn, int D, class TmaK, class MK, class SK>
__device__ __forceinline__ void bwd_load_kv(TmaK const& tma_k, TmaK const& tma_v, MK const& mK,
                                            MK const& mV, SK& sK, SK& sV, uint64_t* bar, int hk,
                                            int b, int n) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
  Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
  auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                  group_modes<0, 2>(gK));
  auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                  group_modes<0, 2>(gV));
  Barrier::arrive_and_expect_tx(bar, 2 * Bn * D * sizeof(Elem));
  copy(tma_k.with(*bar), tKg, tKs);
  copy(tma_v.with(*bar), tVg, tVs);
}
// TMA views of query head h's Q and dO (batch b): the global tiles (mode 1: tile index) and the
// ring's stages, as (tQg, tQs, tdOg, tdOs) for the producer lane's copies.
template <int Bm, int D, class TmaQ, class MQ, class SQ>
__device__ __forceinline__ auto bwd_q_do_views(TmaQ const& tma_q, TmaQ const& tma_do,
                                               MQ const& mQ, MQ const& mdO, SQ& sQ, SQ& sdO,
                                               int h, int b) {
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
  Tensor gdO = local_tile(mdO(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
  auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                  group_modes<0, 2>(gQ));
  auto [tdOg, tdOs] = tma_partition(tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                    group_modes<0, 2>(gdO));
  return cute::make_tuple(tQg, tQs, tdOg, tdOs);
}
template <class Elem, int Bm, int D, class TmaQ, class TQg, class TQs>
__device__ __forceinline__ void bwd_load_q_do(BwdArgs const& a, TmaQ const& tma_q,
                                              TmaQ const& tma_do, TQg const& tQg, TQs& tQs,
                                              TQg const& tdOg, TQs& tdOs, float* rs,
                                              uint64_t* bar, int b, int h, int m, int stage) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  Barrier::arrive_and_expect_tx(bar, 2 * Bm * D * sizeof(Elem) + 2 * Bm * sizeof(float));
  copy(tma_q.with(*bar), tQg(_, m), tQs(_, stage));
  copy(tma_do.with(*bar), tdOg(_, m), tdOs(_, stage));
  const int64_t roff = ((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm;
  SM90_BULK_COPY_G2S::copy(a.lse2 + roff, bar, rs, Bm * (int)sizeof(float));
  SM90_BULK_COPY_G2S::copy(a.delta + roff, bar, rs + Bm, Bm * (int)sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// Masked positions (unseen.cuh). The TMA lane stages a flagged tile onto the hand-off's `aux`
// barrier, posts a request (BwdZeroHandoff, traits.h) and goes on with the next tile: the tile's
// landing and its zeroing (32 lanes, a row each) are off the TMA lane's path. The zero warp fences
// its stores for the async proxy and completes the consumers' full barrier with its one arrival.
enum BwdZeroKind : int { kZeroStop = 0, kZeroKV = 1, kZeroQdO = 2 };
__device__ __forceinline__ void bwd_zero_claim(BwdZeroHandoff& z) {
  volatile uint32_t* u = &z.uses;
  const uint32_t k = *u;
  *u = k + 1u;
  if (k > 0u) pp_wait(&z.done, (int)((k - 1u) & 1u));  // the previous request done
}
__device__ __forceinline__ void bwd_zero_post(BwdZeroHandoff& z, int kind, int y, int hk, int b) {
  volatile int* j = z.job;
  j[0] = kind;
  j[1] = y;
  j[2] = hk;
  j[3] = b;
  pp_arrive(&z.req);  // release: the job is visible to the zero warp's wait
}
// The TMA lane, after its last tile: the zero warp's loop ends.
__device__ __forceinline__ void bwd_zero_stop(BwdZeroHandoff& z) {
  bwd_zero_claim(z);
  bwd_zero_post(z, kZeroStop, 0, 0, 0);
}
// K and V of key block n where bwd_unseen_any said the kv group may leave columns unseen: they
// land on `aux`, and the zero warp clears the columns every mask head of the group leaves unseen.
template <class Elem, int Bn, int D, class TmaK, class MK, class SK>
__device__ __forceinline__ void bwd_load_kv_zeroed(TmaK const& tma_k, TmaK const& tma_v,
                                                   MK const& mK, MK const& mV, SK& sK, SK& sV,
                                                   BwdZeroHandoff& z, int hk, int b, int n) {
  bwd_zero_claim(z);
  bwd_load_kv<Elem, Bn, D>(tma_k, tma_v, mK, mV, sK, sV, &z.aux, hk, b, n);
  bwd_zero_post(z, kZeroKV, n, hk, b);
}
// A Q / dO tile with fully masked rows (tile flag set): Q, dO and the row statistics land on
// `aux`; the zero warp clears the rows whose lse2 is +inf.
template <class Elem, int Bm, int D, class TmaQ, class TQg, class TQs>
__device__ __forceinline__ void bwd_load_q_do_zeroed(BwdArgs const& a, TmaQ const& tma_q,
                                                     TmaQ const& tma_do, TQg const& tQg, TQs& tQs,
                                                     TQg const& tdOg, TQs& tdOs, float* rs,
                                                     BwdZeroHandoff& z, int b, int h, int m,
                                                     int stage) {
  bwd_zero_claim(z);
  bwd_load_q_do<Elem, Bm, D>(a, tma_q, tma_do, tQg, tQs, tdOg, tdOs, rs, &z.aux, b, h, m, stage);
  bwd_zero_post(z, kZeroQdO, stage, 0, 0);
}
// The zero warp's two jobs. Lane t of nt takes rows t, t + nt, ... of the tile (across 8
// consecutive rows a chunk index sits in 8 distinct bank groups under the 128B swizzle, so a
// warp's 16-byte stores take the minimum number of wavefronts).
// K and V rows of key block n that every mask head of kv group hk leaves unseen (batch b).
template <int Bn, int D, class SK>
__device__ __forceinline__ void bwd_zero_unseen_kv(BwdArgs const& a, SK& sK, SK& sV, int hk, int b,
                                                   int n, int t, int nt) {
  const int hm0 = hk * a.heads_per_kv / a.heads_per_mask;
  const int hm1 = (hk * a.heads_per_kv + a.heads_per_kv - 1) / a.heads_per_mask;
  const uint32_t* w0 = a.unseen + ((int64_t)b * a.Hm + hm0) * 8 * a.nblk + 4 * n;
  const uint32_t k0 = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sK(0, 0)));
  const uint32_t v0 = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sV(0, 0)));
#pragma unroll 1
  for (int r = t; r < Bn; r += nt) {
    bool z = true;
#pragma unroll 1
    for (int hm = hm0; hm <= hm1 && z; ++hm)
      z = (__ldg(w0 + (int64_t)(hm - hm0) * 8 * a.nblk + (r >> 5)) >> (r & 31)) & 1u;
    if (z) {
#pragma unroll 4
      for (int c = 0; c < D / 8; ++c) {
        const uint32_t o = sw128_chunk<Bn>(r, c);
        st_shared_zero16(k0 + o);
        st_shared_zero16(v0 + o);
      }
    }
  }
}
// Q and dO rows of stage `stage` whose lse2 (smem, landed with the tile) is +inf.
template <int Bm, int D, class SQ>
__device__ __forceinline__ void bwd_zero_empty_rows(const float* lse2, SQ& sQ, SQ& sdO, int stage,
                                                    int t, int nt) {
  const uint32_t q0 = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sQ(0, 0, stage)));
  const uint32_t d0 = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sdO(0, 0, stage)));
#pragma unroll 1
  for (int r = t; r < Bm; r += nt) {
    if (lse2[r] == INFINITY) {
#pragma unroll 4
      for (int c = 0; c < D / 8; ++c) {
        const uint32_t o = sw128_chunk<Bm>(r, c);
        st_shared_zero16(q0 + o);
        st_shared_zero16(d0 + o);
      }
    }
  }
}
// The zero warp: serves the TMA lane's requests until kZeroStop. rs0: the row statistics
// [stage][2][Bm] (lse2 first). Lane 0 alone reads the job; every lane arrives on `fin` (32
// arrivals) after its stores and fence, and lane 0 completes the full barrier once fin's phase
// is done: each store precedes an arrival of its own thread, the order compute-sanitizer's
// racecheck follows (a __syncwarp before one lane's arrival is as correct, but racecheck reports
// the d = 256 consumers' dQ stores over the stage as racing with the other lanes' zeros).
template <int Bm, int Bn, int D, class SQ, class SK, class Storage>
__device__ __forceinline__ void bwd_zero_warp(BwdArgs const& a, Storage& ss, SQ& sQ, SQ& sdO,
                                              SK& sK, SK& sV, const float* rs0, int lane) {
  static_assert(sizeof(typename SQ::value_type) == 2, "sw128_chunk: 16-bit elements");
#pragma unroll 1
  for (uint32_t k = 0;; ++k) {
    pp_wait(&ss.z.req, (int)(k & 1u));
    int4 j = make_int4(0, 0, 0, 0);
    if (lane == 0) {
      volatile int* p = ss.z.job;
      j = make_int4(p[0], p[1], p[2], p[3]);
    }
    const int kind = __shfl_sync(0xffffffffu, j.x, 0);
    const int y = __shfl_sync(0xffffffffu, j.y, 0);  // the stage, or the key block
    const int hk = __shfl_sync(0xffffffffu, j.z, 0);
    const int b = __shfl_sync(0xffffffffu, j.w, 0);
    if (kind == kZeroStop) return;
    pp_wait(&ss.z.aux, (int)(k & 1u));
    if (kind == kZeroKV) bwd_zero_unseen_kv<Bn, D>(a, sK, sV, hk, b, y, lane, 32);
    else bwd_zero_empty_rows<Bm, D>(rs0 + y * 2 * Bm, sQ, sdO, y, lane, 32);
    fence_generic_to_async_shared();
    pp_arrive(&ss.z.fin);  // each lane's stores, then its own arrival (see above)
    if (lane == 0) {
      pp_wait(&ss.z.fin, (int)(k & 1u));
      pp_arrive(kind == kZeroKV ? &ss.kv_full : &ss.full[y]);
      pp_arrive(&ss.z.done);
    }
  }
}

// Turn of consumer warpgroup wg to issue GEMMs (named barrier 1: warpgroup 0's turn, 2: warpgroup
// 1's). Warpgroup 1 pre-arrives once so that warpgroup 0 goes first; warpgroup 0's last arrive
// (last) is the one that balances it.
__device__ __forceinline__ void bwd_turn_begin(int wg) {
  if (wg == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else asm volatile("bar.sync 2, 256;\n" ::: "memory");
}
__device__ __forceinline__ void bwd_turn_end(int wg, bool last) {
  if (wg == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  else if (!last) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
}

// The element test's bounds of a consumer thread's two key columns key0, key1 (mask head of query
// head h, batch b): LTS / LTE / UTS / UTE of each, and koob = the column is past Sk (its bounds
// stay 0). Loaded on partial tiles only, for the kernels without the mask in registers.
__device__ __forceinline__ void bwd_column_bounds(const BwdArgs& a, int b, int h, int key0, int key1,
                                                  int (&lts)[2], int (&lte)[2], int (&uts)[2],
                                                  int (&ute)[2], bool (&koob)[2]) {
  const int hm = h / a.heads_per_mask;
  const int32_t* bnd = a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
  CUTE_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int j = i == 0 ? key0 : key1;
    koob[i] = j >= a.Sk;
    if (!koob[i]) {
      lts[i] = __ldg(bnd + j);
      lte[i] = __ldg(bnd + a.Sk + j);
      uts[i] = __ldg(bnd + 2 * (int64_t)a.Sk + j);
      ute[i] = __ldg(bnd + 3 * (int64_t)a.Sk + j);
    }
  }
}

// P^T = exp2(S^T * scale * log2(e) - lse2) in place, zero where masked: kMasked tests the key
// column's mask bits (cmask, bit 2 kk + j per query), kElemTest the column bounds on a partial tile
// (lts / lte / uts / ute of the thread's two key columns, koob: column >= Sk); neither: no mask
// arithmetic. l2s = the tile's lse2 row statistics in smem, ms = the tile's first query, col_b =
// the thread's first query column, sl2 = scale * log2(e). kSoftCap: the score is first
// tanh(S^T * prescale) and sl2 = cap * log2(e) (traits.h BwdSoftCap).
template <int Bm, bool kMasked, bool kElemTest, class FragC, bool kSoftCap = false>
__device__ __forceinline__ void bwd_exp_tile(FragC& tSrS, const float* l2s, int col_b, float sl2,
                                             int ms, bool partial, const uint32_t (&cmask)[2],
                                             const int (&lts)[2], const int (&lte)[2],
                                             const int (&uts)[2], const int (&ute)[2],
                                             const bool (&koob)[2], float prescale = 0.f) {
  CUTE_UNROLL
  for (int kk = 0; kk < Bm / 8; ++kk) {
    const float2 l2 = *reinterpret_cast<const float2*>(l2s + 8 * kk + col_b);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int e = 4 * kk + 2 * i + j;
        float s = tSrS(e);
        if constexpr (kSoftCap) s = fast_tanh(s * prescale);
        float p = fast_exp2(fmaf(s, sl2, -(j == 0 ? l2.x : l2.y)));
        if constexpr (kMasked) {
          if (cmask[i] & (1u << (2 * kk + j))) p = 0.f;
        } else if constexpr (kElemTest) {
          if (partial) {
            const int q = ms + 8 * kk + col_b + j;
            const bool masked =
                koob[i] || (lts[i] <= q && q < lte[i]) || (uts[i] <= q && q < ute[i]);
            if (masked) p = 0.f;
          }
        }
        tSrS(e) = p;
      }
    }
  }
}

// P^T and dS^T = P^T (dP^T - D) in the GEMM operand type, from P^T (already exp'ed and masked, in
// tSrS) and dP^T; dls = the tile's D row statistics in smem, col_b = the thread's first query.
// kSoftCap: dS^T also times 1 - tanh^2 (softcap_dtanh, from P and l2s = the tile's lse2).
template <class Elem, int Bm, class FragC, class FragA, bool kSoftCap = false>
__device__ __forceinline__ void bwd_p_ds(FragC const& tSrS, FragC const& tSrdP, const float* dls,
                                         int col_b, FragA& tPrP, FragA& tPrdS,
                                         const float* l2s = nullptr, float inv_sl2 = 0.f) {
  CUTE_UNROLL
  for (int kk = 0; kk < Bm / 8; ++kk) {
    const float2 dd = *reinterpret_cast<const float2*>(dls + 8 * kk + col_b);
    float2 l2 = make_float2(0.f, 0.f);
    if constexpr (kSoftCap) l2 = *reinterpret_cast<const float2*>(l2s + 8 * kk + col_b);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int e = 4 * kk + 2 * i + j;
        const float p = tSrS(e);
        float ds = p * (tSrdP(e) - (j == 0 ? dd.x : dd.y));
        if constexpr (kSoftCap) ds *= softcap_dtanh(p, j == 0 ? l2.x : l2.y, inv_sl2);
        tPrP(e) = static_cast<Elem>(p);
        tPrdS(e) = static_cast<Elem>(ds);
      }
    }
  }
}

// Ping-pong consumers, tile in stage / dS buffer st (parity par): dV += P^T dO, dS^T to smem for
// the dQ GEMMs (after the dQ GEMMs of two tiles back released the buffer: ds_empty; then
// ds_full), dK += dS^T Q, all retired, then the Q / dO stage released (empty). k0w / lane as in
// store_ds_tile.
template <class Elem, class Storage, class MmaKV, class FragA, class TdO, class TQ, class FragKV,
          class SdS>
__device__ __forceinline__ void bwd_dkv_pingpong(Storage& ss, MmaKV& mma_dkv, FragA& tPrP,
                                                 FragA& tPrdS, TdO const& tdVrdO, TQ const& tdKrQ,
                                                 FragKV& tdVrdV, FragKV& tdKrdK, SdS& sdS, int k0w,
                                                 int lane, int st, int par) {
  wgmma_gemm<false, -1, true>(mma_dkv, tPrP, tdVrdO(_, _, _, st), tdVrdV);
  // dS buffer st was last read by the dQ GEMMs of tile t-2 (both warpgroups, in section t)
  pp_wait(&ss.x.ds_empty[st], par ^ 1);
  store_ds_tile<Elem>(sdS, tPrdS, k0w, lane, st);
  pp_fence_async_smem();
  pp_arrive(&ss.x.ds_full[st]);
  wgmma_gemm<false, -1, true>(mma_dkv, tPrdS, tdKrQ(_, _, _, st), tdKrdK);
  warpgroup_wait<0>();
  warpgroup_fence_operand(tdVrdV);
  warpgroup_fence_operand(tdKrdK);
  warpgroup_fence_operand(tPrP);
  warpgroup_fence_operand(tPrdS);
  pp_arrive(&ss.empty[st]);  // this thread's reads of the Q / dO stage of the tile are done
}

// dQ tile of the dS in buffer `buf` (parity `par` of that buffer's use) -> the writer warp's smem
// buffer `buf` (after dq_empty, then dq_full). dq_store: this thread holds part of the tile
// (kDqWG).
template <class T, class Storage, class FragQ>
__device__ __forceinline__ void bwd_put_dq(BwdArgs const& a, Storage& ss, FragQ const& tdQrdQ,
                                           int ctid, bool dq_store, int buf, int par) {
  int ctid_b;
  asm volatile("mov.b32 %0, %1;" : "=r"(ctid_b) : "r"(ctid));
  const int fb = (T::kDqWG == T::NWG ? ctid_b / 128 : 0) * 64 * T::kDqCols +
                 ((ctid_b / 32) % 4) * 2 * T::kDqKK * 64 + 2 * (ctid_b % 32);
  pp_wait(&ss.dq_empty[buf], par ^ 1);  // the reduce from this buffer has read it
  if (dq_store) {
    CUTE_UNROLL
    for (int e = 0; e < size(tdQrdQ); e += 2) {
      const int o = fb + (((e / 2) % 2) * T::kDqKK + e / 4) * 64;
      *reinterpret_cast<float2*>(&ss.dq[buf][o]) = make_float2(tdQrdQ(e), tdQrdQ(e + 1));
    }
  }
  pp_fence_async_smem();
  pp_arrive(&ss.dq_full[buf]);
}

}  // namespace jfm::sm90
