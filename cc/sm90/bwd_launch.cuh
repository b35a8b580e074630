// Declarations shared by the backward pieces: the templated main-kernel launcher (defined in
// bwd_kernel.cuh, instantiated one (dtype, d) per file under inst/) and the small kernels of
// bwd_aux.cu (row statistics before, dQ conversion after).
#pragma once
#include "params.h"

namespace jfm::sm90 {
template <class Elem, int D>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream, const char** err);
// Variants 16, 19 and 21 (d = 128, 80-row query tiles: bwd_kernel.cuh BwdRows80), instantiated in
// inst/bwd_*_d128_r80.cu; launch_bwd<Elem, 128> forwards them here (and bwd_convert_dq_sm90 reads
// their dQ workspace in the 80-row order). The one list of them on the C++ side.
constexpr bool bwd_rows80_variant(int variant) {
  return variant == 16 || variant == 19 || variant == 21;
}
template <class Elem>
cudaError_t launch_bwd_rows80(const BwdParams& p, cudaStream_t stream, const char** err);
// Head dim 256 (bwd_d256_kernel.cuh, instantiated in inst/bwd_*_d256.cu): one kernel for every
// `variant` value (p.variant and p.sm_margin are ignored), key blocks of 64.
template <class Elem>
cudaError_t launch_bwd_d256(const BwdParams& p, cudaStream_t stream, const char** err);

// rowstats[0] = lse * log2(e) (+inf for fully masked and padded rows), rowstats[1] =
// rowsum(dO * O) - dlse (0 on padded rows); both [B, N, sq_pad]. Also zeroes
// dq_accum[0, dq_zero_floats) (the fp32 dQ accumulator; same stream, before the main kernel).
cudaError_t bwd_prep_sm90(const BwdParams& p, int sq_pad, size_t dq_zero_floats, cudaStream_t stream);
// dq [B, Sq, N, d] = dq_accum [B, N, sq_pad, d] * scale, in the input dtype.
// Variant 6 scheduler pre-pass (one CTA): sched[0] = 0 (the item counter) and sched[4 + r] = key
// block of rank r: descending query-tile count summed over (batch, mask head), ties ascending
// (descending key block when `deterministic`; ascending when nblk exceeds the pre-pass's smem).
cudaError_t bwd_sched_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk, int mblk,
                           int Sq, bool deterministic, cudaStream_t stream);
// Variant 17 pre-pass (one CTA, deterministic mode): sched[1] = the launch group size G (pairs
// per interleaved group, bwd_kernel.cuh BwdDetAuto) = mblk * items / (kept query tiles summed over
// the items (batch, mask head, key block)), i.e. how many pairs' walks fit in one head's rows,
// clamped to [1, min(max_group, pairs)] (max_group when nothing is kept).
cudaError_t bwd_det_group_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                               int mblk, int Sq, int pairs, int max_group, cudaStream_t stream);
// Variant 19 / 21 pre-pass (one CTA, deterministic mode): sched[1] = G for variant 16's 80-row
// tiles: min(max_group, pairs) when most key blocks start at the first tile of the key block above
// them and the key blocks keep on average at most half of the query tiles, kDetGroupInverted
// when inverted tails (a key block ending where the one above it ends with a shorter walk) hold
// >= 1/128 of the kept tiles, else 1; then at most kDetGroupTileBudget / (mean kept tiles per
// live key block) (the group's rows in L2), clamped to [1, min(max_group, pairs)] (bwd_aux.cu
// bwd_det_group80_kernel). `perm` (variant 21): sched[2] = 1 and, in the inverted case, the
// key-block order of each (batch, mask head) at sched[4 + nblk + (b * Hm + hm) * nblk + i]; else
// sched[2] = 0. The metadata workspace then needs B * Hm * nblk more int32 after sched[4 + nblk].
cudaError_t bwd_det_group80_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                                 int mblk, int Sq, int pairs, int max_group, bool perm,
                                 cudaStream_t stream);
// Deterministic mode of the kernels launched (nblk, K, B) -- variants 7 / 11 (rows = 128) and the
// d = 256 kernel (rows = 64): variant 21's key-block order at `rows`-row query tiles where the
// tails are inverted (the rule of bwd_det_group80_sm90 without the launch groups): sched[2] = 1
// and the order of each (batch, mask head) at sched[4 + nblk + (b * Hm + hm) * nblk + i]; else
// sched[2] = 0 (descending key block). The metadata workspace as for variant 21.
cudaError_t bwd_det_order_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                               int mblk, int Sq, int rows, cudaStream_t stream);
cudaError_t bwd_convert_dq_sm90(const BwdParams& p, int sq_pad, cudaStream_t stream);
}  // namespace jfm::sm90
