// The mask walk: block metadata -> the kept and partial key blocks of a query tile (forward:
// KeptBlocks, one or two metadata levels, either direction) or the kept query tiles of a key
// block (backward: bwd_find_kept, at most three jumps over the two skipped ranges; the clocked
// walk), and the element masks of partial tiles (forward bit words: fwd_row_bits; backward mask
// in registers: bwd_col_mask).
// Contract: the metadata layout of block_meta_sm90 / group_meta_sm90 (params.h); a tile is
//   skipped iff SPEC section 3's test says fully masked; the kept sequence is the same in every
//   warp that walks it, so producer and consumers agree without sharing a list.
// Synchronization: warp-collective (ballots); no barriers.
// Knobs: KeptBlocks<Bn, kGroups, kRev>; bwd_find_kept<Bm, Bn>.
#pragma once

#include "kernel_args.h"
#include "primitives.cuh"

namespace jfm::sm90 {

using namespace cute;

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

// Mask role, in every warp that needs it: walks the key blocks of one query tile that are not fully
// masked, in order, with a partial/visible flag and a one-block lookahead (so the caller knows
// which block is the last). 32 blocks are classified at a time, one per lane, from the block
// metadata (SPEC section 3); skipped blocks cost one bit of a ballot. Every warp computes the same
// sequence, so the producer and the consumers agree on it without sharing a list.
//
// kGroups (group walk): the key blocks are also classified in groups of 32 (a group's metadata is
// the min/max over its blocks', so a skipped group holds only skipped blocks), 32 groups per
// ballot; the walk scans only the groups whose test does not skip them, and stops after the last
// such group instead of scanning every group to nblk; the ballot of a chunk of groups and the
// block scan of its first group are one step. The kept blocks and their order are the same, and
// per query tile the walk takes at most as many dependent metadata steps as the plain walk's,
// before the first block, between blocks and after the last.
// goff (KArgs::group_meta, passed to every call rather than kept: one register less in the
// producer) is the offset of the group metadata from mt; with goff == 0 every group counts as
// possibly kept (the plain walk, step for step).
template <bool kGroups>
struct KeptGroups {};
template <>
struct KeptGroups<true> {
  unsigned gmask;  // groups of the current chunk of 32 that may hold a kept block
};

// kRev (paired tiles): the walk can also run from the last key block down (rev, set per tile).
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
  // Key block n against this tile's rows [ms, me): k = not skipped (some row visible), p = partial
  // (some row masked, or the block runs past Sk). Both false past the last block.
  __device__ __forceinline__ void classify(int n, bool& k, bool& p) const {
    if (n < nblk) {
      const int lts_mn = __ldg(mt + 0 * nblk + n), lts_mx = __ldg(mt + 1 * nblk + n);
      const int lte_mn = __ldg(mt + 2 * nblk + n), lte_mx = __ldg(mt + 3 * nblk + n);
      const int uts_mn = __ldg(mt + 4 * nblk + n), uts_mx = __ldg(mt + 5 * nblk + n);
      const int ute_mn = __ldg(mt + 6 * nblk + n), ute_mx = __ldg(mt + 7 * nblk + n);
      const bool skip = (ms >= lts_mx && me <= lte_mn) || (ms >= uts_mx && me <= ute_mn);
      p = (ms < lte_mx && me > lts_mn) || (ms < ute_mx && me > uts_mn) || ((n + 1) * Bn > Sk);
      k = !skip;
    }
  }
  // kGroups: with `group` the step also classifies the groups base / 32 .. base / 32 + 31, one per
  // lane (a group's metadata is int4 {LTSmax, LTEmin, UTSmax, UTEmin} at mt + goff; goff == 0:
  // every group that exists counts), and leaves the candidate groups after the first in gmask.
  // The block scan of the first group (base) runs in the same step: its loads are issued with the
  // group loads, so a tile whose walk starts in that group pays one round trip, as the plain walk,
  // not two (ballot, then scan). A group that the group test skips holds only skipped blocks
  // (its max / min bound every block's), so scanning it anyway keeps nothing; no mask needed, and
  // the kept blocks are exactly the plain walk's. One ballot site for every kind of step: with two,
  // ptxas no longer proved the walk warp-uniform (VOTE instead of VOTEU, BRA.DIV, and the main
  // loop's GEMM descriptors moved through vector registers).
  __device__ __forceinline__ void scan(bool group = false, int goff = 0) {
    // the lane id is read here, not kept in a member: a member was one more live register across
    // the consumer's tile loop and ptxas spilled it
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
      classify(n, k, p);
      keep = __ballot_sync(0xffffffffu, k);
      part = __ballot_sync(0xffffffffu, p);
      const unsigned gb = __ballot_sync(0xffffffffu, kg);
      if (group) this->gmask = gb & ~1u;  // bit 0 = the group just scanned
    } else {
      (void)group;
      (void)goff;
      classify(n, k, p);
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
// its key block). m is first tested as a kept tile, so a kept m costs no range arithmetic.
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

// The clocked walk (the 80-row and d = 256 kernels in the default mode, BwdArgs::walk_clocked):
// each head's tiles from tile r up, then from 0 up to r - 1, with r = (tiles issued so far / SMs
// + n) mod mblk, for key blocks that skip no tile of any head of their kv group
// (bwd_group_skips_none; all others walk ascending). Why: at 128K full (H = 32) the resident
// CTAs' Q / dO / dQ stream missed L2 (2 TB of DRAM traffic per kernel against 28 GB at 32K for a
// quarter of the work): CTAs start when their SM's previous one ends, so after many waves their
// walks are out of phase and the tiles in use span the whole head (131 MB against the 50 MB L2).
// The clocked start lets a CTA join where the running ones are (the clock advances one tile per
// SM-tile), one tile after its predecessor key block (docs/decisions.md#bwd-d128-rows80). Masked
// key blocks walk ascending: their walks differ in length, so the clock is no phase for them, and
// ascending they ran faster than clocked (docs/decisions.md#bwd-clocked-walk).
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

// Key block n's first tile r of the clocked walk, or -1 where it walks ascending (no clock, or it
// skips a tile). One thread reads the clock; the value goes to every role.
template <int Bm, int Bn>
__device__ __forceinline__ int bwd_walk_start(const BwdArgs& a, int b, int hk, int n) {
  if (!a.walk_clocked || !bwd_group_skips_none<Bm, Bn>(a, b, hk, n)) return -1;
  const uint32_t r = ld_acquire_gpu(a.walk_clock) / (uint32_t)a.walk_sms;
  return (int)((r + (uint32_t)n) % (uint32_t)a.mblk);
}

// The walk's next candidate after tile (g, m): tile m + 1, and on a clocked walk (rot >= 0, the
// first tile) the wrap to tile 0, then the next head once the walk is back at rot.
__device__ __forceinline__ void bwd_walk_advance(const BwdArgs& a, int rot, int& g, int& m) {
  ++m;
  if (rot >= 0) {
    if (m == a.mblk) m = 0;
    if (m == rot) ++g;
  }
}

// A clocked walk issued one tile (its TMA lane, once per tile): only clocked walks advance the
// clock, so the phase it measures is theirs.
__device__ __forceinline__ void bwd_walk_clock_tick(const BwdArgs& a) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(a.walk_clock) : "memory");
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

// Mask in registers: bit 2*kk + j set <=> query lo + 8*kk + j lies in [lts, lte) or [uts, ute), the
// element mask of one key column (the thread's columns are sorted, so each range is a run of
// bits). Equal, element by element, to `(lts <= q && q < lte) || (uts <= q && q < ute)`.
template <int Bm>
__device__ __forceinline__ uint32_t bwd_col_mask(int lts, int lte, int uts, int ute, int lo) {
  static_assert(2 * (Bm / 8) <= 32, "one bit per element of a key column");
  const int a1 = bwd_cols_below<Bm>(lts, lo), b1 = bwd_cols_below<Bm>(lte, lo);
  const int a2 = bwd_cols_below<Bm>(uts, lo), b2 = bwd_cols_below<Bm>(ute, lo);
  return bwd_bit_range(a1, max(b1 - a1, 0)) | bwd_bit_range(a2, max(b2 - a2, 0));
}

}  // namespace jfm::sm90
