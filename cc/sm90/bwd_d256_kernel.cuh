// FlashMask-3 backward for head dim 256 on Hopper (sm_90a). Same contract as the d = 64 / 128
// kernels of bwd_kernel.cuh (column parallel: one CTA per (key block, kv head, batch); the CTA
// walks the query heads of its GQA group and their non-skipped 64-row query tiles; element mask
// on partial tiles only; dK / dV reduced over the group in registers; dQ in fp32 through the
// dq_accum workspace (reduce-add, quad order), converted by bwd_convert_dq_sm90;
// deterministic mode orders the dQ adds of each query tile by descending key block through the
// same ordering bits), but with a different split of the work, because the d = 128 design does
// not fit: 64 keys x 256 columns of dK plus dV are 256 fp32 registers per thread of a warpgroup.
//
// Design (docs/decisions.md#bwd-d256-kernel):
//  * Bn = 64 keys per CTA (the block metadata is built at 64 too), Bm = 64 query rows per tile.
//    384 threads: a producer warpgroup (setmaxnreg 24: TMA warp, dQ-writer warp, skip-bit warp)
//    and two consumer warpgroups (240) that split the work by columns instead of by keys:
//  * S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries, contraction over d = 256): warpgroup w
//    computes the query columns [32w, 32w + 32) (m64n32k16 WGMMA, both operands from smem),
//    applies exp / the element mask / dS = P (dP - D) to its 64 x 32 slice and stores P^T and
//    dS^T (bf16, keys x queries, queries contiguous) to smem;
//  * once both slices are in smem (mbarrier pds_full), warpgroup w accumulates the d columns
//    [128w, 128w + 128): dV += P^T dO, dK += dS^T Q (m64n128k16, A = P^T / dS^T from smem,
//    B = dO / Q as MN-major views) -- 2 x 64 fp32 accumulator registers per thread -- and
//    dQ = dS K for its 128 columns (A = dS, the MN-major view of the stored dS^T; 64 registers);
//  * per tile and warpgroup: dQ, dV, dK GEMMs of tile t (192 accumulator registers in flight),
//    wait, the first half of the dQ reduce, the S / dP GEMMs of tile t+1 (issued once 32 dQ
//    registers are free), the second half of the dQ reduce under them, then the exp / dS math of
//    tile t+1. Every wgmma group is waited in the loop iteration that issued it (none in flight
//    across the back edge). P / dS are double buffered. (Issuing the S / dP GEMMs of tile t+1
//    before the dV / dK GEMMs of tile t is slower: its Q / dO load latency is exposed);
//  * dQ: each warpgroup reduce-adds its 64 x 128 fp32 half straight from registers into the
//    workspace (red.add.v4.f32, quad order) and hands the Q / dO stage back to the producer
//    as soon as its GEMMs of the tile are done. A 64 KB fp32 staging tile for a bulk reduce does
//    not fit beside K, V (64 KB), the 2-stage Q / dO ring (128 KB) and the P / dS buffers
//    (32 KB); staged over the dead Q / dO stage, it held that stage until the reduce had read it,
//    so the next tile's Q / dO had one tile's GEMMs to land in, and the consumers waited for it.
//    Deterministic mode still stages, because its ordered adds need the writer warp: once both
//    warpgroups' GEMMs of tile t are done (mbarrier `consumed`), warpgroup 0 writes its dQ half
//    over the Q tile, warpgroup 1 over the dO tile, and the dQ-writer warp reduces both in the
//    tile's turn and then hands the stage back.
// The fp32 workspace layout is the "quad order" (bwd_aux.cu, bwd_convert_quad_kernel): the
// fragment order of bwd_kernel.cuh with kDqCols = 128 (the two warpgroups split d), but with each
// thread's four elements of one row in 8-column groups 2kp and 2kp + 1 contiguous, so that one
// 16-byte reduce-add carries them.
// Contract: as bwd_kernel.cuh (dq / dk / dv of BwdParams, deterministic dQ by the ordered writer
//   of epilogue.cuh); sm_margin is not honoured (one CTA per work item).
// Synchronization: Q / dO ring full / empty (empty: 256 consumer arrivals, or the writer's one in
//   deterministic mode), pds_full / pds_empty (both P / dS slices stored / read); deterministic
//   mode: `consumed` (both warpgroups' GEMMs of a tile done: the stage is free for the dQ staging)
//   and dq_full of the staged halves.
// Knobs: BwdD256Traits<Elem> (traits.h).
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

template <class T, class TmaQ, class TmaK>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_bwd_d256_kernel(CUTE_GRID_CONSTANT BwdArgs const a, CUTE_GRID_CONSTANT TmaQ const tma_q,
                              CUTE_GRID_CONSTANT TmaQ const tma_do, CUTE_GRID_CONSTANT TmaK const tma_k,
                              CUTE_GRID_CONSTANT TmaK const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, S = T::Stages;
  using Storage = typename T::SharedStorage;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kConsumers = 128 * T::NWG;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);

  const int hk = blockIdx.y, b = blockIdx.z;
  // deterministic mode: the key block at launch position blockIdx.x, ordering slot nblk - 1 - x
  const int slot = a.deterministic ? a.nblk - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = a.deterministic ? bwd_det_key_block(a, b, hk, (int)blockIdx.x) : slot;
  const int tid = threadIdx.x;
  const int lane = tid % 32;

  if (tid == 0) {
    ss.walk_start = bwd_walk_start<Bm, Bn>(a, b, hk, n);  // one value for every role
    for (int s = 0; s < S; ++s) {
      Barrier::init(&ss.full[s], 1);
      // deterministic: the dQ writer hands the stage back once the dQ staged over it is read;
      // otherwise both consumer warpgroups do, once their GEMMs on it are done
      Barrier::init(&ss.empty[s], a.deterministic ? 1 : kConsumers);
      Barrier::init(&ss.consumed[s], kConsumers);
      Barrier::init(&ss.dq_full[s], kConsumers);
      Barrier::init(&ss.pds_full[s], kConsumers);
      Barrier::init(&ss.pds_empty[s], kConsumers);
    }
    Barrier::init(&ss.kv_full, 1);
    ss.z.init();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});

  // Every role walks the same tiles: ascending, or clocked from tile rot = ss.walk_start >= 0 (a
  // clocked walk keeps every tile, so bwd_find_kept gives (g, m) back with its partial flag, or
  // false past the last head).
  const int rot = ss.walk_start;
  int g = 0, m = max(rot, 0);
  bool partial = false;
  bool have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
  auto next_kept = [&]() {
    bwd_walk_advance(a, rot, g, m);
    return bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
  };

  if (tid < 128) {  // ---------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    const int warp = tid / 32;
    if (warp == 0) {
      if (lane == 0 && have) {
        Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mdO = tma_do.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        // K / V with the kv group's unseen columns zeroed where the block holds any (unseen.cuh)
        if (bwd_unseen_any(a.unseen, a.Hm, a.nblk, a.heads_per_kv, a.heads_per_mask, b, hk, n))
          bwd_load_kv_zeroed<Elem, Bn, D>(tma_k, tma_v, mK, mV, sK, sV, ss.z, hk, b, n);
        else
          bwd_load_kv<Elem, Bn, D>(tma_k, tma_v, mK, mV, sK, sV, &ss.kv_full, hk, b, n);
        int stage = 0, phase = 0;
        while (have) {
          const int h = hk * a.heads_per_kv + g;
          // the tile's empty-row flag (prep kernel), in flight under the stage's wait
          const int32_t zq = __ldg(a.tile_flags + ((int64_t)b * a.N + h) * a.mblk + m);
          Barrier::wait(&ss.empty[stage], phase ^ 1);  // first pass: the preceding phase, done
          auto [tQg, tQs, tdOg, tdOs] =
              bwd_q_do_views<Bm, D>(tma_q, tma_do, mQ, mdO, sQ, sdO, h, b);
          float* rs = &ss.rs[stage][0][0];
          if (zq == 0)
            bwd_load_q_do<Elem, Bm, D>(a, tma_q, tma_do, tQg, tQs, tdOg, tdOs, rs, &ss.full[stage],
                                       b, h, m, stage);
          else  // fully masked rows: their Q / dO zeroed first (unseen.cuh)
            bwd_load_q_do_zeroed<Elem, Bm, D>(a, tma_q, tma_do, tQg, tQs, tdOg, tdOs, rs, ss.z, b,
                                              h, m, stage);
          if (rot >= 0) bwd_walk_clock_tick(a);
          if (++stage == S) { stage = 0; phase ^= 1; }
          have = next_kept();
        }
      }
      if (lane == 0) bwd_zero_stop(ss.z);  // `have` is false here
    } else if (warp == 1) {
      // dQ writer (deterministic mode only): both halves of the tile's dQ, in order, then the
      // stage goes back
      int stage = 0, phase = 0;
      while (have && a.deterministic) {
        const int h = hk * a.heads_per_kv + g;
        const int64_t base = bwd_sem_word(a, b, h, m);
        const uint32_t first = bwd_order_first(a, base, slot, lane);
        float* gtile = bwd_dq_tile<Bm, D>(a, b, h, m);
        Barrier::wait(&ss.dq_full[stage], phase);
        bwd_wait_order(a, base, slot, lane, first);
        if (lane == 0) {
          const float* src0 = reinterpret_cast<const float*>(ss.q.begin() + stage * T::kStageElems);
          const float* src1 = reinterpret_cast<const float*>(ss.dO.begin() + stage * T::kStageElems);
          CUTE_UNROLL
          for (int w = 0; w < 2; ++w)
            asm volatile(
                "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                    gtile + w * T::kDqHalfFloats),
                "r"(cute::cast_smem_ptr_to_uint(w == 0 ? src0 : src1)),
                "r"((int)(T::kDqHalfFloats * sizeof(float)))
                : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
          // frees the stage (the producer may refill it) before the ordering bit's release
          bwd_finish_dq_reduce(a.dq_sem + base + slot / 32, 1u << (slot % 32), true,
                               &ss.empty[stage]);
        }
        __syncwarp();
        if (++stage == S) { stage = 0; phase ^= 1; }
        have = next_kept();
      }
      if (lane == 0 && a.deterministic) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    } else if (warp == 2) {
      if (a.deterministic) bwd_mark_skipped<Bm>(a, b, hk, n, slot, lane);
    } else {  // the zero warp (unseen.cuh)
      bwd_zero_warp<Bm, Bn, D>(a, ss, sQ, sdO, sK, sV, &ss.rs[0][0][0], lane);
    }
    return;
  }

  // ------------------------------------------------------------------------------- consumers
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int ctid = tid - 128;
  const int wg = ctid / 128;
  Tensor sPt = make_tensor(make_smem_ptr(ss.p.begin()), typename T::SmemLayoutPt{});
  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmadKV mma_dkv;
  typename T::TiledMmadQ mma_dq;
  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<Bm>, Int<D>>{});
  static_assert(decltype(size(tSrS))::value == 16 && decltype(size(tdVrdV))::value == 64 &&
                    decltype(size(tdQrdQ))::value == 64,
                "accumulator fragments: 64 x 32 and 64 x 128 per warpgroup");
  // Accumulator fragment element e of a warpgroup's 64 x N slice: row 16*warp + lane/4 +
  // 8*((e/2)%2), column 8*(e/4) + 2*(lane%4) + e%2 (the wgmma C layout, as in bwd_kernel.cuh).
  const int row_base = 16 * ((ctid / 32) % 4) + lane / 4;
  const int col_base = 2 * (lane % 4);

  clear(tdVrdV);
  clear(tdKrdK);
  const float sl2 = a.scale_log2;
  const int key0 = n * Bn + row_base, key1 = key0 + 8;

  // The GEMM operands are rebuilt from a laundered smem pointer at every issue: otherwise ptxas
  // keeps the 64-bit GMMA descriptors of every k-step (loop invariants: 16 per operand for the
  // d = 256 contraction) live across the tile loop and spills them.
  auto smem = [&](auto* p) {
    asm volatile("mov.b64 %0, %0;" : "+l"(p));
    return make_smem_ptr(p);
  };
  auto sdp_gemms = [&](int st) {  // two commit groups: S^T, then dP^T
    auto thr = mma_sdp.get_thread_slice(ctid);
    Tensor tK = thr.partition_fragment_A(make_tensor(smem(ss.k.begin()), typename T::SmemLayoutK{}));
    Tensor tQ = thr.partition_fragment_B(make_tensor(smem(ss.q.begin()), typename T::SmemLayoutQ{}));
    wgmma_gemm<true, -1, false>(mma_sdp, tK, tQ(_, _, _, st), tSrS);
    Tensor tV = thr.partition_fragment_A(make_tensor(smem(ss.v.begin()), typename T::SmemLayoutK{}));
    Tensor tdO = thr.partition_fragment_B(make_tensor(smem(ss.dO.begin()), typename T::SmemLayoutQ{}));
    wgmma_gemm<true, -1, false>(mma_sdp, tV, tdO(_, _, _, st), tSrdP);
  };
  auto dkv_gemms = [&](int st) {  // two commit groups: dV, then dK (P / dS buffer = stage index)
    auto thr = mma_dkv.get_thread_slice(ctid);
    Tensor tP = thr.partition_fragment_A(make_tensor(smem(ss.p.begin()), typename T::SmemLayoutPt{}));
    Tensor tdOt = thr.partition_fragment_B(make_tensor(smem(ss.dO.begin()), typename T::SmemLayoutQt{}));
    wgmma_gemm<false, -1, false>(mma_dkv, tP(_, _, _, st), tdOt(_, _, _, st), tdVrdV);
    Tensor tdS = thr.partition_fragment_A(make_tensor(smem(ss.ds.begin()), typename T::SmemLayoutPt{}));
    Tensor tQt = thr.partition_fragment_B(make_tensor(smem(ss.q.begin()), typename T::SmemLayoutQt{}));
    wgmma_gemm<false, -1, false>(mma_dkv, tdS(_, _, _, st), tQt(_, _, _, st), tdKrdK);
  };
  auto dq_gemm = [&](int st) {
    auto thr = mma_dq.get_thread_slice(ctid);
    Tensor tdS = thr.partition_fragment_A(make_tensor(smem(ss.ds.begin()), typename T::SmemLayoutdS{}));
    Tensor tKt = thr.partition_fragment_B(make_tensor(smem(ss.k.begin()), typename T::SmemLayoutKt{}));
    wgmma_gemm<true, -1, false>(mma_dq, tdS(_, _, _, st), tKt, tdQrdQ);
  };

  // Exp / mask / dS of the tile in stage (and P / dS buffer) st, (g, m, partial) = its position:
  // S^T and dP^T waited here (kWaitS / kWaitdP = wgmma groups that may stay in flight), P^T and
  // dS^T (bf16) stored to buffer st, published on pds_full[st].
  auto math = [&](auto wait_s, auto wait_dp, int st, int par) {
    int row_b, col_b, wg_b;
    asm volatile("mov.b32 %0, %1;" : "=r"(row_b) : "r"(row_base));
    asm volatile("mov.b32 %0, %1;" : "=r"(col_b) : "r"(col_base));
    asm volatile("mov.b32 %0, %1;" : "=r"(wg_b) : "r"(wg));
    const int h = hk * a.heads_per_kv + g;
    const int q0 = m * Bm + T::kQCols * wg_b + col_b;  // query of element e = q0 + 8*(e/4) + e%2
    const float* l2s = &ss.rs[st][0][T::kQCols * wg_b + col_b];
    const float* dls = &ss.rs[st][1][T::kQCols * wg_b + col_b];

    int lts[2] = {0, 0}, lte[2] = {0, 0}, uts[2] = {0, 0}, ute[2] = {0, 0};
    bool koob[2] = {false, false};
    if (partial) bwd_column_bounds(a, b, h, key0, key1, lts, lte, uts, ute, koob);

    warpgroup_wait<decltype(wait_s)::value>();
    warpgroup_fence_operand(tSrS);
    {
      const uint32_t cmask[2] = {0u, 0u};  // no mask bits: the element test
      bwd_exp_tile<T::kQCols, false, true, decltype(tSrS), T::kSoftCap>(
          tSrS, l2s, 0, sl2, q0, partial, cmask, lts, lte, uts, ute, koob, a.softcap_prescale);
    }
    warpgroup_wait<decltype(wait_dp)::value>();
    warpgroup_fence_operand(tSrdP);
    uint32_t pk[T::kQCols / 8][2], dk[T::kQCols / 8][2];  // bf16 pairs (e, e + 1)
    CUTE_UNROLL
    for (int kk = 0; kk < T::kQCols / 8; ++kk) {
      const float2 dd = *reinterpret_cast<const float2*>(dls + 8 * kk);
      float2 l2 = make_float2(0.f, 0.f);
      if constexpr (T::kSoftCap) l2 = *reinterpret_cast<const float2*>(l2s + 8 * kk);
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int e = 4 * kk + 2 * i;
        const float p0 = tSrS(e), p1 = tSrS(e + 1);
        float d0 = p0 * (tSrdP(e) - dd.x), d1 = p1 * (tSrdP(e + 1) - dd.y);
        if constexpr (T::kSoftCap) {  // traits.h BwdSoftCap
          d0 *= softcap_dtanh(p0, l2.x, a.softcap_inv_sl2);
          d1 *= softcap_dtanh(p1, l2.y, a.softcap_inv_sl2);
        }
        // round to nearest, as static_cast<Elem> in the d = 64 / 128 kernels
        pk[kk][i] = (uint32_t)static_cast<Elem>(p0).raw() | ((uint32_t)static_cast<Elem>(p1).raw() << 16);
        dk[kk][i] = (uint32_t)static_cast<Elem>(d0).raw() | ((uint32_t)static_cast<Elem>(d1).raw() << 16);
      }
    }
    // buffer st was last read by the dV / dK / dQ GEMMs two tiles ago (both warpgroups)
    pp_wait(&ss.pds_empty[st], par ^ 1);
    // (key, query pair) = (row_b + 8i, 32*wg + 8kk + col_b): 4-byte aligned (col_b even; the
    // swizzle permutes 16-byte chunks), one 32-bit store per pair
    constexpr uint32_t kDsOff = (uint32_t)(cosize_v<typename T::SmemLayoutPt> * sizeof(Elem));
    static_assert(offsetof(Storage, ds) == offsetof(Storage, p) + kDsOff, "dS^T follows P^T");
    CUTE_UNROLL
    for (int kk = 0; kk < T::kQCols / 8; ++kk) {
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const uint32_t addr = cute::cast_smem_ptr_to_uint(
            raw_pointer_cast(&sPt(row_b + 8 * i, T::kQCols * wg_b + 8 * kk + col_b, st)));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pk[kk][i]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr + kDsOff), "r"(dk[kk][i]) : "memory");
      }
    }
    pp_fence_async_smem();
    pp_arrive(&ss.pds_full[st]);
  };

  // After this warpgroup's GEMMs of the tile in stage st completed. Deterministic: `consumed` (the
  // stage's Q / dO may be overwritten by dQ once both warpgroups arrived); otherwise the stage is
  // free for the producer.
  auto release_stage = [&](int st) {
    pp_arrive(a.deterministic ? &ss.consumed[st] : &ss.empty[st]);
  };
  // This warpgroup's dQ half of the tile in stage st, in the workspace's quad order, in two
  // halves (fragment elements [0, 32) and [32, 64)), so that the S / dP GEMMs of the next tile can
  // be issued in between: the registers of the first half are free by then.
  //  * default: reduce-added from registers (16-byte red.add: a thread's four elements of one row
  //    in two neighbouring 8-column groups are contiguous; a warp covers 512 contiguous bytes, half
  //    the reduce requests of pairs). Staging the tile in smem would hold its Q / dO stage until
  //    the reduce had read it, which leaves the next load one tile's GEMMs to land in
  //    (docs/decisions.md#bwd-d256-kernel);
  //  * deterministic: over the stage's Q (warpgroup 0) or dO (warpgroup 1) tile once both
  //    warpgroups are done with the stage, for the ordered writer warp.
  // gdq = the tile's dQ rows in dq_accum, offset by this warpgroup's half.
  auto write_dq_half = [&](auto half, int st, int par, float* gdq) {
    constexpr int kp0 = decltype(half)::value * 4;  // 16-column groups kp0 .. kp0 + 3
    int ctid_b;
    asm volatile("mov.b32 %0, %1;" : "=r"(ctid_b) : "r"(ctid));
    // float offset of the quad of (row half i, 16-column group kp) in a dQ half tile (the layout
    // bwd_convert_quad_kernel reads): elements 8kp + 2i + {0, 1} and 8kp + 4 + 2i + {0, 1}
    const int fb = ((ctid_b / 32) % 4) * 2 * T::kDqKK * 64 + 4 * (ctid_b % 32);
    auto quad_offset = [&](int kp, int i) { return fb + (i * (T::kDqKK / 2) + kp) * 128; };
    auto quad = [&](int kp, int i) {
      const int e = 8 * kp + 2 * i;
      return make_float4(tdQrdQ(e), tdQrdQ(e + 1), tdQrdQ(e + 4), tdQrdQ(e + 5));
    };
    if (!a.deterministic) {
      CUTE_UNROLL
      for (int kp = kp0; kp < kp0 + 4; ++kp) {
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          const float4 v = quad(kp, i);
          asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                           gdq + quad_offset(kp, i)),
                       "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                       : "memory");
        }
      }
      return;
    }
    if constexpr (kp0 == 0) pp_wait(&ss.consumed[st], par);
    float* dst = reinterpret_cast<float*>((ctid_b < 128 ? ss.q.begin() : ss.dO.begin()) +
                                          st * T::kStageElems);
    CUTE_UNROLL
    for (int kp = kp0; kp < kp0 + 4; ++kp) {
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) *reinterpret_cast<float4*>(dst + quad_offset(kp, i)) = quad(kp, i);
    }
    if constexpr (kp0 == 4) {
      pp_fence_async_smem();
      pp_arrive(&ss.dq_full[st]);
    }
  };
  auto write_dq = [&](int st, int par, float* gdq) {
    write_dq_half(Int<0>{}, st, par, gdq);
    write_dq_half(Int<1>{}, st, par, gdq);
  };
  // the dQ rows of the tile at (g, m) in dq_accum, offset by this warpgroup's half
  auto dq_rows = [&]() {
    return bwd_dq_tile<Bm, D>(a, b, hk * a.heads_per_kv + g, m) + wg * T::kDqHalfFloats;
  };
  auto gemms_done = [&]() {
    warpgroup_fence_operand(tdVrdV);
    warpgroup_fence_operand(tdKrdK);
    warpgroup_fence_operand(tdQrdQ);
  };

  if (have) {
    pp_wait(&ss.kv_full, 0);
    // Tile t uses Q / dO stage and P / dS buffer t % 2 with parity (t / 2) % 2.
    int t = 0;
    pp_wait(&ss.full[0], 0);
    sdp_gemms(0);
    math(Int<1>{}, Int<0>{}, 0, 0);
    float* gdq = dq_rows();  // of tile t
    bool next = next_kept();
    while (true) {
      const int st = t & 1, par = (t >> 1) & 1;
      const int st1 = st ^ 1, par1 = ((t + 1) >> 1) & 1;
      pp_wait(&ss.pds_full[st], par);  // both warpgroups' P^T / dS^T of tile t stored
      // dQ, dV, dK of tile t, the dQ store, then S / dP of tile t+1: the stage of tile t+1 had
      // tile t's GEMMs and dQ store to arrive (a stage is only freed once the dQ staged over it
      // has been read by its reduce). S / dP issued before the dQ store (dQ live under them:
      // 224 accumulator registers) made ptxas serialize every wgmma (C7512) and spill.
      dq_gemm(st);
      dkv_gemms(st);
      warpgroup_wait<0>();
      gemms_done();
      pp_arrive(&ss.pds_empty[st]);
      release_stage(st);
      if (!next) {
        write_dq(st, par, gdq);
        break;
      }
      write_dq_half(Int<0>{}, st, par, gdq);
      pp_wait(&ss.full[st1], par1);
      sdp_gemms(st1);
      write_dq_half(Int<1>{}, st, par, gdq);
      math(Int<1>{}, Int<0>{}, st1, par1);
      gdq = dq_rows();
      ++t;
      next = next_kept();
    }
  }

  // dK / dV: this warpgroup's kDCols d columns of the 64 keys, 16-byte chunks (store_row_chunks)
  Elem* dkp = reinterpret_cast<Elem*>(a.dk);
  Elem* dvp = reinterpret_cast<Elem*>(a.dv);
  CUTE_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int j = n * Bn + row_base + 8 * i;
    const int64_t off = (((int64_t)b * a.Sk + j) * a.K + hk) * D + T::kDCols * wg;
    store_row_chunks<Elem, T::kDCols>(j < a.Sk ? dkp + off : nullptr, tdKrdK, i, a.scale, lane);
    store_row_chunks<Elem, T::kDCols>(j < a.Sk ? dvp + off : nullptr, tdVrdV, i, 1.f, lane);
  }
#endif
}

template <class T>
cudaError_t launch_bwd_d256_impl(const BwdParams& p, cudaStream_t stream, const char** err) {
  if (p.d != T::D) {
    if (err) *err = "flashmask sm90 backward: launch_bwd_d256 called with d != 256";
    return cudaErrorInvalidValue;
  }
  BwdGeometry g;
  cudaError_t e = bwd_geometry<T>(p, g, err);
  if (e != cudaSuccess) return e;
  e = bwd_prepare_workspaces<T>(p, g.mblk, g.sq_pad, g.sem_words,
                                (size_t)p.B * p.N * g.sq_pad * T::D, stream);
  if (e != cudaSuccess) return e;
  const auto tmas = bwd_tma_copies<T>(p);
  auto tma_q = std::get<0>(tmas), tma_do = std::get<1>(tmas);
  auto tma_k = std::get<2>(tmas), tma_v = std::get<3>(tmas);
  BwdArgs a = bwd_args(p, g.nblk, g.mblk, g.sq_pad, g.sem_words);
  bwd_set_clocked_walk(p, a, g.nblk, g.mblk, g.sq_pad, sizeof(typename T::Elem));
  if (p.deterministic) {
    e = bwd_launch_det_order(p, a, g.nblk, g.mblk, T::Bm, stream, err);
    if (e != cudaSuccess) return e;
  }
  return bwd_launch_and_convert<T>(&flashmask_bwd_d256_kernel<T, decltype(tma_q), decltype(tma_k)>,
                                   dim3(g.nblk, p.K, p.B), p, g.sq_pad, stream,
                                   a, tma_q, tma_do, tma_k, tma_v);
}

}  // namespace jfm::sm90
