// FlashMask-3 forward for Hopper (sm_90a): TMA -> multi-stage smem ring (mbarriers) -> WGMMA,
// fp32 online softmax, block skip from the per-key-block metadata, element masking on partial
// tiles only. Warp specialized: warpgroup 0 = producer (lane 0 of warp 0 issues the TMA loads of
// Q, K, V and, for partial key blocks, bulk copies of their bounds; the kept-block sequence comes
// from the per-warp KeptBlocks iterator), warpgroups 1..NWG = consumers (64 query rows each).
// One CTA per query tile, or a persistent grid taking tiles from a global counter (launch_fwd).
//
// Written for jax_flashmask; layouts and pipeline primitives come from CuTe / CUTLASS headers.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
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
  static constexpr bool Overlap = Overlap_;
  using Elem = Elem_;
  static constexpr int D = D_, Bn = Bn_, NWG = NWG_, Stages = Stages_;
  static constexpr int Bm = 64 * NWG;
  static constexpr int kThreads = 128 * (NWG + 1);
  // setmaxnreg split (NWG = 2): 40/232 for Bn <= 128; the wider S/P fragments of Bn > 128 (and of
  // Bn = 80 at d = 256, variant 13, next to its 128 O registers) need 240 per consumer thread,
  // which leaves 24 for the producer (24*128 + 240*256 <= 64K). NWG = 3 (variant 12, d = 64):
  // 32/160 (32*128 + 160*384 = 64K).
  static constexpr bool kWideRegs = Bn > 128 || (D == 256 && Bn > 64);
  static constexpr int kRegProducer = NWG == 3 ? 32 : (kWideRegs ? 24 : 40);
  // Variant 7 (FwdTraitsGroupScan below): KeptBlocks first classifies groups of 32 key blocks
  // (one ballot for 32 groups) and scans only the groups that may hold a kept block.
  static constexpr bool kGroupScan = false;
  // Variant 10 (FwdTraitsMaskBits below): partial blocks' element mask as bit words built by
  // producer warps 1-2, one 32-bit word per key column and 32 query rows.
  static constexpr bool kMaskBits = false;
  static constexpr int kBuilders = 0;  // mask-builder threads (kMaskBits) arriving on K's empty barrier
  // Variant 14 (FwdTraitsPaired below): the persistent grid hands out pairs of tiles, the second
  // one walked from its last key block down.
  static constexpr bool kPaired = false;
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
    int tile_id[QStages];                  // query tile of the slot, -1 = no more tiles
  };
};

// Variant 7: FwdTraits whose KeptBlocks skips whole groups of 32 key blocks through a second
// metadata level (group_meta_sm90). Derived type: the other kernels keep their symbols and SASS.
template <class Base>
struct FwdTraitsGroupScan : Base {
  static constexpr bool kGroupScan = true;
  // setmaxnreg split 56/224 instead of 40/232 (same pool: 56*128 + 224*256 = 168*384): the group
  // walk keeps one more word of state and ptxas hoists the eight metadata row addresses of the
  // block scan, which at 40 registers spilled 24 LDL/STL into the producer's per-block path
  // (the block index and the phase bit reloaded from local memory before every K/V TMA and the
  // bounds' bulk copies; variant 3's producer has none). The consumers top out at R212 (d128) /
  // R185 (d64) / R221 (d256) under 224: no spills anywhere (NOTES_gscan.md, compile facts).
  // kWideRegs (Bn > 128, or Bn > 64 at d = 256) keeps 24/240; the group-walk kernels compiled
  // (d64 / d128 Bn = 128, d256 Bn = 64) are all narrow, i.e. 56/224.
  // Three consumer warpgroups (variant 17, d = 64) keep variant 12's 32/160: at 56/152 the
  // consumers spilled four registers around every key block's QK^T (session 7); the producer's
  // spills at 32 sit off the critical path (it runs a stage ahead).
  static constexpr int kRegProducer = Base::NWG == 3 ? 32 : (Base::kWideRegs ? 24 : 56);
  static constexpr int kRegConsumer = Base::NWG == 3 ? 160 : (Base::kWideRegs ? 240 : 224);
};

// Variant 10 (11: over FwdTraitsGroupScan): the element mask of a partial key block is built by
// the idle producer warps 1 and 2 ("mask builders") as bit words: word (q, c) holds bit k for query
// row ms + 32 q + k of key column c (columns >= Sk: every row). The TMA warp posts each key block
// it loads (block, partial flag, (b, hm), first query row) as a job in the stage's slot; the
// builders read the bounds from global memory, write the words of partial blocks into the stage's
// slot and arrive on bits_full (every block, so its phase follows the K pipeline's) and on the K
// stage's empty barrier (so the TMA warp posts the stage's next job only after they are done with
// this one, and they never lag more than one phase). A consumer thread then needs one LDS.64 per
// column pair and a LOP3 + FSEL per element. Derived storage: the other kernels keep their layout.
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
  // Where the words do not fit beside the rest (variant 18: d = 256, key blocks of 80) they take
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

// The bit words of stage s in the aliased layout (FwdTraitsMaskBits::WordsOverBounds). The other
// kernels keep their `ss.bits[s]` text (and SASS): the two use sites branch on kWordsOverBounds.
template <class T, class SS>
__device__ __forceinline__ uint32_t (&fwd_words_over_bounds(SS& ss, int s))[T::Bm / 32][T::Bn] {
  return (*reinterpret_cast<typename T::Words*>(&ss.bnd[0][0][0]))[s];
}

// Variant 14: FwdTraits whose persistent grid hands out *pairs* of query tiles of one head: in
// each head the order is heaviest, lightest, second heaviest, second lightest, ... (for a causal
// mask every pair holds the same number of key blocks), the two tiles of a pair run back to back
// on one CTA, and the second walks its key blocks from the last down. Then at any moment every
// CTA reads either key block t (first tiles) or key block C - t (second tiles, C = the pair's
// length): the CTAs stay in step the way they do on the full mask, instead of sitting a query
// tile's worth of keys (Bm x d x 4 bytes of K/V) apart, which under the plain heaviest-first order
// spreads the K/V reads of the 132 CTAs over 132 x Bm x 4d bytes = 17 MB at d = 256
// (benchmarks/NOTES_fwd_hd.md). Derived type: the other kernels keep their symbols and SASS.
template <class Base>
struct FwdTraitsPaired : Base {
  static constexpr bool kPaired = true;
  static_assert(!Base::kGroupScan, "paired tiles walk one level of metadata");
};

struct KArgs {
  void* o;
  float* lse;
  const int32_t* bounds;
  const int32_t* meta;
  int B, Sq, Sk, N, K, Hm;
  int nblk;
  int heads_per_kv, heads_per_mask;
  float scale_log2;
  int* tile_counter;  // persistent grid: dynamic tile counter (zeroed by the launcher), else null
  int smem_bounds;    // 1: partial blocks' bounds are staged in smem by the producer (Sk % 4 == 0)
  int tile_overlap;   // 1 (variant 6): the next tile's block scan and first QK^T are issued while
                      // the current tile's last PV GEMM runs (overlap kernels only)
  int group_meta;     // kGroupScan kernels (variant 7): offset in int32 elements from the block
                      // metadata of (b, hm) to its group metadata (int4 {LTSmax, LTEmin, UTSmax,
                      // UTEmin} per group of 32 key blocks); 0 = no group level (every group scanned)
};

// 1-D bulk copy global -> shared completing on an mbarrier (bytes: multiple of 16, both 16B-aligned).
__device__ __forceinline__ void bulk_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                         uint64_t* mbar) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const uint32_t m = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(d), "l"(gmem_src), "r"(bytes), "r"(m)
      : "memory");
}

// Bits k in [0, 32) of query rows rb + k inside the cyclic interval of length len (< 2^31) that
// starts at lo: (unsigned)(rb + k - lo) < len, the consumers' element test, exact for every int32
// lo / rb (the interval may wrap through 2^32). d = rb - lo (mod 2^32): for d < len the rows from k = 0
// on up to k < len - d; else the interval may start inside the word at k = lo - rb (mod 2^32).
__device__ __forceinline__ uint32_t fwd_row_bits(int lo, uint32_t len, int rb) {
  const uint32_t d = (uint32_t)rb - (uint32_t)lo;
  const uint32_t w0 = min(d < len ? len - d : 0u, 32u);
  // operands clamped here to [0, 32], where bmsk.clamp is bits [pos, min(pos + width, 32))
  const uint32_t s = min(0u - d, 32u), w1 = min(len, 32u);
  uint32_t a, b;
  asm("bmsk.clamp.b32 %0, %1, %2;" : "=r"(a) : "r"(0u), "r"(w0));
  asm("bmsk.clamp.b32 %0, %1, %2;" : "=r"(b) : "r"(s), "r"(w1));
  return a | b;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One WGMMA batch: C (+)= A * B over the K mode; optionally wait for completion.
template <bool kZeroInit, int kWait, bool kARegs, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_gemm(TiledMma& mma, TA const& tA, TB const& tB, TC& tC) {
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(tA));
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tA); ++kb) {
    cute::gemm(mma, tA(_, _, kb), tB(_, _, kb), tC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(tC);
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(tA));
}

// Mask role, in every warp that needs it: walks the key blocks of one query tile that are not fully
// masked, in order, with a partial/visible flag and a one-block lookahead (so the caller knows
// which block is the last). 32 blocks are classified at a time, one per lane, from the block
// metadata (SPEC section 3); skipped blocks cost one bit of a ballot. Every warp computes the same
// sequence, so the producer and the consumers agree on it without sharing a list.
//
// kGroups (variant 7): the key blocks are also classified in groups of 32 (a group's metadata is
// the min/max over its blocks', so a skipped group holds only skipped blocks), 32 groups per
// ballot; the walk scans only the groups whose test does not skip them, and stops after the last
// such group instead of scanning every group to nblk; the ballot of a chunk of groups and the
// block scan of its first group are one step. The kept blocks and their order are the same, and
// per query tile the walk takes at most as many dependent metadata steps as variant 3's, before
// the first block, between blocks and after the last (benchmarks/gscan_walk.py --check).
// goff (KArgs::group_meta, passed to every call rather than kept: one register less in the
// producer) is the offset of the group metadata from mt; with goff == 0 every group counts as
// possibly kept (variant 3's walk, step for step).
template <bool kGroups>
struct KeptGroups {};
template <>
struct KeptGroups<true> {
  unsigned gmask;  // groups of the current chunk of 32 that may hold a kept block
};

// Row half i of a consumer thread's m64 x D accumulator fragment (element pairs e = 4 * kk + 2 * i at
// columns 8 * kk + 2 * (lane % 4)), scaled and converted, stored as 16-byte chunks of 8 columns:
// a 4 x 4 transpose of 4-byte words across the lane quad (two shuffle rounds) gives lane q chunk
// 4 * blk + q of each group of four, so a warp store writes 8 rows x 64 contiguous bytes instead
// of 8 rows x 16 bytes (half a sector) per 4-byte store (session 13; the backward pp kernel's dK /
// dV go through smem instead: +7 % at 8K sliding_window). The forward's O and the d = 256
// backward's dK / dV use it. All 32 lanes must call it (row == nullptr: a row past the end,
// shuffle only).
template <class Elem, int D, class Frag>
__device__ __forceinline__ void store_row_chunks(Elem* row, Frag const& acc, int i, float scale,
                                                 int lane) {
  static_assert(sizeof(Elem) == 2 && D % 32 == 0, "groups of four 8-column chunks");
  const int q = lane % 4;
  CUTE_UNROLL
  for (int blk = 0; blk < D / 32; ++blk) {
    uint32_t v[4];  // v[j]: this lane's word of chunk 4 * blk + j
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      cutlass::Array<Elem, 2> p;
      p[0] = static_cast<Elem>(acc(4 * (4 * blk + j) + 2 * i) * scale);
      p[1] = static_cast<Elem>(acc(4 * (4 * blk + j) + 2 * i + 1) * scale);
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

// kRev (variant 14): the walk can also run from the last key block down (rev, set per tile).
template <bool kRev>
struct KeptDir {};
template <>
struct KeptDir<true> {
  bool rev;
};

template <int Bn, bool kGroups = false, bool kRev = false>
struct KeptBlocks : KeptGroups<kGroups>, KeptDir<kRev> {
  static_assert(!(kGroups && kRev), "the reversed walk has no group level");
  const int32_t* mt;
  int nblk, ms, me, Sk;
  int base;
  unsigned keep, part;
  int nxt;
  bool nxt_partial;

  KeptBlocks() = default;
  __device__ __forceinline__ KeptBlocks(const int32_t* mt_, int nblk_, int ms_, int me_, int Sk_, int lane_,
                                        int goff_ = 0, bool rev_ = false)
      : mt(mt_), nblk(nblk_), ms(ms_), me(me_), Sk(Sk_), base(0) {
    (void)lane_;
    (void)rev_;
    if constexpr (kRev) {
      this->rev = rev_;
      if (rev_) base = ((nblk_ - 1) >> 5) << 5;  // the last chunk of 32 blocks first
      scan();
    } else if constexpr (kGroups) {
      base = -32;  // before chunk 0: advance() starts with the group ballot of chunk 0
      keep = 0u;
      part = 0u;
      this->gmask = 0u;
    } else {
      scan();
    }
    advance(goff_);
  }
  // kGroups: with `group` the step also classifies the groups base / 32 .. base / 32 + 31, one per
  // lane (a group's metadata is int4 {LTSmax, LTEmin, UTSmax, UTEmin} at mt + goff; goff == 0:
  // every group that exists counts), and leaves the candidate groups after the first in gmask.
  // The block scan of the first group (base) runs in the same step: its loads are issued with the
  // group loads, so a tile whose walk starts in that group pays one round trip, as in variant 3,
  // not two (ballot, then scan). A group that the group test skips holds only skipped blocks
  // (its max / min bound every block's), so scanning it anyway keeps nothing; no mask needed, and
  // the kept blocks are exactly variant 3's. One ballot site for every kind of step: with two,
  // ptxas no longer proved the walk warp-uniform (VOTE instead of VOTEU, BRA.DIV, and the main
  // loop's GEMM descriptors moved through vector registers).
  __device__ __forceinline__ void scan(bool group = false, int goff = 0) {
    // the lane id is read here, not kept in a member: a member was one more live register across
    // the consumer's tile loop and ptxas spilled it (variant 6 build)
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    const int n = base + (int)lane;
    bool k = false, p = false;
    if constexpr (kGroups) {
      bool kg = false;
      if (group) {
        const int g = (base >> 5) + (int)lane;
        if (32 * g < nblk) {
          kg = true;
          if (goff != 0) {
            const int4 x = __ldg(reinterpret_cast<const int4*>(mt + goff) + g);
            kg = !((ms >= x.x && me <= x.y) || (ms >= x.z && me <= x.w));
          }
        }
      }
      if (n < nblk) {
        const int lts_mn = __ldg(mt + 0 * nblk + n), lts_mx = __ldg(mt + 1 * nblk + n);
        const int lte_mn = __ldg(mt + 2 * nblk + n), lte_mx = __ldg(mt + 3 * nblk + n);
        const int uts_mn = __ldg(mt + 4 * nblk + n), uts_mx = __ldg(mt + 5 * nblk + n);
        const int ute_mn = __ldg(mt + 6 * nblk + n), ute_mx = __ldg(mt + 7 * nblk + n);
        const bool skip = (ms >= lts_mx && me <= lte_mn) || (ms >= uts_mx && me <= ute_mn);
        p = (ms < lte_mx && me > lts_mn) || (ms < ute_mx && me > uts_mn) || ((n + 1) * Bn > Sk);
        k = !skip;
      }
      keep = __ballot_sync(0xffffffffu, k);
      part = __ballot_sync(0xffffffffu, p);
      const unsigned gb = __ballot_sync(0xffffffffu, kg);
      if (group) this->gmask = gb & ~1u;  // bit 0 = the group just scanned
    } else {
      (void)group;
      (void)goff;
      if (n < nblk) {
        const int lts_mn = __ldg(mt + 0 * nblk + n), lts_mx = __ldg(mt + 1 * nblk + n);
        const int lte_mn = __ldg(mt + 2 * nblk + n), lte_mx = __ldg(mt + 3 * nblk + n);
        const int uts_mn = __ldg(mt + 4 * nblk + n), uts_mx = __ldg(mt + 5 * nblk + n);
        const int ute_mn = __ldg(mt + 6 * nblk + n), ute_mx = __ldg(mt + 7 * nblk + n);
        const bool skip = (ms >= lts_mx && me <= lte_mn) || (ms >= uts_mx && me <= ute_mn);
        p = (ms < lte_mx && me > lts_mn) || (ms < ute_mx && me > uts_mn) || ((n + 1) * Bn > Sk);
        k = !skip;
      }
      keep = __ballot_sync(0xffffffffu, k);
      part = __ballot_sync(0xffffffffu, p);
    }
  }
  __device__ __forceinline__ void advance(int goff) {
    if constexpr (kGroups) {
      // One flat loop, one ballot site (see scan). gmask holds the not yet visited candidate
      // groups of the chunk of `base`.
      while (keep == 0u) {
        bool group = false;
        if (this->gmask != 0u) {  // the next candidate group of this chunk: scan its blocks
          const int bit = __ffs(this->gmask) - 1;
          this->gmask &= this->gmask - 1u;
          base = 32 * (((base >> 10) << 5) + bit);
        } else {  // chunk done (or none yet, base = -32): the group ballot of the next chunk,
                  // with the block scan of its first group
          const int c = ((base >> 10) + 1) << 5;  // its first group
          if (32 * c >= nblk) {
            nxt = -1;
            return;
          }
          base = 32 * c;
          group = true;
        }
        scan(group, goff);
      }
    } else if constexpr (kRev) {
      // one loop and one scan site for both directions (see scan)
      (void)goff;
      const int step = this->rev ? -32 : 32;
      while (keep == 0u) {
        base += step;
        if (base < 0 || base >= nblk) {
          nxt = -1;
          return;
        }
        scan();
      }
      const int bit = this->rev ? 31 - __clz(keep) : __ffs(keep) - 1;
      keep &= ~(1u << bit);
      nxt = base + bit;
      nxt_partial = (part >> bit) & 1u;
      return;
    } else {
      (void)goff;
      while (keep == 0u) {
        base += 32;
        if (base >= nblk) {
          nxt = -1;
          return;
        }
        scan();
      }
    }
    const int bit = __ffs(keep) - 1;
    keep &= keep - 1u;
    nxt = base + bit;
    nxt_partial = (part >> bit) & 1u;
  }
  __device__ __forceinline__ bool has_next() const { return nxt >= 0; }
  __device__ __forceinline__ int next(bool& partial, int goff = 0) {
    const int n = nxt;
    partial = nxt_partial;
    advance(goff);
    return n;
  }
};

// kMaskBits, TMA warp, stage wr acquired (K's empty barrier waited: the builders arrived on it
// after bits_full): wait for the completed bits_full phase of the stage's previous job, which the
// consumers waited for only if that block was partial. Every phase then has a waiter before the
// builders arrive on the next one (compute-sanitizer synccheck reports an arrival on an mbarrier
// whose previous phase nobody waited for as "Missing wait"). Already complete: one try_wait. The
// producer state's phase is the previous phase's parity (round 0: the phase before init, done).
template <class Storage, class State>
__device__ __forceinline__ void bits_full_drain(Storage& ss, State const& wr) {
  cutlass::arch::ClusterBarrier::wait(&ss.bits_full[wr.index()], wr.phase());
}

template <class T, class TmaQ, class TmaK, class TmaV>
__global__ void __launch_bounds__(T::kThreads, 1)
    flashmask_fwd_kernel(CUTE_GRID_CONSTANT KArgs const a, CUTE_GRID_CONSTANT TmaQ const tma_q,
                         CUTE_GRID_CONSTANT TmaK const tma_k, CUTE_GRID_CONSTANT TmaV const tma_v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bn = T::Bn, Bm = T::Bm, NWG = T::NWG, QS = T::QStages;
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
  const int mblk = (a.Sq + Bm - 1) / Bm;
  const int NB = a.N * a.B;
  const int total_tiles = mblk * NB;
  // Tile t -> (m_blk, h, b): (batch, head)-major so that the ~132 tiles in flight at any time
  // share one head's K/V in L2 (a head-fastest order thrashed L2: -25 % on full 32K, run 2);
  // inside a head the last query tile comes first (heaviest first for bottom-right causal masks).
  auto decode = [&](int t, int& m_blk, int& h, int& b) {
    const int hb = t / mblk;
    if constexpr (T::kPaired) {
      // variant 14: inside a head j = 0, 1, 2, 3, ... -> query tiles mblk-1, 0, mblk-2, 1, ...
      const int j = t - hb * mblk;
      m_blk = (j & 1) ? (j >> 1) : mblk - 1 - (j >> 1);
    } else {
      m_blk = mblk - 1 - (t - hb * mblk);
    }
    h = hb % a.N;
    b = hb / a.N;
  };
  // variant 14: the second tile of each pair (odd t) walks its key blocks from the last down
  auto reversed = [&](int t) { return T::kPaired && (t & 1) != 0; };

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
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.begin()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.begin()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.begin()), typename T::SmemLayoutVt{});

  // Tile schedule: the first tile of a CTA is blockIdx.x; on the persistent grid the next ones
  // come from a global atomic counter (dynamic: a CTA that finishes early takes the next tile of
  // the same order), else the CTA has one tile. The producer warp fetches the next tile while the
  // current one is loading and publishes each tile id in the slot of its Q buffer (`sched`), so
  // the consumers can classify the tile's key blocks before its Q lands.
  if (wg == 0) {
    // ---------------- producer warpgroup: warp 0 issues TMA (lane 0), the others idle --------
    if constexpr (NWG >= 2) cutlass::arch::warpgroup_reg_dealloc<T::kRegProducer>();
    if (warp == 0) {
      Tensor mQ = tma_q.get_tma_tensor(make_shape(a.Sq, D, a.N, a.B));
      Tensor mK = tma_k.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
      Tensor mV = tma_v.get_tma_tensor(make_shape(a.Sk, D, a.K, a.B));
      auto wr = cutlass::make_producer_start_state<Pipeline>();
      // variant 14: CTA i starts with pair i = tiles 2i, 2i + 1; the counter hands out pairs
      int t = T::kPaired ? 2 * (int)blockIdx.x : (int)blockIdx.x;
      for (int it = 0;; ++it) {
        const int slot = it % QS;
        const bool done = t >= total_tiles;
        if (lane == 0) {
          // the slot's Q and tile id are free once the consumers finished tile it - QS
          if (it >= QS) EmptyBarrier::wait(&ss.q_empty[slot], ((it / QS) - 1) & 1);
          ss.tile_id[slot] = done ? -1 : t;
          EmptyBarrier::arrive(&ss.sched[slot]);
        }
        if (done) break;
        int t_next = total_tiles;
        if constexpr (T::kPaired) {
          if (lane == 0) {
            if ((t & 1) == 0) t_next = t + 1;  // the pair's second tile
            else if (a.tile_counter != nullptr) t_next = 2 * ((int)gridDim.x + atomicAdd(a.tile_counter, 1));
          }
        } else {
          if (lane == 0 && a.tile_counter != nullptr) t_next = gridDim.x + atomicAdd(a.tile_counter, 1);
        }
        int m_blk, h, b;
        decode(t, m_blk, h, b);
        const int hk = h / a.heads_per_kv, hm = h / a.heads_per_mask;
        const int ms = m_blk * Bm, me = min(ms + Bm, a.Sq);
        Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<Bm>, Int<D>>{}, make_coord(m_blk, 0));
        Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(_, 0));
        Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<Bn>, Int<D>>{}, make_coord(_, 0));
        auto [tQgQ, tQsQ] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                          group_modes<0, 2>(gQ));
        auto [tKgK, tKsK] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                          group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                          group_modes<0, 2>(gV));
        if (lane == 0) {
          Barrier::arrive_and_expect_tx(&ss.q_full[slot], Bm * D * sizeof(Elem));
          copy(tma_q.with(ss.q_full[slot]), tQgQ, tQsQ(_, slot));
        }
        const int32_t* bnd = a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
        KeptBlocks<Bn, T::kGroupScan, T::kPaired> blocks(
            a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)nblk, nblk, ms, me, a.Sk, lane, a.group_meta,
            reversed(t));
        while (blocks.has_next()) {
          bool partial;
          const int n = blocks.next(partial, a.group_meta);
          if (lane == 0) {
            pipe_k.producer_acquire(wr);
            if constexpr (T::kMaskBits) bits_full_drain(ss, wr);
            auto* bar = pipe_k.producer_get_barrier(wr);
            if (partial && a.smem_bounds) {
              // the four bound vectors of a partial block ride on K's barrier (expect first, so
              // the phase cannot complete before every copy is counted)
              const uint32_t bytes = 4u * (uint32_t)min(Bn, a.Sk - n * Bn);
              Barrier::expect_transaction(bar, 4 * bytes);
              CUTE_UNROLL
              for (int vv = 0; vv < 4; ++vv)
                bulk_g2s(&ss.bnd[wr.index()][vv][0], bnd + (int64_t)vv * a.Sk + n * Bn, bytes, bar);
            }
            copy(tma_k.with(*bar), tKgK(_, n), tKsK(_, wr.index()));
            if constexpr (T::kMaskBits) {  // the block's job for the mask builders
              ss.job[wr.index()] = make_int4(n, partial ? 1 : 0, b * a.Hm + hm, ms);
              asm volatile("" ::: "memory");  // (the CUTLASS barrier asm has no memory clobber)
              EmptyBarrier::arrive(&ss.job_full[wr.index()]);
            }
            pipe_v.producer_acquire(wr);
            copy(tma_v.with(*pipe_v.producer_get_barrier(wr)), tVgV(_, n), tVsV(_, wr.index()));
          }
          ++wr;
        }
        t = __shfl_sync(0xffffffffu, t_next, 0);
      }
      if constexpr (T::kMaskBits) {
        // no more blocks: the builders' last job (in the next stage, once they and the consumers
        // are done with its previous one)
        if (lane == 0) {
          EmptyBarrier::wait(reinterpret_cast<uint64_t*>(&ss.pipe_k.empty_barrier_[wr.index()]),
                             wr.phase());
          bits_full_drain(ss, wr);
          ss.job[wr.index()] = make_int4(-1, 0, 0, 0);
          asm volatile("" ::: "memory");
          EmptyBarrier::arrive(&ss.job_full[wr.index()]);
        }
      }
    }
    if constexpr (T::kMaskBits) {
      if (warp == 1 || warp == 2) {
        // ---- mask builders: bit words of each partial block (see FwdTraitsMaskBits) ----
        const int bt = threadIdx.x - 32;  // 0 .. kBuilders - 1
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
                if constexpr (T::kWordsOverBounds) {
                  fwd_words_over_bounds<T>(ss, s)[q][c] = fwd_row_bits(lts, ll, rb) | fwd_row_bits(uts, ul, rb);
                } else {
                  ss.bits[s][q][c] = fwd_row_bits(lts, ll, rb) | fwd_row_bits(uts, ul, rb);
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
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    if constexpr (NWG >= 2) cutlass::arch::warpgroup_reg_alloc<T::kRegConsumer>();
    const int ctid = threadIdx.x - 128;
    typename T::TiledMmaQK mma_qk;
    typename T::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(ctid);
    auto thr_pv = mma_pv.get_thread_slice(ctid);
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
    // Tile-boundary overlap (variant 6, overlap kernels only): at the end of tile `it` the consumer
    // reads tile it+1's id, scans its key blocks and issues its first QK^T GEMM (into tSrS) before
    // waiting for tile it's last PV GEMM, then waits for both and runs tile it's epilogue. State
    // carried into the next iteration: t_nxt, blocks_nxt, and (pend) the computed first block.
    const bool tovl = T::Overlap && a.tile_overlap != 0;
    int t_nxt = -1;
    KeptBlocks<Bn, T::kGroupScan, T::kPaired> blocks_nxt;
    bool pend = false, pend_partial = false;
    int pend_n = 0;
    for (int it = 0;; ++it) {
      const int slot = it % QS;
      const uint32_t qphase = (it / QS) & 1;
      // Nothing is in flight here (the boundary waits with wait<0>); kept unconditional so that
      // ptxas sees no wgmma in flight across the loop back-edge on any path.
      if constexpr (T::Overlap) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
      }
      const bool pre = tovl && it > 0;  // tile id and block scan done at the previous boundary
      if (!pre) EmptyBarrier::wait(&ss.sched[slot], qphase);
      const int t = pre ? t_nxt : *reinterpret_cast<volatile int*>(&ss.tile_id[slot]);
      if (t < 0) break;
      int m_blk, h, b;
      decode(t, m_blk, h, b);
      const int hm = h / a.heads_per_mask;
      const int ms = m_blk * Bm, me = min(ms + Bm, a.Sq);
      // Accumulator element e of a 64xN wgmma tile: col = 8*(e>>2) + 2*(lane%4) + (e&1),
      // row = 16*warp_in_wg + lane/4 + 8*((e>>1)&1).
      const int row0 = ms + 64 * cwg + 16 * (warp % 4) + lane / 4;
      const int32_t* bnd = a.bounds + ((int64_t)b * a.Hm + hm) * 4 * (int64_t)a.Sk;
      float m_i[2] = {-INFINITY, -INFINITY};
      float l_i[2] = {0.f, 0.f};
      clear(tOrO);
      auto tSrQs = tSrQ(_, _, _, slot);

      // Element mask of a partial tile (only partial tiles pay for it): four bounds per column,
      // from the smem copy of the K stage when the producer staged them (kSmem), else from global
      // memory. Branch-free per element (run 6: the short-circuit form compiled to a BSSY/BSYNC
      // pair and two branches per element). Out-of-range columns get the interval [0, 2^31).
      auto apply_mask = [&](auto kSmem, int n, int stage) {
        const int32_t* sb = &ss.bnd[stage][0][0];
        CUTE_UNROLL
        for (int kk = 0; kk < Bn / 8; ++kk) {
          const int c = 8 * kk + colq;
          const int col0 = n * Bn + c;  // even; this thread's columns col0, col0 + 1
          int lts[2], lte[2], uts[2], ute[2];
          if constexpr (decltype(kSmem)::value) {  // columns past Sk hold stale values
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
      };
      // Online softmax on S in place (S -> P); returns the O correction factors in corr and
      // whether O must be rescaled by them. Rows i = 0, 1 of this thread; a row lives in the 4
      // lanes of a quad. kLazyRescale (d = 256): the running max m_i moves only when a row of the
      // warp grows past it by more than kRescaleLog2 (log2 units of the scaled score) or had no
      // visible score yet; otherwise P = 2^(s*sl2 - m_i*sl2) <= 2^kRescaleLog2 and O / l keep
      // their scale, which the epilogue's O / l and lse = m + ln l take as they are, and the block
      // skips O's rescale (128 FMUL per thread at d = 256: +4-7 % at 8K, session 14; at d = 64 /
      // 128 it gained nothing at 32K and lost up to 8 % on 8K short walks, so they rescale always).
      constexpr bool kLazyRescale = D >= 256;
      constexpr float kRescaleLog2 = 8.f;
      // the exp of row i against the max m_i (resc: first moved to x) and l_i's update; selects,
      // not a branch: ptxas then keeps the exp loop ahead of the PV GEMM's wait
      auto exp_row = [&](int i, float x, bool resc, float (&corr)[2]) {
        const float m = resc ? x : m_i[i];
        const float msc = (m == -INFINITY) ? 0.f : m * sl2;
        corr[i] = resc ? fast_exp2(m_i[i] * sl2 - msc) : 1.f;
        m_i[i] = m;
        float sum = 0.f;
        CUTE_UNROLL
        for (int kk = 0; kk < Bn / 8; ++kk) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            const float p = fast_exp2(fmaf(tSrS(4 * kk + 2 * i + j), sl2, -msc));
            tSrS(4 * kk + 2 * i + j) = p;
            sum += p;
          }
        }
        l_i[i] = l_i[i] * corr[i] + sum;
      };
      auto softmax = [&](float (&corr)[2]) -> bool {
        float mx[2];
        bool grow = false;
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) {
          float x;
          if constexpr (NWG == 3) {
            // the running max last: at 160 registers ptxas keeps m_i / l_i in local memory
            // across the GEMM issue, and the chain then starts without waiting for their load
            x = fmaxf(tSrS(2 * i), tSrS(2 * i + 1));
            CUTE_UNROLL
            for (int kk = 1; kk < Bn / 8; ++kk) {
              x = fmaxf(x, fmaxf(tSrS(4 * kk + 2 * i), tSrS(4 * kk + 2 * i + 1)));
            }
            x = fmaxf(x, m_i[i]);
          } else {
            x = m_i[i];
            CUTE_UNROLL
            for (int kk = 0; kk < Bn / 8; ++kk) {
              x = fmaxf(x, fmaxf(tSrS(4 * kk + 2 * i), tSrS(4 * kk + 2 * i + 1)));
            }
          }
          x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
          x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
          mx[i] = x;
          if constexpr (kLazyRescale) {
            grow |= (x - m_i[i]) * sl2 > kRescaleLog2 || (m_i[i] == -INFINITY && x != -INFINITY);
          } else {
            exp_row(i, x, true, corr);
          }
        }
        if constexpr (!kLazyRescale) return true;
        const bool resc = __any_sync(0xffffffffu, grow);
        CUTE_UNROLL
        for (int i = 0; i < 2; ++i) exp_row(i, mx[i], resc, corr);
        return resc;
      };
      auto rescale_o = [&](float const (&corr)[2]) {
        CUTE_UNROLL
        for (int kk = 0; kk < D / 8; ++kk) {
          CUTE_UNROLL
          for (int i = 0; i < 2; ++i) {
            tOrO(4 * kk + 2 * i) *= corr[i];
            tOrO(4 * kk + 2 * i + 1) *= corr[i];
          }
        }
      };
      auto convert_p = [&]() {
        CUTE_UNROLL
        for (int e = 0; e < Bn / 2; e += 2) {
          tOrP(e) = static_cast<Elem>(tSrS(e));
          tOrP(e + 1) = static_cast<Elem>(tSrS(e + 1));
        }
      };
      // kMaskBits: the mask from the builders' bit words (one LDS.64 per column pair, a bit test
      // per element); the same -inf / score selection as apply_mask.
      auto apply_bits = [&](int stage) {
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
      };
      // kMaskBits: wait until the builders published the words of a partial block. Called before
      // an aligned wgmma instruction (the issue or the wait of the block's QK^T GEMM): with the
      // wait after it, ptxas dropped its proof that the block walk is warp-uniform (VOTE instead of
      // VOTEU, BRA.DIV before every shuffle, the GEMM descriptors through vector registers).
      auto wait_bits = [&](bool partial, cutlass::PipelineState<T::Stages> st) {
        if constexpr (T::kMaskBits) {
          if (partial) EmptyBarrier::wait(&ss.bits_full[st.index()], st.phase());
          asm volatile("" ::: "memory");  // the words are read after the wait
        }
      };
      // A partial block's staged bounds live in its K stage: release K only after the mask.
      auto mask_and_release_k = [&](bool partial, int n, cutlass::PipelineState<T::Stages> st) {
        if constexpr (T::kMaskBits) {
          // the words live in the stage's slot until K's release lets the builders reuse it
          // (bits_full was waited for in wait_bits)
          (void)n;
          if (partial) apply_bits(st.index());
          asm volatile("" ::: "memory");  // the words are read before the release
          pipe_k.consumer_release(st);
        } else if (partial && smem_bnd) {
          apply_mask(cute::true_type{}, n, st.index());
          pipe_k.consumer_release(st);
        } else {
          pipe_k.consumer_release(st);
          if (partial) apply_mask(cute::false_type{}, n, st.index());
        }
      };

      KeptBlocks<Bn, T::kGroupScan, T::kPaired> blocks =
          pre ? blocks_nxt
              : KeptBlocks<Bn, T::kGroupScan, T::kPaired>(
                    a.meta + ((int64_t)b * a.Hm + hm) * 8 * (int64_t)nblk, nblk, ms, me, a.Sk, lane,
                    a.group_meta, reversed(t));
      if (!pend) Barrier::wait(&ss.q_full[slot], qphase);  // pend: waited at the boundary
      const bool had_blocks = pend || blocks.has_next();
      if constexpr (!T::Overlap) {
        // Step-2 mainloop: S = QK^T, wait; mask + softmax; O += PV, wait.
        while (blocks.has_next()) {
          bool partial;
          const int n = blocks.next(partial, a.group_meta);
          pipe_k.consumer_wait(rd);
          wait_bits(partial, rd);
          wgmma_gemm<true, 0, false>(mma_qk, tSrQs, tSrK(_, _, _, rd.index()), tSrS);
          mask_and_release_k(partial, n, rd);
          float corr[2];
          if (softmax(corr)) rescale_o(corr);
          convert_p();
          pipe_v.consumer_wait(rd);
          wgmma_gemm<false, 0, true>(mma_pv, tOrP, tOrV(_, _, _, rd.index()), tOrO);
          pipe_v.consumer_release(rd);
          ++rd;
        }
      } else if (had_blocks) {
        // FA3-style: the softmax of block t overlaps the QK^T GEMM of block t+1 and the PV GEMM of
        // block t-1 inside the warpgroup; with two consumer warpgroups the GEMM issue alternates
        // (ping-pong through named barriers 1 and 2) so one group's softmax hides the other's GEMMs.
        constexpr bool kPingPong = NWG == 2;
        // NWG = 3 (variant 12): the same idea as a round robin. Warpgroup w issues its GEMMs after
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
            wait_bits(partial, rd);
            wgmma_gemm<true, 0, false>(mma_qk, tSrQs, tSrK(_, _, _, rd.index()), tSrS);
          }
          if (!blocks.has_next()) EmptyBarrier::arrive(&ss.q_empty[slot]);  // last QK^T done
          mask_and_release_k(partial, n, rd);
          float corr[2];
          softmax(corr);
          convert_p();
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
          wait_bits(partial, rd);
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          if (last) EmptyBarrier::arrive(&ss.q_empty[slot]);  // last QK^T of the tile done: Q is free
          mask_and_release_k(partial, n, rd);
          float corr[2];
          const bool resc = softmax(corr);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(tOrP);
          pipe_v.consumer_release(rd_prev);
          if (resc) rescale_o(corr);
          convert_p();
        }
        pipe_v.consumer_wait(rd);
        // last PV GEMM of the tile: waited for (and its V stage released) below, after the tile
        // boundary work of variant 6
        wgmma_gemm<false, -1, true>(mma_pv, tOrP, tOrV(_, _, _, rd.index()), tOrO);
      }
      // Q is free once every QK^T GEMM of the tile has completed (the overlap path signals it
      // right after its last QK^T; here: the other paths and tiles without any kept block).
      if (!T::Overlap || !had_blocks) EmptyBarrier::arrive(&ss.q_empty[slot]);

      if constexpr (T::Overlap) {
        if (tovl) {
          // Tile boundary: next tile's id and block scan (its metadata loads run under the PV GEMM
          // in flight), then its first QK^T issued right behind the PV GEMM, one wait for both.
          const int nit = it + 1, nslot = nit % QS;
          const uint32_t nphase = (nit / QS) & 1;
          EmptyBarrier::wait(&ss.sched[nslot], nphase);
          t_nxt = *reinterpret_cast<volatile int*>(&ss.tile_id[nslot]);
          auto rdn = rd;
          if (had_blocks) ++rdn;  // stage of the next tile's first block
          bool go = false;
          if (t_nxt >= 0) {
            int m2, h2, b2;
            decode(t_nxt, m2, h2, b2);
            const int hm2 = h2 / a.heads_per_mask;
            const int ms2 = m2 * Bm, me2 = min(ms2 + Bm, a.Sq);
            blocks_nxt = KeptBlocks<Bn, T::kGroupScan, T::kPaired>(
                a.meta + ((int64_t)b2 * a.Hm + hm2) * 8 * (int64_t)nblk, nblk, ms2, me2, a.Sk, lane,
                a.group_meta, reversed(t_nxt));
            go = blocks_nxt.has_next();
          }
          if (go) {
            pend_n = blocks_nxt.next(pend_partial, a.group_meta);
            Barrier::wait(&ss.q_full[nslot], nphase);
            pipe_k.consumer_wait(rdn);
            wait_bits(pend_partial, rdn);
            wgmma_gemm<true, -1, false>(mma_qk, tSrQ(_, _, _, nslot), tSrK(_, _, _, rdn.index()),
                                        tSrS);
            pend = true;
            // One wait for this tile's last PV GEMM and the next tile's first QK^T. (wait<1> here,
            // i.e. the epilogue under the QK^T, made ptxas serialize every wgmma of the kernel:
            // C7515, accumulator registers defined inside a wgmma pipeline stage; see NOTES.)
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

      // Epilogue: normalize, write O (input dtype) and LSE (natural log, -inf for empty rows).
      float inv[2], lse[2];
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        float l = l_i[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const bool empty = !(l > 0.f);
        inv[i] = empty ? 0.f : 1.f / l;
        lse[i] = empty ? -INFINITY : (m_i[i] * sl2 + __log2f(l)) * 0.69314718055994530942f;
      }
      Elem* out = reinterpret_cast<Elem*>(a.o);
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int r = row0 + 8 * i;
        // every lane shuffles (store_row_chunks); rows past Sq store nothing
        store_row_chunks<Elem, D>(r < a.Sq ? out + (((int64_t)b * a.Sq + r) * a.N + h) * D : nullptr,
                                  tOrO, i, inv[i], lane);
        if (r < a.Sq && (lane % 4) == 0) a.lse[((int64_t)b * a.Sq + r) * a.N + h] = lse[i];
      }
    }  // tile loop
  }
#endif
}

// GroupScan: variant 7's kernel (FwdTraitsGroupScan; fwd_dispatch.cu passes p.variant = 7, which
// launches like 3: persistent grid, bounds staged in smem). MaskBits: variant 10's (11's with
// GroupScan) kernel, FwdTraitsMaskBits (persistent grid; no bounds staged: the mask builders read
// them from global memory, any Sk).
// Paired: variant 14's kernel (FwdTraitsPaired; launched like 3 with pairs of tiles per claim).
template <class Elem, int D, int Bn, int NWG, int Stages, bool Overlap, bool GroupScan, bool MaskBits,
          bool Paired>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream, const char** err) {
  static_assert(!(Paired && (GroupScan || MaskBits)), "paired tiles: variant 3's walk and mask only");
  using Base = FwdTraits<Elem, D, Bn, NWG, Stages, Overlap>;
  using TG = std::conditional_t<GroupScan, FwdTraitsGroupScan<Base>,
                                std::conditional_t<Paired, FwdTraitsPaired<Base>, Base>>;
  using T = std::conditional_t<MaskBits, FwdTraitsMaskBits<TG>, TG>;
  const int nblk = (p.Sk + Bn - 1) / Bn;
  const int mblk = (p.Sq + T::Bm - 1) / T::Bm;
  const int64_t total_tiles = (int64_t)mblk * p.N * p.B;
  if (total_tiles > INT32_MAX - 1024) {
    if (err) *err = "flashmask sm90 forward: too many query tiles (ceil(Sq/Bm) * N * B >= 2^31)";
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(typename T::SharedStorage);
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "shared memory budget");
  // Every shipped configuration runs on the persistent grid (so sm_margin is always honoured);
  // the kernel also supports one CTA per tile (tile_counter = null).
  constexpr bool persistent = true;
  const int64_t meta_elems = (int64_t)p.B * p.Hm * 8 * nblk;
  // the dynamic tile counter lives in the workspace right after the metadata
  if (p.meta_capacity < meta_elems + (persistent ? 1 : 0)) {
    if (err) *err = "flashmask sm90 forward: metadata workspace too small";
    return cudaErrorInvalidValue;
  }
  cudaError_t e = block_meta_sm90(p.bounds, p.meta, p.B, p.Hm, p.Sk, Bn, stream);
  if (e != cudaSuccess) return e;
  // Variant 7: group metadata (32 key blocks per group) at meta + group_meta: for (b, hm) at the
  // offset of its block metadata, int4 {LTSmax, LTEmin, UTSmax, UTEmin} per group (group_meta_sm90).
  // Only with at least 3 groups: with 1 or 2 the group ballot costs one more metadata round trip
  // per tile than it can save (S <= 8K at Bn = 128). Needs a 16-byte aligned workspace.
  int group_meta = 0;
  if constexpr (GroupScan) {
    const int ngrp = (nblk + 31) / 32;
    const int64_t goff = meta_elems + 32;  // after the tile counter; a multiple of 8
    if (ngrp >= 3 && reinterpret_cast<uintptr_t>(p.meta) % 16 == 0) {
      if (p.meta_capacity < goff + meta_elems || goff > INT32_MAX) {
        if (err) *err = "flashmask sm90 forward: metadata workspace too small for variant 7";
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
  a.scale_log2 = p.scale * 1.4426950408889634f;
  // Bulk copies need 16-byte aligned rows of whole 16-byte units: Sk % 4 == 0 (else global loads).
  // Mask-bits kernels never stage bounds (their mask builders read global memory).
  a.smem_bounds = !MaskBits && p.Sk % 4 == 0 &&
                  (reinterpret_cast<uintptr_t>(p.bounds) % 16) == 0;
  a.tile_counter = nullptr;
  a.tile_overlap = 0;  // the kernel's tile-boundary overlap stays off in every configuration
  a.group_meta = group_meta;

  auto kernel = &flashmask_fwd_kernel<T, decltype(tma_q), decltype(tma_k), decltype(tma_v)>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  // Non-persistent: one CTA per query tile. Persistent: one CTA per SM; CTA i starts with tile i
  // and then takes tiles gridDim.x, gridDim.x + 1, ... of the same (batch, head)-major order from
  // a global counter, so early finishers take the next tile; the next tile's Q (second Q buffer)
  // and first K/V load while the current tile runs.
  int grid = (int)total_tiles;
  if (persistent) {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (sms <= 0) sms = 132;
    // sm_margin: leave SMs free for concurrent kernels (NCCL under context parallelism)
    const int ctas = std::max(1, sms - std::max(0, p.sm_margin));
    // variant 14: one claim = two tiles
    grid = (int)std::min<int64_t>(Paired ? (total_tiles + 1) / 2 : total_tiles, ctas);
    a.tile_counter = p.meta + meta_elems;
    e = cudaMemsetAsync(a.tile_counter, 0, sizeof(int), stream);  // reset per call, no host sync
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, T::kThreads, smem, stream>>>(a, tma_q, tma_k, tma_v);
  return cudaGetLastError();
}

}  // namespace jfm::sm90
