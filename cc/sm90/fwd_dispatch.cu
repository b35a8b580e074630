// Picks the compiled forward configuration for (dtype, head dim, variant).
#include <cutlass/numeric_types.h>
#include "fwd_launch.h"
#include "params.h"

namespace jfm {

int fwd_block_n(int d) { return d == 256 ? 64 : 128; }

cudaError_t flashmask_fwd_sm90(const FwdParams& p, cudaStream_t stream, const char** err) {
  using cutlass::bfloat16_t;
  using cutlass::half_t;
  if (p.B == 0 || p.Sq == 0 || p.N == 0) return cudaSuccess;
  if (p.Sk <= 0) {
    if (err) *err = "flashmask sm90 forward: Sk must be >= 1";
    return cudaErrorInvalidValue;
  }
  if (p.K <= 0 || p.Hm <= 0 || p.N % p.K != 0 || p.N % p.Hm != 0) {
    if (err) *err = "flashmask sm90 forward: N must be a multiple of K and of Hm";
    return cudaErrorInvalidValue;
  }
  const bool bf16 = p.dtype == DType::kBF16;
  if ((p.variant < 2 || p.variant > 7) && (p.variant < 10 || p.variant > 18 || p.variant == 16)) {
    if (err) *err = "flashmask sm90 forward: unknown kernel variant (compiled: 2 to 7, 10 to 15, 17, 18)";
    return cudaErrorInvalidValue;
  }
  if (p.variant == 10) {
    // Variant 3 with the partial blocks' element mask as bit words built by producer warps 1-2
    // (FwdTraitsMaskBits; inst/*_mb.cu). Same outputs as variant 3, bit for bit.
    switch (p.d) {
      case 64:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 2, 2, true, false, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 64, 128, 2, 2, true, false, true>(p, stream, err);
      case 128:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 128, 128, 2, 2, true, false, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 128, 128, 2, 2, true, false, true>(p, stream, err);
      case 256:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 64, 2, 2, true, false, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 256, 64, 2, 2, true, false, true>(p, stream, err);
      default:
        if (err) *err = "flashmask sm90 forward: head dim must be 64, 128 or 256";
        return cudaErrorInvalidValue;
    }
  }
  if (p.variant == 11) {
    // Variant 7 (two-level walk) with variant 10's bit-word mask (inst/*_gsmb.cu).
    switch (p.d) {
      case 64:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 2, 2, true, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 64, 128, 2, 2, true, true, true>(p, stream, err);
      case 128:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 128, 128, 2, 2, true, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 128, 128, 2, 2, true, true, true>(p, stream, err);
      case 256:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 64, 2, 2, true, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 256, 64, 2, 2, true, true, true>(p, stream, err);
      default:
        if (err) *err = "flashmask sm90 forward: head dim must be 64, 128 or 256";
        return cudaErrorInvalidValue;
    }
  }
  if (p.variant == 15) {
    // Variants 13 and 14 together: key blocks of 80 and paired tiles, d = 256 only
    // (inst/*_d256_bn80_*_pair.cu).
    if (p.d != 256) {
      if (err) *err = "flashmask sm90 forward: variant 15 (key blocks of 80, paired tiles) is head dim 256 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 80, 2, 2, true, false, false, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 256, 80, 2, 2, true, false, false, true>(p, stream, err);
  }
  if (p.variant == 14) {
    // Variant 3 with the tiles handed out in pairs (heaviest + lightest of a head on one CTA, the
    // second walked from its last key block down: FwdTraitsPaired), d = 256 only
    // (inst/*_d256_bn64_*_pair.cu).
    if (p.d != 256) {
      if (err) *err = "flashmask sm90 forward: variant 14 (paired tiles) is head dim 256 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 64, 2, 2, true, false, false, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 256, 64, 2, 2, true, false, false, true>(p, stream, err);
  }
  if (p.variant == 17) {
    // Variant 12 (three consumer warpgroups) with variant 11's two-level walk and bit-word mask,
    // d = 64 only (inst/*_d64_bn128_wg3_*_gsmb.cu). Same outputs as variant 12, bit for bit.
    if (p.d != 64) {
      if (err) *err = "flashmask sm90 forward: variant 17 (three consumer warpgroups, mask bits) is head dim 64 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 3, 2, true, true, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 64, 128, 3, 2, true, true, true>(p, stream, err);
  }
  if (p.variant == 18) {
    // Variant 13 (key blocks of 80) with variant 11's two-level walk and bit-word mask, d = 256
    // only (inst/*_d256_bn80_*_gsmb.cu). Same outputs as variant 13, bit for bit.
    if (p.d != 256) {
      if (err) *err = "flashmask sm90 forward: variant 18 (key blocks of 80, mask bits) is head dim 256 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 80, 2, 2, true, true, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 256, 80, 2, 2, true, true, true>(p, stream, err);
  }
  if (p.variant == 12) {
    // Variant 3's grid and bounds path with three consumer warpgroups (192-row query tiles, GEMM
    // issue in a round robin, setmaxnreg 32/160), d = 64 only (inst/*_d64_bn128_wg3_*.cu).
    if (p.d != 64) {
      if (err) *err = "flashmask sm90 forward: variant 12 (three consumer warpgroups) is head dim 64 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 3, 2, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 64, 128, 3, 2, true>(p, stream, err);
  }
  if (p.variant == 13) {
    // Variant 3's grid and bounds path with key blocks of 80 at d = 256 (instead of 64; setmaxnreg
    // 24/240, one Q buffer), d = 256 only (inst/*_d256_bn80_*.cu).
    if (p.d != 256) {
      if (err) *err = "flashmask sm90 forward: variant 13 (key blocks of 80) is head dim 256 only";
      return cudaErrorInvalidValue;
    }
    return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 80, 2, 2, true>(p, stream, err)
                : sm90::launch_fwd<half_t, 256, 80, 2, 2, true>(p, stream, err);
  }
  if (p.variant == 7) {
    // Variant 3's grid and bounds path with the two-level key-block walk (FwdTraitsGroupScan:
    // groups of 32 key blocks classified first; inst/*_gs.cu).
    switch (p.d) {
      case 64:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 2, 2, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 64, 128, 2, 2, true, true>(p, stream, err);
      case 128:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 128, 128, 2, 2, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 128, 128, 2, 2, true, true>(p, stream, err);
      case 256:
        return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 64, 2, 2, true, true>(p, stream, err)
                    : sm90::launch_fwd<half_t, 256, 64, 2, 2, true, true>(p, stream, err);
      default:
        if (err) *err = "flashmask sm90 forward: head dim must be 64, 128 or 256";
        return cudaErrorInvalidValue;
    }
  }
  // Variants 2-6 share one kernel (two consumer warpgroups + softmax/GEMM overlap + ping-pong);
  // the launcher picks the grid and the bounds path at run time:
  //   2: one CTA per tile, partial-block bounds read from global memory by the consumers;
  //   3: persistent grid + dynamic tile counter, bounds staged in smem by the producer;
  //   4: one CTA per tile, bounds staged in smem;  5: persistent + dynamic, bounds from global;
  //   6: variant 3 + tile-boundary overlap (the next tile's block scan and first QK^T GEMM are
  //      issued before the current tile's last PV GEMM is waited for; its epilogue runs under them);
  //   7: variant 3 with the two-level key-block walk (its own instantiations, see above);
  //  10: variant 3 with the bit-word element mask of partial blocks (its own instantiations);
  //  11: variant 7 with it;
  //  12 (d = 64: three consumer warpgroups), 13 (d = 256: key blocks of 80), 14 (d = 256: paired
  //      query tiles), 15 (13 + 14): variant 3's grid and bounds path, own instantiations (above).
  // The persistent variants (3, 5, 6, 7, 10 to 15) launch num_SMs - p.sm_margin CTAs.
  // (Measured and no longer compiled, see benchmarks/NOTES.md: 0 = variant 2 without overlap,
  // 1 = one consumer warpgroup, 7 (old) = variant 3 with key blocks of 176, 8 = variant 3 with part of
  // the softmax exp2 on the FMA pipe, 9 = variant 3 with the PV-GEMM wait pinned below the exps.)
  switch (p.d) {
    case 64:
      return bf16 ? sm90::launch_fwd<bfloat16_t, 64, 128, 2, 2, true>(p, stream, err)
                  : sm90::launch_fwd<half_t, 64, 128, 2, 2, true>(p, stream, err);
    case 128:
      return bf16 ? sm90::launch_fwd<bfloat16_t, 128, 128, 2, 2, true>(p, stream, err)
                  : sm90::launch_fwd<half_t, 128, 128, 2, 2, true>(p, stream, err);
    case 256:
      return bf16 ? sm90::launch_fwd<bfloat16_t, 256, 64, 2, 2, true>(p, stream, err)
                  : sm90::launch_fwd<half_t, 256, 64, 2, 2, true>(p, stream, err);
    default:
      if (err) *err = "flashmask sm90 forward: head dim must be 64, 128 or 256";
      return cudaErrorInvalidValue;
  }
}

}  // namespace jfm
