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

__all__ = ["is_available", "unavailable_reason", "check_supported", "forward", "FWD_TARGET"]

FWD_TARGET = "jax_flashmask_fwd_sm90"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
_META_BLOCK = 64  # smallest key block of any compiled config: sizes the metadata workspace

# Compiled forward kernel variants (cc/sm90/fwd_dispatch.cu; history in benchmarks/NOTES.md):
#   1: producer warp + 1 consumer warpgroup (64-row tiles), no overlap; bf16 d=128 only (baseline);
#   2: producer warp + 2 consumer warpgroups (128-row tiles), FA3-style softmax/GEMM overlap inside a
#      warpgroup and GEMM ping-pong between the two; one CTA per query tile;
#   3: variant 2's kernel on a persistent grid (one CTA per SM walking the tile order).
VARIANTS = (1, 2, 3)
DEFAULT_VARIANT = 2
TESTED_VARIANTS = (2, 3)  # run on every case of tests/gpu/test_cuda_forward.py

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


def forward(q, k, v, bounds, *, scale: float, variant: int | None = None):
    """FlashMask forward on Hopper.

    q [B,Sq,N,d], k/v [B,Sk,K,d] (bf16/fp16), bounds int32 [B,Hm,4,Sk] (canonical LTS, LTE, UTS,
    UTE). Returns out [B,Sq,N,d] in q.dtype and lse float32 [B,Sq,N] (natural log; -inf and out=0
    for fully masked rows). Works under jit and vmap (vmap axes fold into the batch).
    """
    mod, reason = _load()
    if mod is None:
        raise NotImplementedError(f"jax_flashmask CUDA kernels unavailable: {reason}")
    variant = DEFAULT_VARIANT if variant is None else int(variant)
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant}; compiled: {VARIANTS}")
    if variant == 1 and (q.dtype != jnp.bfloat16 or q.shape[-1] != 128):
        raise NotImplementedError("kernel variant 1 is compiled for bfloat16, d=128 only")
    B, Sq, N, d, Sk, K, Hm = _check_problem(q, k, v, bounds)
    bounds = bounds.astype(jnp.int32)
    nblk = -(-Sk // _META_BLOCK)
    out_types = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((B, Sq, N), jnp.float32),
        jax.ShapeDtypeStruct((B, Hm, 8, nblk), jnp.int32),  # block-metadata workspace
    )
    call = jax.ffi.ffi_call(FWD_TARGET, out_types, vmap_method="broadcast_all")
    out, lse, _ = call(q, k, v, bounds, scale=np.float32(scale), variant=np.int32(variant))
    return out, lse
