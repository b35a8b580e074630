// sm_90a primitives the kernels share: 1-D bulk copies on mbarriers, one WGMMA batch
// (wgmma_gemm), acquire loads, and the consumer hand-off barriers of the backward (pp_arrive /
// pp_wait with "memory" clobbers).
// Contract: thin wrappers over PTX; callers own the barrier phases and the wgmma fences.
// Synchronization: as named (mbarrier arrive / try_wait, wgmma commit / wait groups).
// Knobs: wgmma_gemm<kZeroInit, kWait, kARegs>.
#pragma once

#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

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

__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Consumer hand-offs with "memory" clobbers, so that the compiler keeps the plain smem accesses
// (dS stores, row statistics and dQ-offset loads) on the right side of them (the CUTLASS barrier
// and proxy-fence wrappers carry no clobber).
__device__ __forceinline__ void pp_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cute::cast_smem_ptr_to_uint(bar))
               : "memory");
}
__device__ __forceinline__ void pp_wait(uint64_t* bar, int parity) {
  cutlass::arch::ClusterTransactionBarrier::wait(bar, parity);
  asm volatile("" ::: "memory");
}
__device__ __forceinline__ void pp_fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace jfm::sm90
