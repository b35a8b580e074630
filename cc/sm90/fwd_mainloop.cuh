// Forward main loop, the parts flashmask_fwd_kernel composes: the producer warp's loads
// (fwd_tma_views, fwd_load_q, fwd_load_k / fwd_load_v / fwd_load_v_zeroed: Q of a query tile,
// K / V of each kept key block with a partial block's bounds or its job for the mask builders),
// the mask builders' loop (fwd_build_mask_bits, fwd_stop_mask_builders), and the consumers'
// per-block steps (FwdMainloop: the mask builders' words awaited, finish_scores, P for the PV
// GEMM).
// Contract: producer, builders and consumers see the same kept-block sequence (KeptBlocks walks it
//   in every warp, mask_walk.cuh) and step their pipeline states once per kept block; the scores
//   of every kept block pass once through FwdMainloop::finish_scores before the softmax.
// Synchronization: K / V PipelineTmaAsync (a partial block's staged bounds ride on K's barrier,
//   so K is released only after the mask; with mask bits the builders release K stages too),
//   job_full / bits_full (mask bits), q_full.
// Knobs: the traits (kMaskBits, kWordsOverBounds, kGroupScan, kPaired, kSoftCap) and
//   KArgs::smem_bounds.
#pragma once

#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"
#include "unseen.cuh"

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
// of the Q ring (q_full). fwd_load_k: K of kept key block n into the ring's stage wr; a partial
// block's four bound vectors are bulk-copied beside its K stage (smem_bounds), or with kMaskBits
// the block is posted as the stage's job for the mask builders ({n, partial, b * Hm + hm, first
// query row}). fwd_load_v: V of the block into stage wr, unless it holds unseen columns
// (fwd_load_v_zeroed). The TMA views come from fwd_tma_views.
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
template <class T, class TmaK, class TKg, class TKs, class Pipeline, class State>
__device__ __forceinline__ void fwd_load_k(const KArgs& a, typename T::SharedStorage& ss,
                                           TmaK const& tma_k, TKg const& tKgK, TKs& tKsK,
                                           Pipeline& pipe_k, State const& wr, int n, bool partial,
                                           const int32_t* bnd, int bhm, int ms) {
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
}
template <class TmaV, class TVg, class TVs, class Pipeline, class State>
__device__ __forceinline__ void fwd_load_v(TmaV const& tma_v, TVg const& tVgV, TVs& tVsV,
                                           Pipeline& pipe_v, State const& wr, int n) {
  pipe_v.producer_acquire(wr);
  copy(tma_v.with(*pipe_v.producer_get_barrier(wr)), tVgV(_, n), tVsV(_, wr.index()));
}

// Producer warp 0 (all lanes), a key block with unseen columns (unseen.cuh), instead of
// fwd_load_v: V of stage wr lands on `aux`, the warp zeroes the rows of the unseen columns
// (`words`, the block's 4 in global memory: bit c = column n * Bn + c; read there, not held in
// registers: held, they spilled the walk's state) and lane 0 completes the V stage's full phase
// with its one arrival (no transaction bytes). The parity of `aux` lives in shared memory
// (ss.aux_uses), not in a register of the producer's loop (at 56 registers one more spilled
// into every block's path).
template <class T, class TmaV, class TVg, class TVs, class SV, class State>
__device__ __forceinline__ void fwd_load_v_zeroed(typename T::SharedStorage& ss, TmaV const& tma_v,
                                                  TVg const& tVgV, TVs& tVsV, SV& sV,
                                                  State const& wr, int n, const uint32_t* words,
                                                  int lane) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  const uint32_t uses = *reinterpret_cast<volatile uint32_t*>(&ss.aux_uses);
  const uint32_t aux_phase = uses & 1u;
  __syncwarp();
  if (lane == 0) {
    *reinterpret_cast<volatile uint32_t*>(&ss.aux_uses) = uses + 1u;
    EmptyBarrier::wait(reinterpret_cast<uint64_t*>(&ss.pipe_v.empty_barrier_[wr.index()]),
                       wr.phase());
    Barrier::arrive_and_expect_tx(&ss.aux, T::Bn * T::D * sizeof(typename T::Elem));
    copy(tma_v.with(ss.aux), tVgV(_, n), tVsV(_, wr.index()));
  }
  __syncwarp();
  Barrier::wait(&ss.aux, aux_phase);
  zero_tile_rows<T::Bn, T::D>(sV(_, _, wr.index()), words, lane, 32);
  fence_generic_to_async_shared();
  __syncwarp();
  if (lane == 0)
    EmptyBarrier::arrive(reinterpret_cast<uint64_t*>(&ss.pipe_v.full_barrier_[wr.index()]));
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

// ---------------------------------------------------------------------------------------------
// Consumer warpgroup cwg (64 query rows of the tile): the per-block steps of the walk in
// flashmask_fwd_kernel, on a view of the consumer state the kernel body owns (the S / P fragments,
// per-thread constants). The members are references, as the body's own closures were: ptxas then
// gets the code of the single-function kernel (state owned here changed its register allocation).
template <class T, class SQ, class SK, class SVt>
struct FwdMainloop {
  using Elem = typename T::Elem;
  using Storage = typename T::SharedStorage;
  using Pipeline = typename T::Pipeline;
  using State = cutlass::PipelineState<T::Stages>;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  static constexpr int Bn = T::Bn, Bm = T::Bm;
  using FragS = decltype(partition_fragment_C(std::declval<typename T::TiledMmaQK&>(),
                                              Shape<Int<Bm>, Int<Bn>>{}));
  using FragP = decltype(make_tensor<Elem>(partition_shape_A(
      std::declval<typename T::TiledMmaPV&>(), Shape<Int<Bm>, Int<Bn>>{})));

  KArgs const& a;
  Storage& ss;
  Pipeline& pipe_k;
  const int& warp;
  const int& cwg;
  const int& colq;  // this thread's first column of each 8-column group of S
  const bool& sk_even;
  const bool& smem_bnd;
  const uint32_t& mbit0;
  FragS& tSrS;
  FragP& tOrP;

  __device__ __forceinline__ FwdMainloop(KArgs const& a_, Storage& ss_, Pipeline& pipe_k_,
                                         const int& warp_, const int& cwg_, const int& colq_,
                                         const bool& sk_even_, const bool& smem_bnd_,
                                         const uint32_t& mbit0_, FragS& tSrS_, FragP& tOrP_)
      : a(a_), ss(ss_), pipe_k(pipe_k_), warp(warp_), cwg(cwg_), colq(colq_), sk_even(sk_even_),
        smem_bnd(smem_bnd_), mbit0(mbit0_), tSrS(tSrS_), tOrP(tOrP_) {}

  // Element mask of a partial tile (only partial tiles pay for it): four bounds per column, from
  // the smem copy of the K stage when the producer staged them (kSmem), else from global memory
  // (bnd: the tile's bounds rows). Branch-free per element (the short-circuit form compiles to a
  // BSSY/BSYNC pair and two branches per element). Out-of-range columns get the interval
  // [0, 2^31). Accumulator element e of a 64xN wgmma tile: col = 8*(e>>2) + 2*(lane%4) + (e&1),
  // row = 16*warp_in_wg + lane/4 + 8*((e>>1)&1) (row0: this thread's first row).
  template <class KSmem>
  __device__ __forceinline__ void apply_mask(KSmem, int n, int stage, int row0,
                                             const int32_t* bnd) {
    const int32_t* sb = &ss.bnd[stage][0][0];
    CUTE_UNROLL
    for (int kk = 0; kk < Bn / 8; ++kk) {
      const int c = 8 * kk + colq;
      const int col0 = n * Bn + c;  // even; this thread's columns col0, col0 + 1
      int lts[2], lte[2], uts[2], ute[2];
      if constexpr (KSmem::value) {  // columns past Sk hold stale values
        const int2 x0 = *reinterpret_cast<const int2*>(sb + c);
        const int2 x1 = *reinterpret_cast<const int2*>(sb + Bn + c);
        const int2 x2 = *reinterpret_cast<const int2*>(sb + 2 * Bn + c);
        const int2 x3 = *reinterpret_cast<const int2*>(sb + 3 * Bn + c);
        lts[0] = x0.x; lts[1] = x0.y; lte[0] = x1.x; lte[1] = x1.y;
        uts[0] = x2.x; uts[1] = x2.y; ute[0] = x3.x; ute[1] = x3.y;
      } else if (sk_even && col0 + 1 < a.Sk) {  // 8-byte aligned pairs: half the loads
        const int2 x0 = __ldg(reinterpret_cast<const int2*>(bnd + col0));
        const int2 x1 = __ldg(reinterpret_cast<const int2*>(bnd + a.Sk + col0));
        const int2 x2 = __ldg(reinterpret_cast<const int2*>(bnd + 2 * (int64_t)a.Sk + col0));
        const int2 x3 = __ldg(reinterpret_cast<const int2*>(bnd + 3 * (int64_t)a.Sk + col0));
        lts[0] = x0.x; lts[1] = x0.y; lte[0] = x1.x; lte[1] = x1.y;
        uts[0] = x2.x; uts[1] = x2.y; ute[0] = x3.x; ute[1] = x3.y;
      } else {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int cj = min(col0 + j, a.Sk - 1);  // clamped: out-of-range columns masked below
          lts[j] = __ldg(bnd + cj);
          lte[j] = __ldg(bnd + a.Sk + cj);
          uts[j] = __ldg(bnd + 2 * (int64_t)a.Sk + cj);
          ute[j] = __ldg(bnd + 3 * (int64_t)a.Sk + cj);
        }
      }
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const bool oob = col0 + j >= a.Sk;
        const int l0 = oob ? 0 : lts[j];
        const unsigned ll = oob ? 0x7fffffffu : (unsigned)max(lte[j] - lts[j], 0);
        const unsigned ul = (unsigned)max(ute[j] - uts[j], 0);
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          const int r = row0 + 8 * i;
          const bool masked = ((unsigned)(r - l0) < ll) | ((unsigned)(r - uts[j]) < ul);
          float& sv = tSrS(4 * kk + 2 * i + j);
          sv = masked ? -INFINITY : sv;
        }
      }
    }
  }
  // kMaskBits: the mask from the builders' bit words (one LDS.64 per column pair, a bit test per
  // element); the same -inf / score selection as apply_mask.
  __device__ __forceinline__ void apply_bits(int stage) {
    if constexpr (T::kMaskBits) {
      const uint32_t* wb;
      if constexpr (T::kWordsOverBounds) {
        wb = &fwd_words_over_bounds<T>(ss, stage)[2 * cwg + (warp % 4) / 2][colq];
      } else {
        wb = &ss.bits[stage][2 * cwg + (warp % 4) / 2][colq];
      }
      CUTE_UNROLL
      for (int kk = 0; kk < Bn / 8; ++kk) {
        const uint2 w = *reinterpret_cast<const uint2*>(wb + 8 * kk);
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          CUTE_UNROLL
          for (int i = 0; i < 2; ++i) {
            const bool masked = ((j ? w.y : w.x) & (mbit0 << (8 * i))) != 0u;
            float& sv = tSrS(4 * kk + 2 * i + j);
            sv = masked ? -INFINITY : sv;
          }
        }
      }
    }
  }
  // kMaskBits: wait until the builders published the words of a partial block. Called before an
  // aligned wgmma instruction (the issue or the wait of the block's QK^T GEMM): with the wait
  // after it, ptxas dropped its proof that the block walk is warp-uniform (VOTE instead of VOTEU,
  // BRA.DIV before every shuffle, the GEMM descriptors through vector registers).
  __device__ __forceinline__ void wait_bits(bool partial, State st) {
    if constexpr (T::kMaskBits) {
      if (partial) EmptyBarrier::wait(&ss.bits_full[st.index()], st.phase());
      asm volatile("" ::: "memory");  // the words are read after the wait
    }
  }

  // The scores of key block n are final here: S = QK^T of the block (completed), soft-capped
  // (T::kSoftCap: tanh(S * scale / cap), before the mask's -inf, which tanh would lose), masked
  // where the block is partial, then K's stage st is released (a partial block's staged bounds
  // or bit words live in that stage, so the release comes after the mask). Every kept block
  // passes through here once, between its QK^T GEMM and the online softmax.
  __device__ __forceinline__ void finish_scores(bool partial, int n, State st, int row0,
                                                const int32_t* bnd) {
    if constexpr (T::kSoftCap) {
      CUTE_UNROLL
      for (int e = 0; e < Bn / 2; ++e) tSrS(e) = fast_tanh(tSrS(e) * a.softcap_prescale);
    }
    if constexpr (T::kMaskBits) {
      // the words live in the stage's slot until K's release lets the builders reuse it
      // (bits_full was waited for in wait_bits)
      (void)n;
      if (partial) apply_bits(st.index());
      asm volatile("" ::: "memory");  // the words are read before the release
      pipe_k.consumer_release(st);
    } else if (partial && smem_bnd) {
      apply_mask(cute::true_type{}, n, st.index(), row0, bnd);
      pipe_k.consumer_release(st);
    } else {
      pipe_k.consumer_release(st);
      if (partial) apply_mask(cute::false_type{}, n, st.index(), row0, bnd);
    }
  }

  // A kept block's scores to P: finish_scores, then the online softmax (the O correction
  // factors in corr; returns whether O must be rescaled), P pinned before the caller's next
  // wgmma wait. kPartial is a template argument so that the block loop branches once per block
  // and each branch holds its own copy of this path.
  template <bool kPartial, class Softmax>
  __device__ __forceinline__ bool scores_to_p(Softmax& softmax, int n, State st, int row0,
                                              const int32_t* bnd, float (&corr)[2]) {
    finish_scores(kPartial, n, st, row0, bnd);
    const bool resc = softmax.online_softmax(tSrS, corr);
    warpgroup_fence_operand(tSrS);
    return resc;
  }

  __device__ __forceinline__ void convert_p() {
    CUTE_UNROLL
    for (int e = 0; e < Bn / 2; e += 2) {
      tOrP(e) = static_cast<Elem>(tSrS(e));
      tOrP(e + 1) = static_cast<Elem>(tSrS(e + 1));
    }
  }

};

}  // namespace jfm::sm90
