// Forward main loop, the parts flashmask_fwd_kernel composes: the producer warp's loads
// (fwd_tma_views, fwd_load_q, fwd_load_kv: Q of a query tile, K / V of each kept key block with a
// partial block's bounds or its job for the mask builders) and the mask builders' loop
// (fwd_build_mask_bits, fwd_stop_mask_builders).
// Contract: producer, builders and consumers see the same kept-block sequence (KeptBlocks walks it
//   in every warp, mask_walk.cuh) and step their pipeline states once per kept block.
// Synchronization: K / V PipelineTmaAsync (a partial block's staged bounds ride on K's barrier;
//   with mask bits the builders release K stages too), job_full / bits_full (mask bits), q_full.
// Knobs: the traits (kMaskBits, kWordsOverBounds, kGroupScan, kPaired) and KArgs::smem_bounds.
#pragma once

#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

template <class T>
using FwdKeptBlocks = KeptBlocks<T::Bn, T::kGroupScan, T::kPaired>;

// The block metadata of mask head hm, batch b (KeptBlocks' first argument) and its bounds rows.
__device__ __forceinline__ const int32_t* fwd_block_meta(const KArgs& a, int b, int hm) {
  return a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)a.nblk;
}
__device__ __forceinline__ const int32_t* fwd_bounds(const KArgs& a, int b, int hm) {
  return a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
}

// ---------------------------------------------------------------------------------------------
// Producer warp 0, lane 0: the loads of one query tile. fwd_load_q: the tile's Q into its slot
// of the Q ring (q_full). fwd_load_kv: K and V of kept key block n into the ring's stage wr; a
// partial block's four bound vectors are bulk-copied beside its K stage (smem_bounds), or with
// kMaskBits the block is posted as the stage's job for the mask builders ({n, partial, b * Hm +
// hm, first query row}). The TMA views come from fwd_tma_views.
template <class T, class TmaQ, class TmaK, class TmaV, class MQ, class MK, class MV, class SQ,
          class SK, class SV>
__device__ __forceinline__ auto fwd_tma_views(TmaQ const& tma_q, TmaK const& tma_k,
                                              TmaV const& tma_v, MQ& mQ, MK& mK, MV& mV, SQ& sQ,
                                              SK& sK, SV& sV, int m_blk, int h, int hk, int b) {
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm;
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(m_blk, 0));
  Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(_, 0));
  Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(_, 0));
  auto [tQgQ, tQsQ] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
  auto [tKgK, tKsK] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
  auto [tVgV, tVsV] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));
  return cute::make_tuple(tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV);
}
template <class T, class TmaQ, class TQg, class TQs>
__device__ __forceinline__ void fwd_load_q(typename T::SharedStorage& ss, TmaQ const& tma_q,
                                           TQg const& tQgQ, TQs& tQsQ, int slot) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  Barrier::arrive_and_expect_tx(&ss.q_full[slot], T::Bm * T::D * sizeof(typename T::Elem));
  copy(tma_q.with(ss.q_full[slot]), tQgQ, tQsQ(_, slot));
}
template <class T, class TmaK, class TmaV, class TKg, class TKs, class TVg, class TVs,
          class Pipeline, class State>
__device__ __forceinline__ void fwd_load_kv(const KArgs& a, typename T::SharedStorage& ss,
                                            TmaK const& tma_k, TmaV const& tma_v, TKg const& tKgK,
                                            TKs& tKsK, TVg const& tVgV, TVs& tVsV,
                                            Pipeline& pipe_k, Pipeline& pipe_v, State const& wr,
                                            int n, bool partial, const int32_t* bnd, int bhm,
                                            int ms) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  constexpr int Bn = T::Bn;
  pipe_k.producer_acquire(wr);
  if constexpr (T::kMaskBits) bits_full_drain(ss, wr);
  auto* bar = pipe_k.producer_get_barrier(wr);
  if (a.smem_bounds && partial) {
    // the four bound vectors of a partial block ride on K's barrier (expect first, so the phase
    // cannot complete before every copy is counted)
    const uint32_t bytes = 4u * (uint32_t)min(Bn, a.Sk - n * Bn);
    Barrier::expect_transaction(bar, 4 * bytes);
    CUTE_UNROLL
    for (int vv = 0; vv < 4; ++vv)
      bulk_g2s(&ss.bnd[wr.index()][vv][0], bnd + (int64_t)vv * a.Sk + n * Bn, bytes, bar);
  }
  copy(tma_k.with(*bar), tKgK(_, n), tKsK(_, wr.index()));
  if constexpr (T::kMaskBits) {  // the block's job for the mask builders
    ss.job[wr.index()] = make_int4(n, partial ? 1 : 0, bhm, ms);
    asm volatile("" ::: "memory");  // (the CUTLASS barrier asm has no memory clobber)
    EmptyBarrier::arrive(&ss.job_full[wr.index()]);
  }
  pipe_v.producer_acquire(wr);
  copy(tma_v.with(*pipe_v.producer_get_barrier(wr)), tVgV(_, n), tVsV(_, wr.index()));
}

// kMaskBits, producer lane 0 after the last tile: the builders' stop job (in the next stage, once
// they and the consumers are done with its previous one).
template <class T, class State>
__device__ __forceinline__ void fwd_stop_mask_builders(typename T::SharedStorage& ss,
                                                       State const& wr) {
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  EmptyBarrier::wait(reinterpret_cast<uint64_t*>(&ss.pipe_k.empty_barrier_[wr.index()]),
                     wr.phase());
  bits_full_drain(ss, wr);
  ss.job[wr.index()] = make_int4(-1, 0, 0, 0);
  asm volatile("" ::: "memory");
  EmptyBarrier::arrive(&ss.job_full[wr.index()]);
}

// kMaskBits, producer warps 1-2 (thread bt of kBuilders): the mask builders. Per posted job, the
// bit words of a partial block (see FwdTraitsMaskBits), then bits_full and K's empty barrier of
// the stage, for every job (so the phases follow the K pipeline's), until the stop job.
template <class T>
__device__ __forceinline__ void fwd_build_mask_bits(const KArgs& a, typename T::SharedStorage& ss,
                                                    int bt) {
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  constexpr int Bn = T::Bn, Bm = T::Bm;
  cutlass::PipelineState<T::Stages> js;
  for (;;) {
    const int s = js.index();
    EmptyBarrier::wait(&ss.job_full[s], js.phase());
    asm volatile("" ::: "memory");  // no smem read above the wait
    const int4 job = ss.job[s];
    if (job.x < 0) break;
    if (job.y != 0) {
      const int32_t* bnd = a.bounds + (int64_t)job.z * 4 * (int64_t)a.Sk;
      CUTE_UNROLL
      for (int c = bt; c < Bn; c += T::kBuilders) {
        const int col = job.x * Bn + c;
        // the consumers' test: (unsigned)(r - LTS) < max(LTE - LTS, 0) or the same with UTS,
        // UTE; a column >= Sk masks every row (the interval [0, 2^31 - 1))
        int lts = 0, uts = 0;
        uint32_t ll = 0x7fffffffu, ul = 0u;
        if (col < a.Sk) {
          lts = __ldg(bnd + col);
          const int lte = __ldg(bnd + a.Sk + col);
          uts = __ldg(bnd + 2 * (int64_t)a.Sk + col);
          const int ute = __ldg(bnd + 3 * (int64_t)a.Sk + col);
          ll = (uint32_t)max((int)((uint32_t)lte - (uint32_t)lts), 0);
          ul = (uint32_t)max((int)((uint32_t)ute - (uint32_t)uts), 0);
        }
        CUTE_UNROLL
        for (int q = 0; q < Bm / 32; ++q) {
          const int rb = job.w + 32 * q;
          const uint32_t w = fwd_row_bits(lts, ll, rb) | fwd_row_bits(uts, ul, rb);
          if constexpr (T::kWordsOverBounds) {
            fwd_words_over_bounds<T>(ss, s)[q][c] = w;
          } else {
            ss.bits[s][q][c] = w;
          }
        }
      }
    }
    asm volatile("" ::: "memory");  // the words are stored before the arrivals
    EmptyBarrier::arrive(&ss.bits_full[s]);
    EmptyBarrier::arrive(reinterpret_cast<uint64_t*>(&ss.pipe_k.empty_barrier_[s]));
    ++js;
  }
}

}  // namespace jfm::sm90
