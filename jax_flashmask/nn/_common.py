"""Framework-free math shared by the Flax and Equinox attention layers.

Everything here is plain JAX: rotary position embeddings, head reshapes, mask resolution and the
call into `jax_flashmask.attention`. The framework modules only own parameters.
"""

from __future__ import annotations

import jax.numpy as jnp

from .._api import attention
from ..masks import FlashMask

__all__ = [
    "rope_angles",
    "apply_rope",
    "split_heads",
    "merge_heads",
    "resolve_mask",
    "check_head_config",
    "multihead_attention",
]


def rope_angles(positions, head_dim: int, *, base: float = 10000.0):
    """``(cos, sin)`` of the rotary angles, float32 ``positions.shape + (head_dim // 2,)``.

    Frequency ``k`` is ``base ** (-2k / head_dim)``; `positions` are integer (or float) token
    positions of any shape.
    """
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
    inv_freq = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, positions=None, *, base: float = 10000.0):
    """Rotary position embedding of ``x [..., S, H, d]`` ("rotate half" / GPT-NeoX layout).

    Dimension ``k < d/2`` is paired with ``k + d/2`` and the pair is rotated by
    ``positions * base ** (-2k/d)``. `positions`: ``[S]`` or ``[..., S]`` (broadcast against the
    leading dims of `x`); default ``arange(S)``. Computed in float32, returned in ``x.dtype``.
    """
    s, d = x.shape[-3], x.shape[-1]
    if positions is None:
        positions = jnp.arange(s, dtype=jnp.int32)
    positions = jnp.asarray(positions)
    if positions.shape[-1] != s:
        raise ValueError(f"positions must end in the sequence length {s}, got shape {positions.shape}")
    cos, sin = rope_angles(positions, d, base=base)  # [..., S, d/2]
    cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over heads
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def split_heads(x, num_heads: int):
    """``[..., S, H*d] -> [..., S, H, d]``."""
    if x.shape[-1] % num_heads:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of num_heads={num_heads}")
    return x.reshape(x.shape[:-1] + (num_heads, x.shape[-1] // num_heads))


def merge_heads(x):
    """``[..., S, H, d] -> [..., S, H*d]``."""
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def check_head_config(in_features: int, num_heads: int, num_kv_heads, head_dim):
    """Validate and fill in ``(num_kv_heads, head_dim)``; defaults: K = N, d = in_features // N."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    num_kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} (GQA/MQA)"
        )
    if head_dim is None:
        if in_features % num_heads:
            raise ValueError(
                f"in_features={in_features} is not a multiple of num_heads={num_heads}; pass head_dim"
            )
        head_dim = in_features // num_heads
    return num_kv_heads, int(head_dim)


def resolve_mask(mask, causal: bool):
    """``(startend_row_indices | None, causal)`` for `jax_flashmask.attention`.

    `mask` is None (no mask beyond the layer's `causal`), a `FlashMask` (which carries its own
    `causal`, overriding the layer's), or an int32 ``[B, Hm, Sk, D]`` array read with the layer's
    `causal`.
    """
    if mask is None:
        return None, bool(causal)
    if isinstance(mask, FlashMask):
        return mask.startend_row_indices, bool(mask.causal)
    if hasattr(mask, "shape") and hasattr(mask, "dtype"):
        return mask, bool(causal)
    raise TypeError(
        "mask must be None, a jax_flashmask.masks.FlashMask or an int32 startend_row_indices "
        f"array [B, Hm, Sk, D], got {type(mask).__name__}"
    )


def multihead_attention(
    q,
    k,
    v,
    mask=None,
    *,
    causal: bool = False,
    positions=None,
    kv_positions=None,
    rope: bool = True,
    rope_base: float = 10000.0,
    scale: float | None = None,
    implementation: str | None = None,
    attention_fn=None,
):
    """RoPE (optional) + `jax_flashmask.attention` on projected heads.

    q ``[B, Sq, N, d]``, k/v ``[B, Sk, K, d]``; `positions` / `kv_positions` default to
    ``arange``; returns ``[B, Sq, N, d]``. `attention_fn` replaces `jax_flashmask.attention`
    (same signature), e.g. a ``functools.partial`` of
    `jax_flashmask.context_parallel.context_parallel_attention` with its plan and mesh.
    """
    if attention_fn is None:
        attention_fn = attention

    if rope:
        if kv_positions is None and positions is not None and k.shape[-3] == q.shape[-3]:
            kv_positions = positions
        q = apply_rope(q, positions, base=rope_base)
        k = apply_rope(k, kv_positions, base=rope_base)
    indices, causal = resolve_mask(mask, causal)
    return attention_fn(q, k, v, indices, causal=causal, scale=scale, implementation=implementation)
