// FlashMask-3 backward for Hopper (sm_90a): column parallel, one CTA per (key block of Bn = 128
// keys, kv head, batch), two consumer warpgroups (64 keys each). The CTA walks the query heads of
// its GQA group and, for each, the Bm-row query tiles (64; 128 for variant 7) that the block
// metadata does not skip
// (element mask only on partial tiles). Q and dO tiles come by TMA into a 2-stage ring; K and V
// are loaded once. Per tile, all on WGMMA:
//   S^T  = K Q^T, dP^T = V dO^T           (64 x Bm per warpgroup, both operands from smem)
//   P^T  = exp2(S^T * scale*log2e - lse2), dS^T = P^T (dP^T - D)
//   dV  += P^T dO, dK += dS^T Q           (A = P^T / dS^T from registers, B = dO / Q from smem)
//   dQ   = dS K                           (dS through smem; the two warpgroups split d), then
//   the fp32 dQ tile (fragment order, see BwdTraits) -> smem -> one bulk reduce-add into the
//   dq_accum workspace (or float2 atomics, dq_mode 0), converted by bwd_aux.cu.
// dK and dV stay in registers over the whole walk and are written once (dK scaled).
// Kernel variants: 5 = flashmask_bwd_pp_kernel (one CTA per work item),
// 6 = flashmask_bwd_persist_kernel (the same per-item code on a persistent grid with a
// heaviest-first work-item scheduler; the only one that honours sm_margin) and 7 =
// flashmask_bwd_pp_kernel with 128-row query tiles (BwdTraits Bm_ = 128; d = 64 only, the default
// there: jax_flashmask/_cuda.py resolve_bwd_variant): per tile and warpgroup S^T / dP^T are
// 64 keys x 128 queries, dV / dK 64 x 64 over 128 queries, and the dQ GEMM is split between the
// warpgroups by query rows (no duplicated GEMM, unlike variant 5 at d = 64). Variants 1-4 (the
// 2026-11-29/30 steps towards 5: no warp specialization, warp specialization without ping-pong,
// ping-pong with generic-address dS stores, early dK issue) and 8 (5 with the dQ GEMM issued in
// the math, behind dK: equal to 5 on the H200) were measured and are gone: NOTES.md.
// Every kernel (variants 5, 6, 7 and the d = 256 kernel of bwd_d256_kernel.cuh) walks the kept
// query tiles of its key block with the O(1) walk of bwd_find_kept (at most three jumps over the
// skipped tiles; until 2026-12-01 variant 9, now the only walk: benchmarks/NOTES_bwd_walkall.md).
// Deterministic mode (BwdArgs::deterministic): dQ contributions to each query tile are added in
// descending key-block order, ordered through one bit per (query tile, key block) in dq_sem.
// Variants 14 / 15 (BwdDetGroups / BwdDetPipe): variant 5 with interleaved launch groups of (kv
// head, batch) pairs in deterministic mode, 15 also with a pipelined deterministic dQ writer
// (benchmarks/NOTES_bwd_det.md); bitwise variant 5's gradients. Variant 17 (BwdDetAuto, d = 128):
// variant 13 with 15's writer and 14's launch groups sized per launch from the block metadata.
//
// Written for jax_flashmask; layouts and GMMA/TMA primitives come from CuTe / CUTLASS headers.
#pragma once

#include "fwd_kernel.cuh"  // wgmma_gemm, fast_exp2, CuTe / CUTLASS includes
#include "bwd_launch.cuh"

#include <climits>
#include <tuple>
#include <type_traits>

namespace jfm::sm90 {

// Persist_ = false: kernel variant 5, flashmask_bwd_pp_kernel (one CTA per work item); true:
// variant 6, flashmask_bwd_persist_kernel (the same per-item code on a persistent grid).
// Bm_ = query rows per tile: kBwdBlockM (64) for variants 5 and 6; 128 for variant 7
// (flashmask_bwd_pp_kernel at d = 64 only: see kDqRowSplit).
template <class Elem_, int D_, bool Persist_ = false, int Bm_ = kBwdBlockM>
struct BwdTraits {
  using Elem = Elem_;
  static constexpr bool kPersist = Persist_;
  static constexpr int D = D_, Bm = Bm_, Bn = kBwdBlockN, NWG = 2;
  static constexpr int Stages = 2;
  static constexpr int kDsBufs = 2;  // dS tiles in smem
  static constexpr int kDqBufs = Bm_ == 80 ? 1 : 2;  // fp32 dQ tiles in smem
  static constexpr int kThreads = 128 * (NWG + 1);  // + the producer warpgroup
  static constexpr bool kMaskRegs = false;  // true: variants 10 / 11 (BwdMaskRegs)
  static constexpr bool kLockstep = false;  // true: variants 12 / 13 (BwdLockstep)
  static constexpr bool kDetGroups = false;  // true: variants 14 / 15 (BwdDetGroups)
  static constexpr bool kDetPipe = false;    // true: variants 15 (BwdDetPipe) and 17 (BwdDetAuto)
  static constexpr bool kDetAuto = false;    // true: variant 17 (BwdDetAuto)
  // Bm = 80 (variant 16, BwdRows80): dQ^T = K^T dS^T (keys on K, d on M: 64 d-rows per warpgroup,
  // the 80 query rows on N), one dQ buffer (the smem budget).
  static constexpr bool kDqTrans = Bm_ == 80;
  static_assert(D == 64 || D == 128, "backward compiled for head dims 64 and 128");
  static_assert(Bn == 64 * NWG, "one warpgroup per 64 keys");
  static_assert(Bm == kBwdBlockM || (Bm == 128 && D == 64 && !Persist_) ||
                    (Bm == 80 && D == 128 && !Persist_),
                "128-row query tiles: variant 7 (d = 64, one CTA per work item) only; 80-row: "
                "variant 16 (d = 128)");

  // Q / dO ring (Bm, D, Stages), K-major; their (D, Bm, Stages) MN-major views for dK / dV.
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<Bm>, Int<D>, Int<Stages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(Shape<Int<D>, Int<Bm>, Int<Stages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{}, Shape<Int<Bn>, Int<D>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<D>, Int<Bn>>{}, Step<_2, _1>{})));
  // dS (Bm queries, Bn keys), K-major (keys contiguous): A operand of dQ = dS K.
  using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                              Shape<Int<Bm>, Int<Bn>, Int<kDsBufs>>{}));

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, Int<Bm>, Int<D>>>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Elem, Elem, float, Shape<_64, Int<D>, Int<Bm>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));
  // dQ = dS K: for d = 128 (Bm = 64) the two warpgroups split d (64 columns each: one full
  // 128-byte swizzle atom of the MN-major K^T view). For d = 64 with Bm = 64 a split would cut
  // the swizzle atom in half, so both warpgroups run the same 64 x 64 GEMM and only warpgroup 0
  // stores it. With Bm = 128 (variant 7) they split the query rows instead (kDqRowSplit):
  // warpgroup w computes rows [64w, 64w + 64) x D over all Bn keys; nothing is duplicated.
  static constexpr bool kDqRowSplit = Bm == 2 * 64;
  static constexpr int kDqWG = (D >= 128 || kDqRowSplit) ? NWG : 1;
  // dQ tile layout in smem and in the fp32 workspace ("fragment order", one definition: see
  // dq_frag_offset in bwd_aux.cu, which reads it back): the tile is made of 64-row x kDqCols
  // slabs, slab wq = warpgroup wq's accumulator (columns [wq*kDqCols, ...) of a 64-row tile for
  // d = 128; rows [64*wq, 64*wq + 64) for Bm = 128), wq*64*kDqCols floats apart. Element (row r,
  // col c) of a slab sits at ((warp*2 + i)*kDqKK + kk)*64 + 2*lane + j with kk = c / 8,
  // j = c % 2, warp = r / 16, i = (r / 8) % 2, lane = 4*(r % 8) + (c % 8) / 2: the wgmma
  // accumulator fragment of each thread, lanes interleaved. Since kDqCols = D whenever the
  // slabs are row slabs, a 128-row tile is exactly two consecutive 64-row tiles of the Bm = 64
  // layout: the workspace layout and bwd_convert do not depend on Bm.
  // Variant 16 (kDqTrans, Bm = 80): the tile is the transposed dQ^T (d x Bm) in two 64-d-row
  // slabs, slab wq = warpgroup wq's accumulator (d rows [64*wq, 64*wq + 64), all Bm query
  // columns), wq*64*Bm floats apart, with the same formula over (slab row = d, column = query):
  // kDqCols = Bm, kDqKK = Bm / 8 (bwd_aux.cu dq80_frag_offset reads it back).
  static constexpr int kDqCols = kDqTrans ? Bm : kDqRowSplit ? D : D / kDqWG, kDqKK = kDqCols / 8;
  using DqAtomShape = std::conditional_t<
      kDqTrans, Shape<_64, Int<Bm>, Int<Bn>>,
      std::conditional_t<kDqRowSplit, Shape<_64, Int<D>, Int<Bn>>,
                         Shape<_64, Int<D / kDqWG>, Int<Bn>>>>;
  using DqWGLayout = std::conditional_t<kDqRowSplit || kDqTrans, Layout<Shape<Int<NWG>, _1, _1>>,
                                        Layout<Shape<_1, Int<kDqWG>, _1>>>;
  // dQ = dS K: A = dS (K-major), B = K^T (MN-major); dQ^T = K^T dS^T: A = K^T (MN-major), B = dS
  // (K-major: the same smem tile read as (Bm, Bn)).
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, DqAtomShape,
                           kDqTrans ? GMMA::Major::MN : GMMA::Major::K,
                           kDqTrans ? GMMA::Major::K : GMMA::Major::MN>(),
      DqWGLayout{}));

  // The tile's row statistics (lse2, D) by bulk copy with its Q / dO stage, and the mbarriers
  // of the dS tiles shared by the two consumer warpgroups.
  struct PPExtra {
    alignas(16) float rs[Stages][2][Bm];  // [stage][0] = lse * log2(e), [stage][1] = D
    alignas(8) uint64_t ds_full[kDsBufs];   // dS tile stored by all 256 consumer threads
    alignas(8) uint64_t ds_empty[kDsBufs];  // dQ GEMM on the dS tile done in both warpgroups
  };
  // Variant 6 extras: the item-id ring (producer -> consumers and dQ writer) and the K/V release.
  struct PersistExtra : PPExtra {
    alignas(8) uint64_t sched_full[2];   // item id of the slot published (1 arrival)
    alignas(8) uint64_t sched_empty[2];  // slot read by the 256 consumers + the dQ writer
    alignas(8) uint64_t kv_empty;        // last reads of sK / sV of the item done (256)
    int item[2][4];  // item id, then its key block n, kv head hk, batch b
  };
  using Extra = std::conditional_t<Persist_, PersistExtra, PPExtra>;

  struct SharedStorage {
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutQ>> dO;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> v;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutdS>> ds;
    alignas(128) float dq[kDqBufs][Bm * D];  // dQ tiles (fragment order) for the bulk reduce
    alignas(8) uint64_t full[Stages];  // Q + dO of a tile landed
    alignas(8) uint64_t empty[Stages];     // Q + dO stage read by both consumer warpgroups
    alignas(8) uint64_t dq_full[kDqBufs];  // dQ tile stored by the consumers
    alignas(8) uint64_t dq_empty[kDqBufs]; // dQ tile read by its bulk reduce
    alignas(8) uint64_t kv_full;       // K + V landed
    int64_t sem_prev;                  // deterministic: word of the tile whose bit is still owed
    Extra x;
    int walk_start;                    // variants 16 / 19 / 21: the clocked walk's first tile, -1: ascending
  };
};

// Variants 10 / 11: variant 5 / 7's kernel (flashmask_bwd_pp_kernel, Bm = 64 at d = 64 and 128 /
// Bm = 128 at d = 64) with the cheaper element mask of partial tiles: the bounds of a consumer
// thread's two key columns live in registers (loaded on the first partial tile of each query head,
// out-of-range key columns folded into them), and each partial tile turns them into one bit per
// element (bwd_col_mask, before the S wait) instead of ~10 instructions per element and 8 loads
// behind an integer division per tile. Same tiles, same products: results bit for bit those of
// variant 5 / 7 (benchmarks/NOTES_bwd_walkall.md).
template <class Base>
struct BwdMaskRegs : Base {
  static constexpr bool kMaskRegs = true;
};

// Variants 12 / 13 (d = 128, Bm = 64 only): variant 5 / 10's kernel with the two consumer
// warpgroups in lock-step instead of ping-pong, and each warpgroup's GEMMs of a tile kept in flight
// back to back (FlashAttention-3's Hopper backward order; benchmarks/NOTES_bwd_full.md). Per tile:
// S, dP issued; exp under dP; dS; dV issued; dS stored; one 256-thread named barrier (both halves
// of the dS tile stored); dQ issued; wait<1> (dV done); dK issued; wait<1> (dQ done); dQ tile to
// smem under dK; wait<0>. The dQ of a tile is computed in its own iteration (not two tiles
// later), no ds_full / ds_empty mbarriers, no GEMM turns, and no tile walk in the consumers: the
// TMA lane publishes each tile's (m, g, partial, last) with its Q/dO stage.
template <class Base>
struct BwdLockstep : Base {
  static constexpr bool kLockstep = true;
  static_assert(Base::D == 128 && (Base::Bm == 64 || Base::Bm == 80) && !Base::kPersist,
                "lock-step consumers: d = 128, 64- or 80-row tiles, one CTA per work item");
};

// Variant 16 (d = 128): variant 13 (BwdLockstep<BwdMaskRegs<...>>) with 80-row query tiles
// (BwdTraits Bm_ = 80; benchmarks/NOTES_bwd80.md). S^T / dP^T are 64 keys x 80 queries per
// warpgroup (N = 80), dV / dK reduce over K = 80 query rows, and the dQ GEMM is computed
// transposed, dQ^T = K^T dS^T: M = d (64 rows per warpgroup), N = 80 queries, K = 128 keys, A = K
// from smem read MN-major, B = the dS tile read K-major. The fp32 dQ^T tile goes to one smem buffer
// (40 KB; two would exceed the 227 KB of shared memory) in the kDqTrans fragment order, and
// bwd_aux.cu's 80-row converter reads it back. Same per-tile order as 13 over 80-row tiles; the
// dS tile is stored with stmatrix.trans (store_ds_tile_stsm).
template <class Elem, int D>
using BwdRows80 = BwdLockstep<BwdMaskRegs<BwdTraits<Elem, D, false, 80>>>;

// Variant 14: variant 5's kernel with another CTA launch order in deterministic mode (only there:
// in the default mode it is variant 5, launch and all). Variant 5's deterministic grid is
// (nblk, K, B) with the key blocks of one (kv head, batch) pair fastest, descending: the ~132
// CTAs that start together are the consecutive key blocks of one pair, i.e. whole documents of a
// document mask, and all of them start at the document's first query tile. There each one's dQ
// writer waits for the key block above it on every tile, so the j-th key block of a document
// starts its adds ~j writer latencies late and its SM idles meanwhile (the -25 % on document at
// 32K; benchmarks/NOTES_bwd_det.md, benchmarks/bwd_det_model.py). Variant 14 launches a 1-D grid
// in which groups of a.det_group (kv head, batch) pairs are interleaved: position x -> group
// x / (nblk * G), inside it key block nblk - 1 - r / gs descending and pair r % gs fastest (gs =
// the group's size, the last group may be smaller). Consecutive key blocks of one pair are then
// ~G launches apart, so a key block usually starts after the one above it is past the shared
// tiles. Same per-tile summation order (descending key block), so every gradient is bitwise
// variant 5's (dQ in deterministic mode too); same workspaces; deadlock-free for the same reason
// (a CTA only waits for key blocks above it of its own pair, all at lower grid positions).
constexpr int kDetGroupPairs = 8;  // variant 14's default G (the model's choice, NOTES_bwd_det.md)
template <class Base>
struct BwdDetGroups : Base {
  static constexpr bool kDetGroups = true;
  static_assert(!Base::kPersist, "one CTA per work item");
};

// Variant 15: variant 14 with a pipelined dQ writer in deterministic mode. Variant 5's writer,
// per tile: bits -> bulk reduce -> wait for its completion -> own bit -> buffer free, so one
// reduce's full L2 latency (plus the fences) is serial per tile, and when that exceeds the
// consumers' tile time the CTA runs at the writer's pace (the model's reading of the -15 % on
// full). Here the writer issues tile k's reduce, then waits until at most one bulk group is
// pending (tile k-1's complete), publishes tile k-1's bit and frees its buffer: the reduces of
// two tiles overlap (the two dQ buffers are both in flight). The per-tile order is unchanged (a
// reduce is still issued only after the bits of every key block above it are set, and those are
// set only after their reduces completed): bitwise variant 5's gradients. Deadlock-free: tile
// k-1's bit now also waits for tile k's bits, which come only from key blocks above (launched
// before). The later bit lengthens each chain link, so the interleaved launch of variant 14 is
// kept (benchmarks/NOTES_bwd_det.md: pipelined writer without it is worse on document). Since a
// buffer is now freed only once the next tile's dQ is stored, the consumers' last section stores
// the last tile in a turn of its own in this mode (the variant 15 hang: NOTES_bwd_det.md).
template <class Base>
struct BwdDetPipe : Base {
  static constexpr bool kDetPipe = true;
  static_assert(Base::kDetGroups && !Base::kLockstep, "variant 15 = variant 14 + pipelined writer");
};

// Variant 17 (d = 128): variant 13's kernel (lock-step consumers, element mask in registers) with,
// in deterministic mode only, variant 15's pipelined dQ writer and variant 14's interleaved launch
// of (kv head, batch) pairs, the group size G chosen on the device per launch by
// bwd_det_group_sm90 (bwd_aux.cu) from the block metadata: G = clamp(mblk / mean kept query tiles
// per key block, 1, kDetGroupPairs). Full / causal masks (long walks: every resident CTA of a pair
// streams the whole head, G = 1, variant 5's launch order, so the ~132 resident CTAs share one
// head's Q / dO / dQ in L2); short walks (documents, causal documents, windows) G = 8, so the key
// blocks of one document start ~8 launches apart and their ordered dQ chain does not wait
// (benchmarks/NOTES_bwd_det.md, "Variant 17"). The per-tile summation order is still descending
// key block and the GEMMs are variant 13's = 12's = 5's: gradients bitwise variant 5's in both
// modes (dQ in deterministic mode). Deadlock-free for every G (variant 14's argument), and the
// lock-step consumers store tile t's dQ in iteration t, so the pipelined writer's late buffer
// release cannot close the intra-CTA cycle of the variant 15 hang (benchmarks/bwd_det_protocol.py
// config v17). In the default mode it is variant 13, launch and all.
template <class Base>
struct BwdDetAuto : Base {
  static constexpr bool kDetGroups = true;
  static constexpr bool kDetPipe = true;
  static constexpr bool kDetAuto = true;
  static_assert(Base::kLockstep && Base::kMaskRegs, "variant 17 = variant 13 + deterministic order / writer");
};

// Variant 19 (d = 128): variant 16 (BwdRows80: lock-step consumers, 80-row query tiles, one dQ
// buffer, variant 5's serial deterministic writer) with, in deterministic mode only, variant 14's
// interleaved launch groups of (kv head, batch) pairs, G chosen per launch on the device by
// bwd_det_group80_sm90 (bwd_aux.cu) from the block metadata at 80-row tiles: G > 1 only for
// chains whose key blocks reach their shared query tiles together (documents, global rows: the
// key blocks start at the same tile) or in inverted order (causal blockwise: a document's top key
// block ends on the last document's rows, shared with every key block, with a shorter walk than
// the key block above it), capped so that the group's rows stay in L2 (bwd_aux.cu
// kDetGroupTileBudget). Elsewhere G = 1: variant 16's launch order, walk and all. The walk
// order and the per-tile summation order (descending key block) are 16's: every gradient bitwise
// variant 16's in deterministic mode (dK / dV in both modes); in the default mode it is variant
// 16, launch included. Deadlock-free as variant 14 (a CTA waits only for key blocks above it of
// its own pair, at lower grid positions). benchmarks/NOTES_detwalk.md.
// Variant 21 (d = 128): variant 19 whose pre-pass may also reorder a pair's key blocks. When the
// inverted-tails branch of the rule picks G (causal blockwise), bwd_det_group80_sm90 writes, per
// (batch, mask head), the key blocks in ascending kept-tile count, ties by descending key block,
// inside windows of 256 key blocks taken in descending order (bwd_aux.cu kDetOrderWindow: the L2)
// (sched[2] = 1, the order at sched + 4 + nblk). That order is then both the launch order of the
// pair's key blocks and the per-tile summation order of dQ: the key block at launch position i
// owns ordering bit ("slot") nblk - 1 - i, and adds to a tile after every slot above it. A key
// block's walk before the shared tail is its kept tiles minus the tail, so ascending kept count is
// the order in which the key blocks reach the last document's rows: the tail's chain then runs in
// arrival order instead of waiting, at every document boundary, for the longer walk of the key
// block above (NOTES_detwalk.md section 2; model 0.77 -> 0.86 of the default at 32K). Within a
// document the order is descending key block as before (a causal part: fewer tiles higher up).
// H200 s12: causal blockwise deterministic 19 -> 21: 8K 408 -> 418, 32K 405 -> 418, 128K 400 ->
// 411 TFLOP/s (NOTES.md "Session 12").
// Deadlock-free as variant 14: a CTA waits only for slots above its own, launched before it.
// dK / dV bitwise variant 16's (same walk); dQ deterministic, bitwise 19's when the pre-pass
// keeps the identity (every mask without inverted tails). No code of its own: BwdArgs::det_perm.
template <class Base>
struct BwdDetAuto80 : Base {
  static constexpr bool kDetGroups = true;
  static constexpr bool kDetAuto = true;  // G from sched[1] (bwd_det_group80_sm90); writer: 16's
  static_assert(Base::kLockstep && Base::kMaskRegs && Base::Bm == 80 && !Base::kDetPipe,
                "variant 19 = variant 16 + device-sized deterministic launch groups");
};

struct BwdArgs {
  const int32_t* bounds;
  const int32_t* meta;
  const float* lse2;   // [B, N, sq_pad]
  const float* delta;  // [B, N, sq_pad]
  float* dq_accum;     // [B, N, sq_pad, D]: a query tile's dQ is one contiguous block
  void* dk;
  void* dv;
  int B, Sq, Sk, N, K, Hm;
  int nblk, mblk, sq_pad;
  int heads_per_kv, heads_per_mask;
  float scale, scale_log2;
  int dq_bulk;  // 1: dQ tile -> smem -> one cp.reduce.async.bulk add; 0: float2 atomics
  // Deterministic mode: dq_sem [B, N, mblk, sem_words] holds one bit per (query tile, key block),
  // set once that key block's dQ contribution to the tile is complete in dq_accum (or at CTA start
  // when the key block skips the tile). A CTA adds its tile only after every key block above it
  // has its bit: contributions land in descending key-block order, the same on every run.
  int deterministic;
  uint32_t* dq_sem;
  int sem_words;
  // Variant 6 (persistent): sched[0] = item counter, sched[4 + r] = key block of rank r (see
  // flashmask_bwd_persist_kernel); items_total = nblk * K * B; sec_heads = (b, kv head) pairs per
  // L2 section of the item order.
  int* sched;
  int items_total;
  int sec_heads;
  // Variant 14, deterministic mode: (kv head, batch) pairs per interleaved launch group (>= 1).
  // Variant 17: 0 = the group size that bwd_det_group_sm90 wrote to sched[1] (>= 1).
  int det_group;
  // Variant 21 (deterministic): 1 = take the pair's launch / summation order from the pre-pass
  // when it wrote one (sched[2] = 1: sched[4 + nblk + (b * Hm + hm) * nblk + i] = the key block at
  // launch position i); 0 = descending key block (every other variant).
  int det_perm;
  // Look-ahead zeroing of dq_accum (bwd_zero_ahead below; nullptr = the prep kernel zeroes all of
  // it): one counter per launch unit, zeroed before the launch.
  int* zero_count;
  // Variants 16 / 19 / 21, default mode: 1 = clocked walks (bwd_group_skips_none), key block n from
  // tile r = (*walk_clock / walk_sms + n) mod mblk, walk_clock counting the tiles the clocked walks
  // issued so far (its start value is arbitrary); 0 = ascending (every other kernel,
  // deterministic mode).
  int walk_clocked;
  uint32_t* walk_clock;
  int walk_sms;
};

__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// First uint32 of the ordering bits of query tile m of head h (batch b).
__device__ __forceinline__ int64_t bwd_sem_word(const BwdArgs& a, int b, int h, int m) {
  return (((int64_t)b * a.N + h) * a.mblk + m) * a.sem_words;
}

// Deterministic mode, at CTA start (one warp): set this key block's bit (slot: its position in the
// summation order, n except for variant 21) in every query tile of the GQA group that it skips, so
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
// (s13: +4 % deterministic at 32K on top of bwd_finish_dq_reduce's early free).
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

// Query tiles [s, e) lying entirely inside rows [lo, hi): m * Bm >= lo and min(m * Bm + Bm, Sq)
// <= hi (bwd_sched_kernel's sched_inside, half-open; no overflow for any int lo, hi).
template <int Bm>
__device__ __forceinline__ void bwd_skip_range(int lo, int hi, int Sq, int mblk, int& s, int& e) {
  s = lo <= 0 ? 0 : (lo - 1) / Bm + 1;
  e = hi >= Sq ? mblk : max(hi, 0) / Bm;
}

// Advances (g, m) -- head g of the kv group, query tile m -- to the first tile at or after it that
// key block n does not skip (SPEC section 3 classification on the block metadata). Uniform over
// the CTA. Returns false when the walk is over. The tiles a key block skips are the union of two
// ranges, [s1, e1) (inside rows [LTSmax, LTEmin)) and [s2, e2) (inside [UTSmax, UTEmin)), so the
// next kept tile is at most three jumps away (the third when the second range ends inside the
// first): no loop over skipped tiles (a tile-by-tile scan cost every CTA a trip per query tile of
// its key block, 14-37 % of the masked backward: benchmarks/NOTES_bwd_partial.md). m is first
// tested as a kept tile, so a kept m costs no range arithmetic. benchmarks/bwd_mask_model.py
// --walk-check compares this walk with the scan (Bm 64 / 128, Bn 128 / 64).
template <int Bm, int Bn>
__device__ __forceinline__ bool bwd_find_kept(const BwdArgs& a, int b, int hk, int n, int& g,
                                              int& m, bool& partial) {
  const bool ragged = (n + 1) * Bn > a.Sk;
  for (; g < a.heads_per_kv; ++g, m = 0) {
    const int h = hk * a.heads_per_kv + g;
    const int hm = h / a.heads_per_mask;
    const int32_t* mt = a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)a.nblk + n;
    const int lts_mn = __ldg(mt + 0 * a.nblk), lts_mx = __ldg(mt + 1 * a.nblk);
    const int lte_mn = __ldg(mt + 2 * a.nblk), lte_mx = __ldg(mt + 3 * a.nblk);
    const int uts_mn = __ldg(mt + 4 * a.nblk), uts_mx = __ldg(mt + 5 * a.nblk);
    const int ute_mn = __ldg(mt + 6 * a.nblk), ute_mx = __ldg(mt + 7 * a.nblk);
    if (m >= a.mblk) continue;
    int ms = m * Bm, me = min(ms + Bm, a.Sq);
    if ((ms >= lts_mx && me <= lte_mn) || (ms >= uts_mx && me <= ute_mn)) {
      int s1, e1, s2, e2;  // m is skipped: jump
      bwd_skip_range<Bm>(lts_mx, lte_mn, a.Sq, a.mblk, s1, e1);
      bwd_skip_range<Bm>(uts_mx, ute_mn, a.Sq, a.mblk, s2, e2);
      if (m >= s1 && m < e1) m = e1;
      if (m >= s2 && m < e2) m = e2;
      if (m >= s1 && m < e1) m = e1;
      if (m >= a.mblk) continue;
      ms = m * Bm;
      me = min(ms + Bm, a.Sq);
    }
    partial = ragged || (ms < lte_mx && me > lts_mn) || (ms < ute_mx && me > uts_mn);
    return true;
  }
  return false;
}

// The clocked walk (variants 16 / 19 / 21 in the default mode, BwdArgs::walk_clocked): each head's
// tiles from tile r up, then from 0 up to r - 1, with r = (tiles issued so far / SMs + n) mod mblk,
// for key blocks that skip no tile of any head of their kv group (bwd_group_skips_none; all
// others walk ascending). Why: at 128K full (H = 32) the resident CTAs' Q / dO / dQ stream
// missed L2 (2 TB of DRAM traffic per kernel against 28 GB at 32K for a quarter of the work):
// CTAs start when their SM's previous one ends, so after many waves their walks are out of phase
// and the tiles in use span the whole head (131 MB against the 50 MB L2). The clocked start lets a
// CTA join where the running ones are (the clock advances one tile per SM-tile), one tile after
// its predecessor key block: 2 TB -> 68 GB and +12 % at 128K full (benchmarks/NOTES.md sessions
// 22-23). Masked key blocks walk ascending: their walks differ in length, so the clock is no
// phase for them, and ascending they ran 1-3 % faster than clocked.
template <int Bm, int Bn>
__device__ __forceinline__ bool bwd_group_skips_none(const BwdArgs& a, int b, int hk, int n) {
  const int hm_last = (hk * a.heads_per_kv + a.heads_per_kv - 1) / a.heads_per_mask;
  for (int hm = hk * a.heads_per_kv / a.heads_per_mask; hm <= hm_last; ++hm) {
    const int32_t* mt = a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)a.nblk + n;
    int s1, e1, s2, e2;  // bwd_find_kept's two skip ranges, both empty
    bwd_skip_range<Bm>(__ldg(mt + 1 * a.nblk), __ldg(mt + 2 * a.nblk), a.Sq, a.mblk, s1, e1);
    bwd_skip_range<Bm>(__ldg(mt + 5 * a.nblk), __ldg(mt + 6 * a.nblk), a.Sq, a.mblk, s2, e2);
    if (e1 > s1 || e2 > s2) return false;
  }
  return true;
}

// Bits [pos, pos + width) of a 32-bit word (bmsk.clamp: 0 for width 0 or pos >= 32; a range
// reaching past bit 31 ends there). pos, width >= 0.
__device__ __forceinline__ uint32_t bwd_bit_range(int pos, int width) {
  uint32_t r;
  asm("bmsk.clamp.b32 %0, %1, %2;" : "=r"(r) : "r"(pos), "r"(width));
  return r;
}

// A consumer thread's query columns in a tile are q = lo + 8*kk + j (kk < Bm/8, j < 2; lo = the
// tile's first row + col_base), element bit 2*kk + j: the number of them below x (any int x, no
// overflow: x is clamped into [lo, lo + Bm] first).
template <int Bm>
__device__ __forceinline__ int bwd_cols_below(int x, int lo) {
  const int y = min(max(x, lo), lo + Bm) - lo;
  return 2 * (y >> 3) + min(y & 7, 2);
}

// Variants 10 / 11: bit 2*kk + j set <=> query lo + 8*kk + j lies in [lts, lte) or [uts, ute), the
// element mask of one key column (the thread's columns are sorted, so each range is a run of
// bits). Equal, element by element, to `(lts <= q && q < lte) || (uts <= q && q < ute)`:
// benchmarks/bwd_mask_model.py --mask-check.
template <int Bm>
__device__ __forceinline__ uint32_t bwd_col_mask(int lts, int lte, int uts, int ute, int lo) {
  static_assert(2 * (Bm / 8) <= 32, "one bit per element of a key column");
  const int a1 = bwd_cols_below<Bm>(lts, lo), b1 = bwd_cols_below<Bm>(lte, lo);
  const int a2 = bwd_cols_below<Bm>(uts, lo), b2 = bwd_cols_below<Bm>(ute, lo);
  return bwd_bit_range(a1, max(b1 - a1, 0)) | bwd_bit_range(a2, max(b2 - a2, 0));
}

// Consumer hand-offs with "memory" clobbers, so that the compiler keeps the plain smem accesses
// (dS stores, row statistics and dQ-offset loads) on the right side of them (the CUTLASS barrier
// and proxy-fence wrappers carry no clobber).
__device__ __forceinline__ void pp_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cute::cast_smem_ptr_to_uint(bar))
               : "memory");
}
// Look-ahead zeroing of the fp32 dQ accumulator (BwdArgs::zero_count set; flashmask_bwd_pp_kernel).
// The CTAs launch in units whose dQ rows are one contiguous range of dq_accum: a (kv head, batch)
// pair (heads_per_kv heads of sq_pad rows), or in deterministic mode a launch group of G pairs.
// At CTA start the idle producer warp 3 of each CTA of unit u zeroes its slice of unit u + 1's
// range and counts itself in zero_count[u + 1] (release); the dQ writer of a CTA of unit u >= 1
// waits before its first reduce until zero_count[u] counts every CTA of unit u - 1 (acquire).
// The prep kernel zeroes unit 0 only. Why: the prep kernel's zeros went to HBM (2.2 GB per 128K
// tokens x 32 heads at d = 128) and the reduce-adds read them back; these are written into L2
// one unit ahead of their use. Deadlock-free: a CTA waits only for CTAs launched before it.
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
      if constexpr (T::kDetAuto) {
        if (G <= 0) G = __ldg(a.sched + 1);
      }
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
// the reconvergence point) the kernel hung in about half of the calls on the H200 (session 17; a
// lane-0-only sleep at the same place hung every call, without any zeroing). A standalone probe of
// that shape (benchmarks/probes/nanosleep_divergence.cu) never hung (session 18), so the cause is
// not understood; the warp-wide wait hung in none (benchmarks/NOTES.md, sessions 17-18).
__device__ __forceinline__ void bwd_wait_zeroed(const BwdArgs& a, const BwdZeroUnit& z) {
  if (z.u > 0) {
    const uint32_t* c = reinterpret_cast<const uint32_t*>(a.zero_count + z.u);
    while (ld_acquire_gpu(c) < (uint32_t)z.prev_span) __nanosleep(128);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ void pp_wait(uint64_t* bar, int parity) {
  cutlass::arch::ClusterTransactionBarrier::wait(bar, parity);
  asm volatile("" ::: "memory");
}
__device__ __forceinline__ void pp_fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
// consumers' store of the next dQ tile (s13).
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
// Variant 5: warp specialized, ping-pong consumers. 384 threads: warpgroup 0 = producer
// (setmaxnreg 24), warpgroups 1-2 = two consumer warpgroups of 64 keys each (setmaxnreg 240):
//   warp 0 (one lane): K/V once, then Q/dO (+ the tile's row statistics lse2 and D, by bulk copy
//     on the same `full` barrier) of every kept tile into the 2-stage ring; a stage is refilled
//     once both consumer warpgroups arrived on its `empty` barrier (after their last GEMM on it);
//   warp 1 (dQ writer): per tile, waits for the consumers' fp32 dQ tile in smem (`dq_full`, two
//     buffers), issues its bulk reduce-add (deterministic mode: after the ordering bits of the key
//     blocks above say so; then publishes its own bit), frees the buffer (`dq_empty`);
//   warp 2: deterministic mode only, marks the skipped tiles at CTA start.
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

// A consumer thread's share of its dS^T fragment into the dS tile (queries x keys, K-major, 128B
// swizzle) on 32-bit shared addresses: 4 swizzled bases per thread (one per (key half, query
// parity)); the 8 query-row groups of 8 are +1,024 bytes each (the swizzle only sees the row
// within a group of 8: checked on the host for every (q, k, stage) of both SmemLayoutdS
// instantiations, benchmarks/bwd_ds_addr_check.cu). Storing through the CuTe tensor rebuilds
// each element's 64-bit generic address (~340 integer instructions). q0 = the thread's first
// query column of the fragment, k0 = its first key row.
template <class Elem, class SdS, class Frag>
__device__ __forceinline__ void store_ds_tile(SdS& sdS, Frag const& tPrdS, int q0, int k0, int st) {
  // 8 query rows = one 8 x 64 swizzle atom further (the atoms of SmemLayoutdS stack along the
  // query mode first): 512 elements; host check: off(8, 0, 0) = 512, off(0, 0, 1) = 8192
  constexpr uint32_t kRows8 = 8 * 64 * sizeof(Elem);
  uint32_t dsb[2][2];
  CUTE_UNROLL
  for (int i = 0; i < 2; ++i)
    CUTE_UNROLL
    for (int c = 0; c < 2; ++c)
      dsb[i][c] = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&sdS(q0 + c, k0 + 8 * i, st)));
  CUTE_UNROLL
  for (int e = 0; e < size(tPrdS); ++e) {
    const uint32_t addr = dsb[(e / 2) % 2][e % 2] + (e / 4) * kRows8;
    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(tPrdS(e).raw()) : "memory");
  }
}

// store_ds_tile with stmatrix.trans (the 80-row lock-step body: variants 16 / 19 / 21): the same
// dS^T fragment with 5 STSM.x4.trans per thread instead of 40 STS.16, the same bits in smem
// (H200, s13: +3-4 % on the dense backward; the store sits between the dP wait and the dS barrier
// of both warpgroups, on every tile's critical path).
// The fragment's 8 x 8 blocks (keys x queries; register pair 2 * kk + i = keys 8i.., queries
// 8kk..) are the blocks stmatrix takes, and .trans stores each one as 8 query rows of 8
// contiguous keys (16 bytes: one swizzle chunk, never split by the 128B swizzle). Lane l of the
// warp gives the address of stored row l % 8 (a query) of block l / 8 = (key half (l / 8) % 2,
// query group 2p + l / 16); query groups of 8 are kRows8 apart as in store_ds_tile. Element (key
// a, query b) of a block lands at row b's address + 2a, the address store_ds_tile computes for
// it. k0w = the warp's first key row (64 * warpgroup + 16 * warp).
template <class Elem, class SdS, class Frag>
__device__ __forceinline__ void store_ds_tile_stsm(SdS& sdS, Frag const& tPrdS, int k0w, int lane,
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

// The pp kernel's dK / dV epilogue. A warp's accumulator fragment (rows k0w + 0..15 of the key
// block, d columns; element pairs at (row_base, 8 * cc + col_base)) goes as Elem 8 x 8 blocks
// with stmatrix into a row-major (key, d) staging tile whose 16-byte chunks are XOR-swizzled by
// key % 8, so that the 8 rows of a block and the 16 chunks of a row hit distinct banks;
// bwd_rows_to_global then writes whole rows with 16-byte stores. Before s13 each thread stored its
// fragment pairs directly (4-byte stores, half a sector each: 4x the L2 requests for the same bytes
// at the end of every CTA). k0w = the warp's first row (64 * warpgroup + 16 * warp).
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

// Deterministic mode: the key block at launch position r of pair (hk, b), whose ordering slot is
// nblk - 1 - r: the pre-pass's order when the launcher asked for it (BwdArgs::det_perm; variants
// 21, 7, 11 and the d = 256 kernel) and the pre-pass took it (sched[2]: inverted tails), else the
// descending key block nblk - 1 - r. A CTA waits only for the slots above its own, i.e. for
// positions launched before it, so any order is deadlock-free.
__device__ __forceinline__ int bwd_det_key_block(const BwdArgs& a, int b, int hk, int r) {
  if (a.det_perm && __ldg(a.sched + 2)) {
    const int hm = hk * a.heads_per_kv / a.heads_per_mask;
    return __ldg(a.sched + 4 + a.nblk + ((int64_t)b * a.Hm + hm) * a.nblk + r);
  }
  return a.nblk - 1 - r;
}

// (key block, kv head, batch, ordering slot) of this CTA of flashmask_bwd_pp_kernel; variant 14
// in deterministic mode: the interleaved 1-D launch order of BwdDetGroups; the other variants in
// deterministic mode: launch position blockIdx.x (bwd_det_key_block).
template <class T>
__device__ __forceinline__ int4 bwd_pp_item(const BwdArgs& a) {
  if constexpr (T::kDetGroups) {
    if (a.deterministic) {
      int G = a.det_group;
      if constexpr (T::kDetAuto) {
        if (G <= 0) G = __ldg(a.sched + 1);
      }
      const int pairs = a.K * a.B;
      const int64_t span = (int64_t)a.nblk * G;
      const int64_t x = blockIdx.x;
      const int grp = (int)(x / span);
      const int r = (int)(x - grp * span);
      const int p0 = grp * G, gs = min(G, pairs - p0);
      const int pr = p0 + r % gs;
      const int hk = pr % a.K, b = pr / a.K, slot = a.nblk - 1 - r / gs;
      return make_int4(bwd_det_key_block(a, b, hk, r / gs), hk, b, slot);
    }
  }
  const int hk = (int)blockIdx.y, b = (int)blockIdx.z, r = (int)blockIdx.x;
  if (a.deterministic) return make_int4(bwd_det_key_block(a, b, hk, r), hk, b, a.nblk - 1 - r);
  return make_int4(r, hk, b, r);
}

template <class T, class TmaQ, class TmaK>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_bwd_pp_kernel(CUTE_GRID_CONSTANT BwdArgs const a, CUTE_GRID_CONSTANT TmaQ const tma_q,
                            CUTE_GRID_CONSTANT TmaQ const tma_do, CUTE_GRID_CONSTANT TmaK const tma_k,
                            CUTE_GRID_CONSTANT TmaK const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, S = T::Stages;
  using Storage = typename T::SharedStorage;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static_assert((T::kDqBufs == 2 || (T::kDqBufs == 1 && T::kLockstep)) && T::kDsBufs == 2 && S == 2,
                "PP layout");
  constexpr int kConsumers = 128 * T::NWG;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);

  const int4 item = bwd_pp_item<T>(a);
  const int n = item.x, hk = item.y, b = item.z, slot = item.w;
  const int tid = threadIdx.x;
  const int lane = tid % 32;

  constexpr bool kRot = T::kLockstep && Bm == 80;
  if (tid == 0) {
    if constexpr (kRot) {
      // the clocked walk's first tile, one value for the TMA lane and the dQ writer
      ss.walk_start = -1;  // ascending, not on the clock
      if (a.walk_clocked && bwd_group_skips_none<Bm, Bn>(a, b, hk, n)) {
        const uint32_t r = ld_acquire_gpu(a.walk_clock) / (uint32_t)a.walk_sms;
        ss.walk_start = (int)((r + (uint32_t)n) % (uint32_t)a.mblk);
      }
    }
    for (int s = 0; s < S; ++s) {
      Barrier::init(&ss.full[s], 1);
      Barrier::init(&ss.empty[s], kConsumers);
      if (s < T::kDqBufs) {  // variant 16: one dQ buffer
        Barrier::init(&ss.dq_full[s], kConsumers);
        Barrier::init(&ss.dq_empty[s], 1);
      }
      if constexpr (!T::kLockstep) {
        Barrier::init(&ss.x.ds_full[s], kConsumers);
        Barrier::init(&ss.x.ds_empty[s], kConsumers);
      }
    }
    Barrier::init(&ss.kv_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});

  // The tile walk (the lock-step consumers read it from the TMA lane, the others walk it too):
  // ascending, or in variants 16 / 19 / 21 (80-row tiles) clocked from tile `rot` = ss.walk_start
  // >= 0. A clocked walk keeps every tile, so bwd_find_kept gives (g, m) back with its partial
  // flag, or false past the last head.
  int rot = -1;
  if constexpr (kRot) rot = ss.walk_start;
  int g = 0, m = max(rot, 0);
  bool partial = false;
  bool have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
  auto next_kept = [&](int& g_, int& m_, bool& partial_) {
    ++m_;
    if (kRot && rot >= 0) {
      if (m_ == a.mblk) m_ = 0;
      if (m_ == rot) ++g_;  // head g_ done: the next one from rot
    }
    return bwd_find_kept<Bm, Bn>(a, b, hk, n, g_, m_, partial_);
  };
  // Variants 12 / 13: the TMA lane publishes each tile's (m, g | partial << 30 | last << 31) in
  // slot [stage] before its `full` arrive (release; the consumers read it after their `full`
  // wait and before their `empty` arrive), so the consumers run no tile walk of their own. The
  // slots live in the dS mbarriers' storage, unused (not initialized) in these variants.
  static_assert(sizeof(ss.x.ds_full) >= S * sizeof(int2), "tile-info slots");
  int2* tinfo = reinterpret_cast<int2*>(&ss.x.ds_full[0]);

  if (tid < 128) {  // ---------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    const int warp = tid / 32;
    if (warp == 0) {
      if (lane == 0 && have) {
        // only clocked walks advance the clock: the phase it measures is theirs
        const bool on_clock = kRot && rot >= 0;
        Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mdO = tma_do.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
        Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
        auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
        auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
        Barrier::arrive_and_expect_tx(&ss.kv_full, 2 * Bn * D * sizeof(Elem));
        copy(tma_k.with(ss.kv_full), tKg, tKs);
        copy(tma_v.with(ss.kv_full), tVg, tVs);
        int stage = 0, phase = 0;
        while (have) {
          Barrier::wait(&ss.empty[stage], phase ^ 1);  // first pass: the preceding phase, done
          const int h = hk * a.heads_per_kv + g;
          Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
          Tensor gdO = local_tile(mdO(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
          auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                          group_modes<0, 2>(gQ));
          auto [tdOg, tdOs] = tma_partition(tma_do, Int<0>{}, Layout<_1>{},
                                            group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
          // variants 12 / 13: the next kept tile first, so that this one's slot says if it is the last
          int gn = g, mn = m;
          bool pn = false, more = false;
          if constexpr (T::kLockstep) {
            more = next_kept(gn, mn, pn);
            const int info = g | (partial ? 1 << 30 : 0) | (more ? 0 : (int)(1u << 31));
            asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(
                             cute::cast_smem_ptr_to_uint(&tinfo[stage])), "r"(m), "r"(info)
                         : "memory");
          }
          Barrier::arrive_and_expect_tx(&ss.full[stage],
                                        2 * Bm * D * sizeof(Elem) + 2 * Bm * sizeof(float));
          if constexpr (kRot) {
            if (on_clock) asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(a.walk_clock) : "memory");
          }
          copy(tma_q.with(ss.full[stage]), tQg(_, m), tQs(_, stage));
          copy(tma_do.with(ss.full[stage]), tdOg(_, m), tdOs(_, stage));
          // row statistics of the tile (rows padded to sq_pad: always in bounds; 256-byte aligned)
          const int64_t roff = ((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm;
          SM90_BULK_COPY_G2S::copy(a.lse2 + roff, &ss.full[stage], &ss.x.rs[stage][0][0],
                                   Bm * (int)sizeof(float));
          SM90_BULK_COPY_G2S::copy(a.delta + roff, &ss.full[stage], &ss.x.rs[stage][1][0],
                                   Bm * (int)sizeof(float));
          if (++stage == S) { stage = 0; phase ^= 1; }
          if constexpr (T::kLockstep) {
            g = gn;
            m = mn;
            partial = pn;
            have = more;
          } else {
            have = next_kept(g, m, partial);
          }
        }
      }
    } else if (warp == 1) {
      if (a.dq_bulk) {  // dQ writer
        int buf = 0, phase = 0;
        // variant 15, deterministic: ordering-bit word and buffer of the tile whose reduce is
        // still in flight (lane 0; -1: none)
        [[maybe_unused]] int64_t pend_word = -1;
        [[maybe_unused]] int pend_buf = 0;
        // look-ahead zeroing: this unit's rows are zero before the first reduce (the wait ends
        // long before the first dQ tile: the CTAs it waits for were launched before this one)
        if (have && a.zero_count != nullptr) bwd_wait_zeroed(a, bwd_zero_unit<T>(a));
        while (have) {
          const int h = hk * a.heads_per_kv + g;
          const int64_t base = bwd_sem_word(a, b, h, m);
          const uint32_t first = a.deterministic ? bwd_order_first(a, base, slot, lane) : 0u;
          float* gtile = a.dq_accum + (((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm) * D;
          Barrier::wait(&ss.dq_full[buf], phase);
          if (a.deterministic) bwd_wait_order(a, base, slot, lane, first);
          if (lane == 0) {
            bwd_issue_dq_reduce<Bm * D>(gtile, &ss.dq[buf][0]);
            if (T::kDetPipe && a.deterministic) {
              // variant 15: this tile's reduce is in flight; the previous tile's is complete once
              // at most one group is pending: publish its bit and free its buffer now
              if constexpr (T::kDetPipe) {
                if (pend_word >= 0) {
                  asm volatile("cp.async.bulk.wait_group 1;\n" ::: "memory");
                  // variant 17: the previous tile's reduce is complete, so it has read its smem
                  // buffer: free it before the fences of its bit (the lock-step consumers wait for
                  // it in the iteration that follows)
                  if constexpr (T::kDetAuto) Barrier::arrive(&ss.dq_empty[pend_buf]);
                  bwd_release_order_bit(a.dq_sem + pend_word, 1u << (slot % 32));
                  if constexpr (!T::kDetAuto) Barrier::arrive(&ss.dq_empty[pend_buf]);
                }
                pend_word = base + slot / 32;
                pend_buf = buf;
              }
            } else {
              bwd_finish_dq_reduce(a.dq_sem + base + slot / 32, 1u << (slot % 32), a.deterministic,
                                   &ss.dq_empty[buf]);
            }
          }
          __syncwarp();
          if (++buf == T::kDqBufs) { buf = 0; phase ^= 1; }
          have = next_kept(g, m, partial);
        }
        if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        if constexpr (T::kDetPipe) {
          if (lane == 0 && pend_word >= 0) {  // the last tile's bit (its buffer is not reused)
            bwd_release_order_bit(a.dq_sem + pend_word, 1u << (slot % 32));
            Barrier::arrive(&ss.dq_empty[pend_buf]);
          }
        }
      }
    } else if (warp == 2) {
      if (a.deterministic) bwd_mark_skipped<Bm>(a, b, hk, n, slot, lane);
    } else if (a.zero_count != nullptr) {  // warp 3
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
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto thr_dkv = mma_dkv.get_thread_slice(ctid);
  auto thr_dq = mma_dq.get_thread_slice(T::kDqWG == T::NWG ? ctid : ctid % 128);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);
  // dQ GEMM operands: A = dS (buffer mode last), B = K^T; variant 16 (kDqTrans): A = K^T, B = dS
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
  const int wg = ctid / 128;
  const int row_base = 16 * ((ctid / 32) % 4) + lane / 4;
  const int col_base = 2 * (lane % 4);
  const bool dq_store = T::kDqWG == T::NWG || wg == 0;

  clear(tdVrdV);
  clear(tdKrdK);
  const float sl2 = a.scale_log2;
  const int key0 = n * Bn + 64 * wg + row_base, key1 = key0 + 8;
  // Variants 10 / 11 (T::kMaskRegs): LTS, LTE, UTS, UTE of key columns key0 / key1 for query head
  // g_bnd (-1: none loaded yet); a key column >= Sk holds [INT_MIN, INT_MAX): every row masked.
  int cbnd[2][4];
  int g_bnd = -1;

  // Turn of this warpgroup to issue GEMMs (named barrier 1: warpgroup 0's turn, 2: warpgroup 1's).
  auto turn_begin = [&]() {
    if (wg == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    else asm volatile("bar.sync 2, 256;\n" ::: "memory");
  };
  auto turn_end = [&](bool last) {
    if (wg == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
    else if (!last) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  };
  auto sdp_gemms = [&](int st) {
    wgmma_gemm<true, -1, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), tSrS);
    wgmma_gemm<true, -1, false>(mma_sdp, tSrV, tSrdO(_, _, _, st), tSrdP);
  };
  // dQ tile of the dS in buffer `buf` (parity `par` of that buffer's use) -> the writer warp's
  // smem buffer `buf` (bulk mode) or float2 atomics at workspace offset `off` (dq_mode 0).
  auto put_dq = [&](int buf, int par, int64_t off) {
    int ctid_b;
    asm volatile("mov.b32 %0, %1;" : "=r"(ctid_b) : "r"(ctid));
    const int fb = (T::kDqWG == T::NWG ? ctid_b / 128 : 0) * 64 * T::kDqCols +
                   ((ctid_b / 32) % 4) * 2 * T::kDqKK * 64 + 2 * (ctid_b % 32);
    if (a.dq_bulk) {
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
    } else if (dq_store) {
      float* dqa = a.dq_accum + off;
      CUTE_UNROLL
      for (int e = 0; e < size(tdQrdQ); e += 2) {
        const int o = fb + (((e / 2) % 2) * T::kDqKK + e / 4) * 64;
        atomicAdd(reinterpret_cast<float2*>(dqa + o), make_float2(tdQrdQ(e), tdQrdQ(e + 1)));
      }
    }
  };

  if (have) {
    pp_wait(&ss.kv_full, 0);
    if constexpr (!T::kLockstep) {
      if (wg == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 goes first
    }
    // Tile t uses Q/dO stage, dS buffer and dQ buffer t % 2, with parity (t / 2) % 2. No wgmma
    // group is in flight across the loop's back edge (ptxas would serialize them).
    int t = 0;
    int lin1 = 0, lin2 = 0;  // dq_mode 0: workspace tile index ((b*N + h)*mblk + m) of tiles t-1, t-2
    while (true) {
      const int st = t & 1, par = (t >> 1) & 1;
      // ---- section t: dQ GEMM of tile t-2, S/dP GEMMs of tile t (variants 12 / 13: S/dP only,
      // no turn)
      if constexpr (!T::kLockstep) {
        turn_begin();
        if (t >= 2) {
          // both warpgroups stored their dS of tile t-2 before their previous section
          pp_wait(&ss.x.ds_full[st], par ^ 1);
          wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
          const int64_t off = (int64_t)lin2 * (Bm * D);
          pp_arrive(&ss.x.ds_empty[st]);
          put_dq(st, par ^ 1, off);
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
      const int h = hk * a.heads_per_kv + g;
      const int ms = m * Bm;
      const float* l2s = &ss.x.rs[st][0][0];
      const float* dls = &ss.x.rs[st][1][0];

      int lts[2] = {0, 0}, lte[2] = {0, 0}, uts[2] = {0, 0}, ute[2] = {0, 0};
      bool koob[2] = {false, false};
      if (!T::kMaskRegs && partial) {
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
      uint32_t cmask[2] = {0u, 0u};  // variants 10 / 11: element bits of the two key columns
      if constexpr (T::kMaskRegs) {
        if (partial) {
          // variant 16: reloaded on every partial tile (8 loads under the S / dP GEMMs), so that
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
      // P^T = exp2(S^T * scale * log2(e) - lse2), zero where masked. Variants 10 / 11: one loop
      // per case (no per-element test of `partial`), the masked one tests one bit per element.
      auto exp_tile = [&](auto masked_c) {
        constexpr bool kMasked = decltype(masked_c)::value;
        CUTE_UNROLL
        for (int kk = 0; kk < Bm / 8; ++kk) {
          const float2 l2 = *reinterpret_cast<const float2*>(l2s + 8 * kk + col_b);
          CUTE_UNROLL
          for (int i = 0; i < 2; ++i) {
            CUTE_UNROLL
            for (int j = 0; j < 2; ++j) {
              const int e = 4 * kk + 2 * i + j;
              float p = fast_exp2(fmaf(tSrS(e), sl2, -(j == 0 ? l2.x : l2.y)));
              if constexpr (kMasked) {
                if (cmask[i] & (1u << (2 * kk + j))) p = 0.f;
              } else if constexpr (!T::kMaskRegs) {
                if (partial) {
                  const int q = ms + 8 * kk + col_b + j;
                  const bool masked = koob[i] || (lts[i] <= q && q < lte[i]) || (uts[i] <= q && q < ute[i]);
                  if (masked) p = 0.f;
                }
              }
              tSrS(e) = p;
            }
          }
        }
      };
      if constexpr (T::kMaskRegs) {
        if (partial) exp_tile(std::true_type{});
        else exp_tile(std::false_type{});
      } else {
        exp_tile(std::false_type{});
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrdP);
      CUTE_UNROLL
      for (int kk = 0; kk < Bm / 8; ++kk) {
        const float2 dd = *reinterpret_cast<const float2*>(dls + 8 * kk + col_b);
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            const int e = 4 * kk + 2 * i + j;
            const float p = tSrS(e);
            const float ds = p * (tSrdP(e) - (j == 0 ? dd.x : dd.y));
            tPrP(e) = static_cast<Elem>(p);
            tPrdS(e) = static_cast<Elem>(ds);
          }
        }
      }
      if constexpr (!T::kLockstep) {
        wgmma_gemm<false, -1, true>(mma_dkv, tPrP, tdVrdO(_, _, _, st), tdVrdV);
        // dS buffer st was last read by the dQ GEMMs of tile t-2 (both warpgroups, in section t)
        pp_wait(&ss.x.ds_empty[st], par ^ 1);
        store_ds_tile<Elem>(sdS, tPrdS, col_b, 64 * wg_b + row_b, st);
        pp_fence_async_smem();
        pp_arrive(&ss.x.ds_full[st]);
        wgmma_gemm<false, -1, true>(mma_dkv, tPrdS, tdKrQ(_, _, _, st), tdKrdK);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdVrdV);
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tPrP);
        warpgroup_fence_operand(tPrdS);
        pp_arrive(&ss.empty[st]);  // this thread's reads of the Q / dO stage of tile t are done
        lin2 = lin1;
        lin1 = (b * a.N + h) * a.mblk + m;

        ++m;
        have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
        if (!have) break;
        ++t;
      } else {
        // Variants 12 / 13: dV, dQ and dK of tile t issued back to back, one group in flight
        // behind each wait. dS buffer st was last read by the dQ GEMMs of tile t-2, which both
        // warpgroups retired (wait<1> below) before they reached the dS barrier of tile t-1.
        wgmma_gemm<false, -1, true>(mma_dkv, tPrP, tdVrdO(_, _, _, st), tdVrdV);
        if constexpr (T::kDqTrans) store_ds_tile_stsm<Elem>(sdS, tPrdS, 64 * wg_b + (row_b & ~15), lane, st);
        else store_ds_tile<Elem>(sdS, tPrdS, col_b, 64 * wg_b + row_b, st);
        pp_fence_async_smem();
        asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both halves of dS(t) stored
        if constexpr (T::kDqTrans) {
          // variant 16: dV retired before the dQ GEMM is issued, so that P's 20 registers are
          // free while the dQ accumulator (40) and dS (20) are in flight: 188 + the rest, not 208.
          // Waited after the barrier (s12): the barrier's wait runs under this warpgroup's dV
          // GEMM, and each warpgroup issues its dQ GEMM as soon as its own dV is done instead of
          // after the other warpgroup's (before s12: wait, then barrier)
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
        // variant 16: one dQ buffer, tile t is its use t (parity t % 2)
        put_dq(T::kDqBufs == 2 ? st : 0, T::kDqBufs == 2 ? par : (t & 1),
               ((int64_t)(b * a.N + h) * a.mblk + m) * (Bm * D));
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
        if constexpr (T::kDetPipe) {
          // Variant 15, deterministic: tile t's dQ in a turn of its own (both warpgroups: same t).
          // Its put_dq waits for tile t-2's buffer, which the pipelined writer frees only after
          // issuing tile t-1's reduce, i.e. after both warpgroups stored tile t-1; in one turn,
          // warpgroup 0 would wait there while holding the turn warpgroup 1 needs to store tile
          // t-1: every CTA with three or more kept tiles hung (benchmarks/NOTES_bwd_det.md, "The
          // variant 15 hang"; benchmarks/bwd_det_protocol.py). One more turn in both warpgroups
          // keeps the named-barrier phases matched.
          if (u == 0 && a.deterministic && t >= 2) {
            turn_end(false);
            turn_begin();
          }
        }
        const int tu = t - u;
        if (tu >= 0) {
          const int st = tu & 1, par = (tu >> 1) & 1;
          pp_wait(&ss.x.ds_full[st], par);
          wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
          put_dq(st, par, (int64_t)(u == 1 ? lin2 : lin1) * (Bm * D));
        }
      }
      turn_end(true);
    }
  }

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
#endif
}


// ---------------------------------------------------------------------------------------------
// Variant 6: variant 5's kernel body on a persistent grid (num_SMs - sm_margin CTAs, at most one
// per work item). A work item is one (key block n, kv head hk, batch b), i.e. one CTA of variants
// 1-5. Item ids come from BwdArgs::sched: sched[0] is a global counter (zeroed by
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
//    on reading it). It then waits kv_empty (all 256
//    consumer threads past their last dQ GEMM of the item: the last reader of sK / sV) and
//    loads the next K/V, so the next item's K/V and first Q/dO tiles load under the current
//    item's dK/dV epilogue.
//  * Tile-indexed barriers (full/empty, ds_full/ds_empty, dq_full/dq_empty) and their parities
//    run on a tile count that continues across items (consumers: tg + local tile, tg kept mod 4
//    in a packed state register with the slot / kv parities; producer and
//    writer: their stage / buffer counters never reset). The last section of an item also
//    arrives on ds_empty (variant 5 skips it: the kernel ends there), so every use of a buffer
//    completes exactly one phase.
//  * The named-barrier turn-taking is balanced per item (warpgroup 1 pre-arrives, warpgroup 0
//    skips its last arrive), so it simply repeats.
//  * Deterministic mode: the dQ-writer warp marks the item's skipped tiles at item start, then
//    adds dQ in the ordered way of variant 5. Deadlock-free: items are handed out in increasing
//    id, and an item only waits for items of the same (b, head) with a larger key block, which
//    have smaller ids (descending key block within each section). The smallest unfinished id is
//    held by a running CTA whose earlier items are all done, and everything it waits for has a
//    smaller id, so it always progresses (no co-residency assumption needed).
struct BwdItem {
  int n, hk, b;
};
__device__ __forceinline__ BwdItem bwd_decode_item(const BwdArgs& a, int i) {
  const int heads = a.B * a.K;
  const int per_sec = a.sec_heads * a.nblk;
  const int sec = i / per_sec;
  const int h0 = sec * a.sec_heads;
  const int hs = min(a.sec_heads, heads - h0);
  const int j = i - sec * per_sec;
  const int r = j / hs;
  const int head = h0 + (j - r * hs);
  BwdItem w;
  w.n = a.sched[4 + r];
  w.hk = head % a.K;
  w.b = head / a.K;
  return w;
}

template <class T, class TmaQ, class TmaK>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_bwd_persist_kernel(CUTE_GRID_CONSTANT BwdArgs const a,
                                 CUTE_GRID_CONSTANT TmaQ const tma_q,
                                 CUTE_GRID_CONSTANT TmaQ const tma_do,
                                 CUTE_GRID_CONSTANT TmaK const tma_k,
                                 CUTE_GRID_CONSTANT TmaK const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, S = T::Stages;
  using Storage = typename T::SharedStorage;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static_assert(T::kPersist && T::kDqBufs == 2 && T::kDsBufs == 2 && S == 2,
                "PP layout");
  constexpr int kConsumers = 128 * T::NWG;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);

  const int tid = threadIdx.x;
  const int lane = tid % 32;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      Barrier::init(&ss.full[s], 1);
      Barrier::init(&ss.empty[s], kConsumers);
      Barrier::init(&ss.dq_full[s], kConsumers);
      Barrier::init(&ss.dq_empty[s], 1);
      Barrier::init(&ss.x.ds_full[s], kConsumers);
      Barrier::init(&ss.x.ds_empty[s], kConsumers);
      Barrier::init(&ss.x.sched_full[s], 1);
      Barrier::init(&ss.x.sched_empty[s], kConsumers + 1);
    }
    Barrier::init(&ss.kv_full, 1);
    Barrier::init(&ss.x.kv_empty, kConsumers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});

  // dQ-writer side of the item ring: id of item `it` (called once per item, in order; the
  // consumers read the slot directly, see `cs` below).
  auto next_item = [&](int it) {
    const int s = it & 1;
    pp_wait(&ss.x.sched_full[s], (it >> 1) & 1);
    return *reinterpret_cast<volatile int*>(&ss.x.item[s][0]);
  };

  if (tid < 128) {  // ---------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    const int warp = tid / 32;
    if (warp == 0) {
      if (lane == 0) {
        Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mdO = tma_do.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
        Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
        int stage = 0, phase = 0, kvu = 0;
        for (int it = 0;; ++it) {
          const int s = it & 1;
          Barrier::wait(&ss.x.sched_empty[s], ((it >> 1) & 1) ^ 1);  // slot read by all readers
          // every id, the first included, from the counter: ids go out in increasing order and
          // only to running CTAs (the deterministic mode's deadlock argument needs both)
          const int item = atomicAdd(a.sched, 1);
          BwdItem w{0, 0, 0};
          if (item < a.items_total) w = bwd_decode_item(a, item);
          volatile int* slot = &ss.x.item[s][0];
          slot[0] = item;
          slot[1] = w.n;
          slot[2] = w.hk;
          slot[3] = w.b;
          pp_arrive(&ss.x.sched_full[s]);  // release: the slot stores are visible to the waiters
          if (item >= a.items_total) break;
          const int n = w.n, hk = w.hk, b = w.b;
          int g = 0, m = 0;
          bool partial = false;
          bool have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
          if (!have) continue;
          // K / V of the previous item fully read (last dQ GEMM done in both warpgroups)
          if (kvu > 0) Barrier::wait(&ss.x.kv_empty, (kvu - 1) & 1);
          ++kvu;
          Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
          Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(n, 0));
          auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                          group_modes<0, 2>(gK));
          auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                          group_modes<0, 2>(gV));
          Barrier::arrive_and_expect_tx(&ss.kv_full, 2 * Bn * D * sizeof(Elem));
          copy(tma_k.with(ss.kv_full), tKg, tKs);
          copy(tma_v.with(ss.kv_full), tVg, tVs);
          while (have) {
            Barrier::wait(&ss.empty[stage], phase ^ 1);  // first pass: the preceding phase, done
            const int h = hk * a.heads_per_kv + g;
            Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
            Tensor gdO = local_tile(mdO(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(_, 0));
            auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                            group_modes<0, 2>(gQ));
            auto [tdOg, tdOs] = tma_partition(tma_do, Int<0>{}, Layout<_1>{},
                                              group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
            Barrier::arrive_and_expect_tx(&ss.full[stage],
                                          2 * Bm * D * sizeof(Elem) + 2 * Bm * sizeof(float));
            copy(tma_q.with(ss.full[stage]), tQg(_, m), tQs(_, stage));
            copy(tma_do.with(ss.full[stage]), tdOg(_, m), tdOs(_, stage));
            const int64_t roff = ((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm;
            SM90_BULK_COPY_G2S::copy(a.lse2 + roff, &ss.full[stage], &ss.x.rs[stage][0][0],
                                     Bm * (int)sizeof(float));
            SM90_BULK_COPY_G2S::copy(a.delta + roff, &ss.full[stage], &ss.x.rs[stage][1][0],
                                     Bm * (int)sizeof(float));
            if (++stage == S) { stage = 0; phase ^= 1; }
            ++m;
            have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
          }
        }
      }
    } else if (warp == 1) {
      // dQ writer (as variant 5) + deterministic skip marks, item by item; lane 0 releases the slot
      int buf = 0, phase = 0;
      for (int it = 0;; ++it) {
        const int item = next_item(it);
        __syncwarp();
        if (lane == 0) pp_arrive(&ss.x.sched_empty[it & 1]);
        if (item >= a.items_total) break;
        const BwdItem w = bwd_decode_item(a, item);
        const int n = w.n, hk = w.hk, b = w.b;
        if (a.deterministic) bwd_mark_skipped<Bm>(a, b, hk, n, n, lane);
        if (!a.dq_bulk) continue;
        int g = 0, m = 0;
        bool partial = false;
        bool have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
        while (have) {
          const int h = hk * a.heads_per_kv + g;
          const int64_t base = bwd_sem_word(a, b, h, m);
          const uint32_t first = a.deterministic ? bwd_order_first(a, base, n, lane) : 0u;
          float* gtile = a.dq_accum + (((int64_t)b * a.N + h) * a.sq_pad + (int64_t)m * Bm) * D;
          Barrier::wait(&ss.dq_full[buf], phase);
          if (a.deterministic) bwd_wait_order(a, base, n, lane, first);
          if (lane == 0) {
            bwd_issue_dq_reduce<Bm * D>(gtile, &ss.dq[buf][0]);
            bwd_finish_dq_reduce(a.dq_sem + base + n / 32, 1u << (n % 32), a.deterministic,
                                 &ss.dq_empty[buf]);
          }
          __syncwarp();
          if (++buf == 2) { buf = 0; phase ^= 1; }
          ++m;
          have = bwd_find_kept<Bm, Bn>(a, b, hk, n, g, m, partial);
        }
      }
      if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
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
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto thr_dkv = mma_dkv.get_thread_slice(ctid);
  auto thr_dq = mma_dq.get_thread_slice(T::kDqWG == T::NWG ? ctid : ctid % 128);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrK = thr_dq.partition_fragment_B(sKt);
  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<Bn>, Int<Bm>>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<Bn>, Int<D>>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<Bm>, Int<D>>{});
  Tensor tPrP = make_tensor<Elem>(partition_shape_A(mma_dkv, Shape<Int<Bn>, Int<Bm>>{}));
  Tensor tPrdS = make_tensor<Elem>(partition_shape_A(mma_dkv, Shape<Int<Bn>, Int<Bm>>{}));
  const int wg = ctid / 128;
  const int row_base = 16 * ((ctid / 32) % 4) + lane / 4;
  const int col_base = 2 * (lane % 4);
  const bool dq_store = T::kDqWG == T::NWG || wg == 0;

  const float sl2 = a.scale_log2;

  // Turn of this warpgroup to issue GEMMs (named barrier 1: warpgroup 0's turn, 2: warpgroup 1's).
  auto turn_begin = [&]() {
    if (wg == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    else asm volatile("bar.sync 2, 256;\n" ::: "memory");
  };
  auto turn_end = [&](bool last) {
    if (wg == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
    else if (!last) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  };
  auto sdp_gemms = [&](int st) {
    wgmma_gemm<true, -1, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), tSrS);
    wgmma_gemm<true, -1, false>(mma_sdp, tSrV, tSrdO(_, _, _, st), tSrdP);
  };
  // dQ tile of the dS in buffer `buf` (parity `par` of that buffer's use) -> the writer warp's
  // smem buffer `buf` (bulk mode) or float2 atomics at workspace offset `off` (dq_mode 0).
  auto put_dq = [&](int buf, int par, int64_t off) {
    int ctid_b;
    asm volatile("mov.b32 %0, %1;" : "=r"(ctid_b) : "r"(ctid));
    const int fb = (T::kDqWG == T::NWG ? ctid_b / 128 : 0) * 64 * T::kDqCols +
                   ((ctid_b / 32) % 4) * 2 * T::kDqKK * 64 + 2 * (ctid_b % 32);
    if (a.dq_bulk) {
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
    } else if (dq_store) {
      float* dqa = a.dq_accum + off;
      CUTE_UNROLL
      for (int e = 0; e < size(tdQrdQ); e += 2) {
        const int o = fb + (((e / 2) % 2) * T::kDqKK + e / 4) * 64;
        atomicAdd(reinterpret_cast<float2*>(dqa + o), make_float2(tdQrdQ(e), tdQrdQ(e + 1)));
      }
    }
  };

  // Loop-carried state in one register (the consumers have none to spare: variant 5 needs all of
  // its 240): bits 0-1 = items so far mod 4 (item slot, sched_full parity), bits 2-3 = tiles so
  // far mod 4 (tg: barrier slots / parities of the next tile), bit 4 = items with tiles mod 2
  // (kv_full parity). The item's (n, hk, b) are read from its smem slot at each use (volatile
  // ld.shared) instead of living in registers; the slot is released (sched_empty) only after the
  // item's epilogue so that the producer cannot overwrite it earlier.
  uint32_t cs = 0;
  for (;;) {
  const int islot = cs & 1;
  pp_wait(&ss.x.sched_full[islot], (cs >> 1) & 1);
  const volatile int* slot = &ss.x.item[islot][0];
  if (slot[0] >= a.items_total) break;
#define JFM_ITEM_N (slot[1])
#define JFM_ITEM_HK (slot[2])
#define JFM_ITEM_B (slot[3])
  int g = 0, m = 0;
  bool partial = false;
  bool have = bwd_find_kept<Bm, Bn>(a, JFM_ITEM_B, JFM_ITEM_HK, JFM_ITEM_N, g, m, partial);
  clear(tdVrdV);
  clear(tdKrdK);
  if (have) {
    pp_wait(&ss.kv_full, (cs >> 4) & 1);
    cs ^= 16u;
    if (wg == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 goes first
    // Local tile t (global tg + t) uses Q/dO stage, dS buffer and dQ buffer (tg + t) % 2, with
    // parity ((tg + t) / 2) % 2. No wgmma group is in flight across the loop's back edge.
    int t = 0;
    int lin1 = 0, lin2 = 0;  // dq_mode 0: workspace tile index ((b*N + h)*mblk + m) of tiles t-1, t-2
    while (true) {
      const int tg = (int)(cs >> 2) & 3;
      const int st = (tg + t) & 1, par = ((tg + t) >> 1) & 1;
      // ---- section t: dQ GEMM of tile t-2, S/dP GEMMs of tile t
      turn_begin();
      if (t >= 2) {
        // both warpgroups stored their dS of tile t-2 before their previous section
        pp_wait(&ss.x.ds_full[st], par ^ 1);
        wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
        const int64_t off = (int64_t)lin2 * (Bm * D);
        pp_arrive(&ss.x.ds_empty[st]);
        put_dq(st, par ^ 1, off);
      }
      pp_wait(&ss.full[st], par);
      sdp_gemms(st);
      turn_end(false);

      // ---- math of tile t (under the other warpgroup's section)
      int row_b, col_b, wg_b;
      asm volatile("mov.b32 %0, %1;" : "=r"(row_b) : "r"(row_base));
      asm volatile("mov.b32 %0, %1;" : "=r"(col_b) : "r"(col_base));
      asm volatile("mov.b32 %0, %1;" : "=r"(wg_b) : "r"(wg));
      const int h = JFM_ITEM_HK * a.heads_per_kv + g;
      const int ms = m * Bm;
      const float* l2s = &ss.x.rs[st][0][0];
      const float* dls = &ss.x.rs[st][1][0];

      int lts[2] = {0, 0}, lte[2] = {0, 0}, uts[2] = {0, 0}, ute[2] = {0, 0};
      bool koob[2] = {false, false};
      if (partial) {
        const int hm = h / a.heads_per_mask;
        const int32_t* bnd = a.bounds + ((int64_t)JFM_ITEM_B * a.Hm + hm) * 4 * (int64_t)a.Sk;
        const int key0 = JFM_ITEM_N * Bn + 64 * wg + row_base, key1 = key0 + 8;
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

      warpgroup_wait<1>();
      warpgroup_fence_operand(tSrS);
      CUTE_UNROLL
      for (int kk = 0; kk < Bm / 8; ++kk) {
        const float2 l2 = *reinterpret_cast<const float2*>(l2s + 8 * kk + col_b);
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            const int e = 4 * kk + 2 * i + j;
            float p = fast_exp2(fmaf(tSrS(e), sl2, -(j == 0 ? l2.x : l2.y)));
            if (partial) {
              const int q = ms + 8 * kk + col_b + j;
              const bool masked = koob[i] || (lts[i] <= q && q < lte[i]) || (uts[i] <= q && q < ute[i]);
              if (masked) p = 0.f;
            }
            tSrS(e) = p;
          }
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrdP);
      CUTE_UNROLL
      for (int kk = 0; kk < Bm / 8; ++kk) {
        const float2 dd = *reinterpret_cast<const float2*>(dls + 8 * kk + col_b);
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            const int e = 4 * kk + 2 * i + j;
            const float p = tSrS(e);
            const float ds = p * (tSrdP(e) - (j == 0 ? dd.x : dd.y));
            tPrP(e) = static_cast<Elem>(p);
            tPrdS(e) = static_cast<Elem>(ds);
          }
        }
      }
      wgmma_gemm<false, -1, true>(mma_dkv, tPrP, tdVrdO(_, _, _, st), tdVrdV);
      // dS buffer st was last read by the dQ GEMMs of tile t-2 (both warpgroups, in section t)
      pp_wait(&ss.x.ds_empty[st], par ^ 1);
      store_ds_tile<Elem>(sdS, tPrdS, col_b, 64 * wg_b + row_b, st);
      pp_fence_async_smem();
      pp_arrive(&ss.x.ds_full[st]);
      wgmma_gemm<false, -1, true>(mma_dkv, tPrdS, tdKrQ(_, _, _, st), tdKrdK);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tPrP);
      warpgroup_fence_operand(tPrdS);
      pp_arrive(&ss.empty[st]);  // this thread's reads of the Q / dO stage of tile t are done
      lin2 = lin1;
      lin1 = (JFM_ITEM_B * a.N + h) * a.mblk + m;

      ++m;
      have = bwd_find_kept<Bm, Bn>(a, JFM_ITEM_B, JFM_ITEM_HK, JFM_ITEM_N, g, m, partial);
      if (!have) break;
      ++t;
    }
    // ---- last section: dQ GEMMs of tiles t-1 and t
    turn_begin();
    CUTE_UNROLL
    for (int u = 1; u >= 0; --u) {
      const int tu = t - u;
      if (tu >= 0) {
        const int tg = (int)(cs >> 2) & 3;
        const int st = (tg + tu) & 1, par = ((tg + tu) >> 1) & 1;
        pp_wait(&ss.x.ds_full[st], par);
        wgmma_gemm<true, 0, false>(mma_dq, tdQrdS(_, _, _, st), tdQrK, tdQrdQ);
        pp_arrive(&ss.x.ds_empty[st]);  // (variant 5 ends here and skips it)
        put_dq(st, par, (int64_t)(u == 1 ? lin2 : lin1) * (Bm * D));
      }
    }
    turn_end(true);
    // every wgmma of this item has completed (the dQ GEMMs above wait): sK / sV may be reloaded
    pp_arrive(&ss.x.kv_empty);
    cs = (cs & ~12u) | ((cs + 4u * (uint32_t)(t + 1)) & 12u);  // tg += t + 1 (mod 4)
  }

  Elem* dk = reinterpret_cast<Elem*>(a.dk);
  Elem* dv = reinterpret_cast<Elem*>(a.dv);
  const int en = JFM_ITEM_N, ehk = JFM_ITEM_HK, eb = JFM_ITEM_B;
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
#undef JFM_ITEM_N
#undef JFM_ITEM_HK
#undef JFM_ITEM_B
  }  // items
#endif
}

// Host side shared by the backward launchers (launch_bwd_impl here, launch_bwd_d256_impl in
// bwd_d256_kernel.cuh). The workspaces the main kernel reads, in stream order: block metadata
// (at T::Bn keys), row statistics, the zeroed fp32 dQ accumulator (its first dq_zero_floats; all
// of it unless the main kernel zeroes ahead) and (deterministic) ordering bits.
template <class T>
cudaError_t bwd_prepare_workspaces(const BwdParams& p, int mblk, int sq_pad, int sem_words,
                                   size_t dq_zero_floats, cudaStream_t stream) {
  cudaError_t e = block_meta_sm90(p.bounds, p.meta, p.B, p.Hm, p.Sk, T::Bn, stream);
  if (e != cudaSuccess) return e;
  // row statistics and the zeros of the fp32 dQ accumulator [B, N, sq_pad, T::D] in one kernel
  e = bwd_prep_sm90(p, sq_pad, dq_zero_floats, stream);
  if (e != cudaSuccess) return e;
  if (p.deterministic)
    e = cudaMemsetAsync(p.dq_sem, 0, sizeof(uint32_t) * (size_t)p.B * p.N * mblk * sem_words, stream);
  return e;
}

// TMA descriptors of Q, dO ([Bm, D] boxes of T::SmemLayoutQ) and K, V ([Bn, D] boxes of
// T::SmemLayoutK), as a tuple (q, do, k, v).
template <class T>
auto bwd_tma_copies(const BwdParams& p) {
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bm = T::Bm, Bn = T::Bn;
  auto qstride = make_stride((int64_t)p.N * D, _1{}, (int64_t)D, (int64_t)p.Sq * p.N * D);
  auto kstride = make_stride((int64_t)p.K * D, _1{}, (int64_t)D, (int64_t)p.Sk * p.K * D);
  Tensor mQ = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.q)),
                          make_shape(p.Sq, D, p.N, p.B), qstride);
  Tensor mdO = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.dout)),
                           make_shape(p.Sq, D, p.N, p.B), qstride);
  Tensor mK = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.k)),
                          make_shape(p.Sk, D, p.K, p.B), kstride);
  Tensor mV = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.v)),
                          make_shape(p.Sk, D, p.K, p.B), kstride);
  return std::make_tuple(
      make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename T::SmemLayoutQ{}),
                    Shape<Int<Bm>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename T::SmemLayoutQ{}),
                    Shape<Int<Bm>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename T::SmemLayoutK{}, Shape<Int<Bn>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename T::SmemLayoutK{}, Shape<Int<Bn>, Int<D>>{}, _1{}));
}

// Kernel arguments common to every backward kernel (the persistent scheduler fields cleared).
inline BwdArgs bwd_args(const BwdParams& p, int nblk, int mblk, int sq_pad, int sem_words) {
  BwdArgs a;
  a.bounds = p.bounds;
  a.meta = p.meta;
  a.lse2 = p.rowstats;
  a.delta = p.rowstats + (int64_t)p.B * p.N * sq_pad;
  a.dq_accum = p.dq_accum;
  a.dk = p.dk;
  a.dv = p.dv;
  a.B = p.B; a.Sq = p.Sq; a.Sk = p.Sk; a.N = p.N; a.K = p.K; a.Hm = p.Hm;
  a.nblk = nblk; a.mblk = mblk; a.sq_pad = sq_pad;
  a.heads_per_kv = p.N / p.K;
  a.heads_per_mask = p.N / p.Hm;
  a.scale = p.scale;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  a.dq_bulk = p.dq_mode == 1 ? 1 : 0;
  a.deterministic = p.deterministic ? 1 : 0;
  a.dq_sem = p.dq_sem;
  a.sem_words = sem_words;
  a.sched = nullptr;
  a.items_total = 0;
  a.sec_heads = 1;
  a.det_group = 1;
  a.det_perm = 0;
  a.zero_count = nullptr;
  a.walk_clocked = 0;
  a.walk_clock = nullptr;
  a.walk_sms = 1;
  return a;
}

// The metadata workspace (int32) in order, as jax_flashmask._cuda sizes it: the block metadata
// [B, Hm, 8, nblk]; the scheduler area `sched` (4 words: variant 6's item counter, the launch
// group size G, variant 21's order flag, spare; then variant 6's key-block order [nblk]);
// variant 21's key-block orders [B, Hm, nblk]; the look-ahead zeroing's counters [K * B]. Each
// start is also the end a variant needs when it uses nothing after it (the capacity checks).
struct BwdMetaLayout {
  int64_t sched, orders, zero_count, end;
};
inline BwdMetaLayout bwd_meta_layout(const BwdParams& p, int nblk) {
  BwdMetaLayout l;
  l.sched = (int64_t)p.B * p.Hm * 8 * nblk;
  l.orders = l.sched + 4 + nblk;
  l.zero_count = l.orders + (int64_t)p.B * p.Hm * nblk;
  l.end = l.zero_count + (int64_t)p.K * p.B;
  return l;
}

// Deterministic mode of the kernels launched (nblk, K, B) at `rows`-row tiles (variants 7 / 11,
// the d = 256 kernel): variant 21's key-block order where the tails are inverted
// (bwd_det_order_sm90; causal blockwise 0.61 / 0.65 of the default mode at 32K, d = 64 / 256,
// without it). Sets a.det_perm and a.sched (the scheduler area and the orders after the block
// metadata) and runs the pre-pass on `stream`.
inline cudaError_t bwd_launch_det_order(const BwdParams& p, BwdArgs& a, int nblk, int mblk, int rows,
                                        cudaStream_t stream, const char** err) {
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk);
  if (p.meta_capacity < ml.zero_count) {
    if (err) *err = "flashmask sm90 backward: metadata workspace too small for the deterministic order";
    return cudaErrorInvalidValue;
  }
  a.det_perm = 1;
  a.sched = p.meta + ml.sched;
  return bwd_det_order_sm90(p.meta, a.sched, p.B, p.Hm, nblk, mblk, p.Sq, rows, stream);
}

// Attribute `attr` of the current device; `fallback` when the query fails or gives no positive value.
inline int bwd_device_attr(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0)
    return fallback;
  return v;
}

template <class T>
cudaError_t launch_bwd_impl(const BwdParams& p, cudaStream_t stream, const char** err) {
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bm = T::Bm, Bn = T::Bn;
  const int nblk = (p.Sk + Bn - 1) / Bn;
  const int mblk = (p.Sq + Bm - 1) / Bm;
  const int sq_pad = mblk * Bm;
  if (p.meta_capacity < (int64_t)p.B * p.Hm * 8 * nblk ||
      p.rowstats_capacity < 2 * (int64_t)p.B * p.N * sq_pad ||
      p.dq_accum_capacity < (int64_t)p.B * p.N * sq_pad * D) {
    if (err) *err = "flashmask sm90 backward: workspace too small";
    return cudaErrorInvalidValue;
  }
  const int sem_words = (nblk + 31) / 32;
  if (p.deterministic && (p.dq_mode != 1 || p.dq_sem == nullptr ||
                          p.dq_sem_capacity < (int64_t)p.B * p.N * mblk * sem_words)) {
    if (err) *err = "flashmask sm90 backward: deterministic mode needs dq_mode 1 and the dq_sem workspace";
    return cudaErrorInvalidValue;
  }
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk);
  const int64_t items_total = (int64_t)nblk * p.K * p.B;
  if constexpr (T::kPersist) {  // the scheduler area with its key-block order
    if (p.meta_capacity < ml.orders) {
      if (err) *err = "flashmask sm90 backward: metadata workspace too small for variant 6";
      return cudaErrorInvalidValue;
    }
    if (items_total > INT32_MAX / 2) {
      if (err) *err = "flashmask sm90 backward: too many work items for variant 6";
      return cudaErrorInvalidValue;
    }
  }
  if (p.K > 65535 || p.B > 65535) {
    if (err) *err = "flashmask sm90 backward: at most 65535 kv heads and batch entries";
    return cudaErrorInvalidValue;
  }
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "shared memory budget");
  const size_t smem = sizeof(typename T::SharedStorage);

  // Look-ahead zeroing (bwd_zero_unit): the pp kernel with bulk dQ reduces; its counters end the
  // metadata workspace (without room for them: the prep kernel zeroes everything). Unit 0 is
  // zeroed here: one pair, or in deterministic launch groups the largest G the launch can take.
  const int pairs = p.K * p.B;
  const bool zero_ahead = !T::kPersist && p.dq_mode == 1 && p.meta_capacity >= ml.end;
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
  // Clocked walks (bwd_group_skips_none): 80-row lock-step kernels in the default mode
  // (deterministic mode keeps its fixed summation order), where a kv head's Q / dO / dQ stream
  // exceeds the L2; below that size the ascending walk (its out-of-phase CTAs still hit in L2).
  if (T::kLockstep && T::Bm == 80 && !p.deterministic && p.meta_capacity >= ml.sched + 4) {
    const int64_t head_stream_bytes =
        (int64_t)a.heads_per_kv * sq_pad * D * (2 * sizeof(Elem) + sizeof(float));
    const int l2 = bwd_device_attr(cudaDevAttrL2CacheSize, 50 << 20);
    a.walk_clocked = head_stream_bytes > l2 ? 1 : 0;
    if (a.walk_clocked) {
      a.walk_clock = reinterpret_cast<uint32_t*>(p.meta + ml.sched + 3);  // the spare word
      a.walk_sms = bwd_device_attr(cudaDevAttrMultiProcessorCount, 132);
    }
  }

  auto kernel = [&]() {
    if constexpr (T::kPersist)
      return &flashmask_bwd_persist_kernel<T, decltype(tma_q), decltype(tma_k)>;
    else return &flashmask_bwd_pp_kernel<T, decltype(tma_q), decltype(tma_k)>;
  }();
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
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
      static_assert(T::kDetAuto && T::Bm == 80, "deterministic launch groups: the 80-row kernel only");
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
  if constexpr (!T::kDetGroups && !T::kPersist && T::Bm == 128) {  // variants 7 / 11 (d = 64)
    if (p.deterministic) {
      e = bwd_launch_det_order(p, a, nblk, mblk, T::Bm, stream, err);
      if (e != cudaSuccess) return e;
    }
  }
  if constexpr (T::kPersist) {
    // L2 sections: as many (b, kv head) pairs as keep their Q + dO within ~24 MB (half the H200's
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
  kernel<<<grid, T::kThreads, smem, stream>>>(a, tma_q, tma_do, tma_k, tma_v);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return bwd_convert_dq_sm90(p, sq_pad, Bm, stream);
}

}  // namespace jfm::sm90
