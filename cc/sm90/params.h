// Plain parameter blocks shared by the XLA FFI handlers (host C++) and the sm_90a kernels' host
// launchers. Knows nothing about XLA and nothing about CuTe.
#pragma once
#include <cstddef>
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
  // Name of the kernel configuration (instantiations/kernel_table.inc), not NUL-terminated.
  const char* config;
  size_t config_len;
  // SMs left free (grid = num_SMs - sm_margin CTAs, at least 1), e.g. for NCCL's kernels under
  // context parallelism.
  int sm_margin;
  // Logits soft cap: the scaled scores s become softcap * tanh(s / softcap) before masking; 0 =
  // none. Only the configurations compiled with the cap take a positive value (and need one).
  float softcap;
};

// Returns cudaSuccess or the launch error. Never synchronizes. `err` (may be null) gets a message
// for argument errors (then cudaErrorInvalidValue is returned).
cudaError_t flashmask_fwd_sm90(const FwdParams& p, cudaStream_t stream, const char** err);

// Block metadata: for each (b, hm, key block of size bn): min/max of LTS, LTE, UTS, UTE.
// meta layout [B, Hm, 8, nblk]: LTSmin, LTSmax, LTEmin, LTEmax, UTSmin, UTSmax, UTEmin, UTEmax.
// unseen (optional, needs bn <= 128): uint32 laid out as meta ([B, Hm, 8 * nblk] words, of which
// (b, hm)'s block n uses the 4 at 4 * n), bit c % 32 of word c / 32 set iff column n * bn + c is
// masked for every one of the Sq rows (the kernels zero those K / V rows in shared memory:
// docs/decisions.md#nan-guarantee-cuda); unseen_any: word 4 * nblk of each (b, hm), zeroed by the
// caller, becomes 1 where any block of (b, hm) has an unseen column. zero (optional): nzero int32
// words set to 0 by the same kernel.
cudaError_t block_meta_sm90(const int32_t* bounds, int32_t* meta, int B, int Hm, int Sk, int bn,
                            cudaStream_t stream, int Sq = 0, uint32_t* unseen = nullptr,
                            int32_t* zero = nullptr, int64_t nzero = 0, bool unseen_any = false);
// Group metadata (the forward's group walk): per group g of 32 key blocks, int4 {LTSmax, LTEmin,
// UTSmax, UTEmin} over the group's blocks of `meta`, at gmeta + (b * Hm + hm) * 8 * nblk + 4 * g
// (gmeta 16-byte aligned; the (b, hm) offsets are those of meta's [B, Hm, 8, nblk] layout).
cudaError_t group_meta_sm90(const int32_t* meta, int32_t* gmeta, int B, int Hm, int nblk,
                            cudaStream_t stream);


// ---------------------------------------------------------------------------------------------
// Backward. Column-parallel: one CTA per (key block, kv head, batch) or a persistent grid over
// those items; each walks the query heads of its GQA group and their non-skipped query tiles.
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
  int32_t* meta;        // workspace: block metadata, scheduler area, orders (bwd_meta_layout)
  int64_t meta_capacity;
  int B, Sq, Sk, N, K, Hm, d;
  float scale;
  DType dtype;
  // dQ tiles are added to dq_accum by cp.reduce.async.bulk from shared memory.
  // Deterministic mode (bitwise-reproducible dQ): the key-block CTAs of one query tile add their
  // dQ in a fixed key-block order, ordered through one bit per (query tile, key block) in
  // dq_sem [B, N, Sq_pad / block_m, ceil(nblk / 32)] uint32 (zeroed by the launcher).
  int deterministic;
  uint32_t* dq_sem;
  int64_t dq_sem_capacity;  // number of uint32 available in dq_sem
  // Name of the kernel configuration (instantiations/kernel_table.inc), not NUL-terminated.
  const char* config;
  size_t config_len;
  // Persistent configurations only: SMs left free (grid = num_SMs - sm_margin CTAs, at least 1).
  int sm_margin;
  float softcap;  // as in FwdParams
};

constexpr int kBwdBlockM = 64;   // query rows per tile unless a configuration says otherwise
constexpr int kBwdBlockN = 128;  // keys per CTA at d = 64 / 128 (metadata granularity)

cudaError_t flashmask_bwd_sm90(const BwdParams& p, cudaStream_t stream, const char** err);
// Comma-separated names of the compiled kernel configurations (forward and backward).
const char* compiled_configs();

}  // namespace jfm
