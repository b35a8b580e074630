// Masked positions that may hold NaN / Inf (README "Guarantees",
// docs/decisions.md#nan-guarantee-cuda): the rows of a shared-memory tile that no product may see
// are overwritten with zeros before the tile's consumers are released, on the tiles that hold such
// rows only.
//  * unseen key columns (masked for every query row of their mask head): the V rows of a forward
//    key block, the K and V rows of a backward CTA's key block (columns unseen under every mask
//    head of the kv group); flagged per key block by block_meta_sm90's unseen words (one bit per
//    column), and in the forward first per (batch, mask head) by its "any" word, read once per
//    query tile (fwd_kernel.cuh), so that masks without unseen columns read no block's words;
//  * fully masked query rows (lse = -inf): the Q and dO rows of a backward query tile; flagged per
//    (batch, head, tile) by the prep kernel (bwd_aux.cu), the rows read from the tile's lse2.
// Such a tile is staged onto the auxiliary barrier `aux` instead of the consumers' full barrier;
// its rows are zeroed (generic-proxy stores), fenced for the async proxy (the WGMMA reads), and
// the zeroing side then arrives on the full barrier itself: the consumers, their barriers and the
// GEMM schedule are the same on both paths; unflagged tiles take the unchanged path. The forward's
// producer warp zeroes its V tiles itself; in the backward the TMA lane hands each flagged tile to
// a zero warp and goes on (bwd_mainloop.cuh): a flagged Q / dO tile is on every walk that crosses
// padded rows, and the TMA lane zeroing it alone held back the loads queued behind it
// (docs/decisions.md#nan-guarantee-cuda).
// Contract: a tile's rows are 16-byte chunks of 8 contiguous elements in its CuTe smem layout (the
//   K-major 128B-swizzle atoms of traits.h: the swizzle permutes whole 16-byte chunks).
// Synchronization: `aux` (1 arrival + the copies' bytes), one phase in flight at a time (forward:
//   the producer waits for it; backward: the zero warp's `done` of BwdZeroHandoff frees it);
//   fence.proxy.async before the full arrive.
// Knobs: none.
#pragma once

#include "primitives.cuh"

namespace jfm::sm90 {

using namespace cute;

// Generic-proxy stores to shared memory, made visible to the async proxy (WGMMA / TMA reads).
__device__ __forceinline__ void fence_generic_to_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Byte offset, from a tile's first element, of chunk c (elements 8c .. 8c + 7) of row r in an
// [R, D] tile of 16-bit elements laid out in K-major 128B-swizzle atoms (8 rows x 64 elements,
// stacked along the rows first: tile_to_shape of traits.h) at a 1024-byte aligned address: the
// atoms' 16-byte chunks XOR the row within the atom. Equal to CuTe's swizzled address of
// &s(r, 8 c) minus &s(0, 0) for every (R, D) of the shipped tiles (tests/test_sw128_chunk.py
// compiles that check on the host), in a few integer instructions instead of CuTe's
// generic-address rebuild.
template <int R>
CUTE_HOST_DEVICE uint32_t sw128_chunk(int r, int c) {
  static_assert(R % 8 == 0, "whole swizzle atoms");
  return (uint32_t)((r >> 3) * 1024 + (c >> 3) * (R * 128) + (r & 7) * 128 +
                    (((c & 7) ^ (r & 7)) << 4));
}
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// Zeroes row r of the [R, D] smem tile `s` (2-D CuTe tensor, rows mode 0) for every set bit r of
// words[r / 32], R <= 128; thread t of nt threads takes every nt-th 16-byte chunk of those rows.
// The words are read from global memory at each chunk (L1 hits after the first) and the loop is
// not unrolled: no state held in registers (the forward producer warp spilled its walk's state
// with the words in registers and the loop unrolled).
template <int R, int D, class STensor>
__device__ __forceinline__ void zero_tile_rows(STensor&& s, const uint32_t* words, int t, int nt) {
  static_assert(R <= 128 && D % 8 == 0, "rows of whole 16-byte chunks, at most 128");
  static_assert(sizeof(typename std::decay_t<STensor>::value_type) == 2, "16-bit elements");
  constexpr int kChunks = D / 8;
  const uint32_t base = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&s(0, 0)));
#pragma unroll 1
  for (int u = t; u < R * kChunks; u += nt) {
    const int r = u / kChunks, c = u % kChunks;
    if ((__ldg(words + (r >> 5)) >> (r & 31)) & 1u) st_shared_zero16(base + sw128_chunk<R>(r, c));
  }
}

// Whether key block n may hold columns that the kv group hk leaves unseen: any unseen column of
// the group's first mask head (a necessary condition; bwd_load_kv_zeroed tests each row against
// every mask head).
// `unseen`: block_meta_sm90's words (laid out as the block metadata, 4 per block).
__device__ __forceinline__ bool bwd_unseen_any(const uint32_t* unseen, int Hm, int nblk,
                                               int heads_per_kv, int heads_per_mask, int b, int hk,
                                               int n) {
  const int hm0 = hk * heads_per_kv / heads_per_mask;
  const uint32_t* p = unseen + ((int64_t)b * Hm + hm0) * 8 * nblk + 4 * n;
  return (__ldg(p) | __ldg(p + 1) | __ldg(p + 2) | __ldg(p + 3)) != 0u;
}

}  // namespace jfm::sm90
