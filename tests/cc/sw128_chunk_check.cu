// Host check for tests/test_sw128_chunk.py: cc/sm90/unseen.cuh's sw128_chunk<R>(r, c) equals the
// byte offset of CuTe's swizzled address of element (r, 8c) from element (0, 0) of every stage, in
// the K-major 128B-swizzle tiles of traits.h (tile_to_shape of GMMA::Layout_K_SW128_Atom, 16-bit
// elements, buffers 1024-byte aligned), and the 8 elements of each chunk are contiguous.
#include <cstdio>
#include <cstdint>
#include <cutlass/numeric_types.h>
#include "unseen.cuh"
using namespace cute;

template <int R, int D, int S>
bool check() {
  using E = cutlass::bfloat16_t;
  const uintptr_t kBase = uintptr_t(1) << 20;
  Tensor t = make_tensor(make_smem_ptr(reinterpret_cast<E*>(kBase)),
                         tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<R>, Int<D>, Int<S>>{}));
  auto at = [&](int r, int c, int st) {
    return (long)(reinterpret_cast<uintptr_t>(raw_pointer_cast(&t(r, c, st))) - kBase);
  };
  for (int st = 0; st < S; ++st)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < D / 8; ++c) {
        const long got = at(0, 0, st) + (long)jfm::sm90::sw128_chunk<R>(r, c);
        for (int j = 0; j < 8; ++j)
          if (at(r, 8 * c + j, st) != got + 2 * j) {
            printf("FAIL R=%d D=%d stage=%d r=%d c=%d j=%d: cute %ld, sw128_chunk %ld\n", R, D, st, r,
                   c, j, at(r, 8 * c + j, st), got + 2 * j);
            return false;
          }
      }
  return true;
}

int main() {
  // forward K / V rings (Bn x d), backward Q / dO rings (Bm x d) and K / V tiles (Bn x d)
  const bool ok = check<128, 128, 2>() && check<128, 64, 2>() && check<80, 256, 2>() &&
                  check<64, 256, 2>() && check<80, 128, 2>() && check<64, 128, 2>() &&
                  check<64, 64, 2>() && check<128, 128, 1>() && check<128, 64, 1>() &&
                  check<64, 256, 1>();
  if (ok) printf("OK\n");
  return ok ? 0 : 1;
}
