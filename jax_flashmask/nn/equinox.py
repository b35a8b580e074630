"""Equinox attention layer backed by `jax_flashmask.attention`.

Needs Equinox: ``pip install 'jax_flashmask[equinox]'``.
"""

from __future__ import annotations

try:
    import equinox as eqx
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "jax_flashmask.nn.equinox needs Equinox; install it with "
        "`pip install 'jax_flashmask[equinox]'` (or `pip install equinox`)"
    ) from e

import jax

from ..masks import FlashMask
from ._common import check_head_config, merge_heads, multihead_attention, split_heads

__all__ = ["FlashMaskAttention"]


def _linear(layer, x):
    """`eqx.nn.Linear` applied over any leading dims (it is defined on single vectors)."""
    y = x @ layer.weight.T.astype(x.dtype)
    if layer.bias is not None:
        y = y + layer.bias.astype(x.dtype)
    return y


class FlashMaskAttention(eqx.Module):
    """Multi-head self-attention (GQA, optional RoPE) with a FlashMask mask per call.

    Args:
      in_features: model width F.
      num_heads: query heads N.
      num_kv_heads: key/value heads K (N % K == 0); default N, 1 = MQA.
      head_dim: per-head width d; default ``in_features // num_heads``.
      out_features: output width; default `in_features`.
      use_bias: biases on the four projections.
      rope, rope_base: rotary position embeddings on q and k.
      causal: causal masking when the call's mask is None or a raw ``startend_row_indices``
        array (a `FlashMask` carries its own `causal`).
      scale: softmax scale; default ``1/sqrt(head_dim)``.
      implementation: passed to `jax_flashmask.attention`.
      dtype: parameter dtype (as for `eqx.nn.Linear`).
      key: PRNG key for the projection weights.

    Call: ``layer(x, mask=None, *, positions=None)`` with ``x [B, S, F]`` or unbatched
    ``[S, F]`` (equinox style, e.g. under ``jax.vmap``; then the mask, raw or a `FlashMask`, may be
    ``[Hm, S, D]``) -> same leading
    shape with ``out_features``. `positions` feed RoPE (default ``arange(S)``); `attention_fn`
    (default `jax_flashmask.attention`) swaps the attention call, e.g. for context parallelism.
    """

    q_proj: eqx.nn.Linear
    k_proj: eqx.nn.Linear
    v_proj: eqx.nn.Linear
    o_proj: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    rope: bool = eqx.field(static=True)
    rope_base: float = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    scale: float | None = eqx.field(static=True)
    implementation: str | None = eqx.field(static=True)

    def __init__(
        self,
        in_features: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        out_features: int | None = None,
        use_bias: bool = False,
        rope: bool = True,
        rope_base: float = 10000.0,
        causal: bool = False,
        scale: float | None = None,
        implementation: str | None = None,
        dtype=None,
        key: jax.Array,
    ):
        num_kv_heads, head_dim = check_head_config(in_features, num_heads, num_kv_heads, head_dim)
        out_features = in_features if out_features is None else out_features
        kq, kk, kv, ko = jax.random.split(key, 4)
        kw = dict(use_bias=use_bias)
        if dtype is not None:
            kw["dtype"] = dtype
        self.q_proj = eqx.nn.Linear(in_features, num_heads * head_dim, key=kq, **kw)
        self.k_proj = eqx.nn.Linear(in_features, num_kv_heads * head_dim, key=kk, **kw)
        self.v_proj = eqx.nn.Linear(in_features, num_kv_heads * head_dim, key=kv, **kw)
        self.o_proj = eqx.nn.Linear(num_heads * head_dim, out_features, key=ko, **kw)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.rope = bool(rope)
        self.rope_base = float(rope_base)
        self.causal = bool(causal)
        self.scale = scale
        self.implementation = implementation

    def __call__(self, x, mask=None, *, positions=None, attention_fn=None):
        unbatched = x.ndim == 2
        if unbatched:
            x = x[None]
            # An unbatched call (e.g. inside jax.vmap over a batched mask) sees [Hm, S, D] vectors,
            # raw or inside a FlashMask: give them the batch axis of one.
            if isinstance(mask, FlashMask) and mask.startend_row_indices.ndim == 3:
                mask = FlashMask(mask.startend_row_indices[None], causal=mask.causal)
            elif mask is not None and not hasattr(mask, "causal") and getattr(mask, "ndim", 4) == 3:
                mask = mask[None]
        elif x.ndim != 3:
            raise ValueError(f"x must be [S, F] or [B, S, F], got shape {x.shape}")
        q = split_heads(_linear(self.q_proj, x), self.num_heads)
        k = split_heads(_linear(self.k_proj, x), self.num_kv_heads)
        v = split_heads(_linear(self.v_proj, x), self.num_kv_heads)
        out = multihead_attention(
            q, k, v, mask,
            causal=self.causal,
            positions=positions,
            rope=self.rope,
            rope_base=self.rope_base,
            scale=self.scale,
            implementation=self.implementation,
            attention_fn=attention_fn,
        )
        y = _linear(self.o_proj, merge_heads(out))
        return y[0] if unbatched else y
