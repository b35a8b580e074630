// Work-item schedulers of the backward: the pp kernel's item of its CTA (plain grid (nblk, K, B),
// or in deterministic mode the interleaved launch groups and the pre-pass's key-block order) and
// the key block at a launch position; the persistent grid's item decode (bwd_decode_item); the
// schedulers as types for flashmask_bwd_kernel (bwd_kernel.cuh). The forward's tile order is in
// its kernel (heaviest first, pairs with FwdTraitsPaired).
// Contract: every (key block, kv head, batch) item exactly once; in deterministic mode a CTA only
//   waits for ordering slots above its own of its own pair, all at lower grid positions
//   (deadlock-free without co-residency).
// Synchronization: none here (the ordering bits are in epilogue.cuh).
// Knobs: BwdArgs::det_group (0: the device pre-pass's G), BwdArgs::det_perm.
#pragma once

#include "kernel_args.h"

namespace jfm::sm90 {

using namespace cute;

// Deterministic mode: the key block at launch position r of pair (hk, b), whose ordering slot is
// nblk - 1 - r: the pre-pass's order when the launcher asked for it (BwdArgs::det_perm: every
// deterministic launch but the persistent grid's) and the pre-pass took it (sched[2]: inverted tails), else the
// descending key block nblk - 1 - r. A CTA waits only for the slots above its own, i.e. for
// positions launched before it, so any order is deadlock-free.
__device__ __forceinline__ int bwd_det_key_block(const BwdArgs& a, int b, int hk, int r) {
  if (a.det_perm && __ldg(a.sched + 2)) {
    const int hm = hk * a.heads_per_kv / a.heads_per_mask;
    return __ldg(a.sched + 4 + a.nblk + ((int64_t)b * a.Hm + hm) * a.nblk + r);
  }
  return a.nblk - 1 - r;
}

// (key block, kv head, batch, ordering slot) of this CTA (BwdSingleTileScheduler); with launch
// groups (BwdDetAuto80) in deterministic mode: the interleaved 1-D launch order; the other kernels
// in deterministic mode: launch position blockIdx.x (bwd_det_key_block).
template <class T>
__device__ __forceinline__ int4 bwd_pp_item(const BwdArgs& a) {
  if constexpr (T::kDetGroups) {
    if (a.deterministic) {
      int G = a.det_group;
      if (G <= 0) G = __ldg(a.sched + 1);
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

// The backward's schedulers as types (flashmask_bwd_kernel's Sched): BwdSingleTileScheduler, one
// work item per CTA (bwd_pp_item), and BwdPersistentScheduler, a persistent grid whose producer
// takes every item id from the counter (bwd_decode_item) and hands it to the other roles in an
// smem slot. item_view: the consumers' view of the current item's (n, hk, b), registers or that
// slot (read at each use: the persistent consumers have no registers to spare).
struct BwdItemRegs {
  int n_, hk_, b_;
  __device__ __forceinline__ int n() const { return n_; }
  __device__ __forceinline__ int hk() const { return hk_; }
  __device__ __forceinline__ int b() const { return b_; }
};
struct BwdItemSlot {
  const volatile int* s;
  __device__ __forceinline__ int n() const { return s[1]; }
  __device__ __forceinline__ int hk() const { return s[2]; }
  __device__ __forceinline__ int b() const { return s[3]; }
};
struct BwdSingleTileScheduler {
  static constexpr bool kPersistent = false;
  template <class T>
  static __device__ __forceinline__ int4 first_item(const BwdArgs& a) { return bwd_pp_item<T>(a); }
  static __device__ __forceinline__ BwdItemRegs item_view(const volatile int*, int n, int hk,
                                                          int b) {
    return BwdItemRegs{n, hk, b};
  }
};
struct BwdPersistentScheduler {
  static constexpr bool kPersistent = true;
  template <class T>
  static __device__ __forceinline__ int4 first_item(const BwdArgs&) {
    return make_int4(0, 0, 0, 0);
  }
  static __device__ __forceinline__ BwdItemSlot item_view(const volatile int* slot, int, int, int) {
    return BwdItemSlot{slot};
  }
};

}  // namespace jfm::sm90
