// Run-time kernel arguments (passed as __grid_constant__): KArgs (forward), BwdArgs (backward).
// Contract: filled by the host launchers (fwd_kernel.cuh launch_fwd, bwd_host.cuh bwd_args);
//   pointers to workspaces the launchers sized and zeroed on the same stream.
// Synchronization: none (read-only in the kernels).
// Knobs: none; every field is a fact of the call (sizes, pointers, mode flags).
#pragma once

#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

struct KArgs {
  void* o;
  float* lse;
  const int32_t* bounds;
  const int32_t* meta;
  int B, Sq, Sk, N, K, Hm;
  int nblk;
  int heads_per_kv, heads_per_mask;
  float scale_log2;
  int* tile_counter;  // the persistent grid's dynamic tile counter (zeroed by the launcher)
  int smem_bounds;    // 1: partial blocks' bounds are staged in smem by the producer (Sk % 4 == 0)
  int tile_overlap;   // 1: the next tile's block scan and first QK^T are issued while the
                      // current tile's last PV GEMM runs (Overlap kernels; every launcher sets 0)
  int group_meta;     // kGroupScan kernels: offset in int32 elements from the block
                      // metadata of (b, hm) to its group metadata (int4 {LTSmax, LTEmin, UTSmax,
                      // UTEmin} per group of 32 key blocks); 0 = no group level (every group scanned)
  // Soft-cap kernels (T::kSoftCap): scores become tanh(S * softcap_prescale) with softcap_prescale
  // = scale / cap, and scale_log2 = cap * log2(e) scales them in the softmax.
  float softcap_prescale;
  // Unseen key columns (unseen.cuh): offset in int32 elements from the block metadata of (b, hm)
  // to its unseen words (block_meta_sm90: 4 per key block, one bit per column masked for every
  // query row); the producer zeroes those V rows of the blocks that hold any.
  int unseen_off;
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
  // Deterministic mode: dq_sem [B, N, mblk, sem_words] holds one bit per (query tile, key block),
  // set once that key block's dQ contribution to the tile is complete in dq_accum (or at CTA start
  // when the key block skips the tile). A CTA adds its tile only after every key block above it
  // has its bit: contributions land in descending key-block order, the same on every run.
  int deterministic;
  uint32_t* dq_sem;
  int sem_words;
  // Persistent grid: sched[0] = item counter, sched[4 + r] = key block of rank r (see
  // BwdPersistentScheduler); items_total = nblk * K * B; sec_heads = (b, kv head) pairs per
  // L2 section of the item order.
  int* sched;
  int items_total;
  int sec_heads;
  // Launch groups (deterministic mode): (kv head, batch) pairs per interleaved launch group (>= 1);
  // 0 = the group size that the pre-pass wrote to sched[1].
  int det_group;
  // Deterministic: 1 = take the pair's launch / summation order from the pre-pass when it wrote
  // one (sched[2] = 1: sched[4 + nblk + (b * Hm + hm) * nblk + i] = the key block at launch
  // position i); 0 = descending key block.
  int det_perm;
  // Look-ahead zeroing of dq_accum (bwd_zero_ahead below; nullptr = the prep kernel zeroes all of
  // it): one counter per launch unit, zeroed before the launch.
  int* zero_count;
  // 80-row and d = 256 kernels, default mode: 1 = clocked walks (bwd_group_skips_none), key
  // block n from tile r = (*walk_clock / walk_sms + n) mod mblk, walk_clock counting the tiles
  // the clocked walks issued so far (its start value is arbitrary); 0 = ascending (every other
  // kernel, deterministic mode).
  int walk_clocked;
  uint32_t* walk_clock;
  int walk_sms;
  // Soft-cap kernels (T::kSoftCap): P = exp2(tanh(S * softcap_prescale) * scale_log2 - lse2) with
  // scale_log2 = cap * log2(e); softcap_inv_sl2 = 1 / scale_log2 recovers the tanh from P for
  // dS's factor 1 - tanh^2.
  float softcap_prescale, softcap_inv_sl2;
  // Masked positions (unseen.cuh): unseen = the words of block_meta_sm90 (laid out as `meta`) (K / V rows
  // zeroed once per CTA where the kv group leaves a column unseen); tile_flags = [B, N, mblk], 1
  // where the query tile holds a fully masked row (set by the prep kernel: its Q / dO rows zeroed).
  const uint32_t* unseen;
  const int32_t* tile_flags;
};

}  // namespace jfm::sm90
