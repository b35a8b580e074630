// Host checks of the addressing of the backward's smem / workspace tiles (cc/sm90/bwd_kernel.cuh),
// for variant 5 (bf16 d128, fp16 d64: 64-row query tiles) and variant 7 (bf16 d64, 128-row tiles):
//  * dS store (store_ds_tile): for the swizzled SmemLayoutdS tensor on a 1024-byte aligned buffer,
//    the element offset of (q0 + 8 j, k, s) must equal off(q0, k, s) + 512 j for every q0 < 8,
//    j < Bm / 8, key k and buffer s, and the kernel's per-thread form (4 bases + (e / 4) * 512)
//    must address the element its dS^T fragment holds;
//  * dQ tile (put_dq -> bwd_convert): the offset a consumer thread stores fragment element e of
//    its dQ accumulator at must be the offset bwd_convert reads (row r, col c) from, where (r, c)
//    is that element's coordinate in the Bm x D dQ tile (CuTe's partition of an identity tensor),
//    and every offset of the tile is hit exactly once;
//  * variant 16 (80-row tiles): store_ds_tile_stsm's stmatrix.trans lanes / registers must store
//    every element of the dS^T fragment where store_ds_tile would;
//  * sizeof(SharedStorage) against the 227 KB opt-in limit (printed).
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icc/sm90 -isystem $CUTLASS_INCLUDE \
//        benchmarks/bwd_ds_addr_check.cu -o /tmp/bwd_ds_addr_check && /tmp/bwd_ds_addr_check
#include "bwd_kernel.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace cute;

// bwd_aux.cu's reader (dq_frag_offset + the 64-row block base), restated for the host.
static int64_t convert_offset(int i, int c, int d) {
  const int dqc = d >= 128 ? d / 2 : d;
  const int r = i % 64, wq = c / dqc, cc = c % dqc;
  const int lane = 4 * (r % 8) + (cc % 8) / 2;
  return (int64_t)(i / 64) * 64 * d + (int64_t)wq * 64 * dqc +
         (((r / 16) * 2 + (r / 8) % 2) * (dqc / 8) + cc / 8) * 64 + 2 * lane + (cc % 2);
}

template <class T>
int check(const char* name) {
  using E = typename T::Elem;
  constexpr int Bm = T::Bm, Bn = T::Bn, D = T::D;
  E* buf = static_cast<E*>(aligned_alloc(1024, 1 << 17));
  Tensor sdS = make_tensor(make_smem_ptr(buf), typename T::SmemLayoutdS{});
  auto off = [&](int q, int k, int s) { return (int)(raw_pointer_cast(&sdS(q, k, s)) - buf); };
  int bad = 0;
  for (int s = 0; s < T::kDsBufs; ++s)
    for (int k = 0; k < Bn; ++k)
      for (int q0 = 0; q0 < 8; ++q0)
        for (int j = 0; j < Bm / 8; ++j)
          if (off(q0 + 8 * j, k, s) != off(q0, k, s) + 512 * j) ++bad;
  // the kernel's per-thread form: 4 bases (key half i, query parity c) + (e / 4) * 512 elements
  for (int ctid = 0; ctid < 128 * T::NWG; ++ctid)
    for (int s = 0; s < T::kDsBufs; ++s)
      for (int e = 0; e < Bm / 2; ++e) {
        const int lane = ctid % 32, wg = ctid / 128;
        const int row_b = 16 * ((ctid / 32) % 4) + lane / 4, col_b = 2 * (lane % 4);
        const int ref = off(8 * (e / 4) + col_b + (e % 2), 64 * wg + row_b + 8 * ((e / 2) % 2), s);
        const int got = off(col_b + e % 2, 64 * wg + row_b + 8 * ((e / 2) % 2), s) + (e / 4) * 512;
        if (ref != got) ++bad;
      }
  // store_ds_tile_stsm (variant 16, Bm = 80): stmatrix.x4.trans number p, block m = 4 lanes' worth:
  // the element (key a, query b) of block m comes from lane 4a + b / 2, register 4p + m, half
  // b % 2 (fragment element e = 2 (4p + m) + b % 2), and is stored at lane 8m + b's row address +
  // a; that must be the offset of the element the fragment holds.
  if constexpr (T::kDqTrans) {
    for (int wg = 0; wg < T::NWG; ++wg)
      for (int warp = 0; warp < 4; ++warp)
        for (int s = 0; s < T::kDsBufs; ++s)
          for (int p = 0; p < Bm / 16; ++p)
            for (int m = 0; m < 4; ++m)
              for (int a = 0; a < 8; ++a)
                for (int b = 0; b < 8; ++b) {
                  const int lane = 4 * a + b / 2, e = 2 * (4 * p + m) + b % 2;
                  const int row_b = 16 * warp + lane / 4, col_b = 2 * (lane % 4);
                  const int ref = off(8 * (e / 4) + col_b + (e % 2), 64 * wg + row_b + 8 * ((e / 2) % 2), s);
                  const int sl = 8 * m + b;  // the lane whose address is stored row b of block m
                  const int row = off(sl % 8, 64 * wg + 16 * warp + 8 * ((sl / 8) % 2), s) +
                                  (sl / 16) * 512 + 2 * p * 512;
                  if (row + a != ref) ++bad;
                }
  }
  const int ds_bad = bad;

  // dQ: the store offsets of put_dq against bwd_convert's read offsets
  typename T::TiledMmadQ mma_dq;
  Tensor cdQ = make_identity_tensor(Shape<Int<Bm>, Int<D>>{});
  std::vector<int> hits(Bm * D, 0);
  int dq_bad = 0;
  // (variant 16's transposed dQ tile has its own order and converter: tests/test_bwd_prep_layout.py)
  for (int ctid = 0; ctid < (T::kDqTrans ? 0 : 128 * T::NWG); ++ctid) {
    const int wg = ctid / 128;
    const bool dq_store = T::kDqWG == T::NWG || wg == 0;
    if (!dq_store) continue;
    auto thr = mma_dq.get_thread_slice(T::kDqWG == T::NWG ? ctid : ctid % 128);
    Tensor tc = thr.partition_C(cdQ);
    const int fb = (T::kDqWG == T::NWG ? ctid / 128 : 0) * 64 * T::kDqCols +
                   ((ctid / 32) % 4) * 2 * T::kDqKK * 64 + 2 * (ctid % 32);
    for (int e = 0; e < size(tc); ++e) {
      const int o = fb + (((e / 2) % 2) * T::kDqKK + e / 4) * 64 + (e % 2);
      const int r = get<0>(tc(e)), c = get<1>(tc(e));
      if (o < 0 || o >= Bm * D || convert_offset(r, c, D) != o) { ++dq_bad; continue; }
      ++hits[o];
    }
  }
  if constexpr (!T::kDqTrans)
    for (int o = 0; o < Bm * D; ++o) dq_bad += hits[o] != 1;
  bad += dq_bad;
  std::printf("%s (Bm %d): dS %d mismatches, dQ %d mismatches; smem %zu B (limit %d)\n", name, Bm,
              ds_bad, dq_bad, sizeof(typename T::SharedStorage), 227 * 1024);
  std::free(buf);
  return bad;
}

int main() {
  int bad = check<jfm::sm90::BwdTraits<cutlass::bfloat16_t, 128>>("v5 bf16 d128");
  bad += check<jfm::sm90::BwdTraits<cutlass::half_t, 64>>("v5 fp16 d64");
  bad += check<jfm::sm90::BwdTraits<cutlass::bfloat16_t, 64, false, 128>>("v7 bf16 d64");
  bad += check<jfm::sm90::BwdTraits<cutlass::half_t, 64, false, 128>>("v7 fp16 d64");
  bad += check<jfm::sm90::BwdRows80<cutlass::bfloat16_t, 128>>("v16 bf16 d128");
  bad += check<jfm::sm90::BwdRows80<cutlass::half_t, 128>>("v16 fp16 d128");
  return bad != 0;
}
