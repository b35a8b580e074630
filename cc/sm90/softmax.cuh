// Softmax arithmetic: the exp2 the kernels share (the backward's P, the forward's online softmax)
// and the forward's online softmax (FwdOnlineSoftmax: running row max, rescale factors, exp2 of the
// scaled scores, running row sum). The backward's P from the saved LSE is in bwd_mainloop.cuh.
// Contract: scores in log2 units after * scale_log2; a row with no visible score keeps m = -inf
//   and l = 0 (the epilogue's empty-row rule, epilogue.cuh fwd_store_o_lse).
// Synchronization: quad shuffles (a row lives in the 4 lanes of a quad); at d = 256 one warp vote
//   per block (the lazy rescale decides per warp).
// Knobs: FwdOnlineSoftmax<D, Bn, NWG>: kLazyRescale (d = 256), kRescaleLog2.
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

// Online softmax of the forward on a consumer thread's S fragment (64 x Bn per warpgroup, rows
// i = 0, 1 of this thread: elements 4 * kk + 2 * i + j), in place (S -> P). A view over the
// running max m_i and sum l_i of the thread's two rows, which the caller owns and initializes to
// -inf / 0 per query tile (the epilogue reads them); one object per tile.
template <int D, int Bn, int NWG>
struct FwdOnlineSoftmax {
  // kLazyRescale (d = 256): the running max m_i moves only when a row of the warp grows past it
  // by more than kRescaleLog2 (log2 units of the scaled score) or had no visible score yet;
  // otherwise P = 2^(s*sl2 - m_i*sl2) <= 2^kRescaleLog2 and O / l keep their scale, which the
  // epilogue's O / l and lse = m + ln l take as they are, and the block skips O's rescale (128
  // FMUL per thread at d = 256; at d = 64 / 128 the test costs more than it saves, so they
  // rescale always: docs/decisions.md#fwd-d256-bn80).
  static constexpr bool kLazyRescale = D >= 256;
  static constexpr float kRescaleLog2 = 8.f;

  float (&m_i)[2];
  float (&l_i)[2];
  const float& sl2;  // softmax scale * log2(e)

  __device__ __forceinline__ FwdOnlineSoftmax(float (&m)[2], float (&l)[2], const float& scale_log2)
      : m_i(m), l_i(l), sl2(scale_log2) {}

  // The exp of row i against the max m_i (resc: first moved to x) and l_i's update; selects,
  // not a branch: ptxas then keeps the exp loop ahead of the PV GEMM's wait.
  template <class FragS>
  __device__ __forceinline__ void exp_row(FragS& tSrS, int i, float x, bool resc,
                                          float (&corr)[2]) {
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
  }

  // The largest score of row i in this thread's fragment: a pairwise tree (depth log2(Bn / 4)),
  // not a chain through one accumulator, so that the row's exp can start sooner; max is exact and
  // order-free (fmaxf drops a NaN operand either way), so the result is the chain's bit for bit
  // (docs/decisions.md#fwd-row-max-tree).
  template <class FragS>
  __device__ __forceinline__ static float row_max(FragS const& tSrS, int i) {
    constexpr int N = Bn / 4;
    float v[N];
    CUTE_UNROLL
    for (int kk = 0; kk < Bn / 8; ++kk) {
      v[2 * kk] = tSrS(4 * kk + 2 * i);
      v[2 * kk + 1] = tSrS(4 * kk + 2 * i + 1);
    }
    CUTE_UNROLL
    for (int w = 1; w < N; w *= 2) {
      CUTE_UNROLL
      for (int k = 0; k + w < N; k += 2 * w) v[k] = fmaxf(v[k], v[k + w]);
    }
    return v[0];
  }

  // S -> P for one key block; the O correction factors in corr, and whether O must be rescaled
  // by them (always, unless kLazyRescale).
  template <class FragS>
  __device__ __forceinline__ bool online_softmax(FragS& tSrS, float (&corr)[2]) {
    float mx[2];
    bool grow = false;
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      // the running max last: at d = 64's 160 registers ptxas keeps m_i / l_i in local memory
      // across the GEMM issue, and the tree then starts without waiting for their load
      float x = fmaxf(row_max(tSrS, i), m_i[i]);
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
      mx[i] = x;
      if constexpr (kLazyRescale) {
        grow |= (x - m_i[i]) * sl2 > kRescaleLog2 || (m_i[i] == -INFINITY && x != -INFINITY);
      } else {
        // row by row: ptxas runs row 1's max under row 0's exps
        exp_row(tSrS, i, x, true, corr);
      }
    }
    if constexpr (!kLazyRescale) return true;
    const bool resc = __any_sync(0xffffffffu, grow);
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) exp_row(tSrS, i, mx[i], resc, corr);
    return resc;
  }

  // O *= corr row by row (the O accumulator: elements 4 * kk + 2 * i + {0, 1}).
  template <class FragO>
  __device__ __forceinline__ static void rescale_o(FragO& tOrO, float const (&corr)[2]) {
    CUTE_UNROLL
    for (int kk = 0; kk < D / 8; ++kk) {
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        tOrO(4 * kk + 2 * i) *= corr[i];
        tOrO(4 * kk + 2 * i + 1) *= corr[i];
      }
    }
  }
};

}  // namespace jfm::sm90
