// Host check of the layout assumptions of the d = 256 backward (cc/sm90/bwd_d256_kernel.cuh):
// the accumulator fragment element -> (row, column) formula the kernel uses for S^T / dP^T
// (64 x 32 per warpgroup) and dV / dK / dQ (64 x 128 per warpgroup, warpgroup w = columns
// 128w..), the Q stage offset (a warpgroup's fp32 dQ half is staged over one Q or dO stage), the
// dS view of the stored dS^T for the dQ GEMM, the 32-bit P^T / dS^T pair stores, and the fp32 dQ
// offsets against bwd_convert's fragment order (bwd_aux.cu dq_frag_offset, dqc = 128).
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icc/sm90 -isystem $CUTLASS_INCLUDE \
//        benchmarks/bwd_d256_layout_check.cu -o /tmp/bwd_d256_layout_check && /tmp/bwd_d256_layout_check
#include "bwd_d256_kernel.cuh"
#include <cstdio>
#include <vector>
using namespace jfm::sm90;
using namespace cute;
template <class E> int run() {
  using T = BwdD256Traits<E>;
  int bad = 0;
  typename T::TiledMmaSdP mma_sdp; typename T::TiledMmadKV mma_dkv; typename T::TiledMmadQ mma_dq;
  auto cS = make_identity_tensor(Shape<_64, _64>{});
  auto cK = make_identity_tensor(Shape<_64, _256>{});
  for (int ctid = 0; ctid < 256; ++ctid) {
    int wg = ctid / 128, lane = ctid % 32, rb = 16 * ((ctid / 32) % 4) + lane / 4, cb = 2 * (lane % 4);
    auto t1 = mma_sdp.get_thread_slice(ctid).partition_C(cS);
    if (size(t1) != 16) { printf("sdp size %d\n", (int)size(t1)); return 1; }
    for (int e = 0; e < 16; ++e) {
      auto c = t1(e);
      int r = get<0>(c), q = get<1>(c);
      if (r != rb + 8 * ((e / 2) % 2) || q != 32 * wg + 8 * (e / 4) + cb + e % 2) ++bad;
    }
    auto t2 = mma_dkv.get_thread_slice(ctid).partition_C(cK);
    auto t3 = mma_dq.get_thread_slice(ctid).partition_C(cK);
    if (size(t2) != 64 || size(t3) != 64) { printf("size\n"); return 1; }
    for (int e = 0; e < 64; ++e) {
      for (auto c : {t2(e), t3(e)}) {
        int r = get<0>(c), q = get<1>(c);
        if (r != rb + 8 * ((e / 2) % 2) || q != 128 * wg + 8 * (e / 4) + cb + e % 2) ++bad;
      }
    }
  }
  typename T::SmemLayoutQ lq;
  if (lq(0, 0, 1) != T::Bm * T::D || cosize(lq) != 2 * T::Bm * T::D) { printf("stage offset\n"); ++bad; }
  // the dQ view of dS^T: (q, k, s) -> same element as (k, q, s)
  typename T::SmemLayoutPt lp; typename T::SmemLayoutdS ld;
  for (int s = 0; s < 2; ++s) for (int q = 0; q < 64; ++q) for (int k = 0; k < 64; ++k)
    if (ld(q, k, s) != lp(k, q, s)) ++bad;
  // pairs (q even, q+1) adjacent for the 32-bit P^T / dS^T stores; buffers disjoint
  for (int s = 0; s < 2; ++s) for (int k = 0; k < 64; ++k) for (int q = 0; q < 64; q += 2)
    if (lp(k, q + 1, s) != lp(k, q, s) + 1 || lp(k, q, s) % 2 || lp(k,q,s) / 4096 != s) ++bad;
  // the fp32 fragment-order dQ offsets of put_dq vs bwd_convert's dq_frag_offset (dqc = 128)
  std::vector<int> seen(64 * 256, 0);
  for (int ctid = 0; ctid < 256; ++ctid) {
    int wg = ctid / 128, lane = ctid % 32, rb = 16 * ((ctid / 32) % 4) + lane / 4, cb = 2 * (lane % 4);
    int fb = ((ctid / 32) % 4) * 2 * T::kDqKK * 64 + 2 * (ctid % 32);
    for (int e = 0; e < 64; ++e) {
      int o = wg * T::kDqHalfFloats + fb + (((e / 2) % 2) * T::kDqKK + e / 4) * 64 + (e % 2);
      int r = rb + 8 * ((e / 2) % 2), c = 128 * wg + 8 * (e / 4) + cb + e % 2;
      int dqc = 128, wq = c / dqc, cc = c % dqc, ln = 4 * (r % 8) + (cc % 8) / 2;
      int ref = wq * 64 * dqc + (((r / 16) * 2 + (r / 8) % 2) * (dqc / 8) + cc / 8) * 64 + 2 * ln + (cc % 2);
      if (o != ref) ++bad;
      if (o - wg * T::kDqHalfFloats < 0 || o - wg * T::kDqHalfFloats >= T::kDqHalfFloats) ++bad;
      seen[o]++;
    }
  }
  for (int x : seen) if (x != 1) ++bad;
  printf("smem %d bytes, mismatches %d\n", (int)sizeof(typename T::SharedStorage), bad);
  return bad != 0;
}
int main() { return run<cutlass::bfloat16_t>() | run<cutlass::half_t>(); }
