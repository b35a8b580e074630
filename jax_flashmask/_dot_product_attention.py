"""`dot_product_attention`: `jax.nn.dot_product_attention`'s signature and semantics on FlashMask.

Every masking argument of jax.nn (``is_causal``, the sequence lengths, ``local_window_size``, a
boolean ``mask``) becomes FlashMask boundary vectors, so a call site switches with one import; the
keyword extensions (``segment_ids``, ``q_segment_ids`` / ``kv_segment_ids``, ``flash_mask``,
``logits_soft_cap``) reach what jax.nn cannot express.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._api import attention
from .masks import FlashMask, band_bounds, canonical_bounds, from_dense, from_segment_ids

__all__ = ["dot_product_attention"]

_IMPLEMENTATIONS = (None, "xla", "cuda", "reference")


def _implementation(implementation):
    if implementation == "cudnn":
        raise ValueError(
            "implementation='cudnn' selects jax.nn's cuDNN kernels, which jax_flashmask does not "
            "call: use None (the Hopper kernels when they support the problem, else the portable "
            "path), 'cuda' (the Hopper kernels, an error when unavailable) or 'xla' (portable); "
            "or keep jax.nn.dot_product_attention for cuDNN")
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
    return implementation


def _lengths(name, x, batch):
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.shape != (batch,) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an int array of shape ({batch},) (one length per batch "
                         f"entry), got {x.dtype} {tuple(x.shape)}")
    return x.astype(jnp.int32)


def _window(local_window_size):
    if local_window_size is None:
        return None
    w = local_window_size
    if isinstance(w, (int, np.integer)) and not isinstance(w, bool):
        w = (int(w), int(w))
    if (not isinstance(w, (tuple, list)) or len(w) != 2
            or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in w)):
        raise ValueError(f"local_window_size must be an int or a (left, right) pair of ints, got {local_window_size!r}")
    return int(w[0]), int(w[1])


def _intervals(m: FlashMask, q_len: int):
    """(LTS, UTE) ``[B, Hm, Sk]`` of a mask whose visible rows form one interval per column
    (causal D=1, non-causal D=2), else None."""
    if m.causal and m.shape[-1] != 1 or not m.causal and m.shape[-1] != 2:
        return None
    b = canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=q_len)
    return b[:, :, 0], b[:, :, 3]


def _structured_mask(q_len, kv_len, *, is_causal, window, q_lengths, kv_lengths, q_seg, kv_seg,
                     flash_mask):
    """The FlashMask of every argument except a dense `mask`, or None when nothing masks."""
    lo = [s for s in ((0 if is_causal else None), (None if window is None else -window[1])) if s is not None]
    hi = None if window is None else window[0] + 1
    parts = []  # (LTS, UTE) pairs [B|1, Hm|1, Sk] whose visible intervals intersect
    if lo or hi is not None or q_lengths is not None or kv_lengths is not None:
        lts, ute = band_bounds(q_len, kv_len, lo_shift=max(lo) if lo else None, hi_shift=hi,
                               q_lengths=q_lengths, kv_lengths=kv_lengths)
        parts.append((lts[:, None], ute[:, None]))
    if q_seg is not None:
        if kv_seg is None and q_len != kv_len:
            raise ValueError(f"segment ids of one array need equal query and key lengths, got "
                             f"{q_len} and {kv_len}: pass q_segment_ids and kv_segment_ids")
        parts.append(_intervals(from_segment_ids(q_seg, kv_seg, causal=False), q_len))
    if flash_mask is not None:
        if not parts:
            return flash_mask
        iv = _intervals(flash_mask, q_len)
        if iv is None:
            raise NotImplementedError(
                f"flash_mask in mode (causal={flash_mask.causal}, D={flash_mask.shape[-1]}) cannot be "
                "combined with is_causal / lengths / local_window_size / segment ids here (only "
                "causal D=1 and non-causal D=2 masks combine); fold those into the FlashMask "
                "(e.g. with masks.from_mask_fn or masks.from_dense) and pass it alone")
        parts.append(iv)
    if not parts:
        return None
    lts, ute = parts[0]
    for l2, u2 in parts[1:]:
        lts, ute = jnp.minimum(lts, l2), jnp.maximum(ute, u2)
    return FlashMask(jnp.stack([lts, ute], axis=-1).astype(jnp.int32), causal=False)


def _from_boolean(mask, other: FlashMask | None, batch, heads, q_len, kv_len):
    """FlashMask of jax.nn's boolean `mask` (True = attend, broadcastable to [B, N, T, S]) and
    `other` (already a FlashMask), through `masks.from_dense` on the host."""
    traced = other is not None and isinstance(other.startend_row_indices, jax.core.Tracer)
    if isinstance(mask, jax.core.Tracer) or traced:
        raise TypeError(
            "mask= needs concrete values (it is converted on the host by masks.from_dense), and so "
            "do the lengths / segment ids combined with it; inside jit build the FlashMask outside "
            "and pass flash_mask=, or use is_causal / query_seq_lengths / key_value_seq_lengths / "
            "local_window_size / segment_ids, which work on traced values")
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise ValueError(f"mask must be boolean (True = attend; an additive mask belongs in bias), got {m.dtype}")
    if m.ndim > 4:
        raise ValueError(f"mask must be broadcastable to [B, N, T, S], got shape {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    mb, mh = m.shape[:2]
    if mb not in (1, batch) or mh not in (1, heads) or m.shape[2] not in (1, q_len) or m.shape[3] not in (1, kv_len):
        raise ValueError(f"mask shape {m.shape} does not broadcast to [B, N, T, S] = {(batch, heads, q_len, kv_len)} "
                         "(heads must be 1 or N)")
    masked = ~np.broadcast_to(m, (mb, mh, q_len, kv_len))
    if other is not None:
        masked = masked | np.asarray(other.to_dense(q_len))
    return from_dense(masked)


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size: int | tuple[int, int] | None = None,
    implementation: str | None = None,
    return_residual: bool = False,
    segment_ids=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    flash_mask: FlashMask | None = None,
    logits_soft_cap: float | None = None,
):
    """`jax.nn.dot_product_attention` on FlashMask: same arguments, shapes and results.

    Args (as jax.nn's; ``B`` batch, ``T`` query length, ``S`` key length, ``N`` / ``K`` query /
    key-value heads, ``H`` head dim):
      query: ``[B, T, N, H]`` or ``[T, N, H]``; key, value: ``[B, S, K, H]`` or ``[S, K, H]``,
        ``N % K == 0`` (GQA / MQA).
      bias: not supported (``NotImplementedError``): FlashMask masks, it does not add logits.
      mask: boolean, True = attend, broadcastable to ``[B, N, T, S]`` (heads 1 or N). Converted
        exactly by `jax_flashmask.masks.from_dense` (host, O(T·S)): it must be concrete (not traced
        inside jit) and every key column's masked rows must form at most two runs.
      scale: logit scale, default ``1/sqrt(H)``.
      is_causal: query i sees keys ``j <= i``: aligned top-left like jax.nn (for T != S this
        differs from `jax_flashmask.attention(causal=True)`, which is aligned bottom-right).
      query_seq_lengths, key_value_seq_lengths: int ``[B]``; rows / columns past them are masked.
        May be traced.
      local_window_size: ``w`` or ``(left, right)``: query i sees keys ``i - left <= j <= i + right``.
      implementation: None (the Hopper kernels when they support the problem, else the portable
        path), ``"xla"`` (portable blocked JAX), ``"cuda"`` (Hopper kernels), ``"reference"``
        (dense). ``"cudnn"`` raises ``ValueError``: jax_flashmask does not call cuDNN.
      return_residual: also return the log-sum-exp ``[B, T, N]`` (key's dtype), as jax.nn.

    Extensions (keyword only; every constraint given is intersected):
      segment_ids: int ``[B, T]`` packed-document ids for self-attention (T == S), -1 = padding.
      q_segment_ids, kv_segment_ids: ids of queries and keys when they differ (or T != S).
      flash_mask: a `jax_flashmask.FlashMask` (its own `causal`, aligned bottom-right).
      logits_soft_cap: ``cap·tanh(s/cap)`` on the scaled logits before masking (Gemma 2).

    Returns ``[B, T, N, H]`` (or ``[T, N, H]``) in query's dtype, or ``(out, lse)``.

    Rows that see no key: padded query rows (``i >= query_seq_lengths[b]``) give 0, as jax.nn.
    Other rows whose every key is masked (e.g. ``key_value_seq_lengths[b] = 0``, or an all-False
    mask row) give 0 here, where jax.nn's "xla" path returns the mean of all values (its masked
    logits are a large finite negative number); their lse is -inf (jax.nn: a large negative
    number), and their gradients are 0. Unlike jax.nn's residual, the lse returned here carries
    gradients.
    """
    if bias is not None:
        raise NotImplementedError(
            "bias= (an additive logits bias) is not supported: FlashMask masks but never adds to "
            "the logits. Pass a boolean mask= (True = attend), flash_mask= / segment_ids= / the "
            "sequence lengths / local_window_size, or logits_soft_cap=; for an arbitrary bias use "
            "jax.nn.dot_product_attention")
    implementation = _implementation(implementation)
    unbatched = getattr(query, "ndim", None) == 3
    if unbatched:
        query, key, value = (jnp.asarray(x)[None] for x in (query, key, value))
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [B, T|S, N|K, H] or unbatched [T|S, N|K, H] (all of q, k, v "
                             f"alike), got shape {getattr(x, 'shape', type(x).__name__)}")
    b, t, n, h = query.shape
    s = key.shape[1]
    if segment_ids is not None:
        if q_segment_ids is not None or kv_segment_ids is not None:
            raise ValueError("pass segment_ids, or q_segment_ids / kv_segment_ids, not both")
        q_segment_ids = segment_ids
    elif kv_segment_ids is not None and q_segment_ids is None:
        raise ValueError("kv_segment_ids needs q_segment_ids")
    if flash_mask is not None and not isinstance(flash_mask, FlashMask):
        raise TypeError(f"flash_mask must be a jax_flashmask.FlashMask, got {type(flash_mask).__name__} "
                        "(raw startend_row_indices: wrap them as FlashMask(indices, causal=...))")
    window = _window(local_window_size)
    q_lengths = _lengths("query_seq_lengths", query_seq_lengths, b)
    kv_lengths = _lengths("key_value_seq_lengths", key_value_seq_lengths, b)
    # Plain causal with T == S (top-left = bottom-right) needs no vectors: the kernels' causal path.
    causal = (bool(is_causal) and t == s and mask is None and window is None and q_lengths is None
              and kv_lengths is None and q_segment_ids is None and flash_mask is None)
    structured = None if causal else _structured_mask(
        t, s, is_causal=bool(is_causal), window=window, q_lengths=q_lengths, kv_lengths=kv_lengths,
        q_seg=q_segment_ids, kv_seg=kv_segment_ids, flash_mask=flash_mask)
    if mask is not None:
        structured = _from_boolean(mask, structured, b, n, t, s)
    if scale is not None:
        scale = float(scale)
    out, lse = attention(query, key, value, structured, causal=causal, scale=scale, return_residual=True,
                         implementation=implementation, logits_soft_cap=logits_soft_cap)
    if unbatched:
        out, lse = out[0], lse[0]
    return (out, lse.astype(key.dtype)) if return_residual else out
