"""The FFI calls of the Hopper kernels: argument checks, workspaces, `jax.ffi.ffi_call`.

`forward` / `backward` pick the kernel from the config table (configs.py); `run_forward` /
`run_backward` take an explicit config (tests and kernel timing compare configurations with
them). Every check runs in Python before anything is lowered.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from . import _extension
from .configs import (HEAD_DIMS, BackwardConfig, ForwardConfig, backward_config, forward_config)

__all__ = ["FWD_TARGET", "BWD_TARGET", "check_supported", "forward", "backward", "run_forward",
           "run_backward"]

FWD_TARGET = "jax_flashmask_fwd_sm90"
BWD_TARGET = "jax_flashmask_bwd_sm90"
SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)


def check_supported(q_shape, q_dtype, head_dim) -> None:
    """NotImplementedError / ValueError for problems the kernels do not handle, naming the fix.
    Where the extension is loaded, also for a head dim it was not built with (a development
    build of a subset: CMake option JAX_FLASHMASK_HEAD_DIMS)."""
    if len(q_shape) < 4:
        raise ValueError(f"query must be [B, Sq, N, d]; got shape {tuple(q_shape)}")
    dt = jnp.dtype(q_dtype)
    if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise NotImplementedError(f"the CUDA kernel takes bfloat16 or float16, not {dt}; cast the "
                                  "inputs or use implementation='xla'")
    if int(head_dim) not in HEAD_DIMS:
        raise NotImplementedError(f"the CUDA kernel supports head dims {HEAD_DIMS}, not {head_dim}; "
                                  "use implementation='xla'")
    if int(q_shape[-2]) > 65535:
        raise NotImplementedError("the CUDA kernel supports at most 65535 query heads")
    compiled = _extension.compiled_configs()
    if compiled and forward_config(int(head_dim)).name not in compiled:
        raise NotImplementedError(
            f"this build of the CUDA extension has no kernels for head dim {head_dim} (built with "
            f"JAX_FLASHMASK_HEAD_DIMS excluding it); rebuild with the default, or use "
            "implementation='xla'")


def _check_problem(q, k, v, bounds):
    check_supported(q.shape, q.dtype, q.shape[-1])
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or bounds.ndim != 4:
        raise ValueError("the CUDA kernels take q [B,Sq,N,d], k/v [B,Sk,K,d], bounds [B,Hm,4,Sk]")
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


def _kernel_bounds(bounds, Sq):
    """The bounds the kernels take: int32, clipped to [0, Sq]. Clipping keeps every row's mask
    (a row i in [0, Sq) tests LTS <= i < LTE and UTS <= i < UTE, which clipping both ends to
    [0, Sq] leaves unchanged), and it keeps the kernels' interval arithmetic (LTE - LTS as an
    unsigned length) from overflowing on bounds anywhere in int32 (traced masks are not
    validated)."""
    return jnp.clip(bounds.astype(jnp.int32), 0, Sq)


def _check_soft_cap(logits_soft_cap, config) -> np.float32:
    """The cap as the kernels' `softcap` attribute (0 = none), checked against the config."""
    if logits_soft_cap is not None:
        logits_soft_cap = float(logits_soft_cap)
        if not (np.isfinite(logits_soft_cap) and logits_soft_cap > 0):
            raise ValueError(f"logits_soft_cap must be a finite float > 0, got {logits_soft_cap}")
    if config.soft_cap != (logits_soft_cap is not None):
        raise ValueError(f"kernel config {config.name} is for "
                         f"{'a' if config.soft_cap else 'no'} logits soft cap; got "
                         f"logits_soft_cap={logits_soft_cap}")
    return np.float32(logits_soft_cap or 0.0)


def _check_deterministic(deterministic) -> bool:
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    return bool(deterministic)


def _loaded(config):
    mod, reason = _extension.load()
    if mod is None:
        raise NotImplementedError(f"jax_flashmask CUDA kernels unavailable: {reason}")
    compiled = _extension.compiled_configs()
    if config.name not in compiled:
        raise NotImplementedError(
            f"kernel config {config.name} is not compiled into this build (compiled: "
            f"{', '.join(sorted(compiled))}); rebuild without JAX_FLASHMASK_HEAD_DIMS")


def run_forward(config: ForwardConfig, q, k, v, bounds, *, scale: float, sm_margin: int = 0,
                logits_soft_cap: float | None = None):
    """The forward kernel `config` on (q, k, v, bounds); see `forward`."""
    scale = _check_scale(scale)
    sm_margin = _check_sm_margin(sm_margin)
    B, Sq, N, d, Sk, K, Hm = _check_problem(q, k, v, bounds)
    if not isinstance(config, ForwardConfig) or config.head_dim != d:
        raise ValueError(f"config must be a ForwardConfig for head dim {d}, got {config!r}")
    softcap = _check_soft_cap(logits_soft_cap, config)
    _loaded(config)
    out_types = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((B, Sq, N), jnp.float32),
        jax.ShapeDtypeStruct((config.workspace_words(B, Hm, Sk),), jnp.int32),
    )
    call = jax.ffi.ffi_call(FWD_TARGET, out_types, vmap_method="broadcast_all")
    out, lse, _ = call(q, k, v, _kernel_bounds(bounds, Sq), scale=np.float32(scale),
                       config=config.name, sm_margin=np.int32(sm_margin), softcap=softcap)
    return out, lse


def forward(q, k, v, bounds, *, scale: float, sm_margin: int = 0, structure: str = "general",
            logits_soft_cap: float | None = None):
    """FlashMask forward on Hopper.

    q [B,Sq,N,d], k/v [B,Sk,K,d] (bf16/fp16), bounds int32 [B,Hm,4,Sk] (canonical LTS, LTE, UTS,
    UTE). Returns out [B,Sq,N,d] in q.dtype and lse float32 [B,Sq,N] (natural log; -inf and out=0
    for fully masked rows). Works under jit and vmap (vmap axes fold into the batch).

    sm_margin: SMs the persistent grid leaves free (grid = max(1, num_SMs - sm_margin) CTAs), e.g.
    for NCCL's kernels under context parallelism. structure: "full" / "causal" when `bounds` is
    known to be the unmasked (or causal) mask, "general" otherwise; it only picks the kernel
    (configs.FORWARD_TABLE), the result is exact for any bounds. logits_soft_cap: None, or a cap
    > 0: the scaled scores s become cap·tanh(s / cap) before the mask (a soft-cap kernel).
    """
    config = forward_config(q.shape[-1] if q.ndim else 0, structure, logits_soft_cap is not None)
    return run_forward(config, q, k, v, bounds, scale=scale, sm_margin=sm_margin,
                       logits_soft_cap=logits_soft_cap)


def run_backward(config: BackwardConfig, q, k, v, bounds, out, lse, dout, dlse=None, *,
                 scale: float, deterministic: bool = False, sm_margin: int = 0,
                 logits_soft_cap: float | None = None):
    """The backward kernel `config`; see `backward`."""
    scale = _check_scale(scale)
    sm_margin = _check_sm_margin(sm_margin)
    deterministic = _check_deterministic(deterministic)
    B, Sq, N, d, Sk, K, Hm = _check_problem(q, k, v, bounds)
    if not isinstance(config, BackwardConfig) or config.head_dim != d:
        raise ValueError(f"config must be a BackwardConfig for head dim {d}, got {config!r}")
    softcap = _check_soft_cap(logits_soft_cap, config)
    if out.shape != q.shape or dout.shape != q.shape:
        raise ValueError(f"out {out.shape} and dout {dout.shape} must match q {q.shape}")
    if lse.shape != (B, Sq, N):
        raise ValueError(f"lse must be [B, Sq, N] = {(B, Sq, N)}; got {lse.shape}")
    _loaded(config)
    dlse = jnp.zeros((B, Sq, N), jnp.float32) if dlse is None else dlse.astype(jnp.float32)
    ws = config.workspace_shapes(B, Sq, Sk, N, K, Hm, deterministic)
    out_types = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(ws["dq_accum"], jnp.float32),
        jax.ShapeDtypeStruct(ws["rowstats"], jnp.float32),
        jax.ShapeDtypeStruct(ws["meta"], jnp.int32),
        jax.ShapeDtypeStruct(ws["dq_sem"], jnp.int32),
    )
    call = jax.ffi.ffi_call(BWD_TARGET, out_types, vmap_method="broadcast_all")
    dq, dk, dv, *_ = call(q, k, v, _kernel_bounds(bounds, Sq), out.astype(q.dtype),
                          lse.astype(jnp.float32), dout.astype(q.dtype), dlse,
                          scale=np.float32(scale), deterministic=np.int32(deterministic),
                          config=config.name, sm_margin=np.int32(sm_margin), softcap=softcap)
    return dq, dk, dv


def backward(q, k, v, bounds, out, lse, dout, dlse=None, *, scale: float,
             deterministic: bool = False, sm_margin: int = 0, logits_soft_cap: float | None = None):
    """FlashMask backward on Hopper: (dq, dk, dv) in the inputs' dtypes.

    Same arguments as the forward plus out [B,Sq,N,d], lse float32 [B,Sq,N] (as the forward
    returns them), dout (cotangent of out) and dlse (cotangent of lse; None = zeros). Math of
    `portable.backward`: D = rowsum(dO * O) - dlse, dS = P * (dP - D); fully masked rows get
    zero gradients.

    deterministic=True: bitwise-reproducible gradients (dQ summed over key blocks in a fixed
    order through one bit per (query tile, key block); dK / dV reduce in registers in a fixed
    order in both modes). sm_margin > 0: the persistent kernel, leaving that many SMs free (at
    d = 256, and with a logits soft cap, the kernel runs one CTA per work item and does not honour
    it). logits_soft_cap: as in the forward (dS times the cap's derivative 1 - tanh²).

    Where the extension lacks the kernel for the dtype / head dim (a development build of a
    subset), the portable backward runs instead, so a CUDA forward never makes training fail in
    the backward; both honour `deterministic`.
    """
    deterministic = _check_deterministic(deterministic)
    sm_margin = _check_sm_margin(sm_margin)
    d = q.shape[-1]
    try:
        check_supported(q.shape, q.dtype, d)
        config = backward_config(d, deterministic, sm_margin, logits_soft_cap is not None)
        if config.name not in _extension.compiled_configs():  # (empty when not loaded)
            raise NotImplementedError(config.name)
    except NotImplementedError:
        from .. import portable  # only the fallback needs the portable path

        return portable.backward(q, k, v, bounds, out, lse, dout, dlse, scale=scale,
                                 deterministic=deterministic, logits_soft_cap=logits_soft_cap)
    return run_backward(config, q, k, v, bounds, out, lse, dout, dlse, scale=scale,
                        deterministic=deterministic, sm_margin=sm_margin,
                        logits_soft_cap=logits_soft_cap)
