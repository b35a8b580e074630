// FlashMask-3 backward for Hopper (sm_90a), d = 64 / 128: column parallel, one CTA per (key block
// of Bn = 128 keys, kv head, batch) -- the "pp" kernel, BwdSingleTileScheduler -- or a persistent
// grid over those items -- BwdPersistentScheduler --: one body, flashmask_bwd_kernel<T, Sched>, two
// consumer warpgroups (64 keys each). The CTA walks
// the query heads of its GQA group and, for each, the Bm-row query tiles that the block metadata
// does not skip (element mask only on partial tiles). Q and dO tiles come by TMA into a 2-stage
// ring; K and V are loaded once. Per tile, all on WGMMA:
//   S^T  = K Q^T, dP^T = V dO^T           (64 x Bm per warpgroup, both operands from smem)
//   P^T  = exp2(S^T * scale*log2e - lse2), dS^T = P^T (dP^T - D)
//   dV  += P^T dO, dK += dS^T Q           (A = P^T / dS^T from registers, B = dO / Q from smem)
//   dQ   = dS K (or dQ^T = K^T dS^T)      (dS through smem), then the fp32 dQ tile -> smem -> one
//   bulk reduce-add into the dq_accum workspace, converted by bwd_aux.cu.
// dK and dV stay in registers over the whole walk and are written once (dK scaled).
// Contract: dq / dk / dv of BwdParams; deterministic mode: dQ bitwise reproducible (the ordered
//   writer of epilogue.cuh), dK / dV always.
// Synchronization: Q / dO ring full / empty, dS and dQ buffers (mbarriers), named barriers for
//   the consumers' GEMM turns (ping-pong) or their shared dS barrier (lock-step); persistent grid:
//   the item-id ring and the K / V release.
// Knobs: the traits (traits.h): Persist, Bm (64 / 80 / 128), kMaskRegs, kLockstep, kDetGroups;
//   the scheduler type (tile_scheduler.cuh), which follows Persist.
//
// Written for jax_flashmask; layouts and GMMA/TMA primitives come from CuTe / CUTLASS headers.
#pragma once

#include "bwd_host.cuh"
#include "bwd_launch.cuh"
#include "bwd_mainloop.cuh"
#include "epilogue.cuh"
#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

// BwdSingleTileScheduler: warp specialized, one CTA per work item. 384 threads: warpgroup 0 =
// producer (setmaxnreg 24), warpgroups 1-2 = two consumer warpgroups of 64 keys each (240):
//   warp 0 (one lane): K/V once, then Q/dO (+ the tile's row statistics lse2 and D, by bulk copy
//     on the same `full` barrier) of every kept tile into the 2-stage ring; a stage is refilled
//     once both consumer warpgroups arrived on its `empty` barrier (after their last GEMM on it);
//   warp 1 (dQ writer): per tile, waits for the consumers' fp32 dQ tile in smem (`dq_full`, two
//     buffers), issues its bulk reduce-add (deterministic mode: after the ordering bits of the key
//     blocks above say so; then publishes its own bit), frees the buffer (`dq_empty`);
//   warp 2: deterministic mode only, marks the skipped tiles at CTA start;
//   warp 3: the look-ahead zeroing of the next unit's dQ rows (bwd_zero_unit).
// Each producer role runs one item loop, the scheduler's (tile_scheduler.cuh: producer_item,
// writer_item, start_walk): one pass here, every item of the CTA on the persistent grid.
// The two consumer warpgroups run out of lock-step, so that one's exp/dS math runs under the
// other's GEMMs:
//  * the dQ GEMM of tile t is issued two tiles later (in the GEMM section that follows the math of
//    tile t+1), when the other warpgroup's dS of tile t is certainly stored: ds_full[buf] (256
//    arrivals after each thread's dS store + proxy fence), and ds_empty[buf] (256 arrivals after
//    the dQ GEMM on it completed) guards the rewrite of a dS buffer two tiles on;
//  * the GEMM issue of the two warpgroups alternates through named barriers 1 and 2 (as the
//    forward's ping-pong): per warpgroup and tile one "section" = [dQ GEMM of tile t-1, wait for it
//    and for this tile's dV/dK GEMMs, release the Q/dO stage, dQ tile to smem, S/dP GEMMs of tile
//    t+1]; the other warpgroup's exp/dS math runs under it. Sections: one before the loop (S/dP
//    of the first tile), one per tile, one after (the last tile's dQ GEMM), the same count in both
//    warpgroups; warpgroup 1 pre-arrives once so that warpgroup 0 goes first and skips its last
//    arrive, so every named-barrier phase is matched.
// BwdPersistentScheduler: the same body on a persistent grid (num_SMs - sm_margin CTAs, at most
// one per work item). A work item is one (key block n, kv head hk, batch b), i.e. one CTA of the
// pp kernel. Item ids come from BwdArgs::sched: sched[0] is a global counter (zeroed by
// bwd_sched_sm90 in the same stream before the launch), sched[4 + r] the key block of rank r
// (bwd_sched_sm90: key blocks by descending query-tile count summed over batch and mask heads,
// ties ascending; descending key block in deterministic mode). Item i -> (section of
// a.sec_heads (b, hk) heads sized so that its Q + dO fit in about half the L2, rank r within the
// section, head within the section): bwd_decode_item. Every item id, a CTA's first one included,
// is atomicAdd(counter, 1).
//  * The producer's TMA lane fetches the next id as soon as it has issued the last Q/dO load of
//    the current item and publishes it in a 2-slot smem ring (sched_full: 1 arrival, sched_empty:
//    256 consumer threads after the item's epilogue, as they read the item's (n, hk, b) from
//    the slot at each use instead of keeping them in registers, + the dQ-writer warp's lane 0
//    on reading it). It then waits kv_empty (all 256 consumer threads past their last dQ GEMM
//    of the item: the last reader of sK / sV) and loads the next K/V, so the next item's K/V and
//    first Q/dO tiles load under the current item's dK/dV epilogue.
//  * Tile-indexed barriers (full/empty, ds_full/ds_empty, dq_full/dq_empty) and their parities
//    run on a tile count that continues across items (consumers: tg + local tile, tg kept mod 4
//    in a packed state register with the slot / kv parities; producer and writer: their stage /
//    buffer counters never reset). The last section of an item also
//    arrives on ds_empty (the pp kernel skips it: it ends there), so every use of a buffer
//    completes exactly one phase.
//  * The named-barrier turn-taking is balanced per item (warpgroup 1 pre-arrives, warpgroup 0
//    skips its last arrive), so it simply repeats.
//  * Deterministic mode: the dQ-writer warp marks the item's skipped tiles at item start, then
//    adds dQ in the ordered way of the pp kernel. Deadlock-free: items are handed out in increasing
//    id, and an item only waits for items of the same (b, head) with a larger key block, which
//    have smaller ids (descending key block within each section). The smallest unfinished id is
//    held by a running CTA whose earlier items are all done, and everything it waits for has a
//    smaller id, so it always progresses (no co-residency assumption needed).
template <class T, class Sched, class TmaQ, class TmaK>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_bwd_kernel(CUTE_GRID_CONSTANT BwdArgs const a, CUTE_GRID_CONSTANT TmaQ const tma_q,
                         CUTE_GRID_CONSTANT TmaQ const tma_do, CUTE_GRID_CONSTANT TmaK const tma_k,
                         CUTE_GRID_CONSTANT TmaK const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, S = T::Stages;
  using Storage = typename T::SharedStorage;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr bool kPersist = Sched::kPersistent;
  static_assert(kPersist == T::kPersist, "the traits' storage is the scheduler's");
  static_assert((T::kDqBufs == 2 || (T::kDqBufs == 1 && T::kLockstep && !kPersist)) &&
                    T::kDsBufs == 2 && S == 2,
                "PP layout");
  constexpr int kConsumers = 128 * T::NWG;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);

  const Sched sched = Sched::template make<T>(a);
  const BwdItem cta = sched.first();  // persistent: none, each role takes its items (`cs`)
  const int n = cta.n, hk = cta.hk, b = cta.b, slot = cta.slot;
  const int tid = threadIdx.x;
  const int lane = tid % 32;

  constexpr bool kRot = T::kLockstep && Bm == 80;
  if (tid == 0) {
    // the clocked walk's first tile, one value for the TMA lane and the dQ writer
    if constexpr (kRot) ss.walk_start = bwd_walk_start<Bm, Bn>(a, b, hk, n);
    for (int s = 0; s < S; ++s) {
      Barrier::init(&ss.full[s], 1);
      Barrier::init(&ss.empty[s], kConsumers);
      if (s < T::kDqBufs) {  // 80-row tiles: one dQ buffer
        Barrier::init(&ss.dq_full[s], kConsumers);
        Barrier::init(&ss.dq_empty[s], 1);
      }
      if constexpr (!T::kLockstep) {
        Barrier::init(&ss.x.ds_full[s], kConsumers);
        Barrier::init(&ss.x.ds_empty[s], kConsumers);
      }
      if constexpr (kPersist) {
        Barrier::init(&ss.x.sched_full[s], 1);
        Barrier::init(&ss.x.sched_empty[s], kConsumers + 1);
      }
    }
    Barrier::init(&ss.kv_full, 1);
    if constexpr (kPersist) Barrier::init(&ss.x.kv_empty, kConsumers);
    ss.z.init();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});

  // The tile walk of the single-tile scheduler, started here for every role (the lock-step
  // consumers read it from the TMA lane, the others walk it too): ascending, or (80-row tiles)
  // clocked from tile `rot` = ss.walk_start >= 0. A clocked walk keeps every tile, so
  // bwd_find_kept gives (g, m) back with its partial flag, or false past the last head.
  int rot = -1;
  if constexpr (kRot) rot = ss.walk_start;
  int g = 0, m = max(rot, 0);
  bool partial = false;
  bool have = false;  // persistent: per item and role (Sched::start_walk)
  if constexpr (!kPersist) have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
  auto next_kept = [&](const BwdItem& w, int& g_, int& m_, bool& partial_) {
    bwd_walk_advance(a, rot, g_, m_);
    return bwd_find_kept<Bm, Bn>(a, w.b, w.hk, w.n, g_, m_, partial_);
  };
  // Lock-step consumers: the TMA lane publishes each tile's (m, g | partial << 30 | last << 31) in
  // slot [stage] before its `full` arrive (release; the consumers read it after their `full`
  // wait and before their `empty` arrive), so the consumers run no tile walk of their own. The
  // slots live in the dS mbarriers' storage, unused (not initialized) there.
  static_assert(sizeof(ss.x.ds_full) >= S * sizeof(int2), "tile-info slots");
  int2* tinfo = reinterpret_cast<int2*>(&ss.x.ds_full[0]);

  if (tid < 128) {  // ---------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    const int warp = tid / 32;
    if (warp == 0) {
      if (lane == 0) {
        // only clocked walks advance the clock: the phase it measures is theirs
        const bool on_clock = kRot && rot >= 0;
        Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mdO = tma_do.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        int stage = 0, phase = 0, kvu = 0;
        for (int it = 0;; ++it) {
          BwdItem w;
          if (!sched.producer_item(a, ss, it, w)) break;
          // the kv group's unseen columns of the block (unseen.cuh), loaded with the walk's metadata
          const bool zkv = bwd_unseen_any(a.unseen, a.Hm, a.nblk, a.heads_per_kv,
                                          a.heads_per_mask, w.b, w.hk, w.n);
          sched.template start_walk<Bm, Bn>(a, w, g, m, partial, have);
          if (!have) continue;
          sched.producer_kv_acquire(ss, kvu);
          ++kvu;
          if (zkv)
            bwd_load_kv_zeroed<Elem, Bn, D>(tma_k, tma_v, mK, mV, sK, sV, ss.z, w.hk, w.b, w.n);
          else bwd_load_kv<Elem, Bn, D>(tma_k, tma_v, mK, mV, sK, sV, &ss.kv_full, w.hk, w.b, w.n);
          while (have) {
            const int h = w.hk * a.heads_per_kv + g;
            // the tile's empty-row flag (prep kernel), in flight under the stage's wait
            const int32_t zq = __ldg(a.tile_flags + ((int64_t)w.b * a.N + h) * a.mblk + m);
            Barrier::wait(&ss.empty[stage], phase ^ 1);  // first pass: the preceding phase, done
            auto [tQg, tQs, tdOg, tdOs] =
                bwd_q_do_views<Bm, D>(tma_q, tma_do, mQ, mdO, sQ, sdO, h, w.b);
            // lock-step: the next kept tile first, so that this one's slot says if it is the last
            int gn = g, mn = m;
            bool pn = false, more = false;
            if constexpr (T::kLockstep) {
              more = next_kept(w, gn, mn, pn);
              const int info = g | (partial ? 1 << 30 : 0) | (more ? 0 : (int)(1u << 31));
              asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(
                               cute::cast_smem_ptr_to_uint(&tinfo[stage])), "r"(m), "r"(info)
                           : "memory");
            }
            if constexpr (kRot) {
              if (on_clock) bwd_walk_clock_tick(a);
            }
            float* rs = &ss.x.rs[stage][0][0];
            if (zq == 0)
              bwd_load_q_do<Elem, Bm, D>(a, tma_q, tma_do, tQg, tQs, tdOg, tdOs, rs,
                                         &ss.full[stage], w.b, h, m, stage);
            else  // fully masked rows: their Q / dO zeroed first (unseen.cuh)
              bwd_load_q_do_zeroed<Elem, Bm, D>(a, tma_q, tma_do, tQg, tQs, tdOg, tdOs, rs, ss.z,
                                                w.b, h, m, stage);
            if (++stage == S) { stage = 0; phase ^= 1; }
            if constexpr (T::kLockstep) {
              g = gn;
              m = mn;
              partial = pn;
              have = more;
            } else {
              have = next_kept(w, g, m, partial);
            }
          }
        }
        bwd_zero_stop(ss.z);
      }
    } else if (warp == 1) {
      // dQ writer; with Sched::kWriterTakesItems also the item's skip marks (deterministic mode)
      int buf = 0, phase = 0;
      for (int it = 0;; ++it) {
        BwdItem w;
        if (!sched.writer_item(a, ss, it, lane, w)) break;
        if (Sched::kWriterTakesItems && a.deterministic)
          bwd_mark_skipped<Bm>(a, w.b, w.hk, w.n, w.slot, lane);
        sched.template start_walk<Bm, Bn>(a, w, g, m, partial, have);
        // look-ahead zeroing: this unit's rows are zero before the first reduce (the wait ends
        // long before the first dQ tile: the CTAs it waits for were launched before this one)
        if (Sched::kZeroAhead && have && a.zero_count != nullptr)
          bwd_wait_zeroed(a, bwd_zero_unit<T>(a));
        while (have) {
          const int h = w.hk * a.heads_per_kv + g;
          bwd_write_dq_tile<Bm, D>(a, ss, w.b, h, m, w.slot, lane, buf, phase);
          if (++buf == T::kDqBufs) { buf = 0; phase ^= 1; }
          have = next_kept(w, g, m, partial);
        }
      }
      if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    } else if (warp == 2) {
      // the zero warp (unseen.cuh), after the deterministic mode's skip marks
      if (!Sched::kWriterTakesItems && a.deterministic)
        bwd_mark_skipped<Bm>(a, b, hk, n, slot, lane);
      bwd_zero_warp<Bm, Bn, D>(a, ss, sQ, sdO, sK, sV, &ss.x.rs[0][0][0], lane);
    } else if (Sched::kZeroAhead && a.zero_count != nullptr) {  // warp 3
      bwd_zero_next_unit<D>(a, bwd_zero_unit<T>(a), lane);
    }
    return;
  }

  // ------------------------------------------------------------------------------- consumers
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int ctid = tid - 128;
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dO.begin()), typename T::SmemLayoutQt{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutKt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds.begin()), typename T::SmemLayoutdS{});

  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmadKV mma_dkv;
  typename T::TiledMmadQ mma_dq;
  const int slice_tid =
      T::kUniformSlices ? 128 * (cutlass::canonical_warp_group_idx() - 1) : ctid;
  auto thr_sdp = mma_sdp.get_thread_slice(slice_tid);
  auto thr_dkv = mma_dkv.get_thread_slice(slice_tid);
  auto thr_dq = mma_dq.get_thread_slice(T::kDqWG == T::NWG ? slice_tid : slice_tid % 128);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);
  // dQ GEMM operands: A = dS (buffer mode last), B = K^T; kDqTrans: A = K^T, B = dS
  Tensor tdQrdS = [&] {
    if constexpr (T::kDqTrans) return thr_dq.partition_fragment_B(sdS);
    else return thr_dq.partition_fragment_A(sdS);
  }();
  Tensor tdQrK = [&] {
    if constexpr (T::kDqTrans) return thr_dq.partition_fragment_A(sKt);
    else return thr_dq.partition_fragment_B(sKt);
  }();
  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdQrdQ = partition_fragment_C(
      mma_dq, std::conditional_t<T::kDqTrans, Shape<Int<D>, Int<Bm>>, Shape<Int<Bm>, Int<D>>>{});
  Tensor tPrP = make_tensor<Elem>(partition_shape_A(mma_dkv, Shape<Int<Bn>, Int<Bm>>{}));
  Tensor tPrdS = make_tensor<Elem>(partition_shape_A(mma_dkv, Shape<Int<Bn>, Int<Bm>>{}));
  const int wg = T::kUniformSlices ? cutlass::canonical_warp_group_idx() - 1 : ctid / 128;
  const int row_base = 16 * ((ctid / 32) % 4) + lane / 4;
  const int col_base = 2 * (lane % 4);
  const bool dq_store = T::kDqWG == T::NWG || wg == 0;

  if constexpr (!kPersist) {
    clear(tdVrdV);
    clear(tdKrdK);
  }
  const float sl2 = a.scale_log2;
  const int key0 = n * Bn + 64 * wg + row_base, key1 = key0 + 8;  // single tile, kMaskRegs
  // T::kMaskRegs: LTS, LTE, UTS, UTE of key columns key0 / key1 for query head
  // g_bnd (-1: none loaded yet); a key column >= Sk holds [INT_MIN, INT_MAX): every row masked.
  int cbnd[2][4];
  int g_bnd = -1;

  // GEMM turns and the dQ hand-off as lambdas, so that they inline where the kernel's own code does
  auto turn_begin = [&]() { bwd_turn_begin(wg); };
  auto turn_end = [&](bool last) { bwd_turn_end(wg, last); };
  auto put_dq = [&](int buf, int par) {
    bwd_put_dq<T>(a, ss, tdQrdQ, ctid, dq_store, buf, par);
  };
  auto sdp_gemms = [&](int st) {
    wgmma_gemm<true, -1, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), tSrS);
    wgmma_gemm<true, -1, false>(mma_sdp, tSrV, tSrdO(_, _, _, st), tSrdP);
  };

  // Persistent scheduler: loop-carried state in one register (the consumers have none to spare:
  // the body needs all of its 240): bits 0-1 = items so far mod 4 (item slot, sched_full parity),
  // bits 2-3 = tiles so far mod 4 (tg: barrier slots / parities of the next tile), bit 4 = items
  // with tiles mod 2 (kv_full parity). The item's (n, hk, b) are read from its smem slot at each
  // use (BwdItemSlot: volatile ld.shared) instead of living in registers; the slot is released
  // (sched_empty) only after the item's epilogue so that the producer cannot overwrite it earlier.
  // Single tile: one pass, the item in registers (BwdItemRegs).
  uint32_t cs = 0;
  for (;;) {
    const int islot = cs & 1;
    const volatile int* item_slot = nullptr;
    if constexpr (kPersist) {
      pp_wait(&ss.x.sched_full[islot], (cs >> 1) & 1);
      item_slot = &ss.x.item[islot][0];
      if (item_slot[0] >= a.items_total) break;
    }
    const auto it = Sched::item_view(item_slot, n, hk, b);
    if constexpr (kPersist) {
      g = 0;
      m = 0;
      partial = false;
      have = bwd_find_kept<Bm, Bn>(a, it.b(), it.hk(), it.n(), g, m, partial);
      clear(tdVrdV);
      clear(tdKrdK);
    }
    if (have) {
      pp_wait(&ss.kv_full, kPersist ? (cs >> 4) & 1 : 0);
      if constexpr (kPersist) cs ^= 16u;
      if constexpr (!T::kLockstep) {
        if (wg == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 goes first
      }
      // Local tile t (global tg + t; tg = 0 on the single-tile scheduler) uses Q/dO stage, dS buffer
      // and dQ buffer (tg + t) % 2, with parity ((tg + t) / 2) % 2. No wgmma group is in flight
      // across the loop's back edge (ptxas would serialize them).
      int t = 0;
      while (true) {
        const int tg = kPersist ? (int)(cs >> 2) & 3 : 0;
        const int st = (tg + t) & 1, par = ((tg + t) >> 1) & 1;
        // ---- section t: dQ GEMM of tile t-2, S/dP GEMMs of tile t (lock-step: S/dP only, no
        // turn)
        if constexpr (!T::kLockstep) {
          turn_begin();
          if (t >= 2) {
            // both warpgroups stored their dS of tile t-2 before their previous section
            pp_wait(&ss.x.ds_full[st], par ^ 1);
            wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
            pp_arrive(&ss.x.ds_empty[st]);
            put_dq(st, par ^ 1);
          }
        }
        pp_wait(&ss.full[st], par);
        bool last = false;
        if constexpr (T::kLockstep) {  // this tile's (m, g, partial, last) from the TMA lane
          int im, ig;
          asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];\n"
                       : "=r"(im), "=r"(ig)
                       : "r"(cute::cast_smem_ptr_to_uint(&tinfo[st]))
                       : "memory");
          m = im;
          g = ig & 0x3fffffff;
          partial = (ig >> 30) & 1;
          last = ig < 0;
        }
        sdp_gemms(st);
        if constexpr (!T::kLockstep) turn_end(false);

        // ---- math of tile t (under the other warpgroup's section)
        int row_b, col_b, wg_b;
        asm volatile("mov.b32 %0, %1;" : "=r"(row_b) : "r"(row_base));
        asm volatile("mov.b32 %0, %1;" : "=r"(col_b) : "r"(col_base));
        asm volatile("mov.b32 %0, %1;" : "=r"(wg_b) : "r"(wg));
        const int h = it.hk() * a.heads_per_kv + g;
        const int ms = m * Bm;
        const float* l2s = &ss.x.rs[st][0][0];
        const float* dls = &ss.x.rs[st][1][0];

        int lts[2] = {0, 0}, lte[2] = {0, 0}, uts[2] = {0, 0}, ute[2] = {0, 0};
        bool koob[2] = {false, false};
        if (!T::kMaskRegs && partial) {  // the element test's column bounds
          const int kc0 = it.n() * Bn + 64 * wg + row_base;
          bwd_column_bounds(a, it.b(), h, kc0, kc0 + 8, lts, lte, uts, ute, koob);
        }
        uint32_t cmask[2] = {0u, 0u};  // kMaskRegs: element bits of the two key columns
        if constexpr (T::kMaskRegs) {
          if (partial) {
            // 80-row tiles: reloaded on every partial tile (8 loads under the S / dP GEMMs), so that
            // the bounds are not live across the loop (9 registers it does not have at Bm = 80)
            if (T::kDqTrans || g != g_bnd) {  // first partial tile of this query head: its mask head's bounds
              g_bnd = g;
              const int hm = h / a.heads_per_mask;
              const int32_t* bnd = a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
              CUTE_UNROLL
              for (int i = 0; i < 2; ++i) {
                const int j = i == 0 ? key0 : key1;
                const bool in = j < a.Sk;
                const int jj = in ? j : 0;
                CUTE_UNROLL
                for (int c = 0; c < 4; ++c) {
                  const int v = __ldg(bnd + c * (int64_t)a.Sk + jj);
                  cbnd[i][c] = in ? v : (c == 0 ? INT_MIN : c == 1 ? INT_MAX : 0);
                }
              }
            }
            // under the S / dP GEMMs (before their wait)
            CUTE_UNROLL
            for (int i = 0; i < 2; ++i)
              cmask[i] = bwd_col_mask<Bm>(cbnd[i][0], cbnd[i][1], cbnd[i][2], cbnd[i][3], ms + col_b);
          }
        }

        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        // P^T = exp2(S^T * scale * log2(e) - lse2), zero where masked. kMaskRegs: one loop
        // per case (no per-element test of `partial`), the masked one tests one bit per element.
        auto exp_tile = [&](auto masked_c) {
          bwd_exp_tile<Bm, decltype(masked_c)::value, !T::kMaskRegs, decltype(tSrS), T::kSoftCap>(
              tSrS, l2s, col_b, sl2, ms, partial, cmask, lts, lte, uts, ute, koob,
              a.softcap_prescale);
        };
        if constexpr (T::kMaskRegs) {
          if (partial) exp_tile(std::true_type{});
          else exp_tile(std::false_type{});
        } else {
          bwd_exp_tile<Bm, false, true, decltype(tSrS), T::kSoftCap>(
              tSrS, l2s, col_b, sl2, ms, partial, cmask, lts, lte, uts, ute, koob,
              a.softcap_prescale);
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrdP);
        bwd_p_ds<Elem, Bm, decltype(tSrS), decltype(tPrP), T::kSoftCap>(
            tSrS, tSrdP, dls, col_b, tPrP, tPrdS, l2s, a.softcap_inv_sl2);
        if constexpr (!T::kLockstep) {
          bwd_dkv_pingpong<Elem>(ss, mma_dkv, tPrP, tPrdS, tdVrdO, tdKrQ, tdVrdV, tdKrdK, sdS,
                                 64 * wg_b + (row_b & ~15), lane, st, par);

          ++m;
          have = bwd_find_kept<Bm, Bn>(a, it.b(), it.hk(), it.n(), g, m, partial);
          if (!have) break;
          ++t;
        } else {
          // Lock-step: dV, dQ and dK of tile t issued back to back, one group in flight
          // behind each wait. dS buffer st was last read by the dQ GEMMs of tile t-2, which both
          // warpgroups retired (wait<1> below) before they reached the dS barrier of tile t-1.
          wgmma_gemm<false, -1, true>(mma_dkv, tPrP, tdVrdO(_, _, _, st), tdVrdV);
          store_ds_tile<Elem>(sdS, tPrdS, 64 * wg_b + (row_b & ~15), lane, st);
          pp_fence_async_smem();
          asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both halves of dS(t) stored
          if constexpr (T::kDqTrans) {
            // kDqTrans: dV retired before the dQ GEMM is issued, so that P's 20 registers are
            // free while the dQ accumulator (40) and dS (20) are in flight: 188 + the rest, not 208.
            // Waited after the barrier: the barrier's wait runs under this warpgroup's dV GEMM,
            // and each warpgroup issues its dQ GEMM as soon as its own dV is done instead of after
            // the other warpgroup's (as it would with the wait before the barrier)
            warpgroup_wait<0>();
            warpgroup_fence_operand(tdVrdV);
            warpgroup_fence_operand(tPrP);
          }
          if constexpr (T::kDqTrans) wgmma_gemm<true, -1, false>(mma_dq, tdQrK, tdQrdS(_, _, _, st), tdQrdQ);
          else wgmma_gemm<true, -1, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
          if constexpr (!T::kDqTrans) {
            warpgroup_wait<1>();  // dV retired: P's registers are free
            warpgroup_fence_operand(tdVrdV);
            warpgroup_fence_operand(tPrP);
          }
          wgmma_gemm<false, -1, true>(mma_dkv, tPrdS, tdKrQ(_, _, _, st), tdKrdK);
          warpgroup_wait<1>();  // dQ retired (dK in flight)
          warpgroup_fence_operand(tdQrdQ);
          // one dQ buffer (80-row tiles): tile t is its use t (parity t % 2)
          put_dq(T::kDqBufs == 2 ? st : 0, T::kDqBufs == 2 ? par : (t & 1));
          warpgroup_wait<0>();
          warpgroup_fence_operand(tdKrdK);
          warpgroup_fence_operand(tPrdS);
          pp_arrive(&ss.empty[st]);  // this thread's reads of the Q / dO stage of tile t are done
          if (last) break;
          ++t;
        }
      }
      if constexpr (!T::kLockstep) {
        // ---- last section: dQ GEMMs of tiles t-1 and t
        turn_begin();
        CUTE_UNROLL
        for (int u = 1; u >= 0; --u) {
          const int tu = t - u;
          if (tu >= 0) {
            const int tg = kPersist ? (int)(cs >> 2) & 3 : 0;
            const int st = (tg + tu) & 1, par = ((tg + tu) >> 1) & 1;
            pp_wait(&ss.x.ds_full[st], par);
            wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
            // persistent: the buffer is rewritten by the next item (a single tile ends here)
            if constexpr (kPersist) pp_arrive(&ss.x.ds_empty[st]);
            put_dq(st, par);
          }
        }
        turn_end(true);
      }
      if constexpr (kPersist) {
        // every wgmma of this item has completed (the dQ GEMMs above wait): sK / sV may be reloaded
        pp_arrive(&ss.x.kv_empty);
        cs = (cs & ~12u) | ((cs + 4u * (uint32_t)(t + 1)) & 12u);  // tg += t + 1 (mod 4)
      }
    }

    if constexpr (!kPersist) {
      break;
    } else {
      Elem* dk = reinterpret_cast<Elem*>(a.dk);
      Elem* dv = reinterpret_cast<Elem*>(a.dv);
      const int en = it.n(), ehk = it.hk(), eb = it.b();
      CUTE_UNROLL
      for (int e = 0; e < size(tdKrdK); e += 2) {
        const int j = en * Bn + 64 * wg + row_base + 8 * ((e / 2) % 2);
        const int c = 8 * (e / 4) + col_base;
        if (j < a.Sk) {
          const int64_t off = (((int64_t)eb * a.Sk + j) * a.K + ehk) * D + c;
          cutlass::Array<Elem, 2> pk, pv;
          pk[0] = static_cast<Elem>(tdKrdK(e) * a.scale);
          pk[1] = static_cast<Elem>(tdKrdK(e + 1) * a.scale);
          pv[0] = static_cast<Elem>(tdVrdV(e));
          pv[1] = static_cast<Elem>(tdVrdV(e + 1));
          *reinterpret_cast<cutlass::Array<Elem, 2>*>(dk + off) = pk;
          *reinterpret_cast<cutlass::Array<Elem, 2>*>(dv + off) = pv;
        }
      }
      pp_arrive(&ss.x.sched_empty[islot]);  // item slot free (see cs above)
      cs = (cs & ~3u) | ((cs + 1u) & 3u);
    }
  }  // items

  if constexpr (!kPersist) {
    // dK / dV through shared memory (bwd_stage_rows): sK / sV are free once both warpgroups have
    // retired their last GEMMs (each waited for its own; the dQ GEMM of either reads all of sK)
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
    const int k0w = 64 * wg + (row_base & ~15);  // this warp's first key row
    bwd_stage_rows<Elem, D>(ss.k.begin(), tdKrdK, a.scale, k0w, lane);
    bwd_stage_rows<Elem, D>(ss.v.begin(), tdVrdV, 1.f, k0w, lane);
    // each warpgroup reads back only its own 64 rows
    if (wg == 0) asm volatile("bar.sync 4, 128;\n" ::: "memory");
    else asm volatile("bar.sync 5, 128;\n" ::: "memory");
    const int64_t row0 = ((int64_t)b * a.Sk + n * Bn + 64 * wg) * a.K + hk;  // (key, kv head) row
    const int rows = min(64, a.Sk - (n * Bn + 64 * wg));
    bwd_rows_to_global<Elem, D>(reinterpret_cast<Elem*>(a.dk), ss.k.begin(), row0, a.K, rows,
                                64 * wg, ctid % 128);
    bwd_rows_to_global<Elem, D>(reinterpret_cast<Elem*>(a.dv), ss.v.begin(), row0, a.K, rows,
                                64 * wg, ctid % 128);
  }
#endif
}

template <class T>
cudaError_t launch_bwd_impl(const BwdParams& p, cudaStream_t stream, const char** err) {
  using Elem = typename T::Elem;
  constexpr int D = T::D;
  BwdGeometry g;
  if (cudaError_t e = bwd_geometry<T>(p, g, err); e != cudaSuccess) return e;
  const int nblk = g.nblk, mblk = g.mblk, sq_pad = g.sq_pad, sem_words = g.sem_words;
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk, mblk);
  const int64_t items_total = (int64_t)nblk * p.K * p.B;
  if constexpr (T::kPersist) {  // the scheduler area with its key-block order
    if (p.meta_capacity < ml.orders) {
      if (err) *err = "flashmask sm90 backward: metadata workspace too small for the persistent grid";
      return cudaErrorInvalidValue;
    }
    if (items_total > INT32_MAX / 2) {
      if (err) *err = "flashmask sm90 backward: too many work items for the persistent grid";
      return cudaErrorInvalidValue;
    }
  }

  // Look-ahead zeroing (bwd_zero_unit): the pp kernel with bulk dQ reduces; its counters follow
  // the orders in the metadata workspace (without room for them: the prep kernel zeroes everything). Unit 0 is
  // zeroed here: one pair, or in deterministic launch groups the largest G the launch can take.
  const int pairs = p.K * p.B;
  const bool zero_ahead = !T::kPersist && p.meta_capacity >= ml.unseen;
  int unit0_pairs = 1;
  if constexpr (T::kDetGroups) {
    if (p.deterministic) unit0_pairs = std::min(pairs, kDetGroupPairs);
  }
  const size_t pair_floats = (size_t)(p.N / p.K) * sq_pad * D;
  cudaError_t e = bwd_prepare_workspaces<T>(
      p, mblk, sq_pad, sem_words, pair_floats * (zero_ahead ? (size_t)unit0_pairs : (size_t)pairs),
      stream);
  if (e != cudaSuccess) return e;
  int* zero_count = nullptr;
  if (zero_ahead) {
    zero_count = p.meta + ml.zero_count;
    e = cudaMemsetAsync(zero_count, 0, sizeof(int) * (size_t)pairs, stream);
    if (e != cudaSuccess) return e;
  }
  const auto tmas = bwd_tma_copies<T>(p);
  auto tma_q = std::get<0>(tmas), tma_do = std::get<1>(tmas);
  auto tma_k = std::get<2>(tmas), tma_v = std::get<3>(tmas);
  BwdArgs a = bwd_args(p, nblk, mblk, sq_pad, sem_words);
  a.items_total = (int)std::min<int64_t>(items_total, INT32_MAX);
  a.zero_count = zero_count;
  // clocked walks: the 80-row lock-step kernels (the others walk ascending)
  if (T::kLockstep && T::Bm == 80) bwd_set_clocked_walk(p, a, nblk, mblk, sq_pad, sizeof(Elem));

  dim3 grid(nblk, p.K, p.B);
  if constexpr (T::kDetGroups) {
    if (p.deterministic) {
      if (items_total > INT32_MAX) {
        if (err) *err = "flashmask sm90 backward: too many work items for the deterministic launch groups";
        return cudaErrorInvalidValue;
      }
      grid = dim3((unsigned)items_total, 1, 1);
      // The launch group size G and the pair's key-block order come from the block metadata, on
      // the device (sched[1], sched[2] and the orders; same stream, no host sync).
      static_assert(T::Bm == 80, "deterministic launch groups: the 80-row kernel only");
      if (p.meta_capacity < ml.zero_count) {
        if (err) *err = "flashmask sm90 backward: metadata workspace too small for the deterministic launch groups";
        return cudaErrorInvalidValue;
      }
      a.det_group = 0;
      a.det_perm = 1;
      a.sched = p.meta + ml.sched;
      e = bwd_det_group80_sm90(p.meta, a.sched, p.B, p.Hm, nblk, mblk, p.Sq, pairs,
                               kDetGroupPairs, true, stream);
      if (e != cudaSuccess) return e;
    }
  }
  if constexpr (!T::kDetGroups && !T::kPersist && T::Bm == 128) {  // d = 64, 128-row tiles
    if (p.deterministic) {
      e = bwd_launch_det_order(p, a, nblk, mblk, T::Bm, stream, err);
      if (e != cudaSuccess) return e;
    }
  }
  if constexpr (T::kPersist) {
    // L2 sections: as many (b, kv head) pairs as keep their Q + dO within ~24 MB (half an H200's
    // L2), so that the CTAs working on one section share the Q / dO tiles they stream.
    const int64_t head_bytes = (int64_t)a.heads_per_kv * p.Sq * D * 2 * (int64_t)sizeof(Elem);
    const int64_t heads = (int64_t)p.B * p.K;
    a.sec_heads = (int)std::max<int64_t>(1, std::min<int64_t>(heads, (24ll << 20) / std::max<int64_t>(head_bytes, 1)));
    a.sched = p.meta + ml.sched;
    // zeroes the counter and writes the key-block order (same stream: no host sync)
    e = bwd_sched_sm90(p.meta, a.sched, p.B, p.Hm, nblk, mblk, p.Sq, p.deterministic != 0, stream);
    if (e != cudaSuccess) return e;
    const int sms = bwd_device_attr(cudaDevAttrMultiProcessorCount, 132);
    const int ctas = std::max(1, sms - std::max(0, p.sm_margin));
    grid = dim3((unsigned)std::min<int64_t>(items_total, ctas), 1, 1);
  }
  using Sched = std::conditional_t<T::kPersist, BwdPersistentScheduler, BwdSingleTileScheduler>;
  return bwd_launch_and_convert<T>(&flashmask_bwd_kernel<T, Sched, decltype(tma_q), decltype(tma_k)>,
                                   grid, p, sq_pad, stream, a, tma_q, tma_do, tma_k, tma_v);
}

}  // namespace jfm::sm90
