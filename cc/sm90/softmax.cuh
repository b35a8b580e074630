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

}  // namespace jfm::sm90
