"""`attention`: the public entry point — argument checks, dispatch, and the custom VJP.

Data path: mask vectors -> canonical bounds (`masks.canonical_bounds`) -> block metadata and tile
classes (`_blocks`) -> a kernel (`_cuda` on Hopper, `_xla` anywhere, `_reference` for tests) ->
`jax.custom_vjp` whose residuals are (q, k, v, out, lse).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from . import _reference, _xla
from .masks import FlashMask, canonical_bounds, unmasked_bounds, validate

try:  # the Hopper path; its module imports without the compiled extension
    from .backends import cuda as _cuda
except ImportError:  # pragma: no cover - only while the kernel module is absent
    _cuda = None

IMPLEMENTATIONS = (None, "cuda", "xla", "reference")
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
    if key.shape[0] != b:
        raise ValueError(f"key/value batch {key.shape[0]} does not match query batch {b}")
    if key.shape[3] != d:
        raise ValueError(f"key/value head dim {key.shape[3]} does not match query head dim {d}")
    kh = key.shape[2]
    if kh == 0 or n % kh:
        raise ValueError(
            f"the number of query heads N={n} must be a multiple of the number of kv heads K={kh} (GQA/MQA)"
        )
    if min(sq, key.shape[1], d) < 1:
        raise ValueError(f"empty problem: query {query.shape}, key {key.shape}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a Python float or None, got {type(scale).__name__}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def _cuda_unavailable_reason(query) -> str | None:
    if _cuda is None:
        return "the CUDA module is not part of this build"
    if not _cuda.is_available():
        return _cuda.unavailable_reason()
    return None


def _choose(implementation, query):
    if implementation is not None:
        if implementation == "cuda":
            reason = _cuda_unavailable_reason(query)
            if reason is not None:
                raise NotImplementedError(
                    f"implementation='cuda' is not available: {reason}. "
                    "Use implementation='xla' (portable) or None (best available)."
                )
            _cuda.check_supported(query.shape, query.dtype, query.shape[-1])
        return implementation
    if _cuda_unavailable_reason(query) is None:
        try:
            _cuda.check_supported(query.shape, query.dtype, query.shape[-1])
            return "cuda"
        except (NotImplementedError, ValueError):
            pass
    return "xla"


def _kernels(implementation: str, sm_margin: int = 0, structure: str = "general"):
    """(forward, backward) for an implementation. Every backward takes `deterministic=`;
    `sm_margin` and `structure` (the Hopper forward's default variant: "full" / "causal" when no
    mask vectors were given) only mean something to the Hopper kernels."""
    if implementation == "reference":
        return _reference_forward, _reference_backward
    if implementation == "cuda":
        return (functools.partial(_cuda.forward, sm_margin=sm_margin, structure=structure),
                functools.partial(_cuda.backward, sm_margin=sm_margin))
    return _xla.forward, _xla.backward


def _reference_forward(q, k, v, bounds, *, scale):
    return _reference.attention(q, k, v, bounds, scale=scale)


def _reference_backward(q, k, v, bounds, out, lse, dout, dlse, *, scale, deterministic=False):
    # Dense autodiff: einsums, row sums and a repeat's transpose (a sum): no unordered reduction.
    del deterministic
    f = lambda q, k, v: _reference.attention(q, k, v, bounds, scale=scale)  # noqa: E731
    _, vjp = jax.vjp(f, q, k, v)
    return vjp((dout, dlse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _flash(q, k, v, bounds, scale, implementation, deterministic, sm_margin, structure):
    fwd, _ = _kernels(implementation, sm_margin, structure)
    return fwd(q, k, v, bounds, scale=scale)


def _flash_fwd(q, k, v, bounds, scale, implementation, deterministic, sm_margin, structure):
    fwd, _ = _kernels(implementation, sm_margin, structure)
    out, lse = fwd(q, k, v, bounds, scale=scale)
    residuals = tuple(checkpoint_name(x, name) for x, name in zip((q, k, v, out, lse), RESIDUAL_NAMES))
    return (out, lse), residuals + (bounds,)


def _flash_bwd(scale, implementation, deterministic, sm_margin, structure, residuals, cotangents):
    q, k, v, out, lse, bounds = residuals
    dout, dlse = cotangents
    _, bwd = _kernels(implementation, sm_margin)
    dq, dk, dv = bwd(q, k, v, bounds, out, lse, dout, dlse, scale=scale,
                     deterministic=deterministic)
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

    Returns:
      ``[B, Sq, N, d]`` in query's dtype, or ``(out, lse)``. Rows whose keys are all masked give
      0 and lse -inf (and zero gradients).
    """
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
        bounds = unmasked_bounds(b, sk, causal=causal, q_len=sq)
        structure = "causal" if causal else "full"
    else:
        structure = "general"
        validate(startend_row_indices, causal=causal, q_len=sq, kv_len=sk, batch=b,
                 num_heads=n, num_kv_heads=kh)
        bounds = canonical_bounds(startend_row_indices, causal=causal, q_len=sq)
        bounds = jnp.broadcast_to(bounds, (b,) + bounds.shape[1:])
    implementation = _choose(implementation, query)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out, lse = _flash(query, key, value, bounds, scale, implementation, deterministic, int(sm_margin),
                      structure)
    return (out, lse) if return_residual else out
