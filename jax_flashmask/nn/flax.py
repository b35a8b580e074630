"""Flax NNX attention layer backed by `jax_flashmask.attention`.

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

import jax.numpy as jnp

from ._common import check_head_config, merge_heads, multihead_attention, split_heads

__all__ = ["FlashMaskAttention"]


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
