// Declarations shared by the backward pieces: the small kernels of bwd_aux.cu (row statistics
// before the main kernel, the device pre-passes that order it, dQ conversion after it).
#pragma once
#include "params.h"

namespace jfm::sm90 {

// rowstats[0] = lse * log2(e) (+inf for fully masked and padded rows), rowstats[1] =
// rowsum(dO * O) - dlse (0 on padded rows); both [B, N, sq_pad]. Also zeroes
// dq_accum[0, dq_zero_floats) (the fp32 dQ accumulator; same stream, before the main kernel).
// tile_flags (may be null): [B, N, sq_pad / block_m], zeroed before; set to 1 for every query
// tile of block_m rows that holds a fully masked row (lse = -inf; its D is 0).
cudaError_t bwd_prep_sm90(const BwdParams& p, int sq_pad, size_t dq_zero_floats, int32_t* tile_flags,
                          int block_m, cudaStream_t stream);
// Persistent scheduler pre-pass (one CTA): sched[0] = 0 (the item counter) and sched[4 + r] = key
// block of rank r: descending query-tile count summed over (batch, mask head), ties ascending
// (descending key block when `deterministic`; ascending when nblk exceeds the pre-pass's smem).
cudaError_t bwd_sched_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk, int mblk,
                           int Sq, bool deterministic, cudaStream_t stream);
// Deterministic launch groups of the 80-row kernel (one CTA): sched[1] = G, the (kv head, batch)
// pairs per interleaved launch group: min(max_group, pairs) when most key blocks start at the
// first tile of the key block above them and the key blocks keep on average at most half of the
// query tiles, kDetGroupInverted when inverted tails (a key block ending where the one above it
// ends with a shorter walk) hold >= 1/128 of the kept tiles, else 1; then at most
// kDetGroupTileBudget / (mean kept tiles per live key block) (the group's rows in L2), clamped to
// [1, min(max_group, pairs)] (bwd_aux.cu bwd_det_group80_kernel). With `perm`: sched[2] = 1 and,
// in the inverted case, the key-block order of each (batch, mask head) at
// sched[4 + nblk + (b * Hm + hm) * nblk + i]; else sched[2] = 0. The metadata workspace then needs
// B * Hm * nblk more int32 after sched[4 + nblk].
cudaError_t bwd_det_group80_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                                 int mblk, int Sq, int pairs, int max_group, bool perm,
                                 cudaStream_t stream);
// Deterministic mode of the kernels launched (nblk, K, B) -- the d = 64 kernel (rows = 128) and
// the d = 256 kernel (rows = 64): the key-block order of bwd_det_group80_sm90 at `rows`-row query
// tiles where the tails are inverted, without launch groups: sched[2] = 1 and the order of each
// (batch, mask head) at sched[4 + nblk + (b * Hm + hm) * nblk + i]; else sched[2] = 0
// (descending key block). The metadata workspace as for bwd_det_group80_sm90.
cudaError_t bwd_det_order_sm90(const int32_t* meta, int32_t* sched, int B, int Hm, int nblk,
                               int mblk, int Sq, int rows, cudaStream_t stream);
// dq [B, Sq, N, d] = dq_accum [B, N, sq_pad, d] * scale, in the input dtype; block_m = the main
// kernel's query rows per tile (80: the transposed fragment order of the 80-row kernel).
cudaError_t bwd_convert_dq_sm90(const BwdParams& p, int sq_pad, int block_m, cudaStream_t stream);
}  // namespace jfm::sm90
