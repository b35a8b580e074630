// Softmax arithmetic shared by the kernels: the exp2 the online softmax and the backward's P use.
// Contract: ex2.approx.ftz on fp32; the running max / rescale of the online softmax stays in the
//   kernel bodies (fwd_kernel.cuh, bwd_kernel.cuh), next to the GEMMs it overlaps.
// Synchronization: none. Knobs: none.
#pragma once

#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The logits soft cap's tanh (MUFU.TANH, max relative error ~2^-11: below bf16's rounding of P)
// and the log2 the backward recovers it with.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Soft-cap backward factor d tanh(u) / du = 1 - t^2 of a score whose P = exp2(t * sl2 - lse2)
// is p: t = (log2 p + lse2) / sl2. Zero where p is 0 (masked, or exp2 underflow: dS is 0 there
// anyway, and log2 0 = -inf would make it NaN); a NaN p keeps dS NaN through p itself.
__device__ __forceinline__ float softcap_dtanh(float p, float lse2, float inv_sl2) {
  const float t = (fast_log2(p) + lse2) * inv_sl2;
  return p > 0.f ? fmaxf(1.f - t * t, 0.f) : 0.f;
}

}  // namespace jfm::sm90
