// 2^x evaluated on the FMA/ALU pipes instead of the MUFU (SFU) pipe, for the softmax of the
// forward kernel's variant 8 (cc/sm90/fwd_kernel.cuh: a fixed share of each thread's softmax
// exponentials go through this function, the rest through ex2.approx). Host + device, so
// benchmarks/exp2_fma_check.cu can sweep it on the CPU with the same arithmetic.
//
// Domain: the softmax arguments x = s*scale*log2(e) - m*scale*log2(e) <= ~0, and -inf for masked
// scores. Method (8 SASS instructions: FMNMX, FADD.RM, 2 FADD, 3 FFMA, 1 IMAD for the shift-add):
//   x <- max(x, -127)                      -inf and large negative arguments -> -127
//   t  = RD(x + 1.5*2^23)                  = 1.5*2^23 + floor(x) exactly: every float in
//                                            [2^23, 2^24) is an integer, so rounding down is floor;
//                                            bits(t) = 0x4B400000 + floor(x)
//   n  = t - 1.5*2^23, f = x - n           both exact; f in [0, 1]
//   p  = 1 + f*(c1 + f*(c2 + f*c3))        2^f on [0, 1], relative minimax fit with p(0) = 1
//                                            exactly (so x = -127 gives exactly +0 below);
//                                            p in [1, 2), exponent field 127
//   2^x = bits(p) + (bits(t) << 23)        adds floor(x) to the exponent field (the constant
//                                            part of bits(t) has its low 9 bits zero and drops out)
// Accuracy (benchmarks/exp2_fma_check.cu): max relative error 8.6e-5 against exp2 for
// x in [-126, 0] (plus float rounding of f); x = -inf and x <= -127 give exactly +0; for
// -127 < x < -126 the result is a subnormal below 2^-126 (not 2^x: harmless in a softmax sum,
// where ex2.approx.ftz returns 0). Never NaN, never negative, for any x <= 2^22 (and NaN -> 0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace jfm::sm90 {

// Coefficients of 1 + c1 f + c2 f^2 + c3 f^3 ~ 2^f on [0, 1]: linear-programming fit of the
// maximum relative error on a 4001-point grid, rounded to float (benchmarks/NOTES.md, variant 8).
constexpr float kExp2C1 = 0.6951166391372681f;
constexpr float kExp2C2 = 0.22764497995376587f;
constexpr float kExp2C3 = 0.07706724107265472f;
constexpr float kExp2Shift = 12582912.0f;  // 1.5 * 2^23

__host__ __device__ __forceinline__ float exp2_fma(float x) {
#if defined(__CUDA_ARCH__)
  x = fmaxf(x, -127.0f);
  const float t = __fadd_rd(x, kExp2Shift);  // FADD.RM
  const float n = __fsub_rn(t, kExp2Shift);
  const float f = __fsub_rn(x, n);
  const float p = fmaf(f, fmaf(f, fmaf(f, kExp2C3, kExp2C2), kExp2C1), 1.0f);
  const uint32_t r = static_cast<uint32_t>(__float_as_int(p)) +
                     (static_cast<uint32_t>(__float_as_int(t)) << 23);
  return __int_as_float(static_cast<int>(r));
#else
  // Host mirror (benchmarks/exp2_fma_check.cu): the same float operations; RD(x + 1.5*2^23) is
  // written as 1.5*2^23 + floor(x), which is exact and equal for every x in [-127, 2^22].
  x = std::fmax(x, -127.0f);
  const float t = kExp2Shift + std::floor(x);
  const float n = t - kExp2Shift;
  const float f = x - n;
  const float p = std::fma(f, std::fma(f, std::fma(f, kExp2C3, kExp2C2), kExp2C1), 1.0f);
  uint32_t pb, tb;
  std::memcpy(&pb, &p, 4);
  std::memcpy(&tb, &t, 4);
  const uint32_t r = pb + (tb << 23);
  float y;
  std::memcpy(&y, &r, 4);
  return y;
#endif
}

}  // namespace jfm::sm90
