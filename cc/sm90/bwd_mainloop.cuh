// Building blocks of the backward main loops: the dS tile's stores to shared memory (32-bit
// shared addresses, or stmatrix.trans for the 80-row kernel). The loops themselves (walk, GEMM
// issue, softmax, dS) are still the kernel bodies in bwd_kernel.cuh / bwd_d256_kernel.cuh.
// Contract: the SmemLayoutdS of traits.h (K-major, 128B swizzle), bit for bit as a CuTe store.
// Synchronization: the caller fences the generic-proxy stores before the GEMMs read them.
// Knobs: none.
#pragma once

#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

// A consumer thread's share of its dS^T fragment into the dS tile (queries x keys, K-major, 128B
// swizzle) on 32-bit shared addresses: 4 swizzled bases per thread (one per (key half, query
// parity)); the 8 query-row groups of 8 are +1,024 bytes each (the swizzle only sees the row
// within a group of 8, for every (q, k, stage) of the SmemLayoutdS instantiations). Storing through the CuTe tensor rebuilds
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

// store_ds_tile with stmatrix.trans (the 80-row lock-step body): the same dS^T fragment with 5
// STSM.x4.trans per thread instead of 40 STS.16, the same bits in smem (the store sits between the
// dP wait and the dS barrier of both warpgroups, on every tile's critical path).
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

}  // namespace jfm::sm90
