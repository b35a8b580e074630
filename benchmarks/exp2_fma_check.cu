// Host check of exp2_fma (cc/sm90/exp2_fma.h), the FMA-pipe 2^x of forward variant 8: the same
// float arithmetic as the device code (RD(x + 1.5*2^23) written as 1.5*2^23 + floor(x), equal for
// every x it sees), swept over every float in [-130, -2^-24] plus the edge cases the softmax
// relies on. No GPU needed:
//   nvcc -std=c++17 -O2 -Icc/sm90 benchmarks/exp2_fma_check.cu -o /tmp/exp2_fma_check && /tmp/exp2_fma_check
#include "exp2_fma.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

using jfm::sm90::exp2_fma;

static float from_bits(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
static uint32_t to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

// round-to-nearest-even float -> bf16 / fp16 value (as float / double), normal range only
static float to_bf16(float x) {
  uint32_t b = to_bits(x);
  b += 0x7fffu + ((b >> 16) & 1u);
  return from_bits(b & 0xffff0000u);
}
static double to_fp16(double x) {  // x in (2^-14, 1]: 11 significant bits
  int e;
  const double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11);
}

int main() {
  int fails = 0;
  // 1. dense sweep: every float x in [-130, -2^-24] (negative floats: bits 0xB3800000 .. 0xC3020000)
  double max_rel = 0, max_rel_f = 0, x_at = 0;
  double max_rel_sub = 0;  // (-127, -126): absolute error relative to 2^-126
  uint64_t n_norm = 0, bf16_diff = 0, fp16_diff = 0, n_fp16 = 0;
  bool bad = false;
  for (uint32_t b = 0xB3800000u; b <= 0xC3020000u; ++b) {
    const float x = from_bits(b);
    const float y = exp2_fma(x);
    if (!(y >= 0.0f) || std::isinf(y)) {
      if (!bad) std::printf("FAIL: exp2_fma(%a) = %a\n", x, y);
      bad = true;
      continue;
    }
    const double ref = std::exp2((double)x);
    if (x >= -126.0f) {
      const double rel = std::fabs((double)y / ref - 1.0);
      if (rel > max_rel) { max_rel = rel; x_at = x; }
      const float reff = std::exp2f(x);
      const double relf = std::fabs((double)y / (double)reff - 1.0);
      if (relf > max_rel_f) max_rel_f = relf;
      ++n_norm;
      // does the P operand change? bf16 for every x, fp16 where 2^x is an fp16 normal
      if (to_bf16(y) != to_bf16((float)ref)) ++bf16_diff;
      if (x >= -14.0f) {
        ++n_fp16;
        if (to_fp16((double)y) != to_fp16(ref)) ++fp16_diff;
      }
    } else if (x > -127.0f) {
      const double a = std::fabs((double)y - ref) / std::ldexp(1.0, -126);
      if (a > max_rel_sub) max_rel_sub = a;
      if (y > std::ldexp(1.0f, -126)) { std::printf("FAIL: %a -> %a above 2^-126\n", x, y); bad = true; }
    } else if (y != 0.0f) {
      std::printf("FAIL: exp2_fma(%a) = %a, want 0 for x <= -127\n", x, y);
      bad = true;
    }
  }
  fails += bad;
  std::printf("sweep: %llu floats in [-126, -2^-24]: max rel error vs exp2 (double) %.3e at x = %.6g, "
              "vs exp2f %.3e\n", (unsigned long long)n_norm, max_rel, x_at, max_rel_f);
  std::printf("       P operand changed by the approximation: bf16 %.3f %% of x in [-126, 0), "
              "fp16 %.3f %% of x in [-14, 0)\n"
              "       (each by 1 ulp at most: the relative error is below half an ulp of both formats)\n",
              100.0 * bf16_diff / n_norm, 100.0 * fp16_diff / n_fp16);
  std::printf("       (-127, -126): |y - 2^x| <= %.3f * 2^-126 (subnormal range; ex2.approx.ftz gives 0)\n",
              max_rel_sub);
  if (max_rel > 1e-4) { std::printf("FAIL: relative error above 1e-4\n"); ++fails; }

  // 2. tiny arguments around 0 (the row maximum itself; x can round to a tiny positive value)
  double max_rel0 = 0;
  for (float x = -1e-3f; x <= 1e-3f; x = std::nextafter(x, 1.0f)) {
    if (x > -std::ldexp(1.0f, -24) && x < 0) continue;  // covered below in steps
    const double rel = std::fabs((double)exp2_fma(x) / std::exp2((double)x) - 1.0);
    if (rel > max_rel0) max_rel0 = rel;
  }
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-38f, -1e-38f, 1e-45f, -1e-45f}) {
    const double rel = std::fabs((double)exp2_fma(x) - 1.0);
    if (rel > max_rel0) max_rel0 = rel;
  }
  std::printf("near 0 (|x| <= 1e-3 incl. +-0, +-1e-45): max rel error %.3e\n", max_rel0);
  if (max_rel0 > 1e-4) { std::printf("FAIL near 0\n"); ++fails; }

  // 3. edges the masking relies on: -inf and huge negative arguments -> exactly +0 (no NaN)
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct { float x; const char* name; } edge[] = {
      {-inf, "-inf"}, {-std::numeric_limits<float>::max(), "-FLT_MAX"}, {-1e30f, "-1e30"},
      {-4194304.0f, "-2^22"}, {-1000.0f, "-1000"}, {-150.0f, "-150"}, {-127.0f, "-127"},
      {std::nextafter(-127.0f, 0.0f), "-127+ulp"}, {-126.5f, "-126.5"},
      {std::nextafter(-126.0f, -200.0f), "-126-ulp"}, {-126.0f, "-126"}, {nan, "NaN"}};
  for (auto& e : edge) {
    const float y = exp2_fma(e.x);
    std::printf("  exp2_fma(%-9s) = %-14a (%g)  bits 0x%08x\n", e.name, y, y, to_bits(y));
  }
  for (float x : {-inf, -std::numeric_limits<float>::max(), -1e30f, -4194304.0f, -1000.0f,
                  -150.0f, -127.0f, nan})
    if (to_bits(exp2_fma(x)) != 0u) { std::printf("FAIL: %a does not give +0\n", x); ++fails; }
  if (exp2_fma(-126.0f) != std::ldexp(1.0f, -126)) { std::printf("FAIL: 2^-126\n"); ++fails; }
  if (exp2_fma(0.0f) != 1.0f) { std::printf("FAIL: 2^0 != 1\n"); ++fails; }

  // 4. monotone (non-decreasing) over [-127, 0]: a softmax never sees 2^a > 2^b for a < b
  uint64_t nonmono = 0;
  float prev = exp2_fma(-127.0f);
  for (uint32_t b = 0xC2FE0000u; b >= 0xB3800000u; --b) {  // -127 up to -2^-24
    const float y = exp2_fma(from_bits(b));
    if (y < prev) ++nonmono;
    prev = y;
  }
  std::printf("monotonicity over [-127, -2^-24]: %llu decreasing steps\n", (unsigned long long)nonmono);

  std::printf(fails ? "exp2_fma_check: %d FAILED\n" : "exp2_fma_check: all checks passed\n", fails);
  return fails ? 1 : 0;
}
