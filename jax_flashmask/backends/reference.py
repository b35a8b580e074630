"""Dense reference attention: materialises the Sq×Sk mask. For tests and small problems only."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..masks import dense_from_bounds


def attention(q, k, v, bounds, *, scale: float, compute_dtype=jnp.float32, logits_soft_cap=None):
    """(out ``[B, Sq, N, d]`` in q.dtype, lse float32 ``[B, Sq, N]``) with fully-masked rows 0 / -inf.
    `logits_soft_cap`: the scaled scores become ``cap·tanh(s/cap)`` before masking.

    Differentiable with plain autodiff (no NaN for fully-masked rows).
    """
    b, sq, n, d = q.shape
    kh = k.shape[2]
    hm = bounds.shape[1]
    masked = dense_from_bounds(bounds, sq)  # [B, Hm, Sq, Sk]
    masked = jnp.repeat(masked, n // hm, axis=1)  # query head h uses mask head h // (N // Hm)
    kx = jnp.repeat(k, n // kh, axis=2).astype(compute_dtype)
    vx = jnp.repeat(v, n // kh, axis=2).astype(compute_dtype)
    # Keys masked for every row (padding, unused cache slots) may hold NaN/Inf: P = 0 there, but
    # 0 * NaN = NaN in the einsums, so their K/V rows are zeroed (their gradients are then 0).
    # Queries masked for every key likewise (their gradient flows into dK through 0 * q).
    dead = jnp.transpose(jnp.all(masked, axis=2), (0, 2, 1))[..., None]  # [B, Sk, N, 1]
    kx = jnp.where(dead, 0.0, kx)
    vx = jnp.where(dead, 0.0, vx)
    dead_q = jnp.transpose(jnp.all(masked, axis=3), (0, 2, 1))[..., None]  # [B, Sq, N, 1]
    qx = jnp.where(dead_q, 0.0, q.astype(compute_dtype))
    s = jnp.einsum("bqhd,bkhd->bhqk", qx, kx) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    s = jnp.where(masked, -jnp.inf, s)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    # Only a row without a finite-or-+inf score is shifted by 0; NaN and +inf maxima propagate.
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    alive = denom != 0  # a NaN sum (NaN/Inf in a visible input) must not look fully masked
    p = e / jnp.where(alive, denom, 1.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, vx)
    # a row with no visible score is 0 even where a key other rows see holds NaN/Inf (0 * NaN)
    out = jnp.where(jnp.transpose(alive, (0, 2, 1, 3)), out, 0.0)
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, denom, 1.0)), -jnp.inf)[..., 0]
    return out.astype(q.dtype), jnp.transpose(lse, (0, 2, 1)).astype(jnp.float32)
