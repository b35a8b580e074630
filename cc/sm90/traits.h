// Compile-time configuration of every kernel: tile sizes, warpgroup counts, setmaxnreg splits,
// shared-memory layouts and storage, GMMA atoms, and the feature flags the kernel bodies branch
// on with `if constexpr`.
// Contract: a traits type is all a kernel template needs besides its TMA descriptor types; the
//   generated instantiation units (instantiations/, from cc/generate_kernels.py) name them.
//   Derived traits (FwdTraitsGroupScan, FwdTraitsMaskBits, FwdTraitsPaired, FwdTraitsSoftCap;
//   BwdMaskRegs, BwdLockstep, BwdDetAuto80, BwdSoftCap) switch one feature on over a base;
//   BwdTraits and BwdD256Traits share BwdTraitsBase (thread count, Q / dO ring, K / V layouts).
// Synchronization: none here; the mbarriers and named barriers live in the SharedStorage types.
// Knobs: FwdTraits<Elem, D, Bn, NWG, Stages, Overlap>, BwdTraits<Elem, D, Persist, Bm>,
//   BwdD256Traits<Elem>, and the derived feature traits.
//
// Written for jax_flashmask; layouts and GMMA/TMA primitives come from CuTe / CUTLASS headers.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "params.h"

namespace jfm::sm90 {

using namespace cute;

template <class Elem_, int D_, int Bn_, int NWG_, int Stages_, bool Overlap_>
struct FwdTraits {
  // Every forward overlaps the softmax of block t with the GEMMs of t - 1 and t + 1 (FA3-style);
  // the serial walk left the tree with the last configuration that used it.
  static_assert(Overlap_, "the forward kernel has the overlapped walk only");
  static constexpr bool Overlap = Overlap_;
  using Elem = Elem_;
  static constexpr int D = D_, Bn = Bn_, NWG = NWG_, Stages = Stages_;
  static constexpr int Bm = 64 * NWG;
  static constexpr int kThreads = 128 * (NWG + 1);
  // setmaxnreg split (NWG = 2): 40/232 for Bn <= 128; the wider S/P fragments of Bn > 128 (and of
  // Bn = 80 at d = 256, next to its 128 O registers) need 240 per consumer thread, which leaves 24
  // for the producer (24*128 + 240*256 <= 64K). NWG = 3 (d = 64): 32/160 (32*128 + 160*384 = 64K).
  static constexpr bool kWideRegs = Bn > 128 || (D == 256 && Bn > 64);
  static constexpr int kRegProducer = NWG == 3 ? 32 : (kWideRegs ? 24 : 40);
  // Group walk (FwdTraitsGroupScan below): KeptBlocks first classifies groups of 32 key blocks
  // (one ballot for 32 groups) and scans only the groups that may hold a kept block.
  static constexpr bool kGroupScan = false;
  // Mask bits (FwdTraitsMaskBits below): partial blocks' element mask as bit words built by
  // producer warps 1-2, one 32-bit word per key column and 32 query rows.
  static constexpr bool kMaskBits = false;
  static constexpr int kBuilders = 0;  // mask-builder threads (kMaskBits) arriving on K's empty barrier
  // Paired tiles (FwdTraitsPaired below): the persistent grid hands out pairs of tiles, the second
  // one walked from its last key block down.
  static constexpr bool kPaired = false;
  // Logits soft cap (FwdTraitsSoftCap below): tanh on the scores before the mask.
  static constexpr bool kSoftCap = false;
  static constexpr int kRegConsumer = NWG == 3 ? 160 : (kWideRegs ? 240 : 232);
  static_assert(NWG <= 3, "at most three consumer warpgroups (named barriers 1..3)");
  static_assert(D % 64 == 0, "head dim must be a multiple of 64");
  static_assert(Bn % 16 == 0 && Bn <= 256, "bad key block");

  // Q ring: two Q tiles where shared memory allows (the next tile's Q loads while the current tile
  // runs on the persistent grid), else one.
  static constexpr int kSmemKV = 2 * Stages * Bn * D * (int)sizeof(Elem);
  static constexpr int kSmemBnd = Stages * 4 * Bn * 4;
  static constexpr int QStages =
      (2 * Bm * D * (int)sizeof(Elem) + kSmemKV + kSmemBnd + 1024 <= 227 * 1024) ? 2 : 1;
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<Bm>, Int<D>, Int<QStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<Bn>, Int<D>, Int<Stages>>{}));
  // V^T view of the V ring: (D, Bn, Stages), MN-major for the PV GEMM's B operand.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{},
      make_ordered_layout(Shape<Int<D>, Int<Bn>, Int<Stages>>{}, Step<_2, _1, _3>{})));

  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, Int<Bn>, Int<D>>>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Elem, Elem, float, Shape<_64, Int<D>, Int<Bn>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));

  // One GMMA instruction per k-step for QK^T (N = Bn) and PV (N = D): a selector fallback to a
  // narrower N (e.g. 64x16 for Bn = 80 without CuTe's extended shapes) is a compile error.
  static_assert(decltype(size<1>(typename TiledMmaQK::AtomShape_MNK{}))::value == Bn,
                "QK^T GMMA atom narrower than the key block");
  static_assert(decltype(size<1>(typename TiledMmaPV::AtomShape_MNK{}))::value == D,
                "PV GMMA atom narrower than the head dim");

  using Pipeline = cutlass::PipelineTmaAsync<Stages>;

  struct SharedStorage {
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> v;
    // LTS, LTE, UTS, UTE of a partial key block, one slot per K stage (bulk copy on K's barrier)
    alignas(128) int32_t bnd[Stages][4][Bn];
    typename Pipeline::SharedStorage pipe_k;
    typename Pipeline::SharedStorage pipe_v;
    alignas(8) uint64_t q_full[QStages];   // Q tile landed (TMA transaction barrier)
    alignas(8) uint64_t q_empty[QStages];  // consumers finished reading Q (and tile_id) of the slot
    alignas(8) uint64_t sched[QStages];    // tile_id of the slot published by the producer
    alignas(8) uint64_t aux;               // V of a block with unseen columns (unseen.cuh)
    uint32_t aux_uses;                     // phases of aux so far (its parity: the next one)
    int tile_id[QStages];                  // query tile of the slot, -1 = no more tiles
  };
};

// Group walk: FwdTraits whose KeptBlocks skips whole groups of 32 key blocks through a second
// metadata level (group_meta_sm90).
template <class Base>
struct FwdTraitsGroupScan : Base {
  static constexpr bool kGroupScan = true;
  // setmaxnreg split 56/224 instead of 40/232 (same pool: 56*128 + 224*256 = 168*384): the group
  // walk keeps one more word of state and ptxas hoists the eight metadata row addresses of the
  // block scan, which at 40 registers spilled 24 LDL/STL into the producer's per-block path
  // (the block index and the phase bit reloaded from local memory before every K/V TMA and the
  // bounds' bulk copies); the consumers stay under 224 without spills.
  // kWideRegs (Bn > 128, or Bn > 64 at d = 256) keeps 24/240; the group-walk kernels compiled
  // (d64 / d128 Bn = 128, d256 Bn = 64) are all narrow, i.e. 56/224.
  // Three consumer warpgroups (d = 64) keep 32/160: at 56/152 the consumers spill around every
  // key block's QK^T; the producer's spills at 32 sit off the critical path (it runs a stage
  // ahead).
  static constexpr int kRegProducer = Base::NWG == 3 ? 32 : (Base::kWideRegs ? 24 : 56);
  static constexpr int kRegConsumer = Base::NWG == 3 ? 160 : (Base::kWideRegs ? 240 : 224);
};

// Mask bits (over FwdTraits or FwdTraitsGroupScan): the element mask of a partial key block is built by
// the idle producer warps 1 and 2 ("mask builders") as bit words: word (q, c) holds bit k for query
// row ms + 32 q + k of key column c (columns >= Sk: every row). The TMA warp posts each key block
// it loads (block, partial flag, (b, hm), first query row) as a job in the stage's slot; the
// builders read the bounds from global memory, write the words of partial blocks into the stage's
// slot and arrive on bits_full (every block, so its phase follows the K pipeline's) and on the K
// stage's empty barrier (so the TMA warp posts the stage's next job only after they are done with
// this one, and they never lag more than one phase). A consumer thread then needs one LDS.64 per
// column pair and a LOP3 + FSEL per element.
template <class Base>
struct FwdTraitsMaskBits : Base {
  static constexpr bool kMaskBits = true;
  static constexpr int kBuilders = 64;  // threads 32..95 of the producer warpgroup
  static_assert(Base::Bm % 32 == 0, "bit words cover 32 query rows");
  using Words = uint32_t[Base::Stages][Base::Bm / 32][Base::Bn];
  struct OwnWords : Base::SharedStorage {
    alignas(16) Words bits;
    alignas(16) int4 job[Base::Stages];  // {key block (-1: no more), partial, b * Hm + hm, ms}
    alignas(8) uint64_t job_full[Base::Stages];   // job posted (TMA warp, 1 arrival)
    alignas(8) uint64_t bits_full[Base::Stages];  // words of the job written (kBuilders arrivals)
  };
  // Where the words do not fit beside the rest (d = 256 with key blocks of 80) they take
  // the place of the staged bounds, which a mask-bits kernel never loads (smem_bounds = 0):
  // fwd_words_over_bounds() below.
  struct WordsOverBounds : Base::SharedStorage {
    alignas(16) int4 job[Base::Stages];
    alignas(8) uint64_t job_full[Base::Stages];
    alignas(8) uint64_t bits_full[Base::Stages];
    static_assert(sizeof(Words) <= sizeof(Base::SharedStorage::bnd), "words fit over the bounds");
  };
  static constexpr bool kWordsOverBounds = sizeof(OwnWords) > 227 * 1024;
  using SharedStorage = std::conditional_t<kWordsOverBounds, WordsOverBounds, OwnWords>;
};

// The bit words of stage s in the aliased layout (FwdTraitsMaskBits::WordsOverBounds); the two
// use sites branch on kWordsOverBounds.
template <class T, class SS>
__device__ __forceinline__ uint32_t (&fwd_words_over_bounds(SS& ss, int s))[T::Bm / 32][T::Bn] {
  return (*reinterpret_cast<typename T::Words*>(&ss.bnd[0][0][0]))[s];
}

// Paired tiles: FwdTraits whose persistent grid hands out *pairs* of query tiles of one head: in
// each head the order is heaviest, lightest, second heaviest, second lightest, ... (for a causal
// mask every pair holds the same number of key blocks), the two tiles of a pair run back to back
// on one CTA, and the second walks its key blocks from the last down. Then at any moment every
// CTA reads either key block t (first tiles) or key block C - t (second tiles, C = the pair's
// length): the CTAs stay in step the way they do on the full mask, instead of sitting a query
// tile's worth of keys (Bm x d x 4 bytes of K/V) apart, which under the plain heaviest-first order
// spreads the K/V reads of the 132 CTAs over 132 x Bm x 4d bytes = 17 MB at d = 256.
template <class Base>
struct FwdTraitsPaired : Base {
  static constexpr bool kPaired = true;
  static_assert(!Base::kGroupScan, "paired tiles walk one level of metadata");
};

// Logits soft cap over any forward traits: each QK^T tile becomes tanh(S * scale / cap) before
// the mask, and the softmax scales it by cap * log2(e) (KArgs::softcap_prescale, scale_log2).
// One MUFU.TANH per score beside the exp's MUFU.EX2; the kernels without it are unchanged.
template <class Base>
struct FwdTraitsSoftCap : Base {
  static constexpr bool kSoftCap = true;
};

// The backward's hand-off of flagged tiles from the TMA lane to the zero warp (unseen.cuh,
// bwd_mainloop.cuh), in the shared memory of both backward kernels: a tile lands on `aux`, the
// request goes to `job` ({kind, stage or key block, hk, b}; `req`: posted, `done`: served, so aux
// and the slot are free again), and `fin` collects the zero-warp lanes' arrivals after their
// stores. `uses` counts the requests (in shared memory: the producer has 24 registers).
struct BwdZeroHandoff {
  alignas(8) uint64_t aux;
  alignas(8) uint64_t req;
  alignas(8) uint64_t done;
  alignas(8) uint64_t fin;  // 32 arrivals, one per zero-warp lane
  int job[4];
  uint32_t uses;

  __device__ __forceinline__ void init() {
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    Barrier::init(&aux, 1);
    Barrier::init(&req, 1);
    Barrier::init(&done, 1);
    Barrier::init(&fin, 32);
    uses = 0u;
  }
};

// What the backward kernels share (BwdTraits, BwdD256Traits): 384 threads (a producer warpgroup
// and two consumer warpgroups), the 2-stage Q / dO ring (Bm, D, Stages), K-major, with its
// (D, Bm, Stages) MN-major views for dK / dV, and the K / V tiles (Bn, D) with their MN-major view.
template <class Elem_, int D_, int Bm_, int Bn_>
struct BwdTraitsBase {
  using Elem = Elem_;
  static constexpr int D = D_, Bm = Bm_, Bn = Bn_, NWG = 2, Stages = 2;
  static constexpr int kThreads = 128 * (NWG + 1);  // + the producer warpgroup
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<Bm>, Int<D>, Int<Stages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(Shape<Int<D>, Int<Bm>, Int<Stages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{}, Shape<Int<Bn>, Int<D>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<D>, Int<Bn>>{}, Step<_2, _1>{})));
};

// The backward kernels of bwd_kernel.cuh (d = 64 / 128). Persist_ = false:
// flashmask_bwd_kernel on BwdSingleTileScheduler, one CTA per work item (key block, kv head,
// batch); true: on BwdPersistentScheduler, the same per-item code on a persistent grid. Bm_ =
// query rows per tile: 64; 128 at d = 64 (the dQ GEMM split by rows: kDqRowSplit); 80 at d = 128 (BwdRows80).
template <class Elem_, int D_, bool Persist_ = false, int Bm_ = kBwdBlockM>
struct BwdTraits : BwdTraitsBase<Elem_, D_, Bm_, kBwdBlockN> {
  using Base = BwdTraitsBase<Elem_, D_, Bm_, kBwdBlockN>;
  using typename Base::Elem;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutKt;
  using typename Base::SmemLayoutQ;
  using typename Base::SmemLayoutQt;
  using Base::Bm;
  using Base::Bn;
  using Base::D;
  using Base::NWG;
  using Base::Stages;
  static constexpr bool kPersist = Persist_;
  static constexpr int kDsBufs = 2;  // dS tiles in smem
  static constexpr int kDqBufs = Bm_ == 80 ? 1 : 2;  // fp32 dQ tiles in smem
  static constexpr bool kMaskRegs = false;  // true: BwdMaskRegs
  static constexpr bool kLockstep = false;  // true: BwdLockstep
  static constexpr bool kDetGroups = false;  // true: BwdDetAuto80 (deterministic launch groups)
  static constexpr bool kSoftCap = false;    // true: BwdSoftCap
  // The warpgroup index and the GEMM slices are taken warp-uniformly (the slices by the
  // warpgroup's first thread: the shared-memory operands depend only on the warpgroup), which
  // keeps the wgmma descriptors in uniform registers. At d = 64 and in the persistent kernels
  // that shortens the key-block loop; in the 80-row d = 128 kernel it puts spills into it
  // (docs/decisions.md#bwd-uniform-slice).
  static constexpr bool kUniformSlices = D == 64 || Persist_;
  // Bm = 80 (BwdRows80): dQ^T = K^T dS^T (keys on K, d on M: 64 d-rows per warpgroup,
  // the 80 query rows on N), one dQ buffer (the smem budget).
  static constexpr bool kDqTrans = Bm_ == 80;
  static_assert(D == 64 || D == 128, "backward compiled for head dims 64 and 128");
  static_assert(Bn == 64 * NWG, "one warpgroup per 64 keys");
  static_assert(Bm == kBwdBlockM || (Bm == 128 && D == 64 && !Persist_) ||
                    (Bm == 80 && D == 128 && !Persist_),
                "128-row query tiles: d = 64, one CTA per work item; 80-row: d = 128");

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
  // stores it. With Bm = 128 they split the query rows instead (kDqRowSplit):
  // warpgroup w computes rows [64w, 64w + 64) x D over all Bn keys; nothing is duplicated.
  static constexpr bool kDqRowSplit = Bm == 2 * 64;
  static constexpr int kDqWG = (D >= 128 || kDqRowSplit) ? NWG : 1;
  // dQ tile layout in smem and in the fp32 workspace ("fragment order", one definition: see
  // dq_frag_run in bwd_aux.cu, which reads it back): the tile is made of 64-row x kDqCols
  // slabs, slab wq = warpgroup wq's accumulator (columns [wq*kDqCols, ...) of a 64-row tile for
  // d = 128; rows [64*wq, 64*wq + 64) for Bm = 128), wq*64*kDqCols floats apart. Element (row r,
  // col c) of a slab sits at ((warp*2 + i)*kDqKK + kk)*64 + 2*lane + j with kk = c / 8,
  // j = c % 2, warp = r / 16, i = (r / 8) % 2, lane = 4*(r % 8) + (c % 8) / 2: the wgmma
  // accumulator fragment of each thread, lanes interleaved. Since kDqCols = D whenever the
  // slabs are row slabs, a 128-row tile is exactly two consecutive 64-row tiles of the Bm = 64
  // layout: the workspace layout and bwd_convert do not depend on Bm.
  // kDqTrans (Bm = 80): the tile is the transposed dQ^T (d x Bm) in two 64-d-row
  // slabs, slab wq = warpgroup wq's accumulator (d rows [64*wq, 64*wq + 64), all Bm query
  // columns), wq*64*Bm floats apart, with the same formula over (slab row = d, column = query):
  // kDqCols = Bm, kDqKK = Bm / 8 (bwd_aux.cu's 80-row convert reads it back).
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
  // Persistent-grid extras: the item-id ring (producer -> consumers and dQ writer) and the K/V release.
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
    BwdZeroHandoff z;                  // flagged tiles to the zero warp (bwd_mainloop.cuh)
    int64_t sem_prev;                  // deterministic: word of the tile whose bit is still owed
    Extra x;
    int walk_start;                    // the clocked walk's first tile, -1: ascending
  };
};

// The cheaper element mask of partial tiles: the bounds of a consumer thread's two key columns
// live in registers (loaded on the first partial tile of each query head, out-of-range key
// columns folded into them), and each partial tile turns them into one bit per element
// (bwd_col_mask, before the S wait) instead of ~10 instructions per element and 8 loads behind an
// integer division per tile. Same tiles, same products: the same gradients bit for bit.
template <class Base>
struct BwdMaskRegs : Base {
  static constexpr bool kMaskRegs = true;
};

// Lock-step consumers (d = 128): the two consumer warpgroups in lock-step instead of ping-pong,
// each warpgroup's GEMMs of a tile kept in flight back to back (FlashAttention-3's Hopper backward
// order). Per tile: S, dP issued; exp under dP; dS; dV issued; dS stored; one 256-thread named
// barrier (both halves of the dS tile stored); dQ issued; wait<1> (dV done); dK issued; wait<1>
// (dQ done); dQ tile to smem under dK; wait<0>. The dQ of a tile is computed in its own iteration
// (not two tiles later), no ds_full / ds_empty mbarriers, no GEMM turns, and no tile walk in the
// consumers: the TMA lane publishes each tile's (m, g, partial, last) with its Q/dO stage.
template <class Base>
struct BwdLockstep : Base {
  static constexpr bool kLockstep = true;
  static_assert(Base::D == 128 && (Base::Bm == 64 || Base::Bm == 80) && !Base::kPersist,
                "lock-step consumers: d = 128, 64- or 80-row tiles, one CTA per work item");
};

// 80-row query tiles (d = 128): lock-step consumers with the mask in registers over 80-row
// tiles. S^T / dP^T are 64 keys x 80 queries per warpgroup (N = 80), dV / dK reduce over K = 80
// query rows, and the dQ GEMM is computed transposed, dQ^T = K^T dS^T: M = d (64 rows per
// warpgroup), N = 80 queries, K = 128 keys, A = K from smem read MN-major, B = the dS tile read
// K-major. The fp32 dQ^T tile goes to one smem buffer (40 KB; two would exceed the 227 KB of
// shared memory) in the kDqTrans fragment order, and bwd_aux.cu's 80-row converter reads it
// back. The dS tile is stored with stmatrix.trans (store_ds_tile).
template <class Elem, int D>
using BwdRows80 = BwdLockstep<BwdMaskRegs<BwdTraits<Elem, D, false, 80>>>;

// Deterministic launch groups (BwdDetAuto80, the 80-row kernel, deterministic mode only). The
// plain deterministic grid is (nblk, K, B) with the key blocks of one (kv head, batch) pair
// fastest, descending: the CTAs that start together are the consecutive key blocks of one pair,
// i.e. whole documents of a document mask, all starting at the document's first query tile,
// where each one's dQ writer waits for the key block above it on every tile. Here the grid is
// 1-D, groups of G (kv head, batch) pairs interleaved: position x -> group x / (nblk * G),
// inside it launch position nblk - 1 - r / gs descending and pair r % gs fastest (gs = the
// group's size, the last group may be smaller), so consecutive key blocks of one pair start ~G
// launches apart. G is chosen per launch on the device from the block metadata
// (bwd_det_group80_sm90): G > 1 only for chains whose key blocks reach their shared query tiles
// together (documents, global rows) or in inverted order (causal blockwise: a document's top key
// block ends on the last document's rows with a shorter walk than the key block above it),
// capped so that the group's rows stay in L2 (bwd_aux.cu kDetGroupTileBudget); else G = 1.
// In the inverted case the pre-pass also writes, per (batch, mask head), the key blocks in
// ascending kept-tile count (ties: descending key block) inside windows of kDetOrderWindow key
// blocks taken in descending order: the order in which their walks reach the shared tail. That
// order is both the pair's launch order and every query tile's dQ summation order: the key block
// at launch position i owns ordering slot nblk - 1 - i and adds to a tile after every slot above
// it (BwdArgs::det_perm). Elsewhere the order is descending key block. Deadlock-free: a CTA waits
// only for slots above its own of its own pair, launched before it. dK / dV are those of the
// default mode bit for bit (same walk); in the default mode the kernel is BwdRows80's, launch
// included.
constexpr int kDetGroupPairs = 8;  // the largest launch group G
template <class Base>
struct BwdDetAuto80 : Base {
  static constexpr bool kDetGroups = true;
  static_assert(Base::kLockstep && Base::kMaskRegs && Base::Bm == 80,
                "deterministic launch groups: the 80-row kernel");
};

// Logits soft cap over any backward traits: P from tanh(S * scale / cap) as in the forward,
// and dS multiplied by 1 - tanh^2, the tanh recovered from P and the row's lse (one MUFU.LG2
// per score instead of a second S fragment held across the dP GEMM).
template <class Base>
struct BwdSoftCap : Base {
  static constexpr bool kSoftCap = true;
};

template <class Elem_>
struct BwdD256Traits : BwdTraitsBase<Elem_, 256, kBwdBlockM, 64> {
  using Base = BwdTraitsBase<Elem_, 256, kBwdBlockM, 64>;
  using typename Base::Elem;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutQ;
  using Base::Bm;
  using Base::Bn;
  using Base::D;
  using Base::NWG;
  using Base::Stages;
  static constexpr int kPdsBufs = 2;
  static constexpr bool kSoftCap = false;  // true: BwdSoftCap
  static constexpr int kQCols = Bm / NWG;  // query columns of S^T / dP^T per warpgroup
  static constexpr int kDCols = D / NWG;   // d columns of dK / dV / dQ per warpgroup
  static constexpr int kDqKK = kDCols / 8;
  static_assert(Bm == 64, "quad order (bwd_convert_quad_kernel) assumes 64-row query tiles");

  // P^T and dS^T: (Bn keys, Bm queries, buffers), queries contiguous (K-major A of dV / dK); the
  // (Bm queries, Bn keys) view of dS^T is the MN-major A operand of dQ = dS K.
  using SmemLayoutPt = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                              Shape<Int<Bn>, Int<Bm>, Int<kPdsBufs>>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutPt{},
      make_ordered_layout(Shape<Int<Bm>, Int<Bn>, Int<kPdsBufs>>{}, Step<_2, _1, _3>{})));

  // Both warpgroups share the A operand (M = 64 keys, or 64 queries for dQ) and split N.
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, Int<kQCols>, Int<D>>>(),
      Layout<Shape<_1, Int<NWG>, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, Int<kDCols>, Int<Bm>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, Int<NWG>, _1>>{}));
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, Int<kDCols>, Int<Bn>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, Int<NWG>, _1>>{}));

  static constexpr int kStageElems = Bm * D;  // one Q (or dO) stage
  static constexpr int kDqHalfFloats = Bm * kDCols;  // one warpgroup's fp32 dQ half
  static_assert(kDqHalfFloats * 4 == kStageElems * (int)sizeof(Elem),
                "a warpgroup's fp32 dQ half fills exactly one Q (or dO) stage");

  struct SharedStorage {
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutQ>> dO;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutK>> v;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutPt>> p;
    alignas(1024) cute::ArrayEngine<Elem, cosize_v<SmemLayoutPt>> ds;
    alignas(16) float rs[Stages][2][Bm];  // [stage][0] = lse * log2(e), [stage][1] = D
    alignas(8) uint64_t full[Stages];      // Q + dO + row statistics of a tile landed
    alignas(8) uint64_t empty[Stages];     // stage free again (deterministic: its staged dQ read)
    alignas(8) uint64_t consumed[Stages];  // deterministic: both warpgroups' GEMMs on it done
    alignas(8) uint64_t dq_full[Stages];   // deterministic: both dQ halves written over the stage
    alignas(8) uint64_t pds_full[kPdsBufs];   // P^T / dS^T slices of both warpgroups stored
    alignas(8) uint64_t pds_empty[kPdsBufs];  // GEMM reads of the P / dS buffer done (both)
    alignas(8) uint64_t kv_full;              // K + V landed
    BwdZeroHandoff z;                         // flagged tiles to the zero warp (bwd_mainloop.cuh)
    int walk_start;                           // the clocked walk's first tile, -1: ascending
  };
};

}  // namespace jfm::sm90
