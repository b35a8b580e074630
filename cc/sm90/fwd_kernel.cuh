// FlashMask-3 forward for Hopper (sm_90a): TMA -> multi-stage smem ring (mbarriers) -> WGMMA,
// fp32 online softmax, block skip from the per-key-block metadata, element masking on partial
// tiles only. Warp specialized: warpgroup 0 = producer (lane 0 of warp 0 issues the TMA loads of
// Q, K, V and, for partial key blocks, bulk copies of their bounds; with mask bits warps 1-2 build
// the element bit words; K goes one key block ahead of V), warpgroups 1..NWG = consumers (64
// query rows each), ping-pong (or a round robin of three; free issue in the d = 256 kernels
// without mask bits) of their GEMMs with softmax / GEMM overlap inside a warpgroup.
// The kept key-block sequence comes from the per-warp KeptBlocks walk (mask_walk.cuh).
// Persistent grid: CTAs take query tiles (or pairs) from a global counter, heaviest first within
// a head.
// Contract: out / lse of FwdParams for any canonical bounds; fully masked rows give 0 / -inf.
// Synchronization: K / V pipelines (PipelineTmaAsync), Q full / empty and the tile-id slots
//   (mbarriers), named barriers 1..NWG for the GEMM turns; mask bits: job_full / bits_full.
// Knobs: the traits (traits.h) and launch_fwd's template arguments, one set per generated unit.
#pragma once

#include "epilogue.cuh"
#include "fwd_mainloop.cuh"
#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

template <class T, class TmaQ, class TmaK, class TmaV>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_fwd_kernel(CUTE_GRID_CONSTANT KArgs const a, CUTE_GRID_CONSTANT TmaQ const tma_q,
                         CUTE_GRID_CONSTANT TmaK const tma_k, CUTE_GRID_CONSTANT TmaV const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, NWG = T::NWG, QS = T::QStages;
  // The d = 256 kernels without mask bits: free GEMM issue (no ping-pong turns) with each
  // warpgroup's softmax under its own PV GEMM (docs/decisions.md#fwd-d256-own-pv).
  constexpr bool kOwnPv = NWG == 2 && D > 128 && !T::kMaskBits;
  using Pipeline = typename T::Pipeline;
  using Storage = typename T::SharedStorage;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);

  const int warp = cutlass::canonical_warp_idx_sync();
  const int lane = threadIdx.x % 32;
  const int wg = threadIdx.x / 128;
  const int nblk = a.nblk;
  using Sched = FwdTileScheduler<Bm, T::kPaired>;
  const Sched sched(a);

  typename Pipeline::Params pp;
  pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = 128 * NWG;
  pp.transaction_bytes = Bn * D * sizeof(Elem);
  pp.initializing_warp = 0;
  pp.num_consumers = 128 * NWG + T::kBuilders;  // kMaskBits: the mask builders release K stages too
  Pipeline pipe_k(ss.pipe_k, pp, Shape<_1, _1, _1>{});
  pp.num_consumers = 128 * NWG;
  pp.initializing_warp = 1;
  Pipeline pipe_v(ss.pipe_v, pp, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < QS; ++s) {
      Barrier::init(&ss.q_full[s], 1);
      EmptyBarrier::init(&ss.q_empty[s], 128 * NWG);
      EmptyBarrier::init(&ss.sched[s], 1);
    }
    if constexpr (T::kMaskBits) {
      CUTE_UNROLL
      for (int s = 0; s < T::Stages; ++s) {
        EmptyBarrier::init(&ss.job_full[s], 1);
        EmptyBarrier::init(&ss.bits_full[s], T::kBuilders);
      }
    }
    Barrier::init(&ss.aux, 1);
    ss.aux_uses = 0u;
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutVt{});

  if (wg == 0) {
    // ---------------- producer warpgroup: warp 0 issues TMA (lane 0), warps 1-2 build mask bits
    if constexpr (NWG >= 2) cutlass::arch::warpgroup_reg_dealloc<T::kRegProducer>();
    if (warp == 0) {
      Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
      Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
      Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
      auto wr = cutlass::make_producer_start_state<Pipeline>();
      auto wr_v = wr;  // V's own state: V is loaded a block behind K
      int t = sched.first_tile();
      for (int it = 0;; ++it) {
        const int slot = it % QS;
        const bool done = t >= sched.total_tiles;
        if (lane == 0) Sched::template publish<QS>(ss, it, slot, t, done);
        if (done) break;
        int t_next = sched.total_tiles;
        sched.claim_next(t_next, t, lane, a.tile_counter);
        const FwdTile tile = sched.decode(t);
        const int hk = tile.h / a.heads_per_kv, hm = tile.h / a.heads_per_mask;
        const int ms = tile.m_blk * Bm, me = min(ms + Bm, a.Sq);
        auto [tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV] = fwd_tma_views<T>(
            tma_q, tma_k, tma_v, mQ, mK, mV, sQ, sK, sV, tile.m_blk, tile.h, hk, tile.b);
        if (lane == 0) fwd_load_q<T>(ss, tma_q, tQgQ, tQsQ, slot);
        const int32_t* bnd = fwd_bounds(a, tile.b, hm);
        // any unseen column under mask head hm (block_meta_sm90's per-(b, hm) flag): only then
        // does the block loop read the blocks' words
        const bool tile_unseen =
            __ldg(fwd_block_meta(a, tile.b, hm) + a.unseen_off + 4 * nblk) != 0;
        FwdKeptBlocks<T> blocks(fwd_block_meta(a, tile.b, hm), nblk, ms, me, a.Sk, lane,
                                a.group_meta, sched.reversed(t));
        // V of key block n into stage wv (with tile_unseen, lane i < 4 loads word i of the block's
        // unseen columns, issued after the K copy: live across it, the word spilled the walk's
        // state in this loop)
        auto load_v = [&](auto const& wv, int n, auto const& gV, auto& sVs) {
          uint32_t uw = 0u;
          if (tile_unseen && lane < 4)
            uw = (uint32_t)__ldg(fwd_block_meta(a, tile.b, hm) + a.unseen_off + 4 * n + lane);
          if (tile_unseen && __any_sync(0xffffffffu, uw != 0u)) {
            fwd_load_v_zeroed<T>(ss, tma_v, gV, sVs, sV, wv, n,
                                 reinterpret_cast<const uint32_t*>(fwd_block_meta(a, tile.b, hm) +
                                                                   a.unseen_off + 4 * n),
                                 lane);
          } else if (lane == 0) {
            fwd_load_v(tma_v, gV, sVs, pipe_v, wv, n);
          }
        };
        // K of block n+1 goes out before V of block n (docs/decisions.md#fwd-k-ahead): K's stage
        // is free once its QK^T completed, V's only once the PV GEMM a block later did, so in
        // block order the next K would wait behind V's release.
        int n_prev = -1;
        while (blocks.has_next()) {
          bool partial;
          const int n = blocks.next(partial, a.group_meta);
          if (lane == 0) {
            fwd_load_k<T>(a, ss, tma_k, tKgK, tKsK, pipe_k, wr, n, partial, bnd,
                          tile.b * a.Hm + hm, ms);
          }
          if (n_prev >= 0) {
            load_v(wr_v, n_prev, tVgV, tVsV);
            ++wr_v;
          }
          n_prev = n;
          ++wr;
        }
        if (n_prev >= 0) {
          load_v(wr_v, n_prev, tVgV, tVsV);
          ++wr_v;
        }
        t = __shfl_sync(0xffffffffu, t_next, 0);
      }
      if constexpr (T::kMaskBits) {
        if (lane == 0) fwd_stop_mask_builders<T>(ss, wr);
      }
    }
    if constexpr (T::kMaskBits) {
      if (warp == 1 || warp == 2) fwd_build_mask_bits<T>(a, ss, threadIdx.x - 32);
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    if constexpr (NWG >= 2) cutlass::arch::warpgroup_reg_alloc<T::kRegConsumer>();
    typename T::TiledMmaQK mma_qk;
    typename T::TiledMmaPV mma_pv;
    // The GEMM operands in shared memory depend only on the consumer warpgroup, so the slices are
    // taken by a warp-uniform index: the wgmma descriptors then stay in uniform registers instead
    // of being rebuilt in vector registers and moved over before every HGMMA. (cwg below holds the
    // same warpgroup, but from threadIdx, which ptxas cannot prove uniform.)
    const int wg_first_thread = 128 * (cutlass::canonical_warp_group_idx() - 1);
    auto thr_qk = mma_qk.get_thread_slice(wg_first_thread);
    auto thr_pv = mma_pv.get_thread_slice(wg_first_thread);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrK = thr_qk.partition_fragment_B(sK);
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<Bm>, Int<Bn>>{});
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<Bm>, Int<D>>{});
    Tensor tOrP = make_tensor<Elem>(partition_shape_A(mma_pv, Shape<Int<Bm>, Int<Bn>>{}));
    static_assert(decltype(size(tSrS))::value == Bn / 2, "unexpected S fragment");
    static_assert(decltype(size(tOrO))::value == D / 2, "unexpected O fragment");
    static_assert(decltype(size(tOrP))::value == Bn / 2, "unexpected P fragment");
    const int colq = 2 * (lane % 4);
    const float sl2 = a.scale_log2;
    const int cwg = wg - 1;  // consumer warpgroup index
    // bounds rows start at multiples of Sk: int2 loads are aligned iff Sk is even
    const bool sk_even = (a.Sk % 2) == 0;
    const bool smem_bnd = a.smem_bounds != 0;
    // kMaskBits: this thread's rows are bits b and b + 8 of word 2 * cwg + (warp % 4) / 2
    const uint32_t mbit0 = 1u << (16 * ((warp % 4) & 1) + lane / 4);

    cutlass::PipelineState<T::Stages> rd;
    // Tile-boundary overlap (KArgs::tile_overlap, off in every shipped launch): at the end of
    // tile `it` the consumer reads tile it+1's id, scans its key blocks and issues its first QK^T
    // GEMM (into tSrS) before waiting for tile it's last PV GEMM, then waits for both and runs
    // tile it's epilogue. State carried into the next iteration: t_nxt, blocks_nxt, and (pend)
    // the computed first block. Kept although off: without this path ptxas serializes the
    // kernel's wgmma (docs/decisions.md#fwd-rejected).
    const bool tovl = a.tile_overlap != 0;
    int t_nxt = -1;
    KeptBlocks<Bn, T::kGroupScan, T::kPaired> blocks_nxt;
    bool pend = false, pend_partial = false;
    int pend_n = 0;
    FwdMainloop<T, decltype(sQ), decltype(sK), decltype(sVt)> ml(
        a, ss, pipe_k, warp, cwg, colq, sk_even, smem_bnd, mbit0, tSrS, tOrP);
    for (int it = 0;; ++it) {
      const int slot = it % QS;
      const uint32_t qphase = (it / QS) & 1;
      // Nothing is in flight here (the boundary waits with wait<0>); kept unconditional so that
      // ptxas sees no wgmma in flight across the loop back-edge on any path.
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      const bool pre = tovl && it > 0;  // tile id and block scan done at the previous boundary
      if (!pre) Sched::wait_published(ss, slot, qphase);
      const int t = pre ? t_nxt : Sched::published(ss, slot);
      if (t < 0) break;
      const FwdTile tile = sched.decode(t);
      const int m_blk = tile.m_blk, h = tile.h, b = tile.b;
      const int hm = h / a.heads_per_mask;
      const int ms = m_blk * Bm, me = min(ms + Bm, a.Sq);
      // Accumulator element e of a 64xN wgmma tile: col = 8*(e>>2) + 2*(lane%4) + (e&1),
      // row = 16*warp_in_wg + lane/4 + 8*((e>>1)&1).
      const int row0 = ms + 64 * cwg + 16 * (warp % 4) + lane / 4;
      const int32_t* bnd = a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
      float m_i[2] = {-INFINITY, -INFINITY};
      float l_i[2] = {0.f, 0.f};
      FwdOnlineSoftmax<D, Bn, NWG> softmax(m_i, l_i, sl2);
      clear(tOrO);
      auto tSrQs = tSrQ(_, _, _, slot);

      KeptBlocks<Bn, T::kGroupScan, T::kPaired> blocks =
          pre ? blocks_nxt
              : KeptBlocks<Bn, T::kGroupScan, T::kPaired>(
                    a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)nblk, nblk, ms, me, a.Sk, lane,
                    a.group_meta, sched.reversed(t));
      if (!pend) Barrier::wait(&ss.q_full[slot], qphase);  // pend: waited at the boundary
      const bool had_blocks = pend || blocks.has_next();
      if (had_blocks) {
        // FA3-style: the softmax of block t overlaps the QK^T GEMM of block t+1 and the PV GEMM of
        // block t-1 inside the warpgroup; with two consumer warpgroups the GEMM issue alternates
        // (ping-pong through named barriers 1 and 2) so one group's softmax hides the other's GEMMs.
        // The d = 256 kernels without mask bits instead keep each warpgroup's softmax under its own
        // PV GEMM and let both warpgroups issue freely (docs/decisions.md#fwd-d256-own-pv).
        constexpr bool kPingPong = NWG == 2 && !kOwnPv;
        // NWG = 3: the same idea as a round robin. Warpgroup w issues its GEMMs after
        // a sync on named barrier 1 + w and then arrives on the next one's (1 + (w + 1) % 3), so
        // the tensor pipe takes warpgroup 0, 1, 2, 0, ... and each softmax runs under the two other
        // warpgroups' GEMMs. Every barrier has one syncing and one arriving warpgroup (256 threads);
        // warpgroup 2 opens the round (like warpgroup 1 above) and skips its arrival after the
        // tile's last block, so the counts balance within each tile.
        constexpr bool kRoundRobin = NWG == 3;
        {
          bool partial;
          int n;
          if (pend) {  // issued and completed at the previous tile boundary
            n = pend_n;
            partial = pend_partial;
            pend = false;
          } else {
            n = blocks.next(partial, a.group_meta);
            pipe_k.consumer_wait(rd);
            ml.wait_bits(partial, rd);
            wgmma_gemm<true, 0, false>(mma_qk, tSrQs, tSrK(_, _, _, rd.index()), tSrS);
          }
          if (!blocks.has_next()) EmptyBarrier::arrive(&ss.q_empty[slot]);  // last QK^T done
          ml.finish_scores(partial, n, rd, row0, bnd);
          float corr[2];
          softmax.online_softmax(tSrS, corr);
          ml.convert_p();
        }
        if constexpr (kPingPong) {
          if (cwg == 1 && blocks.has_next()) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
        }
        if constexpr (kRoundRobin) {
          if (cwg == 2 && blocks.has_next()) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
        }
        while (blocks.has_next()) {
          bool partial;
          const int n = blocks.next(partial, a.group_meta);
          const bool last = !blocks.has_next();
          auto rd_prev = rd;
          ++rd;
          pipe_k.consumer_wait(rd);
          if constexpr (kPingPong) {
            if (cwg == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
            else asm volatile("bar.sync 2, 256;\n" ::: "memory");
          }
          if constexpr (kRoundRobin) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cwg) : "memory");
          wgmma_gemm<true, -1, false>(mma_qk, tSrQs, tSrK(_, _, _, rd.index()), tSrS);
          pipe_v.consumer_wait(rd_prev);
          wgmma_gemm<false, -1, true>(mma_pv, tOrP, tOrV(_, _, _, rd_prev.index()), tOrO);
          if constexpr (kPingPong) {
            if (cwg == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
            else if (!last) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
          }
          if constexpr (kRoundRobin) {
            if (cwg < 2) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + cwg) : "memory");
            else if (!last) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
          }
          ml.wait_bits(partial, rd);
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          if (last) EmptyBarrier::arrive(&ss.q_empty[slot]);  // last QK^T of the tile done: Q is free
          float corr[2];
          bool resc;
          if constexpr (kOwnPv) {
            // One copy of the scores' path per block kind: after a control-flow merge ahead of
            // the softmax, ptxas places the wait for the PV GEMM in flight before the softmax,
            // which then no longer runs under it.
            resc = partial ? ml.template scores_to_p<true>(softmax, n, rd, row0, bnd, corr)
                           : ml.template scores_to_p<false>(softmax, n, rd, row0, bnd, corr);
          } else {
            ml.finish_scores(partial, n, rd, row0, bnd);
            resc = softmax.online_softmax(tSrS, corr);
          }
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(tOrP);
          pipe_v.consumer_release(rd_prev);
          if (resc) softmax.rescale_o(tOrO, corr);
          ml.convert_p();
        }
        pipe_v.consumer_wait(rd);
        // last PV GEMM of the tile: waited for (and its V stage released) below, after the tile
        // boundary work of the overlap
        wgmma_gemm<false, -1, true>(mma_pv, tOrP, tOrV(_, _, _, rd.index()), tOrO);
      }
      // Q is free once every QK^T GEMM of the tile has completed (the walk signals it right after
      // its last QK^T; here: tiles without any kept block).
      if (!had_blocks) EmptyBarrier::arrive(&ss.q_empty[slot]);

      {
        if (tovl) {
          // Tile boundary: next tile's id and block scan (its metadata loads run under the PV GEMM
          // in flight), then its first QK^T issued right behind the PV GEMM, one wait for both.
          const int nit = it + 1, nslot = nit % QS;
          const uint32_t nphase = (nit / QS) & 1;
          Sched::wait_published(ss, nslot, nphase);
          t_nxt = Sched::published(ss, nslot);
          auto rdn = rd;
          if (had_blocks) ++rdn;  // stage of the next tile's first block
          bool go = false;
          if (t_nxt >= 0) {
            const FwdTile w = sched.decode(t_nxt);
            const int m2 = w.m_blk, h2 = w.h, b2 = w.b;
            const int hm2 = h2 / a.heads_per_mask;
            const int ms2 = m2 * Bm, me2 = min(ms2 + Bm, a.Sq);
            blocks_nxt = KeptBlocks<Bn, T::kGroupScan, T::kPaired>(
                a.meta + ((int64_t)b2 * a.Hm + hm2) * 8 * (int64_t)nblk, nblk, ms2, me2, a.Sk, lane,
                a.group_meta, sched.reversed(t_nxt));
            go = blocks_nxt.has_next();
          }
          if (go) {
            pend_n = blocks_nxt.next(pend_partial, a.group_meta);
            Barrier::wait(&ss.q_full[nslot], nphase);
            pipe_k.consumer_wait(rdn);
            ml.wait_bits(pend_partial, rdn);
            wgmma_gemm<true, -1, false>(mma_qk, tSrQ(_, _, _, nslot), tSrK(_, _, _, rdn.index()),
                                        tSrS);
            pend = true;
            // One wait for this tile's last PV GEMM and the next tile's first QK^T. (wait<1> here,
            // i.e. the epilogue under the QK^T, made ptxas serialize every wgmma of the kernel:
            // C7515, accumulator registers defined inside a wgmma pipeline stage.)
            warpgroup_wait<0>();
          } else {
            warpgroup_wait<0>();
          }
        } else {
          warpgroup_wait<0>();  // the tile's last PV GEMM
        }
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        if (had_blocks) {
          pipe_v.consumer_release(rd);
          ++rd;
        }
      }

      fwd_store_o_lse<Elem, D>(a, tOrO, m_i, l_i, sl2, row0, b, h, lane);
    }  // tile loop
  }
#endif
}

// Host launcher of one forward configuration (instantiations/fwd_*.cu): block metadata (and, with
// GroupScan, the group metadata), TMA descriptors, then the kernel on the persistent grid.
// GroupScan: FwdTraitsGroupScan (two-level key-block walk). MaskBits: FwdTraitsMaskBits (no
// bounds staged: the mask builders read them from global memory, any Sk). Paired:
// FwdTraitsPaired (two tiles per claim). Otherwise the partial blocks' bounds are staged in smem
// where Sk % 4 == 0. SoftCap: FwdTraitsSoftCap (the cap is p.softcap).
template <class Elem, int D, int Bn, int NWG, int Stages, bool Overlap, bool GroupScan, bool MaskBits,
          bool Paired, bool SoftCap = false>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream, const char** err) {
  static_assert(!(Paired && (GroupScan || MaskBits)), "paired tiles: the plain walk and mask only");
  using Base = FwdTraits<Elem, D, Bn, NWG, Stages, Overlap>;
  using TG = std::conditional_t<GroupScan, FwdTraitsGroupScan<Base>,
                                std::conditional_t<Paired, FwdTraitsPaired<Base>, Base>>;
  using TM = std::conditional_t<MaskBits, FwdTraitsMaskBits<TG>, TG>;
  using T = std::conditional_t<SoftCap, FwdTraitsSoftCap<TM>, TM>;
  const int nblk = (p.Sk + Bn - 1) / Bn;
  const int mblk = (p.Sq + T::Bm - 1) / T::Bm;
  const int64_t total_tiles = (int64_t)mblk * p.N * p.B;
  if (total_tiles > INT32_MAX - 1024) {
    if (err) *err = "flashmask sm90 forward: too many query tiles (ceil(Sq/Bm) * N * B >= 2^31)";
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(typename T::SharedStorage);
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "shared memory budget");
  // The persistent grid (so sm_margin is always honoured).
  const int64_t meta_elems = (int64_t)p.B * p.Hm * 8 * nblk;
  // the dynamic tile counter lives in the workspace right after the metadata
  if (p.meta_capacity < meta_elems + 1) {
    if (err) *err = "flashmask sm90 forward: metadata workspace too small";
    return cudaErrorInvalidValue;
  }
  // Unseen columns (unseen.cuh): words laid out as the block metadata at the end of the workspace,
  // after the tile counter's 32 words and (GroupScan) the group metadata's as many again
  // (ForwardConfig.workspace_words).
  const int64_t unseen_off = (GroupScan ? 2 : 1) * (meta_elems + 32);
  if (p.meta_capacity < unseen_off + meta_elems || unseen_off > INT32_MAX) {
    if (err) *err = "flashmask sm90 forward: metadata workspace too small for the unseen columns";
    return cudaErrorInvalidValue;
  }
  uint32_t* unseen = reinterpret_cast<uint32_t*>(p.meta + unseen_off);
  // one memset for the tile counter (reset per call, no host sync) and everything after it: the
  // unseen words' per-(b, hm) "any" flags start at 0 (the group metadata, written below, rides
  // along)
  // ([meta_elems, unseen_off + meta_elems): unseen_off words)
  cudaError_t e = cudaMemsetAsync(p.meta + meta_elems, 0, sizeof(int32_t) * (size_t)unseen_off,
                                  stream);
  if (e != cudaSuccess) return e;
  e = block_meta_sm90(p.bounds, p.meta, p.B, p.Hm, p.Sk, Bn, stream, p.Sq, unseen, nullptr, 0, true);
  if (e != cudaSuccess) return e;
  // Group metadata (32 key blocks per group) at meta + group_meta: for (b, hm) at the
  // offset of its block metadata, int4 {LTSmax, LTEmin, UTSmax, UTEmin} per group (group_meta_sm90).
  // Only with at least 3 groups: with 1 or 2 the group ballot costs one more metadata round trip
  // per tile than it can save (S <= 8K at Bn = 128). Needs a 16-byte aligned workspace.
  int group_meta = 0;
  if constexpr (GroupScan) {
    const int ngrp = (nblk + 31) / 32;
    const int64_t goff = meta_elems + 32;  // after the tile counter; a multiple of 8
    if (ngrp >= 3 && reinterpret_cast<uintptr_t>(p.meta) % 16 == 0) {
      if (p.meta_capacity < goff + meta_elems || goff > INT32_MAX) {
        if (err) *err = "flashmask sm90 forward: metadata workspace too small for the group walk";
        return cudaErrorInvalidValue;
      }
      e = group_meta_sm90(p.meta, p.meta + goff, p.B, p.Hm, nblk, stream);
      if (e != cudaSuccess) return e;
      group_meta = (int)goff;
    }
  }

  const Elem* q = reinterpret_cast<const Elem*>(p.q);
  const Elem* k = reinterpret_cast<const Elem*>(p.k);
  const Elem* v = reinterpret_cast<const Elem*>(p.v);
  Tensor mQ = make_tensor(make_gmem_ptr(q), make_shape(p.Sq, D, p.N, p.B),
                          make_stride((int64_t)p.N * D, _1{}, (int64_t)D, (int64_t)p.Sq * p.N * D));
  Tensor mK = make_tensor(make_gmem_ptr(k), make_shape(p.Sk, D, p.K, p.B),
                          make_stride((int64_t)p.K * D, _1{}, (int64_t)D, (int64_t)p.Sk * p.K * D));
  Tensor mV = make_tensor(make_gmem_ptr(v), make_shape(p.Sk, D, p.K, p.B),
                          make_stride((int64_t)p.K * D, _1{}, (int64_t)D, (int64_t)p.Sk * p.K * D));
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename T::SmemLayoutQ{}),
                             Shape<Int<T::Bm>, Int<D>>{}, _1{});
  auto tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename T::SmemLayoutK{}),
                             Shape<Int<Bn>, Int<D>>{}, _1{});
  auto tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename T::SmemLayoutK{}),
                             Shape<Int<Bn>, Int<D>>{}, _1{});

  KArgs a;
  a.o = p.o;
  a.lse = p.lse;
  a.bounds = p.bounds;
  a.meta = p.meta;
  a.B = p.B; a.Sq = p.Sq; a.Sk = p.Sk; a.N = p.N; a.K = p.K; a.Hm = p.Hm;
  a.nblk = nblk;
  a.heads_per_kv = p.N / p.K;
  a.heads_per_mask = p.N / p.Hm;
  // soft cap: the scores are tanh(S * scale / cap), scaled by cap in the softmax
  a.scale_log2 = (SoftCap ? p.softcap : p.scale) * 1.4426950408889634f;
  a.softcap_prescale = SoftCap ? p.scale / p.softcap : 0.f;
  // Bulk copies need 16-byte aligned rows of whole 16-byte units: Sk % 4 == 0 (else global loads).
  // Mask-bits kernels never stage bounds (their mask builders read global memory).
  a.smem_bounds = !MaskBits && p.Sk % 4 == 0 &&
                  (reinterpret_cast<uintptr_t>(p.bounds) % 16) == 0;
  a.tile_counter = p.meta + meta_elems;
  a.tile_overlap = 0;  // the kernel's tile-boundary overlap stays off in every configuration
  a.group_meta = group_meta;
  a.unseen_off = (int)unseen_off;

  auto kernel = &flashmask_fwd_kernel<T, decltype(tma_q), decltype(tma_k), decltype(tma_v)>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  // One CTA per SM; CTA i starts with tile i and then takes tiles gridDim.x, gridDim.x + 1, ... of
  // the same (batch, head)-major order from a global counter, so early finishers take the next
  // tile; the next tile's Q (second Q buffer) and first K/V load while the current tile runs.
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (sms <= 0) sms = 132;
  // sm_margin: leave SMs free for concurrent kernels (NCCL under context parallelism)
  const int ctas = std::max(1, sms - std::max(0, p.sm_margin));
  // paired tiles: one claim = two tiles
  const int grid = (int)std::min<int64_t>(Paired ? (total_tiles + 1) / 2 : total_tiles, ctas);
  kernel<<<grid, T::kThreads, smem, stream>>>(a, tma_q, tma_k, tma_v);
  return cudaGetLastError();
}

}  // namespace jfm::sm90
