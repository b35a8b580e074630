// Work-item schedulers. Forward: FwdTileScheduler, the query-tile order of flashmask_fwd_kernel
// on its persistent grid (heaviest first within a head; pairs with FwdTraitsPaired) and the
// tile-id hand-off from the producer to the consumers. Backward, as types for
// flashmask_bwd_kernel (bwd_kernel.cuh): BwdSingleTileScheduler, the pp kernel's item of its CTA
// (plain grid (nblk, K, B), or in deterministic mode the interleaved launch groups and the
// pre-pass's key-block order), and BwdPersistentScheduler, the persistent grid's item ring
// (bwd_decode_item); both give each role its items through one interface (producer_item,
// writer_item, start_walk, item_view), so that the kernel has one item loop per role.
// Contract: every query tile (forward) / (key block, kv head, batch) item (backward) exactly
//   once; in deterministic mode a CTA only waits for ordering slots above its own of its own
//   pair, all at lower grid positions (deadlock-free without co-residency).
// Synchronization: forward: the tile-id slots (sched / q_empty mbarriers); backward: the
//   persistent grid's item ring (sched_full / sched_empty) and K / V release (kv_empty); the
//   ordering bits are in epilogue.cuh.
// Knobs: FwdTileScheduler<Bm, kPaired>; BwdArgs::det_group (0: the device pre-pass's G),
//   BwdArgs::det_perm, BwdArgs::sec_heads.
#pragma once

#include "kernel_args.h"
#include "mask_walk.cuh"
#include "primitives.cuh"

namespace jfm::sm90 {

using namespace cute;

// ---------------------------------------------------------------------------------------------
// Forward query tiles. Tile t -> (m_blk, h, b): (batch, head)-major so that the ~132 tiles in
// flight at any time share one head's K/V in L2 (a head-fastest order thrashes L2); inside a head
// the last query tile comes first (heaviest first for bottom-right causal masks). kPaired: inside
// a head j = 0, 1, 2, 3, ... -> query tiles mblk-1, 0, mblk-2, 1, ..., handed out in pairs (2i,
// 2i + 1), the second of each pair walked from its last key block down (FwdTraitsPaired).
// The first tile (pair) of a CTA is blockIdx.x; the next ones come from the global counter
// KArgs::tile_counter (dynamic: a CTA that finishes early takes the next tile of the same order).
// The producer warp claims the next tile while the current one loads and publishes each tile
// id in the slot of its Q buffer (`sched`), so the consumers can classify the tile's key blocks
// before its Q lands.
struct FwdTile {
  int m_blk, h, b;
};
template <int Bm, bool kPaired>
struct FwdTileScheduler {
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  KArgs const& a;
  const int mblk;         // query tiles per (batch, head)
  const int total_tiles;  // mblk * N * B

  __device__ __forceinline__ explicit FwdTileScheduler(KArgs const& a_)
      : a(a_), mblk((a_.Sq + Bm - 1) / Bm), total_tiles(mblk * (a_.N * a_.B)) {}

  __device__ __forceinline__ FwdTile decode(int t) const {
    FwdTile w;
    const int hb = t / mblk;
    if constexpr (kPaired) {
      const int j = t - hb * mblk;
      w.m_blk = (j & 1) ? (j >> 1) : mblk - 1 - (j >> 1);
    } else {
      w.m_blk = mblk - 1 - (t - hb * mblk);
    }
    w.h = hb % a.N;
    w.b = hb / a.N;
    return w;
  }
  // the tile walks its key blocks from the last down (the second tile of a pair)
  __device__ __forceinline__ bool reversed(int t) const { return kPaired && (t & 1) != 0; }
  // CTA i starts with tile i (pair i = tiles 2i, 2i + 1)
  __device__ __forceinline__ int first_tile() const {
    return kPaired ? 2 * (int)blockIdx.x : (int)blockIdx.x;
  }
  // Producer warp, after tile t: lane 0 claims the next tile from the counter (tiles, or pairs)
  // into t_next; the other lanes leave it. The caller broadcasts lane 0's.
  __device__ __forceinline__ void claim_next(int& t_next, int t, int lane, int* counter) const {
    if constexpr (kPaired) {
      if (lane == 0) {
        if ((t & 1) == 0) {
          t_next = t + 1;  // the pair's second tile
        } else {
          t_next = 2 * ((int)gridDim.x + atomicAdd(counter, 1));
        }
      }
    } else {
      if (lane == 0) t_next = gridDim.x + atomicAdd(counter, 1);
    }
  }
  // Producer lane 0: the it-th tile id t (done: -1, no more tiles) into its Q slot, once the
  // consumers finished tile it - QS there (q_empty).
  template <int QS, class Storage>
  __device__ __forceinline__ static void publish(Storage& ss, int it, int slot, int t, bool done) {
    if (it >= QS) EmptyBarrier::wait(&ss.q_empty[slot], ((it / QS) - 1) & 1);
    ss.tile_id[slot] = done ? -1 : t;
    EmptyBarrier::arrive(&ss.sched[slot]);
  }
  // Consumers: wait for the slot's tile id (phase: the slot's round parity), then read it.
  template <class Storage>
  __device__ __forceinline__ static void wait_published(Storage& ss, int slot, uint32_t phase) {
    EmptyBarrier::wait(&ss.sched[slot], phase);
  }
  template <class Storage>
  __device__ __forceinline__ static volatile int& published(Storage& ss, int slot) {
    return *reinterpret_cast<volatile int*>(&ss.tile_id[slot]);
  }
};

// Deterministic mode: the key block at launch position r of pair (hk, b), whose ordering slot is
// nblk - 1 - r: the pre-pass's order when the launcher asked for it (BwdArgs::det_perm: every
// deterministic launch but the persistent grid's) and the pre-pass took it (sched[2]: inverted
// tails), else the descending key block nblk - 1 - r. A CTA waits only for the slots above its
// own, i.e. for positions launched before it, so any order is deadlock-free.
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

// A work item: key block n of kv head hk, batch b, and its ordering slot (deterministic mode:
// the key block's place in each query tile's dQ summation order).
struct BwdItem {
  int n, hk, b, slot;
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
  w.slot = w.n;  // descending key block (bwd_sched_sm90)
  return w;
}

// The backward's schedulers as types (flashmask_bwd_kernel's Sched): BwdSingleTileScheduler, one
// work item per CTA (bwd_pp_item), and BwdPersistentScheduler, a persistent grid whose producer
// takes every item id from the counter (bwd_decode_item) and hands it to the other roles in an
// smem slot. Both give each role its items the same way, so that a role has one item loop:
//   for (int it = 0;; ++it) { BwdItem w; if (!sched.producer_item(a, ss, it, w)) break; ... }
// (the TMA lane; the dQ-writer warp: sched.writer_item(a, ss, it, lane, w))
// (single tile: item 0 is the CTA's, there is no item 1: a loop of one pass, which the compiler
// removes), and start_walk: the first kept tile (g, m, partial, have) of the item (single tile:
// walked once at CTA start by every thread, shared by the roles; persistent: per item and role).
// item_view: the consumers' view of the current item's (n, hk, b), registers or the smem slot
// (read at each use: the persistent consumers have no registers to spare). The role duties that
// differ are flags: kWriterTakesItems (the dQ-writer warp releases every item slot, so it runs
// whatever the dQ mode, and it marks each item's skipped tiles as it takes it; single tile: warp 2
// marks them at CTA start), kZeroAhead (the look-ahead zeroing of bwd_zero_unit, which needs the
// single-tile grid's launch order).
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
  static constexpr bool kWriterTakesItems = false;
  static constexpr bool kZeroAhead = true;
  BwdItem cta;  // this CTA's item

  template <class T>
  static __device__ __forceinline__ BwdSingleTileScheduler make(const BwdArgs& a) {
    const int4 i = bwd_pp_item<T>(a);
    return BwdSingleTileScheduler{BwdItem{i.x, i.y, i.z, i.w}};
  }
  __device__ __forceinline__ BwdItem first() const { return cta; }
  template <class Storage>
  __device__ __forceinline__ bool producer_item(const BwdArgs&, Storage&, int it,
                                                BwdItem& w) const {
    w = cta;
    return it == 0;
  }
  template <class Storage>
  __device__ __forceinline__ bool writer_item(const BwdArgs&, Storage&, int it, int,
                                              BwdItem& w) const {
    w = cta;
    return it == 0;
  }
  template <int Bm, int Bn>
  __device__ __forceinline__ void start_walk(const BwdArgs&, const BwdItem&, int&, int&, bool&,
                                             bool&) const {}
  // The TMA lane, before loading K / V: nothing to wait for (one item).
  template <class Storage>
  __device__ __forceinline__ void producer_kv_acquire(Storage&, int) const {}
  static __device__ __forceinline__ BwdItemRegs item_view(const volatile int*, int n, int hk,
                                                          int b) {
    return BwdItemRegs{n, hk, b};
  }
};
struct BwdPersistentScheduler {
  static constexpr bool kPersistent = true;
  static constexpr bool kWriterTakesItems = true;
  static constexpr bool kZeroAhead = false;

  template <class T>
  static __device__ __forceinline__ BwdPersistentScheduler make(const BwdArgs&) {
    return BwdPersistentScheduler{};
  }
  __device__ __forceinline__ BwdItem first() const { return BwdItem{0, 0, 0, 0}; }  // per role
  // The TMA lane: item `it` of this CTA into ring slot it % 2 (sched_full: 1 arrival; it waits
  // for sched_empty, i.e. every reader done with the slot's previous item). Every id, the first
  // included, comes from the counter: ids go out in increasing order and only to running CTAs
  // (the deterministic mode's deadlock argument needs both). false: no items left (published as
  // such, so that the other roles stop too).
  template <class Storage>
  __device__ __forceinline__ bool producer_item(const BwdArgs& a, Storage&, int it,
                                                BwdItem& w) const {
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    // the storage from the kernel's dynamic shared memory, not from the parameter (its type
    // only): the slot and barrier addresses then fold into constants as in the kernel body
    // (through the parameter: a common base register, other code)
    extern __shared__ __align__(1024) char smem_raw[];
    Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
    const int s = it & 1;
    Barrier::wait(&ss.x.sched_empty[s], ((it >> 1) & 1) ^ 1);  // slot read by all readers
    const int item = atomicAdd(a.sched, 1);
    w = BwdItem{0, 0, 0, 0};
    if (item < a.items_total) w = bwd_decode_item(a, item);
    volatile int* slot = &ss.x.item[s][0];
    slot[0] = item;
    slot[1] = w.n;
    slot[2] = w.hk;
    slot[3] = w.b;
    pp_arrive(&ss.x.sched_full[s]);  // release: the slot stores are visible to the waiters
    return item < a.items_total;
  }
  // The dQ-writer warp: item `it` from its ring slot (the consumers read the slot directly and
  // release it after their epilogue). Lane 0 alone reads the slot, releases it and passes the id
  // on by shuffle, so every read of the slot precedes an arrival of its own thread: the order
  // compute-sanitizer's racecheck can follow (it tracks arrivals per thread, not a warp barrier
  // followed by one lane's arrival).
  template <class Storage>
  __device__ __forceinline__ bool writer_item(const BwdArgs& a, Storage& ss, int it, int lane,
                                              BwdItem& w) const {
    const int s = it & 1;
    pp_wait(&ss.x.sched_full[s], (it >> 1) & 1);
    int item = 0;
    if (lane == 0) {
      item = *reinterpret_cast<volatile int*>(&ss.x.item[s][0]);
      pp_arrive(&ss.x.sched_empty[s]);
    }
    item = __shfl_sync(0xffffffffu, item, 0);
    if (item >= a.items_total) return false;
    w = bwd_decode_item(a, item);
    return true;
  }
  template <int Bm, int Bn>
  __device__ __forceinline__ void start_walk(const BwdArgs& a, const BwdItem& w, int& g, int& m,
                                             bool& partial, bool& have) const {
    g = 0;
    m = 0;
    partial = false;
    have = bwd_find_kept<Bm, Bn>(a, w.b, w.hk, w.n, g, m, partial);
  }
  // The TMA lane, before loading K / V of an item with tiles, kvu such items before it: the
  // previous one's K / V fully read (kv_empty: the last dQ GEMM done in both warpgroups).
  template <class Storage>
  __device__ __forceinline__ void producer_kv_acquire(Storage& ss, int kvu) const {
    if (kvu > 0) cutlass::arch::ClusterTransactionBarrier::wait(&ss.x.kv_empty, (kvu - 1) & 1);
  }
  static __device__ __forceinline__ BwdItemSlot item_view(const volatile int* slot, int, int, int) {
    return BwdItemSlot{slot};
  }
};

}  // namespace jfm::sm90
