// Host check of the dS store addressing of backward variant 4 (cc/sm90/bwd_kernel.cuh): for the
// swizzled SmemLayoutdS tensor on a 1024-byte aligned buffer, the element offset of (q0 + 8 j, k, s)
// must equal off(q0, k, 0) + 512 j + 8192 s for every q0 < 8, j < 8, key k and stage s.
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icc/sm90 -isystem $CUTLASS_INCLUDE \
//        benchmarks/bwd_ds_addr_check.cu -o /tmp/bwd_ds_addr_check && /tmp/bwd_ds_addr_check
#include "bwd_kernel.cuh"

#include <cstdio>
#include <cstdlib>

using namespace cute;

template <class T>
int check(const char* name) {
  using E = typename T::Elem;
  E* buf = static_cast<E*>(aligned_alloc(1024, 1 << 16));
  Tensor sdS = make_tensor(make_smem_ptr(buf), typename T::SmemLayoutdS{});
  auto off = [&](int q, int k, int s) { return (int)(raw_pointer_cast(&sdS(q, k, s)) - buf); };
  int bad = 0;
  for (int s = 0; s < T::kDsBufs; ++s)
    for (int k = 0; k < T::Bn; ++k)
      for (int q0 = 0; q0 < 8; ++q0)
        for (int j = 0; j < T::Bm / 8; ++j)
          if (off(q0 + 8 * j, k, s) != off(q0, k, 0) + 512 * j + 8192 * s) ++bad;
  // the kernel's per-thread form: 4 bases (key half i, query parity c) + (e / 4) * 512 elements
  for (int ctid = 0; ctid < 128 * T::NWG; ++ctid)
    for (int s = 0; s < T::kDsBufs; ++s)
      for (int e = 0; e < 32; ++e) {
        const int lane = ctid % 32, wg = ctid / 128;
        const int row_b = 16 * ((ctid / 32) % 4) + lane / 4, col_b = 2 * (lane % 4);
        const int ref = off(8 * (e / 4) + col_b + (e % 2), 64 * wg + row_b + 8 * ((e / 2) % 2), s);
        const int got = off(col_b + e % 2, 64 * wg + row_b + 8 * ((e / 2) % 2), s) + (e / 4) * 512;
        if (ref != got) ++bad;
      }
  std::printf("%s: %d mismatches\n", name, bad);
  std::free(buf);
  return bad;
}

int main() {
  int bad = check<jfm::sm90::BwdTraits<cutlass::bfloat16_t, 128, true, true, true>>("bf16 d128");
  bad += check<jfm::sm90::BwdTraits<cutlass::half_t, 64, true, true, true>>("fp16 d64");
  return bad != 0;
}
