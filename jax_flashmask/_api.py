"""`attention`: the public entry point — argument checks, dispatch, and the custom VJP.

Data path: mask vectors -> canonical bounds (`masks.canonical_bounds`) -> block metadata and tile
classes (`_blocks`) -> an implementation (`backends`: Hopper kernels, portable blocked JAX, dense
reference) -> `jax.custom_vjp` whose residuals are (q, k, v, out, lse).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from . import _sharding, _transforms, backends
from .masks import FlashMask, canonical_bounds, unmasked_bounds, validate

IMPLEMENTATIONS = backends.IMPLEMENTATIONS
_FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
RESIDUAL_NAMES = ("flashmask_q", "flashmask_k", "flashmask_v", "flashmask_out", "flashmask_lse")


def _check_inputs(query, key, value, scale, implementation):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "shape") or x.ndim != 4:
            shape = getattr(x, "shape", type(x).__name__)
            expected = "[B, Sq, N, d]" if name == "query" else "[B, Sk, K, d]"
            raise ValueError(f"{name} must be a rank-4 array {expected}, got {shape}")
        if x.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    b, sq, n, d = query.shape
    if key.shape != value.shape:
        raise ValueError(f"key and value must have the same shape [B, Sk, K, d], got {key.shape} and {value.shape}")
    # Empty arrays are refused rather than answered with an empty result: a zero-size batch or
    # head axis is almost always a slicing or reshaping mistake upstream.
    for name, size in (("query batch B (query.shape[0])", b), ("query length Sq (query.shape[1])", sq),
                       ("query heads N (query.shape[2])", n), ("head dim d (query.shape[3])", d),
                       ("key length Sk (key.shape[1])", key.shape[1]),
                       ("kv heads K (key.shape[2])", key.shape[2])):
        if size < 1:
            raise ValueError(
                f"{name} is 0 (query {query.shape}, key {key.shape}): jax_flashmask.attention "
                "needs every dimension >= 1; skip the call for an empty batch"
            )
    if key.shape[0] != b:
        raise ValueError(f"key/value batch {key.shape[0]} does not match query batch {b}")
    if key.shape[3] != d:
        raise ValueError(f"key/value head dim {key.shape[3]} does not match query head dim {d}")
    kh = key.shape[2]
    if n % kh:
        raise ValueError(
            f"the number of query heads N={n} must be a multiple of the number of kv heads K={kh} (GQA/MQA)"
        )
    if scale is not None and (isinstance(scale, (bool, np.bool_))
                              or not isinstance(scale, (int, float, np.integer, np.floating))):
        raise ValueError(f"scale must be a Python float or None, got {type(scale).__name__}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """The static options of one attention call: hashable, so that they key jit's cache and travel
    through `custom_vjp` and the partitioning rule as one value."""

    implementation: str
    scale: float
    deterministic: bool = False
    sm_margin: int = 0
    structure: str = "general"  # "full" / "causal" when no mask vectors were given
    logits_soft_cap: float | None = None

    def kernels(self, backward: bool = False):
        return backends.kernels(self.implementation, self.sm_margin,
                                "general" if backward else self.structure, self.logits_soft_cap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, bounds, opts: CallOptions):
    return _sharding.forward(q, k, v, bounds, opts)


def _flash_fwd(q, k, v, bounds, opts):
    with _transforms.explain_higher_order():
        out, lse = _sharding.forward(q, k, v, bounds, opts)
    residuals = tuple(checkpoint_name(x, name) for x, name in zip((q, k, v, out, lse), RESIDUAL_NAMES))
    return (out, lse), residuals + (bounds,)


def _flash_bwd(opts, residuals, cotangents):
    q, k, v, out, lse, bounds = residuals
    dout, dlse = cotangents
    with _transforms.explain_higher_order():
        dq, dk, dv = _sharding.backward(q, k, v, bounds, out, lse, dout, dlse, opts)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(
    query,
    key,
    value,
    startend_row_indices=None,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_residual: bool = False,
    implementation: str | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    logits_soft_cap: float | None = None,
):
    """FlashMask attention.

    Args:
      query: ``[B, Sq, N, d]``; key, value: ``[B, Sk, K, d]`` with ``N % K == 0`` (GQA/MQA).
      startend_row_indices: int32 ``[B, Hm, Sk, D]`` column-wise row boundaries (see
        `jax_flashmask.masks`), a `FlashMask` (which carries `causal`), or None (no mask beyond
        `causal`). ``Hm`` in {1, K, N}; query head h uses mask head ``h // (N // Hm)``.
      causal: bottom-right aligned causal mask (``delta = Sk - Sq``).
      scale: softmax scale, default ``1 / sqrt(d)``.
      return_residual: also return the log-sum-exp, float32 ``[B, Sq, N]``.
      implementation: None (best available), "cuda" (Hopper kernels), "xla" (portable blocked),
        "reference" (dense, for tests).
      deterministic: bitwise-reproducible gradients (same inputs, same compiled program, same GPU
        -> same bits). The Hopper backward then adds each query tile's dQ contributions in a fixed
        key-block order (a little slower); the portable backward avoids its one unordered
        scatter-add. The forward is deterministic either way.
      sm_margin: Hopper kernels only: SMs their persistent grids leave free for work running at the
        same time, e.g. the overlapped K/V transfers of context parallelism (NCCL's kernels need
        SMs). 0 (default) uses every SM; ignored by the other implementations.
      logits_soft_cap: None, or a float ``cap > 0``: the scaled scores become
        ``cap * tanh(s / cap)`` before masking and softmax (Gemma 2's soft cap).

    Returns:
      ``[B, Sq, N, d]`` in query's dtype, or ``(out, lse)``. Rows whose keys are all masked give
      0 and lse -inf (and zero gradients).
    """
    for name, flag in (("causal", causal), ("return_residual", return_residual)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool (True or False), got {flag!r}: a string or "
                            f"number is not read as a flag; pass {name}=bool(...)")
    if isinstance(startend_row_indices, FlashMask):
        mask = startend_row_indices
        if causal and not mask.causal:
            raise ValueError("causal=True conflicts with a FlashMask built with causal=False")
        causal, startend_row_indices = mask.causal, mask.startend_row_indices
    _check_inputs(query, key, value, scale, implementation)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    deterministic = bool(deterministic)
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, (int, np.integer)) or sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin!r}")
    b, sq, n, d = query.shape
    sk, kh = key.shape[1], key.shape[2]
    causal = bool(causal)
    if startend_row_indices is None:
        structure = "causal" if causal else "full"
    else:
        structure = "general"
        validate(startend_row_indices, causal=causal, q_len=sq, kv_len=sk, batch=b,
                 num_heads=n, num_kv_heads=kh)
    if logits_soft_cap is not None:
        if isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, (int, float, np.floating, np.integer)):
            raise TypeError(f"logits_soft_cap must be a Python float or None, got {type(logits_soft_cap).__name__}")
        logits_soft_cap = float(logits_soft_cap)
        if not (math.isfinite(logits_soft_cap) and logits_soft_cap > 0):
            raise ValueError(f"logits_soft_cap must be a finite float > 0, got {logits_soft_cap}")
    implementation = backends.choose(implementation, query)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    opts = CallOptions(implementation, scale, deterministic, int(sm_margin), structure, logits_soft_cap)
    with _transforms.explain_forward_mode():
        out, lse = _attend(query, key, value, startend_row_indices, opts=opts, causal=causal)
    return (out, lse) if return_residual else out


@functools.partial(jax.jit, static_argnames=("opts", "causal"))
def _attend(query, key, value, startend_row_indices, *, opts: CallOptions, causal: bool):
    """Bounds and the custom-VJP call, compiled once per shapes and options: eager calls hit
    jit's cache instead of re-tracing the blocked loops (under an outer jit it is inlined)."""
    b, sq = query.shape[:2]
    if startend_row_indices is None:
        bounds = unmasked_bounds(b, key.shape[1], causal=causal, q_len=sq)
    else:
        bounds = canonical_bounds(startend_row_indices, causal=causal, q_len=sq)
        bounds = jnp.broadcast_to(bounds, (b,) + bounds.shape[1:])
    return _flash(query, key, value, bounds, opts)
