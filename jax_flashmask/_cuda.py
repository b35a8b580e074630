"""Hopper (sm_90a) FlashMask kernels behind XLA FFI custom calls.

The compiled extension ``jax_flashmask._flashmask_cuda`` (nanobind) only exports FFI handler
capsules; this module registers them with ``jax.ffi.register_ffi_target(platform="CUDA")`` once
and calls them through ``jax.ffi.ffi_call``. It imports cleanly where the extension or a GPU is
missing: `is_available` then says False and `unavailable_reason` says why.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

import jax
import jax.numpy as jnp

from .backends import portable as _xla

__all__ = ["is_available", "unavailable_reason", "check_supported", "forward", "FWD_TARGET",
           "backward", "check_supported_backward", "BWD_TARGET"]

FWD_TARGET = "jax_flashmask_fwd_sm90"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
_META_BLOCK = 64  # smallest key block of any compiled config: sizes the metadata workspace

# Compiled forward kernel variants (cc/sm90/fwd_dispatch.cu; 2-6 are one kernel chosen at run
# time; history in benchmarks/NOTES.md):
#   2: producer warp + 2 consumer warpgroups (128-row tiles), FA3-style softmax/GEMM overlap inside a
#      warpgroup and GEMM ping-pong between the two; one CTA per query tile;
#   3: variant 2's kernel on a persistent grid (one CTA per SM) taking tiles from a global atomic
#      counter, with the bounds of partial key blocks staged in smem by the producer (Sk % 4 == 0);
#   4: one CTA per query tile (as 2) with the bounds staged in smem (as 3);
#   5: persistent + dynamic (as 3) with the bounds read from global memory (as 2);
#   6: variant 3 + overlap at tile boundaries: the next tile's block scan and first QK^T GEMM are
#      issued before the current tile's last PV GEMM is waited for, and the current tile's
#      epilogue runs after both (run B: within -7..+5 % of 3, slower on 4 of 7 masks);
#   7: variant 3 with a two-level key-block walk: groups of 32 key blocks are classified first (one
#      ballot per 32 groups, from group metadata built after the block metadata) and only the
#      groups that may hold a kept block are scanned, instead of every group of every query tile
#      (used from 3 groups on: Sk > 8K at d = 64/128, > 4K at d = 256); same blocks in the same
#      order, outputs bit-identical to 3 (benchmarks/NOTES_fwd_model.md; not yet run on a GPU);
#  10: variant 3 with the element mask of partial key blocks as bit words (one 32-bit word per key
#      column and 32 query rows) built by the idle producer warps 1-2 from the bounds in global
#      memory; a consumer thread tests one bit per element instead of the interval arithmetic
#      (~155 instead of ~586 instructions per warp and partial block; any Sk, no staged bounds).
#      Outputs bit-identical to 3 (benchmarks/NOTES_fwd_mask.md; not yet run on a GPU);
#  11: variant 7 (two-level walk) with variant 10's bit-word mask; bit-identical to 3 and 7.
# Measured and removed: 1 (one consumer warpgroup), 7 (old number: key blocks of 176: run B +0.4 % on
# full 8K, -2..-22 % elsewhere), 8 (3 of every 16 softmax exp2 on the FMA pipe) and 9 (the PV-GEMM
# wait pinned below the softmax exponentials): on the H200 slower than 3 or no better (NOTES.md);
# 16 (11 with the consumers' key-block walk taken from the producer's job slots: H200 session 7
# run 2, 32K: not faster than 11 on any mask beyond noise; 11 / 16: full 628 / 617,
# sliding_window 543 / 524).
# The persistent variants (3, 5, 6, 7, 10-15, 17, 18) launch num_SMs - sm_margin CTAs (`forward(..., sm_margin=)`).
# History of the default (today's: DEFAULT_VARIANTS below): 3 from run 6 (run B, H200 2026-11-30:
# 8K full 593, causal 567, sliding_window 364, document 533, random_eviction 430 TFLOP/s;
# benchmarks/NOTES.md, forward run B); then variant 7 (the group walk) from 32K keys on,
# H200 2026-12-01, d = 128, bit-identical to 3, v3 -> v7 in one interleaved run (`--variants 3 7 3 7`, s5 runs 6-7, with the
# walk's merged first step): 128K sliding_window 538 -> 578, causal_document 526 -> 568,
# share_question 441 -> 541, prefix_lm_document 531 -> 568, full 616 -> 616; 32K sliding_window
# 483 -> 529, causal_document 485 -> 515, share_question 376 -> 431, prefix_lm_document 484 -> 509,
# causal 589 -> 606, full 608 -> 612, document 541 -> 532, random_eviction 462 -> 449 TFLOP/s.
GROUP_SCAN_VARIANT = 7
MASK_BITS_VARIANT = 10  # bit-identical to 3 (tests/gpu: test_mask_bits_bit_identical)
MASK_BITS_GS_VARIANT = 11  # 7 with 10's mask
# 11's walk and mask on the single-head-dim kernels: 17 = 12 + both (d = 64), 18 = 13 + both (d = 256)
WG3_MASK_BITS_VARIANT = 17
BN80_MASK_BITS_VARIANT = 18
GROUP_META_VARIANTS = (GROUP_SCAN_VARIANT, MASK_BITS_GS_VARIANT, WG3_MASK_BITS_VARIANT,
                       BN80_MASK_BITS_VARIANT)  # + group metadata
# Forward variants compiled for one head dim (HEAD_DIM_VARIANTS below):
#  12: variant 3 with three consumer warpgroups, d = 64 only: 192-row query tiles, key blocks of 128,
#      GEMM issue in a round robin over the three warpgroups (each softmax under the two others'
#      GEMMs; FlashAttention-3's d = 64 tile), setmaxnreg 32/160 (benchmarks/NOTES_fwd_hd.md; not
#      yet run on a GPU).
#  13: variant 3 with key blocks of 80 at d = 256 only (instead of 64: a quarter more GEMM work per
#      softmax step, per-block fixed costs amortized; setmaxnreg 24/240, one Q buffer, 227 KB of
#      shared memory) (benchmarks/NOTES_fwd_hd.md; not yet run on a GPU).
#  14: variant 3 (d = 256 only) with the query tiles handed out in pairs: in each head the order is
#      heaviest, lightest, second heaviest, ..., a CTA runs the two tiles of a pair back to back and
#      walks the second from its last key block down, so on a causal mask all CTAs read the same
#      K/V blocks at the same time (as on the full mask) instead of a query tile's worth of keys
#      apart: aimed at the L2 reuse distance of d = 256 causal (benchmarks/NOTES_fwd_hd.md; not
#      yet run on a GPU).
#  15: 13 and 14 together (d = 256 only): key blocks of 80 and paired tiles (not yet run on a GPU).
#  17: 12 with 11's two-level walk and bit-word mask (d = 64 only; 12's setmaxnreg 32/160).
#      Bit-identical to 12 (H200 s7 run 5: 87 hd_variant tests, memcheck / racecheck clean).
#      17 and 18 run on the persistent grid (session 7 timed them one CTA per query tile: the
#      launcher's list had missed them).
#  18: 13 with 11's two-level walk and bit-word mask (d = 256 only; the bit words take the place
#      of the staged bounds in shared memory). Bit-identical to 13 (s7 run 5). Not a default: at
#      32K full 616 against 13's 671, sliding_window 505 against 11's 523 (wins causal_document).
VARIANTS = (2, 3, 4, 5, 6, GROUP_SCAN_VARIANT, MASK_BITS_VARIANT, MASK_BITS_GS_VARIANT, 12, 13, 14, 15,
            WG3_MASK_BITS_VARIANT, BN80_MASK_BITS_VARIANT)
# the persistent-grid variants: they launch num_SMs - sm_margin CTAs
PERSISTENT_VARIANTS = (3, 5, 6, GROUP_SCAN_VARIANT, MASK_BITS_VARIANT, MASK_BITS_GS_VARIANT, 12, 13, 14, 15,
                       WG3_MASK_BITS_VARIANT, BN80_MASK_BITS_VARIANT)
DEFAULT_VARIANT = 3
# variant=None: DEFAULT_VARIANTS[head_dim][structure], at every key count (until session 10 the
# table had a second column, from 32K keys on; the measurements below name both). structure: "full" / "causal" when attention() got no mask vectors (the mask is known to be
# dense up to the causal edge), "general" otherwise. H200 session 6 run 2 (kernel_timing.py, 8K
# and 32K, TFLOP/s): d = 64 full / causal variant 12 (three consumer warpgroups) 454 / 447 at 32K
# against 3's 425 / 412 (cuDNN 461 / 448), but 12 loses on bands (sliding_window 310 vs 11's 354);
# 11 (group walk + mask bits) wins the masked cases at 8K and 32K. d = 128: 11 over 7 at 32K and
# 128K on every mask (full 613 -> 628, share_question 405 -> 462, random_eviction 457 -> 511 at
# 32K); at 8K (run 3) 10 and 11 both over 3 on every mask (full 592 -> 603, document 518 -> 554,
# random_eviction 440 -> 515), 10 and 11 within noise of each other: 11 at every length. d = 256: 13 (key blocks of 80) full 671 (cuDNN 654), 15 (13 + paired tiles) causal 644
# (3: 577); general masks: 3 at 8K (13 / 15 lose 9-10 % on sliding_window there), and at 32K
# 11 (s7 run 4, 3 / 11 / 13 / 15: sliding_window 493 / 531 / 495 / 513, cuDNN 583; document 547 /
# 569 / 567 / 554; causal_document 484 / 527 / 506 / 477; share_question 452 / 527 / 448 / 435).
# d = 64 from 32K keys on: 17 (12 + 11's walk and mask bits; s7 run 5, 32K, 11 / 12 / 17, cuDNN:
# full 419 / 449 / 479, 457; causal 410 / 445 / 462, 444; sliding_window 350 / 326 / 363, 364;
# causal_document 334 / 318 / 353; document 378 / 378 / 411; prefix_lm_causal 411 / 454 / 467;
# qk_sparse 404 / 435 / 463; share_question 295 / 241 / 290). Until session 10, 12 / 11 below 32K
# keys and 3 for d = 256 general masks there (17 / 11 had not been timed at 8K).
# Since session 10 (H200 run 5 / 6, 8K, kernel_timing.py): 17 at d = 64 below 32K keys too (full
# 444 / 471 / 407 for 12 / 17 / 11, cuDNN 451; causal 407 / 434 / 385, cuDNN 437; general masks 11
# -> 17: document 352 -> 406, causal_blockwise 365 -> 410, prefix_lm_causal 395 -> 445, qk_sparse
# 376 -> 422, seven of ten up 6-15 %, share_question / global_sliding_window equal, sliding_window
# 243 -> 231), and 11 at d = 256 for general masks below 32K too (3 -> 11: sliding_window 395 ->
# 420, random_eviction 494 -> 536, five more up 1-3 %; causal_document / prefix_lm_causal 1-2.5 %
# down), so no default depends on the key count any more. Under 8K keys neither is measured.
DEFAULT_VARIANTS = {
    64: {"full": WG3_MASK_BITS_VARIANT, "causal": WG3_MASK_BITS_VARIANT, "general": WG3_MASK_BITS_VARIANT},
    128: {"full": 11, "causal": 11, "general": 11},
    256: {"full": 13, "causal": 15, "general": MASK_BITS_GS_VARIANT},
}
STRUCTURES = ("full", "causal", "general")
TESTED_VARIANTS = (2, 3, 4, 6, GROUP_SCAN_VARIANT)  # run on every case of tests/gpu/test_cuda_forward.py
# Variants compiled for one head dim only (variant -> head dim); forward() raises ValueError for
# the others. Every other variant is compiled for 64, 128 and 256.
HEAD_DIM_VARIANTS = {12: 64, 13: 256, 14: 256, 15: 256, WG3_MASK_BITS_VARIANT: 64, BN80_MASK_BITS_VARIANT: 256}

_lock = threading.Lock()
_state: dict = {}


def _load():
    """Import the extension and register its targets once; returns (module or None, reason)."""
    with _lock:
        if "mod" in _state:
            return _state["mod"], _state["reason"]
        mod, reason = None, ""
        try:
            from . import _flashmask_cuda as mod  # type: ignore[attr-defined]
        except ImportError as e:  # not built (CPU-only build, no nvcc) or not loadable
            reason = f"the CUDA extension jax_flashmask._flashmask_cuda is not built or not loadable ({e})"
        if mod is not None:
            try:
                # Start the backends first: a registration for a platform whose plugin has not
                # started is queued and applied when it starts, where a failure (e.g. handlers
                # built against a newer XLA FFI API than this jaxlib's) is only logged and every
                # call fails later with "No FFI handler registered". Registered now, it raises.
                jax.devices()
            except Exception:  # noqa: BLE001 - no backend can start: the registration stays queued
                pass
            try:
                for name, capsule in mod.registrations().items():
                    jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            except Exception as e:  # noqa: BLE001 - report, do not crash the import
                mod, reason = None, f"registering the FFI targets failed: {e}"
        _state["mod"], _state["reason"] = mod, reason
        return mod, reason


@functools.lru_cache(maxsize=None)
def _device_reason() -> str:
    try:
        gpus = jax.devices("gpu")
    except Exception:  # noqa: BLE001 - no GPU backend at all
        return "no CUDA GPU visible to JAX"
    if not gpus:
        return "no CUDA GPU visible to JAX"
    for d in gpus:
        cc = getattr(d, "compute_capability", None)
        if cc is None:
            continue
        try:
            major = int(str(cc).split(".")[0])
        except ValueError:
            continue
        if major != 9:
            return f"the kernels need an sm_90 (Hopper) GPU; found compute capability {cc}"
    if getattr(gpus[0], "platform", "gpu") not in ("gpu", "cuda"):
        return "the GPU backend is not CUDA"
    return ""


def unavailable_reason() -> str:
    """Why the CUDA kernels cannot run here ('' when they can)."""
    mod, reason = _load()
    if mod is None:
        return reason
    return _device_reason()


def is_available() -> bool:
    return unavailable_reason() == ""


def check_supported(q_shape, q_dtype, head_dim) -> None:
    """Raise NotImplementedError / ValueError for problems the kernel does not handle."""
    if len(q_shape) < 4:
        raise ValueError(f"query must be [B, Sq, N, d]; got shape {tuple(q_shape)}")
    dt = jnp.dtype(q_dtype)
    if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise NotImplementedError(f"the CUDA kernel takes bfloat16 or float16, not {dt}")
    if int(head_dim) not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(
            f"the CUDA kernel supports head dims {SUPPORTED_HEAD_DIMS}, not {head_dim}")
    if int(q_shape[-2]) > 65535:
        raise NotImplementedError("the CUDA kernel supports at most 65535 query heads")


def _check_problem(q, k, v, bounds):
    check_supported(q.shape, q.dtype, q.shape[-1])
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or bounds.ndim != 4:
        raise ValueError("forward takes q [B,Sq,N,d], k/v [B,Sk,K,d], bounds [B,Hm,4,Sk]")
    B, Sq, N, d = q.shape
    Bk, Sk, K, dk = k.shape
    if k.shape != v.shape or Bk != B or dk != d:
        raise ValueError(f"k {k.shape} / v {v.shape} do not match q {q.shape}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("q, k and v must share one dtype")
    if bounds.shape[0] != B or bounds.shape[2] != 4 or bounds.shape[3] != Sk:
        raise ValueError(f"bounds must be [B, Hm, 4, Sk] = [{B}, Hm, 4, {Sk}]; got {bounds.shape}")
    Hm = bounds.shape[1]
    if K < 1 or N % K or Hm < 1 or N % Hm:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K} and mask heads Hm={Hm}")
    if Sk < 1:
        raise ValueError("the CUDA kernel needs Sk >= 1")
    return B, Sq, N, d, Sk, K, Hm


def variant_supported(variant: int, dtype, head_dim: int) -> bool:
    """Whether forward kernel `variant` is compiled for (dtype, head_dim) (dtype bf16/fp16)."""
    variant, head_dim = int(variant), int(head_dim)
    if variant in HEAD_DIM_VARIANTS:
        return head_dim == HEAD_DIM_VARIANTS[variant]
    return variant in VARIANTS and head_dim in SUPPORTED_HEAD_DIMS


def check_variant_head_dim(variant: int, head_dim: int) -> None:
    """ValueError when forward kernel `variant` (already resolved) is not compiled for `head_dim`
    (variants 12 to 15, 17 and 18 are single-head-dim kernels: HEAD_DIM_VARIANTS)."""
    want = HEAD_DIM_VARIANTS.get(int(variant))
    if want is not None and int(head_dim) != want:
        raise ValueError(f"forward kernel variant {variant} is compiled for head dim {want} only, "
                         f"got d = {head_dim}; use variant 3 (the default) or None")


def resolve_variant(variant: int | None, head_dim: int = 128, structure: str = "general") -> int:
    """The forward kernel variant `forward(..., variant=variant)` runs at `head_dim` for a mask of
    `structure` (None: DEFAULT_VARIANTS; see there); ValueError for one that is not compiled.
    Needs neither the extension nor a GPU."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
    if variant is None:
        return DEFAULT_VARIANTS.get(int(head_dim), DEFAULT_VARIANTS[128])[structure]
    if int(variant) not in VARIANTS:
        raise ValueError(f"unknown forward kernel variant {variant}; valid: "
                         f"{', '.join(map(str, VARIANTS))}, or None (the default for the head dim)")
    return int(variant)


def forward(q, k, v, bounds, *, scale: float, variant: int | None = None, sm_margin: int = 0,
            structure: str = "general"):
    """FlashMask forward on Hopper.

    q [B,Sq,N,d], k/v [B,Sk,K,d] (bf16/fp16), bounds int32 [B,Hm,4,Sk] (canonical LTS, LTE, UTS,
    UTE). Returns out [B,Sq,N,d] in q.dtype and lse float32 [B,Sq,N] (natural log; -inf and out=0
    for fully masked rows). Works under jit and vmap (vmap axes fold into the batch).

    sm_margin: number of SMs the persistent variants (3, 5, 6, 7, 10-15, 17, 18; variant=None picks one) leave
    free, e.g. for NCCL's send/recv kernels to run concurrently under context parallelism (grid =
    max(1, num_SMs - sm_margin) CTAs). Ignored by the one-CTA-per-tile variants (2, 4).
    structure: "full" / "causal" when `bounds` is known to be the unmasked (or causal) mask,
    "general" otherwise; only picks the default variant (DEFAULT_VARIANTS), the result is exact
    for any bounds.
    """
    scale = _check_scale(scale)
    mod, reason = _load()
    if mod is None:
        raise NotImplementedError(f"jax_flashmask CUDA kernels unavailable: {reason}")
    sm_margin = _check_sm_margin(sm_margin)
    B, Sq, N, d, Sk, K, Hm = _check_problem(q, k, v, bounds)
    variant = resolve_variant(variant, d, structure)
    check_variant_head_dim(variant, d)
    bounds = bounds.astype(jnp.int32)
    nblk = -(-Sk // _META_BLOCK)
    # workspace: block metadata [B, Hm, 8, nblk] + the persistent grid's tile counter; variants 7
    # , 11, 17 and 18 also the group metadata (as much again, after the counter)
    ws = B * Hm * 8 * nblk + 32
    if variant in GROUP_META_VARIANTS:
        ws = 2 * ws
    out_types = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((B, Sq, N), jnp.float32),
        jax.ShapeDtypeStruct((ws,), jnp.int32),
    )
    call = jax.ffi.ffi_call(FWD_TARGET, out_types, vmap_method="broadcast_all")
    out, lse, _ = call(q, k, v, bounds, scale=np.float32(scale), variant=np.int32(variant),
                          sm_margin=np.int32(sm_margin))
    return out, lse


# --------------------------------------------------------------------------------------- backward

BWD_TARGET = "jax_flashmask_bwd_sm90"
BWD_HEAD_DIMS = (64, 128, 256)  # cc/sm90/bwd_aux.cu dispatch
_BWD_BLOCK_M = 64   # query rows per tile (row-statistics padding), cc/sm90/params.h kBwdBlockM


def _bwd_block_m(head_dim: int, variant: int) -> int:
    """Query rows per tile of the backward kernel (sizes the Sq padding of the dQ / row-statistics
    workspaces and the query-tile count of the ordering bits): 128 for variants 7 and 11 (d = 64 only),
    80 for variant 16 (d = 128 only), kBwdBlockM = 64 otherwise (the d = 256 kernel too)."""
    if int(variant) in BWD_ROWS80_VARIANTS and int(head_dim) == 128:
        return 80
    return 128 if int(variant) in BWD_ROWS128_VARIANTS and int(head_dim) == 64 else _BWD_BLOCK_M


def _bwd_block_n(head_dim: int) -> int:
    """Keys per CTA of the backward kernel for `head_dim` (the metadata granularity: sizes the
    metadata and ordering-bit workspaces): kBwdBlockN = 128 for d = 64 / 128, 64 for the d = 256
    kernel (cc/sm90/bwd_d256_kernel.cuh)."""
    return 64 if int(head_dim) == 256 else 128


def _bwd_meta_words(B: int, Hm: int, K: int, nblk: int) -> int:
    """int32 words of the backward's metadata workspace, in bwd_kernel.cuh's bwd_meta_layout order:
    the block metadata [B, Hm, 8, nblk]; the scheduler area (counter, G, order flag, spare, then
    variant 6's key-block order [nblk]); variant 21's key-block orders [B, Hm, nblk]; the
    look-ahead zeroing's counters [K * B]. tests/test_bwd_prep_layout.py evaluates the C++ layout
    against this."""
    return B * Hm * 8 * nblk + 4 + nblk + B * Hm * nblk + K * B


def _bwd_compiled_configs():
    mod, _ = _load()
    cfg = getattr(mod, "backward_configs", None) if mod is not None else None
    return tuple(c for c in str(cfg).split(",") if c) if cfg is not None else ()


def check_supported_backward(q_shape, q_dtype, head_dim) -> None:
    """Raise NotImplementedError / ValueError for problems the backward kernel does not handle."""
    check_supported(q_shape, q_dtype, head_dim)
    if int(head_dim) not in BWD_HEAD_DIMS:
        raise NotImplementedError(
            f"the CUDA backward supports head dims {BWD_HEAD_DIMS}, not {head_dim}")
    dt = jnp.dtype(q_dtype)
    name = "bf16" if dt == jnp.dtype(jnp.bfloat16) else "fp16"
    cfg = _bwd_compiled_configs()
    if f"{name}_d{int(head_dim)}" not in cfg:
        raise NotImplementedError(
            f"the CUDA backward is not compiled for {name}, d={head_dim} (compiled: {cfg})")


# dQ reduction over key blocks: 1 = each CTA's 64 x d fp32 tile goes through smem into one
# cp.reduce.async.bulk add (default), 0 = float2 atomics from registers (kept for comparison).
BWD_DQ_MODES = (0, 1)
DEFAULT_BWD_DQ_MODE = 1
# Backward kernel variants (cc/sm90/bwd_kernel.cuh; history in benchmarks/NOTES.md "Backward"):
#   5: warp specialized (a producer warpgroup with a TMA warp and a dQ-writer warp, setmaxnreg 24;
#      two consumer warpgroups, 240) with the consumer warpgroups in ping-pong (each tile's dQ GEMM
#      two tiles later, dS buffers on mbarriers, GEMM issue alternating through named barriers),
#      row statistics by bulk copy, dS stored on precomputed 32-bit shared addresses; one CTA
#      per work item (key block, kv head, batch). The default at d = 128.
#   6: variant 5's per-item code on a persistent grid of num_SMs - sm_margin CTAs taking work
#      items from a global counter, heaviest key blocks first within L2 sections of heads, the
#      next item's K/V load under the current item's dK/dV epilogue. Same per-item math as 5
#      (bitwise equal dK/dV; dQ too in deterministic mode).
#   7: variant 5's kernel with 128-row query tiles, d = 64 only (ValueError for d = 128; d = 256
#      runs its own kernel for every variant number): per tile and warpgroup S^T / dP^T 64 keys x
#      128 queries, dV / dK 64 x 64, the dQ GEMM split by query rows between the warpgroups
#      (variant 5 at d = 64 runs it twice). The default at d = 64: H200, 8K, B = 16, H = 32:
#      full 385 / causal 347 / document 287 / sliding_window 161 TFLOP/s against variant 5's
#      299 / 274 / 235 / 136, dK/dV bitwise equal to 5 (NOTES.md "Variant 7").
#  10: variant 5 with the cheaper element mask of partial tiles (d = 64 and 128): the bounds of a
#      consumer thread's two key columns are loaded once per query head into registers (out-of-range
#      key columns folded in) and each partial tile turns them into one bit per element before the
#      S wait (2 instructions per element instead of ~10, no per-tile loads or integer division);
#      visible tiles run an exp loop without any mask test. Same products as 5: dK/dV (and dQ in
#      deterministic mode) bitwise equal (benchmarks/NOTES_bwd_walkall.md; not yet run on a GPU).
#  11: variant 7 (128-row query tiles, d = 64 only) with the same mask; bitwise equal to 7.
#  12: variant 5 with the two consumer warpgroups in lock-step instead of ping-pong, d = 128 only
#      (ValueError at d = 64; d = 256 runs its own kernel for every variant number): per tile each
#      warpgroup issues S and dP back to back, runs the exp under dP, then issues dV, stores dS,
#      meets the other warpgroup at one named barrier, issues dQ and dK behind it with one GEMM
#      group always in flight (the dQ tile's smem store and the next tile's walk run under dK):
#      FlashAttention-3's Hopper order (benchmarks/NOTES_bwd_full.md; not yet run on a GPU).
#      Same products per element as 5 in the same order: dK/dV bitwise equal to 5 (dQ too in
#      deterministic mode).
#  13: variant 12 with variant 10's element mask of partial tiles; bitwise equal to 12.
#  14: variant 5 with another CTA launch order in deterministic mode (issue 4; in the default mode
#      it is variant 5, launch included): a 1-D grid in which groups of G = 8 (kv head, batch)
#      pairs are interleaved (key blocks descending, pair fastest), so that the key-block CTAs of
#      one document no longer start together and wait for each other's ordered dQ adds tile by
#      tile (benchmarks/NOTES_bwd_det.md: timeline model, 32K document -25 % deterministic).
#      Same per-tile order (descending key block), same workspaces: every gradient bitwise
#      variant 5's, dQ in deterministic mode too. JFM_BWD_DET_GROUP=G (environment, read once
#      per process) overrides G for timing experiments. Not a default (not yet run on a GPU).
#  15: variant 14 with a pipelined deterministic dQ writer: tile k's bulk reduce is issued before
#      tile k-1's has completed; k-1's ordering bit and buffer follow once at most one reduce is
#      pending (variant 5 waits for each reduce's completion before the next tile: in the model
#      that serial latency is what costs full / causal ~15 %). Same order, bitwise variant 5's
#      gradients; default mode = variant 5. Not a default. Its first device run (2026-12-01) hung in
#      deterministic mode (consumers' last section vs the delayed buffer release; fixed by a turn
#      of its own for the last tile, benchmarks/NOTES_bwd_det.md "The variant 15 hang"; the fix is
#      not yet run on a GPU).
#  17: variant 13 (lock-step consumers, mask in registers; d = 128 only) with, in deterministic
#      mode, variant 15's pipelined dQ writer and variant 14's interleaved launch groups, the group
#      size G chosen per launch on the device from the block metadata (bwd_aux.cu
#      bwd_det_group_kernel): G = 1 (variant 5's launch order) unless most key blocks start their
#      walk at the same query tile as the key block above them (documents), then as many pairs as
#      keep G * (mean kept tiles per key block) <= query tiles, at most 8. Full / causal keep the
#      L2 working set of one head (what 14 / 15 lost there), documents get 14's spread chains.
#      Same per-tile order (descending key block) and products: every gradient bitwise variant
#      13's = 5's, dQ in deterministic mode too; default mode = variant 13. JFM_BWD_DET_GROUP=G
#      overrides G. Not a default (benchmarks/NOTES_bwd_det.md "Variant 17"; not yet run on a GPU).
#  19: variant 16 (80-row query tiles; d = 128 only) with, in deterministic mode only, variant 14's
#      interleaved launch groups, G chosen per launch on the device (bwd_aux.cu
#      bwd_det_group80_kernel, at 80-row tiles): G = 1 (16's launch order) unless the key blocks'
#      ordered dQ chains reach their shared tiles together (most key blocks start at the tile where
#      the key block above starts: documents, global rows -> 8, unless the key blocks keep more
#      than half the query tiles on average) or in inverted order (a key block ending where the one
#      above ends with a shorter walk, >= 1/128 of the kept tiles: causal blockwise -> 4), then at
#      most 300 / (mean kept tiles per key block) so that the group's rows stay in L2 (since s11:
#      128K document / global_sliding_window 8 -> 1, causal blockwise 8 -> 2; 32K document 8 -> 6,
#      gsw 7 -> 5; 8K document 3 -> 8, gsw 6 -> 8, prefix_lm_document 5 -> 8, causal blockwise 8 -> 4).
#      Walk, writer and per-tile order are 16's: every gradient
#      bitwise variant 16's in deterministic mode; default mode = variant 16. JFM_BWD_DET_GROUP=G
#      overrides G. The deterministic default at d = 128 since s9 (benchmarks/NOTES_detwalk.md).
#  21: variant 19 whose pre-pass, in the inverted-tails case (causal blockwise), also writes each
#      (batch, mask head)'s key blocks in ascending kept-tile count (ties: descending key block),
#      the order in which their walks reach the shared tail; that order is the pair's launch order
#      and every query tile's dQ summation order (bwd_kernel.cuh BwdDetAuto80 / BwdArgs::det_perm).
#      dK / dV bitwise 16's; dQ deterministic, bitwise 19's on masks without inverted tails.
#      Sorted inside windows of 256 key blocks (bwd_aux.cu kDetOrderWindow; JFM_BWD_DET_ORDER_WINDOW=W
#      overrides it), so that the resident CTAs stay on a few documents' rows (L2) at 128K.
#      JFM_BWD_DET_GROUP=G overrides G only (the order still comes from the pre-pass).
# Every variant (and the d = 256 kernel) walks a key block's kept query tiles with the O(1) walk:
# the tiles a key block skips form two contiguous ranges, so the next kept tile is at most three
# jumps away (until 2026-12-01 variant 9 = variant 5 with this walk, the default at d = 128: H200
# session 4, 32K, B = 4, H = 32: sliding_window 313 -> 378, causal_document 314 -> 382,
# share_question 238 -> 320 TFLOP/s against the tile-by-tile scan, dK/dV bitwise equal; the scan
# cost 14-37 % of the masked backward, benchmarks/NOTES_bwd_partial.md). Now the only walk, so 9 is
# variant 5 and its number is gone (benchmarks/NOTES_bwd_walkall.md).
# Measured and removed (NOTES.md): 1 (no warp specialization), 2 (warp specialized, lock-step
# consumers), 3 (ping-pong, generic-address dS stores), 4 (dK GEMM issued before the dS store,
# which reads an in-flight wgmma's A registers: not allowed by PTX), 8 (5 with the dQ GEMM issued
# in the math behind dK: equal to 5 within noise on the H200), 9 (variant 5 with the O(1) walk:
# the walk of every variant since 2026-12-01).
# sm_margin (SMs left free, e.g. for NCCL under context parallelism) applies to variant 6 only;
# variants 5, 7, 10 and 11 launch one CTA per work item and ignore it. variant=None
# (resolve_bwd_variant) picks variant 6 when sm_margin > 0 (the only one that can leave SMs free),
# at every head dim, else DEFAULT_BWD_VARIANTS[d]: 11 at d = 64, 16 at d = 128, (nominal) 5 at 256
# (deterministic: DEFAULT_DET_BWD_VARIANTS, 21 at d = 128).
# Head dim 256 has its own kernel for every variant number (cc/sm90/bwd_d256_kernel.cuh: 64 keys
# per CTA, the two consumer warpgroups split d, dQ staged over the dead Q/dO stage; one CTA per
# work item, sm_margin ignored). H200 session 3 run 4: 63 GPU tests, sanitizers clean; 8K, H=16:
# full 321, causal 332, document 306 TFLOP/s (cuDNN 354 / 368 / -; the portable fallback it
# replaces: 7.9 on full).
BWD_VARIANTS = (5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 19, 21)
BWD_ROWS128_VARIANT = 7
BWD_ROWS128_VARIANTS = (7, 11)  # 128-row query tiles: d = 64 only
MASK_REGS_BWD_VARIANTS = {10: 5, 11: 7, 13: 12, 14: 5, 15: 5, 17: 13, 19: 16}  # variant -> the variant it is bitwise equal to
DET_GROUPS_BWD_VARIANT = 14  # variant 5 with interleaved launch groups in deterministic mode
DET_PIPE_BWD_VARIANT = 15  # 14 with the pipelined deterministic dQ writer
DET_GROUPS_BWD_VARIANTS = (DET_GROUPS_BWD_VARIANT, DET_PIPE_BWD_VARIANT)
DET_AUTO_BWD_VARIANT = 17  # 13 with 15's writer and launch groups sized on the device (deterministic)
LOCKSTEP_BWD_VARIANTS = (12, 13, 17)  # lock-step consumer warpgroups: d = 128 only (256: own kernel)
# Variant 16: 13 with 80-row query tiles and dQ^T = K^T dS^T (benchmarks/NOTES_bwd80.md); d = 128
# only (ValueError at 64 and 256), Sq padded to a multiple of 80. The default at d = 128.
BWD_ROWS80_VARIANTS = (16, 19, 21)
DET_AUTO80_BWD_VARIANT = 19  # 16 with launch groups sized on the device (deterministic; 80-row rule)
DET_ORDER80_BWD_VARIANT = 21  # 19 with the key-block order of inverted tails (deterministic)
# The base variant: d = 256's nominal number (and the deterministic default at d = 128 until s7).
DEFAULT_BWD_VARIANT = 5  # H200 2026-11-30 run B: 37 GPU tests, sanitizers
                         # clean; 8K full 445 / causal 415 / document 369 TFLOP/s, deterministic
                         # 424 / 405 / 312; benchmarks/results/bwd_dev_2026-11-30_run3.md.
                         # Variant 6 (session 3, runs 1-2): 62 GPU tests, sanitizers clean, dK/dV
                         # bitwise = 5, but full 402 / causal 384 (-10 % / -7 %); sliding_window
                         # +2.6 %.
# Defaults: the mask-in-registers twins (H200 2026-12-01, s5 run 1, 32K, B = 4, H = 32, dK/dV
# bitwise equal to the twin): d = 128 variant 10 vs 5 sliding_window 367 -> 386, causal_document
# 370 -> 385, share_question 311 -> 341, random_eviction 400 -> 472 TFLOP/s; d = 64 variant 11 vs 7
# full 392 -> 439, causal 396 -> 430, sliding_window 306 -> 345, causal_document 284 -> 343,
# share_question 238 -> 278. d = 128 then variant 13 (10 with lock-step consumer warpgroups; s5 run
# 6, 32K: full 491 -> 513, causal 490 -> 514, document 440 -> 467, sliding_window 397 -> 415,
# causal_document 394 -> 415, share_question 340 -> 361; s6 run 1: 72 GPU tests passed, memcheck 0
# errors, racecheck 0 hazards). d = 128 then variant 16 (13 with 80-row query tiles; H200 s7 runs
# 1-3, 32K, bwd_timing.py interleaved: full 507 -> 530, causal 502 -> 526, document 460 -> 479,
# sliding_window 405 -> 414, causal_document 409 -> 421, share_question 363 -> 369; dK/dV bitwise
# 13; 79 GPU tests passed, memcheck / synccheck 0 errors, racecheck 0 hazards). s12: 16's dV wait
# after the dS barrier (same bits): 8K full 518 -> 526, causal 483 -> 491, 32K full 524 -> 533
# (level with cuDNN at 8K: 526 / 528, 526 / 523 in one process; NOTES.md session 12). s23: 16 / 19
# / 21 in the default mode walk the key blocks that skip no query tile of their kv group from a
# clocked start (the tiles clocked walks issued so far / SMs + key block, mod the tile count),
# where a kv head's Q / dO / dQ stream exceeds the L2 (64K / 128K at d = 128): 128K full 495 -> 553
# TFLOP/s, DRAM 2.0 TB -> 68 GB per kernel; JFM_BWD_WALK_CLOCK=0 / 1 (environment, read once per
# process) forces the ascending walk / the clocked one (bwd_kernel.cuh bwd_group_skips_none;
# NOTES.md sessions 23-24).
DEFAULT_BWD_VARIANTS = {64: 11, 128: 16, 256: DEFAULT_BWD_VARIANT}
# Deterministic mode: DEFAULT_DET_BWD_VARIANTS. At d = 128 variant 19 = 16 with launch groups sized
# on the device (bitwise 16's gradients; H200 s9 run 2, 32K, deterministic 16 -> 19, two alternated
# runs: document 395 -> 422, global_sliding_window 362 -> 415, causal_blockwise 312 -> 398 TFLOP/s,
# the other nine masks equal within 1 %; 80 GPU tests passed, memcheck 0 errors, racecheck 0
# hazards). Since s12 variant 21 = 19 with the key-block order of inverted tails (H200 s12 runs 2-4,
# deterministic 19 -> 21 in one process: causal_blockwise 8K 408 -> 418, 32K 405 -> 418, 128K
# 400 -> 410 TFLOP/s; document 426 -> 427, bitwise 19's there; 20 GPU tests, memcheck 0 errors,
# racecheck 0 hazards). Before: 19 (s9-s11), 16 (s7-s8; 17 lost 18-25 % on short documents),
# 5 (s1-s6).
DEFAULT_DET_BWD_VARIANTS = {**DEFAULT_BWD_VARIANTS, 128: DET_ORDER80_BWD_VARIANT}
PERSISTENT_BWD_VARIANT = 6


def resolve_bwd_variant(variant: int | None, head_dim: int, sm_margin: int = 0,
                        deterministic: bool = False) -> int:
    """The backward kernel variant `backward(..., variant=variant, sm_margin=sm_margin)` runs at
    `head_dim`: None gives PERSISTENT_BWD_VARIANT (6) when sm_margin > 0, else
    DEFAULT_BWD_VARIANTS[head_dim] (11 at d = 64, 16 at d = 128, 5 at 256), or with
    `deterministic` DEFAULT_DET_BWD_VARIANTS[head_dim] (21 at d = 128: 16's dK / dV bit for bit).
    ValueError for a variant that is not compiled, or not for `head_dim`. Needs neither the
    extension nor a GPU."""
    head_dim = int(head_dim)
    if variant is None:
        if int(sm_margin) > 0:
            return PERSISTENT_BWD_VARIANT
        table = DEFAULT_DET_BWD_VARIANTS if deterministic else DEFAULT_BWD_VARIANTS
        return table.get(head_dim, DEFAULT_BWD_VARIANT)
    variant = int(variant)
    if variant not in BWD_VARIANTS:
        raise ValueError(f"unknown backward kernel variant {variant}; valid: "
                         f"{', '.join(map(str, BWD_VARIANTS))}, or None (the default for the head dim)")
    if variant in BWD_ROWS128_VARIANTS and head_dim == 128:  # (d = 256: one kernel for every variant)
        raise ValueError(f"backward kernel variant {variant} (128-row query tiles) is d = 64 only, "
                         f"got d = {head_dim}")
    if variant in LOCKSTEP_BWD_VARIANTS and head_dim == 64:  # (d = 256: one kernel for every variant)
        raise ValueError(f"backward kernel variant {variant} (lock-step consumers) is d = 128 only, "
                         f"got d = {head_dim}")
    if variant in BWD_ROWS80_VARIANTS and head_dim != 128:
        raise ValueError(f"backward kernel variant {variant} (80-row query tiles) is d = 128 only, "
                         f"got d = {head_dim}")
    return variant


def _backward_kernel(q, k, v, bounds, out, lse, dout, dlse=None, *, scale: float,
                     dq_mode: int | None = None, deterministic: bool = False,
                     variant: int | None = None, sm_margin: int = 0):
    """FlashMask backward on Hopper: (dq, dk, dv) in the inputs' dtypes.

    Same arguments as the forward plus out [B,Sq,N,d], lse float32 [B,Sq,N] (as the forward returns
    them), dout (cotangent of out) and dlse (cotangent of lse; None = zeros). Math of
    `_xla.backward`: D = rowsum(dO * O) - dlse, dS = P * (dP - D); fully masked rows get zero
    gradients. `backward` (below) adds the portable fallback for configurations not compiled.

    deterministic=True: bitwise-reproducible gradients. The key-block CTAs of each query tile add
    their dQ into the fp32 workspace in a fixed (descending key-block) order, ordered through one bit
    per (query tile, key block) in an extra workspace; dK/dV are reduced in registers in a fixed
    order in both modes. Needs dq_mode 1 (the default).

    sm_margin: SMs the persistent variant 6 leaves free (it launches max(1, num_SMs - sm_margin)
    CTAs), e.g. for NCCL's kernels under context parallelism. Variants 5, 7, 10, 11 ignore it.

    variant=None: 6 when sm_margin > 0, else 11 at d = 64 and 16 at d = 128 (21 with
    deterministic=True: 16's dK / dV, launch groups and order sized on the device;
    resolve_bwd_variant).
    d=256: its own kernel (64 keys per CTA) for every `variant`; it ignores sm_margin.
    variant=7 / 11 (d = 64 only; ValueError at d = 128): 128-row query tiles (their dQ /
    row-statistics workspaces padded to a multiple of 128 rows). variant=10 / 11: variant 5 / 7 with
    the element mask of partial tiles from registers (bitwise the same gradients). variant=12 / 13
    (d = 128 only; ValueError at d = 64): variant 5 / 10 with lock-step consumer warpgroups
    (bitwise the same dK/dV as 5). variant=14: variant 5 launched in interleaved groups of (kv
    head, batch) pairs in deterministic mode (bitwise variant 5's gradients; for masks of many
    short key-block chains such as documents, see benchmarks/NOTES_bwd_det.md). variant=15: 14 with
    the pipelined deterministic dQ writer (bitwise variant 5's gradients too). variant=16 (d = 128
    only; ValueError elsewhere): variant 13 with 80-row query tiles (dQ computed transposed; its
    workspaces padded to a multiple of 80 rows); dK / dV / dQ close to 13's, not bitwise.
    variant=17 (d = 128 only): variant 13 with 15's writer and launch groups sized per launch on
    the device in deterministic mode (bitwise variant 13's = 5's gradients).
    variant=19 (d = 128 only): variant 16 with launch groups sized per launch on the device in
    deterministic mode (documents, global rows, causal blockwise; bitwise variant 16's gradients).
    variant=21 (d = 128 only): 19 whose deterministic dQ order (and launch order) follows the key
    blocks' arrival at a shared tail on causal-blockwise-like masks (dK / dV bitwise 16's).
    """
    scale = _check_scale(scale)
    mod, reason = _load()
    if mod is None:
        raise NotImplementedError(f"jax_flashmask CUDA kernels unavailable: {reason}")
    B, Sq, N, d, Sk, K, Hm = _check_problem(q, k, v, bounds)
    check_supported_backward(q.shape, q.dtype, d)
    if out.shape != q.shape or dout.shape != q.shape:
        raise ValueError(f"out {out.shape} and dout {dout.shape} must match q {q.shape}")
    if lse.shape != (B, Sq, N):
        raise ValueError(f"lse must be [B, Sq, N] = {(B, Sq, N)}; got {lse.shape}")
    dq_mode = DEFAULT_BWD_DQ_MODE if dq_mode is None else int(dq_mode)
    if dq_mode not in BWD_DQ_MODES:
        raise ValueError(f"dq_mode must be one of {BWD_DQ_MODES}")
    sm_margin = _check_sm_margin(sm_margin)
    deterministic = _check_deterministic(deterministic)
    variant = resolve_bwd_variant(variant, d, sm_margin, deterministic)
    if deterministic and dq_mode != 1:
        raise ValueError("deterministic=True needs dq_mode=1 (ordered bulk reduction of dQ)")
    bounds = bounds.astype(jnp.int32)
    out = out.astype(q.dtype)
    dout = dout.astype(q.dtype)
    lse = lse.astype(jnp.float32)
    dlse = jnp.zeros((B, Sq, N), jnp.float32) if dlse is None else dlse.astype(jnp.float32)
    block_m = _bwd_block_m(d, variant)
    sq_pad = -(-Sq // block_m) * block_m
    nblk = -(-Sk // _bwd_block_n(d))
    # ordering bits of the deterministic mode: [B, N, query tiles, ceil(nblk / 32)] (else unused)
    sem_shape = (B, N, sq_pad // block_m, -(-nblk // 32)) if deterministic else (1,)
    out_types = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct((B, N, sq_pad, d), jnp.float32),  # dQ accumulator workspace
        jax.ShapeDtypeStruct((2, B, N, sq_pad), jnp.float32),  # row statistics workspace
        jax.ShapeDtypeStruct((_bwd_meta_words(B, Hm, K, nblk),), jnp.int32),  # metadata
        jax.ShapeDtypeStruct(sem_shape, jnp.int32),            # dQ ordering bits (deterministic)
    )
    call = jax.ffi.ffi_call(BWD_TARGET, out_types, vmap_method="broadcast_all")
    dq, dk, dv, *_ = call(q, k, v, bounds, out, lse, dout, dlse, scale=np.float32(scale),
                          dq_mode=np.int32(dq_mode), deterministic=np.int32(deterministic),
                          variant=np.int32(variant), sm_margin=np.int32(sm_margin))
    return dq, dk, dv


def _check_scale(scale) -> float:
    # the kernels' softmax takes each row's running max of the raw scores QK^T as the max of the
    # scaled ones, which holds for a positive scale only
    scale = float(scale)
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 for the CUDA kernels, got {scale}; "
                         "implementation='xla' takes any scale")
    return scale


def _check_sm_margin(sm_margin) -> int:
    if isinstance(sm_margin, (bool, np.bool_)) or not isinstance(sm_margin, (int, np.integer)):
        raise ValueError(f"sm_margin must be an int, got {type(sm_margin).__name__}")
    if int(sm_margin) < 0:
        raise ValueError(f"sm_margin must be >= 0, got {sm_margin}")
    return int(sm_margin)


def _check_deterministic(deterministic) -> bool:
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    return bool(deterministic)


def _backward_with_fallback(q, k, v, bounds, out, lse, dout, dlse=None, *, scale: float,
                            dq_mode: int | None = None, deterministic: bool = False,
                            variant: int | None = None, sm_margin: int = 0):
    """The kernel where it is compiled for (dtype, d); the portable `_xla.backward` elsewhere
    (e.g. an extension built without the d=256 kernel), so that a CUDA forward never makes
    training fail in the backward. Both honour `deterministic` (see `_xla.backward`)."""
    deterministic = _check_deterministic(deterministic)
    sm_margin = _check_sm_margin(sm_margin)
    try:
        check_supported_backward(q.shape, q.dtype, q.shape[-1])
    except NotImplementedError:
        return _xla.backward(q, k, v, bounds, out, lse, dout, dlse, scale=scale,
                             deterministic=deterministic)
    return _backward_kernel(q, k, v, bounds, out, lse, dout, dlse, scale=scale, dq_mode=dq_mode,
                            deterministic=deterministic, variant=variant, sm_margin=sm_margin)


# Enabled after the GPU backward tests passed on an H200 (2026-11-29 23:36 UTC: 26/26 of
# tests/gpu/test_cuda_backward.py, memcheck clean). attention.py picks `backward` for its custom_vjp.
# 2026-11-30 ~17:27 UTC (H200): 52/52 incl. deterministic mode and both kernel variants,
# memcheck 0 errors, racecheck 0 hazards.
backward = _backward_with_fallback
