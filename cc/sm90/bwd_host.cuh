// Host side shared by the backward launchers (launch_bwd_impl, launch_bwd_d256_impl): the
// problem's geometry and its checks, workspace preparation (block metadata, row statistics,
// zeroed dQ accumulator, ordering bits), TMA descriptors, the common kernel arguments, the
// metadata workspace layout, the deterministic order's pre-pass, and the launch with the dQ
// conversion behind it.
// Contract: everything on the caller's stream, no host synchronization; capacity checks return
//   cudaErrorInvalidValue with a message.
// Synchronization: stream order only. Knobs: none.
#pragma once

#include "bwd_launch.cuh"
#include "kernel_args.h"
#include "traits.h"

namespace jfm::sm90 {

using namespace cute;

// The tile counts of a backward problem at T's tiles: key blocks, query tiles, the padded query
// length of the row statistics and dQ accumulator, and the ordering-bit words per query tile.
struct BwdGeometry {
  int nblk, mblk, sq_pad, sem_words;
};

// The metadata workspace (int32) in order, as BackwardConfig.meta_words sizes it: the block
// metadata [B, Hm, 8, nblk]; the scheduler area `sched` (4 words: the persistent grid's item
// counter, the launch group size G, the deterministic order flag, spare; then the persistent
// grid's key-block order [nblk]); the deterministic key-block orders [B, Hm, nblk]; the
// look-ahead zeroing's counters [K * B]; the unseen-column words of block_meta_sm90 (laid out as
// the block metadata, [B, Hm, 8 * nblk]); the query tiles' empty-row flags [B, N, mblk]
// (unseen.cuh). Each start is also the end a kernel needs when it uses nothing after it (the
// capacity checks).
struct BwdMetaLayout {
  int64_t sched, orders, zero_count, unseen, tile_flags, end;
};
inline BwdMetaLayout bwd_meta_layout(const BwdParams& p, int nblk, int mblk) {
  BwdMetaLayout l;
  l.sched = (int64_t)p.B * p.Hm * 8 * nblk;
  l.orders = l.sched + 4 + nblk;
  l.zero_count = l.orders + (int64_t)p.B * p.Hm * nblk;
  l.unseen = l.zero_count + (int64_t)p.K * p.B;
  l.tile_flags = l.unseen + (int64_t)p.B * p.Hm * 8 * nblk;
  l.end = l.tile_flags + (int64_t)p.B * p.N * mblk;
  return l;
}

// The geometry of `p` at T's tiles, after the checks every backward launcher makes: the
// workspaces' capacities (block metadata at T::Bn keys, row statistics, dQ accumulator), what the
// deterministic mode needs, and the grid's limits on kv heads and batch.
template <class T>
cudaError_t bwd_geometry(const BwdParams& p, BwdGeometry& g, const char** err) {
  g.nblk = (p.Sk + T::Bn - 1) / T::Bn;
  g.mblk = (p.Sq + T::Bm - 1) / T::Bm;
  g.sq_pad = g.mblk * T::Bm;
  g.sem_words = (g.nblk + 31) / 32;
  if (p.meta_capacity < bwd_meta_layout(p, g.nblk, g.mblk).end ||
      p.rowstats_capacity < 2 * (int64_t)p.B * p.N * g.sq_pad ||
      p.dq_accum_capacity < (int64_t)p.B * p.N * g.sq_pad * T::D) {
    if (err) *err = "flashmask sm90 backward: workspace too small";
    return cudaErrorInvalidValue;
  }
  if (p.deterministic && (p.dq_sem == nullptr ||
                          p.dq_sem_capacity < (int64_t)p.B * p.N * g.mblk * g.sem_words)) {
    if (err) *err = "flashmask sm90 backward: deterministic mode needs the dq_sem workspace";
    return cudaErrorInvalidValue;
  }
  if (p.K > 65535 || p.B > 65535) {
    if (err) *err = "flashmask sm90 backward: at most 65535 kv heads and batch entries";
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// The main kernel's launch with T's shared memory, then the dQ conversion (fp32 accumulator to
// the output dtype) behind it on the same stream.
template <class T, class Kernel, class... Args>
cudaError_t bwd_launch_and_convert(Kernel kernel, dim3 grid, const BwdParams& p, int sq_pad,
                                   cudaStream_t stream, const Args&... args) {
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "shared memory budget");
  const int smem = (int)sizeof(typename T::SharedStorage);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<grid, T::kThreads, smem, stream>>>(args...);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return bwd_convert_dq_sm90(p, sq_pad, T::Bm, stream);
}

// The workspaces the main kernel reads, in stream order: block metadata
// (at T::Bn keys), row statistics, the zeroed fp32 dQ accumulator (its first dq_zero_floats; all
// of it unless the main kernel zeroes ahead) and (deterministic) ordering bits.
template <class T>
cudaError_t bwd_prepare_workspaces(const BwdParams& p, int mblk, int sq_pad, int sem_words,
                                   size_t dq_zero_floats, cudaStream_t stream) {
  // the unseen columns' words, and the zeroed empty-row flags that the prep kernel then sets
  const BwdMetaLayout ml = bwd_meta_layout(p, (p.Sk + T::Bn - 1) / T::Bn, mblk);
  int32_t* tile_flags = p.meta + ml.tile_flags;
  cudaError_t e = block_meta_sm90(p.bounds, p.meta, p.B, p.Hm, p.Sk, T::Bn, stream, p.Sq,
                                  reinterpret_cast<uint32_t*>(p.meta + ml.unseen), tile_flags,
                                  (int64_t)p.B * p.N * mblk);
  if (e != cudaSuccess) return e;
  // row statistics and the zeros of the fp32 dQ accumulator [B, N, sq_pad, T::D] in one kernel
  e = bwd_prep_sm90(p, sq_pad, dq_zero_floats, tile_flags, T::Bm, stream);
  if (e != cudaSuccess) return e;
  if (p.deterministic)
    e = cudaMemsetAsync(p.dq_sem, 0, sizeof(uint32_t) * (size_t)p.B * p.N * mblk * sem_words, stream);
  return e;
}

// TMA descriptors of Q, dO ([Bm, D] boxes of T::SmemLayoutQ) and K, V ([Bn, D] boxes of
// T::SmemLayoutK), as a tuple (q, do, k, v).
template <class T>
auto bwd_tma_copies(const BwdParams& p) {
  using Elem = typename T::Elem;
  constexpr int D = T::D, Bm = T::Bm, Bn = T::Bn;
  auto qstride = make_stride((int64_t)p.N * D, _1{}, (int64_t)D, (int64_t)p.Sq * p.N * D);
  auto kstride = make_stride((int64_t)p.K * D, _1{}, (int64_t)D, (int64_t)p.Sk * p.K * D);
  Tensor mQ = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.q)),
                          make_shape(p.Sq, D, p.N, p.B), qstride);
  Tensor mdO = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.dout)),
                           make_shape(p.Sq, D, p.N, p.B), qstride);
  Tensor mK = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.k)),
                          make_shape(p.Sk, D, p.K, p.B), kstride);
  Tensor mV = make_tensor(make_gmem_ptr(reinterpret_cast<const Elem*>(p.v)),
                          make_shape(p.Sk, D, p.K, p.B), kstride);
  return std::make_tuple(
      make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename T::SmemLayoutQ{}),
                    Shape<Int<Bm>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename T::SmemLayoutQ{}),
                    Shape<Int<Bm>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename T::SmemLayoutK{}, Shape<Int<Bn>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename T::SmemLayoutK{}, Shape<Int<Bn>, Int<D>>{}, _1{}));
}

// Kernel arguments common to every backward kernel (the persistent scheduler fields cleared).
inline BwdArgs bwd_args(const BwdParams& p, int nblk, int mblk, int sq_pad, int sem_words) {
  BwdArgs a;
  a.bounds = p.bounds;
  a.meta = p.meta;
  a.lse2 = p.rowstats;
  a.delta = p.rowstats + (int64_t)p.B * p.N * sq_pad;
  a.dq_accum = p.dq_accum;
  a.dk = p.dk;
  a.dv = p.dv;
  a.B = p.B; a.Sq = p.Sq; a.Sk = p.Sk; a.N = p.N; a.K = p.K; a.Hm = p.Hm;
  a.nblk = nblk; a.mblk = mblk; a.sq_pad = sq_pad;
  a.heads_per_kv = p.N / p.K;
  a.heads_per_mask = p.N / p.Hm;
  a.scale = p.scale;
  // soft cap: the kernels scale tanh(S * scale / cap) by cap (traits.h BwdSoftCap); dK / dQ keep
  // the factor `scale` of d(S * scale) / dS
  const bool cap = p.softcap > 0.f;
  a.scale_log2 = (cap ? p.softcap : p.scale) * 1.4426950408889634f;
  a.softcap_prescale = cap ? p.scale / p.softcap : 0.f;
  a.softcap_inv_sl2 = cap ? 1.f / a.scale_log2 : 0.f;
  a.deterministic = p.deterministic ? 1 : 0;
  a.dq_sem = p.dq_sem;
  a.sem_words = sem_words;
  a.sched = nullptr;
  a.items_total = 0;
  a.sec_heads = 1;
  a.det_group = 1;
  a.det_perm = 0;
  a.zero_count = nullptr;
  a.walk_clocked = 0;
  a.walk_clock = nullptr;
  a.walk_sms = 1;
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk, mblk);
  a.unseen = reinterpret_cast<const uint32_t*>(p.meta + ml.unseen);
  a.tile_flags = p.meta + ml.tile_flags;
  return a;
}


// Deterministic mode of the kernels launched (nblk, K, B) at `rows`-row tiles (d = 64 with
// 128-row tiles, d = 256): the launch groups' key-block order where the tails are inverted
// (bwd_det_order_sm90; docs/decisions.md#det-arrival-order). Sets a.det_perm and a.sched (the scheduler area and the orders after the block
// metadata) and runs the pre-pass on `stream`.
inline cudaError_t bwd_launch_det_order(const BwdParams& p, BwdArgs& a, int nblk, int mblk, int rows,
                                        cudaStream_t stream, const char** err) {
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk, mblk);
  if (p.meta_capacity < ml.zero_count) {
    if (err) *err = "flashmask sm90 backward: metadata workspace too small for the deterministic order";
    return cudaErrorInvalidValue;
  }
  a.det_perm = 1;
  a.sched = p.meta + ml.sched;
  return bwd_det_order_sm90(p.meta, a.sched, p.B, p.Hm, nblk, mblk, p.Sq, rows, stream);
}

// Attribute `attr` of the current device; `fallback` when the query fails or gives no positive value.
inline int bwd_device_attr(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0)
    return fallback;
  return v;
}

// Clocked walks (mask_walk.cuh bwd_group_skips_none; docs/decisions.md#bwd-clocked-walk) in the
// default mode (deterministic mode keeps its fixed summation order) where a kv head's Q / dO / dQ
// stream exceeds the L2; below that size the ascending walk (its out-of-phase CTAs still hit in
// L2). The clock is the scheduler area's spare word; its start value does not matter.
inline void bwd_set_clocked_walk(const BwdParams& p, BwdArgs& a, int nblk, int mblk, int sq_pad,
                                 size_t elem_bytes) {
  const BwdMetaLayout ml = bwd_meta_layout(p, nblk, mblk);
  if (p.deterministic || p.meta_capacity < ml.sched + 4) return;
  const int64_t head_stream_bytes =
      (int64_t)a.heads_per_kv * sq_pad * p.d * (2 * (int64_t)elem_bytes + (int64_t)sizeof(float));
  if (head_stream_bytes <= bwd_device_attr(cudaDevAttrL2CacheSize, 50 << 20)) return;
  a.walk_clocked = 1;
  a.walk_clock = reinterpret_cast<uint32_t*>(p.meta + ml.sched + 3);
  a.walk_sms = bwd_device_attr(cudaDevAttrMultiProcessorCount, 132);
}

}  // namespace jfm::sm90
