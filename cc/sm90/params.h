// Plain parameter block shared by the XLA FFI handler (host C++) and the sm_90a kernels.
// Knows nothing about XLA and nothing about CuTe.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace jfm {

enum class DType : int { kBF16 = 0, kFP16 = 1 };

struct FwdParams {
  const void* q;        // [B, Sq, N, d]
  const void* k;        // [B, Sk, K, d]
  const void* v;        // [B, Sk, K, d]
  const int32_t* bounds;  // [B, Hm, 4, Sk]  (LTS, LTE, UTS, UTE)
  void* o;              // [B, Sq, N, d]   (q dtype)
  float* lse;           // [B, Sq, N]      float32 (natural log)
  int32_t* meta;        // workspace: [B, Hm, 8, nblk_k] block min/max, then the tile counter
  int64_t meta_capacity;  // number of int32 available in meta
  int B, Sq, Sk, N, K, Hm, d;
  float scale;          // softmax scale applied to q.k
  DType dtype;
  int variant;          // kernel variant: 2 to 7, 10, 11, 12 (d = 64), 13-15 (d = 256), 17 (d = 64), 18 (d = 256) (fwd_dispatch.cu, _cuda.py)
  // Persistent variants (3, 5, 6, 7, 10-15): SMs left free (grid = num_SMs - sm_margin CTAs, at least 1), e.g.
  // for NCCL's kernels under context parallelism. Ignored by the one-CTA-per-tile variants.
  int sm_margin;
};

// Returns cudaSuccess or the launch error. Never synchronizes. `err` (may be null) gets a message
// for argument errors (then cudaErrorInvalidValue is returned).
cudaError_t flashmask_fwd_sm90(const FwdParams& p, cudaStream_t stream, const char** err);

// Key block size the forward kernel uses for head dim d (the metadata granularity).
int fwd_block_n(int d);

// Block metadata: for each (b, hm, key block of size bn): min/max of LTS, LTE, UTS, UTE.
// meta layout [B, Hm, 8, nblk]: LTSmin, LTSmax, LTEmin, LTEmax, UTSmin, UTSmax, UTEmin, UTEmax.
cudaError_t block_meta_sm90(const int32_t* bounds, int32_t* meta, int B, int Hm, int Sk, int bn,
                            cudaStream_t stream);
// Group metadata (forward variant 7): per group g of 32 key blocks, int4 {LTSmax, LTEmin, UTSmax,
// UTEmin} over the group's blocks of `meta`, at gmeta + (b * Hm + hm) * 8 * nblk + 4 * g (gmeta
// 16-byte aligned; the (b, hm) offsets are those of meta's [B, Hm, 8, nblk] layout).
cudaError_t group_meta_sm90(const int32_t* meta, int32_t* gmeta, int B, int Hm, int nblk,
                            cudaStream_t stream);


// ---------------------------------------------------------------------------------------------
// Backward (bwd_*.cu). Column-parallel: one CTA per (key block of 128, kv head, batch); it walks
// the query heads of its GQA group and their non-skipped 64-row query tiles.
struct BwdParams {
  const void* q;        // [B, Sq, N, d]
  const void* k;        // [B, Sk, K, d]
  const void* v;        // [B, Sk, K, d]
  const int32_t* bounds;  // [B, Hm, 4, Sk]
  const void* o;        // [B, Sq, N, d]
  const float* lse;     // [B, Sq, N]  natural log, -inf for fully masked rows
  const void* dout;     // [B, Sq, N, d]
  const float* dlse;    // [B, Sq, N]  cotangent of lse
  void* dq;             // [B, Sq, N, d]
  void* dk;             // [B, Sk, K, d]
  void* dv;             // [B, Sk, K, d]
  float* dq_accum;      // workspace [B, N, Sq_pad, d] float32 (zeroed by the launcher)
  int64_t dq_accum_capacity;
  float* rowstats;      // workspace [2, B, N, Sq_pad]: lse*log2(e) (+inf for empty rows), D
  int64_t rowstats_capacity;
  int32_t* meta;        // workspace [B, Hm, 8, ceil(Sk / 128)]
  int64_t meta_capacity;
  int B, Sq, Sk, N, K, Hm, d;
  float scale;
  DType dtype;
  int dq_mode;          // 1: dQ tiles reduced by cp.reduce.async.bulk (default); 0: float2 atomics
  // Deterministic mode (bitwise-reproducible dQ): the key-block CTAs of one query tile add their
  // dQ in descending key-block order, ordered through one bit per (query tile, key block) in
  // dq_sem [B, N, Sq_pad / 64, ceil(nblk / 32)] uint32 (zeroed by the launcher). Needs dq_mode 1.
  int deterministic;
  uint32_t* dq_sem;
  int64_t dq_sem_capacity;  // number of uint32 available in dq_sem
  int variant;          // 5: warp specialized, ping-pong consumer warpgroups; 6: variant 5 on a
                        // persistent grid; 7: variant 5 with 128-row query tiles (d = 64 only:
                        // Sq_pad, dq_sem and the tile count at 128 rows); 10 / 11: variant 5 / 7
                        // with the element mask from registers (bwd_kernel.cuh BwdMaskRegs);
                        // 12 / 13: variant 5 / 10 with lock-step consumer warpgroups (d = 128
                        // only; bwd_kernel.cuh BwdLockstep); 14: variant 5 with interleaved
                        // launch groups in deterministic mode (bwd_kernel.cuh BwdDetGroups);
                        // 15: 14 with a pipelined deterministic dQ writer (BwdDetPipe);
                        // 16: 13 with 80-row query tiles and dQ^T = K^T dS^T (d = 128 only:
                        // Sq_pad, dq_sem and the tile count at 80 rows; bwd_kernel.cuh BwdRows80)
                        // 17: 13 with 15's writer and 14's launch groups, G chosen per launch
                        // on the device (d = 128 only; BwdDetAuto, bwd_det_group_sm90)
                        // 19: 16 with 14's launch groups in deterministic mode, G chosen per
                        // launch on the device (d = 128 only; BwdDetAuto80, bwd_det_group80_sm90)
                        // 21: 19 with the pre-pass's key-block order (launch and dQ summation)
                        // for inverted tails (d = 128 only; BwdArgs::det_perm)
  // Variant 6 only: SMs left free (grid = num_SMs - sm_margin CTAs, at least 1), e.g. for NCCL's
  // kernels under context parallelism. Variants 1-5 (one CTA per work item) ignore it. Variant 6
  // also needs meta_capacity >= B*Hm*8*ceil(Sk/128) + 4 + ceil(Sk/128) (scheduler area).
  int sm_margin;
};

constexpr int kBwdBlockM = 64;   // query rows per tile (Sq_pad = multiple of this); variant 7
                                 // (d = 64): 128, variant 16 (d = 128): 80 (BwdTraits Bm_,
                                 // _cuda._bwd_block_m)
constexpr int kBwdBlockN = 128;  // keys per CTA (metadata granularity of the backward)

cudaError_t flashmask_bwd_sm90(const BwdParams& p, cudaStream_t stream, const char** err);
// Comma-separated list of the compiled backward configurations, e.g. "bf16_d128,fp16_d128".
const char* bwd_compiled_configs();

}  // namespace jfm
