"""Flax NNX attention layer backed by `jax_flashmask.attention`, and `attention_fn`, the hook for
Flax's own attention modules (``nnx.MultiHeadAttention``, linen's ``MultiHeadDotProductAttention``).

Needs Flax with NNX: ``pip install 'jax_flashmask[flax]'``.
"""

from __future__ import annotations

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "jax_flashmask.nn.flax needs Flax (with flax.nnx); install it with "
        "`pip install 'jax_flashmask[flax]'` (or `pip install flax`)"
    ) from e

import math

import jax.numpy as jnp

from .._dot_product_attention import dot_product_attention
from ..masks import FlashMask
from ._common import check_head_config, merge_heads, multihead_attention, split_heads

__all__ = ["FlashMaskAttention", "attention_fn"]


def attention_fn(
    query,
    key,
    value,
    bias=None,
    mask=None,
    broadcast_dropout: bool = True,
    dropout_rng=None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype=None,
    precision=None,
    module=None,
    promote_dtype=None,
    is_causal: bool = False,
    force_fp32_for_softmax: bool = False,
    qk_attn_weights_einsum=None,
    attn_weights_value_einsum=None,
    *,
    implementation: str | None = None,
    logits_soft_cap: float | None = None,
):
    """Flax's ``dot_product_attention`` signature on `jax_flashmask.dot_product_attention`.

    Pass it as ``nnx.MultiHeadAttention(..., attention_fn=attention_fn)`` or
    ``nn.MultiHeadDotProductAttention(attention_fn=attention_fn)`` (linen keeps only the keywords
    that this signature names, so every one of them is spelled out), then call the layer with
    ``mask=`` a `jax_flashmask.FlashMask` (Flax passes it through untouched; it works under jit), a
    boolean / 0-1 mask broadcastable to ``[batch..., N, T, S]`` (True = attend; converted on the
    host by `masks.from_dense`, so it must be concrete), or None. ``is_causal`` is top-left, as
    Flax's. Choose the implementation or a soft cap with ``functools.partial(attention_fn,
    implementation="xla", logits_soft_cap=30.0)``.

    Dropout on the attention weights is not implemented: the dropout arguments are ignored when
    dropout is off (``dropout_rate == 0`` or ``deterministic``), otherwise ``NotImplementedError``.
    Sowing the weights (``module`` given, Flax's ``sow_weights=True``), a `bias` and custom einsums
    raise too (there is no weight matrix); `precision` and `force_fp32_for_softmax` are ignored
    (scores and softmax are float32 already). `dtype` casts q, k, v (else they are promoted to
    one dtype).
    """
    del broadcast_dropout, dropout_rng, precision, force_fp32_for_softmax
    if dropout_rate and not deterministic:
        raise NotImplementedError(
            f"attention dropout (dropout_rate={dropout_rate}, deterministic=False) is not implemented "
            "by jax_flashmask: set the layer's dropout_rate=0 or call it with deterministic=True")
    if module is not None:
        raise NotImplementedError("sow_weights=True: jax_flashmask never forms the attention weights; "
                                  "call the layer with sow_weights=False")
    if qk_attn_weights_einsum is not None or attn_weights_value_einsum is not None:
        raise NotImplementedError("custom attention einsums (qk_attn_weights_einsum / "
                                  "attn_weights_value_einsum) are not supported by jax_flashmask")
    if dtype is None:
        dtype = jnp.result_type(query, key, value)
    query, key, value = (jnp.asarray(x, dtype) for x in (query, key, value))
    batch_dims = query.shape[:-3]
    if len(batch_dims) > 1:  # Flax allows several batch dims: fold them into one
        query, key, value = (x.reshape((math.prod(batch_dims),) + x.shape[-3:]) for x in (query, key, value))
        if mask is not None and not isinstance(mask, FlashMask):
            mask = jnp.broadcast_to(mask, batch_dims + mask.shape[-3:]).reshape((-1,) + mask.shape[-3:])
    kw = dict(bias=bias, is_causal=is_causal, implementation=implementation, logits_soft_cap=logits_soft_cap)
    if isinstance(mask, FlashMask):
        out = dot_product_attention(query, key, value, flash_mask=mask, **kw)
    else:  # Flax's masks are often float 0 / 1
        mask = None if mask is None else jnp.asarray(mask).astype(bool)
        out = dot_product_attention(query, key, value, mask=mask, **kw)
    return out.reshape(batch_dims + out.shape[-3:]) if len(batch_dims) > 1 else out


class FlashMaskAttention(nnx.Module):
    """Multi-head self-attention (GQA, optional RoPE) with a FlashMask mask per call.

    Args:
      in_features: model width F of the input ``x [B, S, F]``.
      num_heads: query heads N.
      num_kv_heads: key/value heads K (N % K == 0); default N (plain multi-head), 1 = MQA.
      head_dim: per-head width d; default ``in_features // num_heads``.
      out_features: output width; default `in_features`.
      use_bias: biases on the four projections.
      rope: apply rotary position embeddings to q and k.
      rope_base: RoPE base frequency.
      causal: causal masking when the call's mask is None or a raw ``startend_row_indices``
        array (a `FlashMask` carries its own `causal`).
      scale: softmax scale; default ``1/sqrt(head_dim)``.
      implementation: passed to `jax_flashmask.attention` (None, "cuda", "xla", "reference").
      dtype, param_dtype, kernel_init, bias_init: as for `nnx.Linear`.
      rngs: `nnx.Rngs` for the projection weights.

    Call: ``layer(x, mask=None, *, positions=None) -> [B, S, out_features]``; `positions`
    ``[S]`` or ``[B, S]`` (default ``arange(S)``) feed RoPE; `attention_fn` (default
    `jax_flashmask.attention`) swaps the attention call, e.g. for context parallelism.
    """

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
        param_dtype=jnp.float32,
        kernel_init=None,
        bias_init=None,
        rngs: nnx.Rngs,
    ):
        num_kv_heads, head_dim = check_head_config(in_features, num_heads, num_kv_heads, head_dim)
        out_features = in_features if out_features is None else out_features
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.rope = bool(rope)
        self.rope_base = float(rope_base)
        self.causal = bool(causal)
        self.scale = scale
        self.implementation = implementation
        kw = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        if kernel_init is not None:
            kw["kernel_init"] = kernel_init
        if bias_init is not None:
            kw["bias_init"] = bias_init
        self.q_proj = nnx.Linear(in_features, num_heads * head_dim, **kw)
        self.k_proj = nnx.Linear(in_features, num_kv_heads * head_dim, **kw)
        self.v_proj = nnx.Linear(in_features, num_kv_heads * head_dim, **kw)
        self.o_proj = nnx.Linear(num_heads * head_dim, out_features, **kw)

    def __call__(self, x, mask=None, *, positions=None, attention_fn=None):
        if x.ndim != 3:
            raise ValueError(f"x must be [B, S, F], got shape {x.shape}")
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_kv_heads)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
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
        return self.o_proj(merge_heads(out))
