"""Portable blocked FlashMask attention in pure JAX (any backend).

Online softmax over key blocks; Sq×Sk is never materialised. Per query tile, the block metadata
classifies every key block (`_blocks.classify`); the tile's loop visits only the non-skipped blocks
(a compacted list, as the kernel's mask role hands its consumers) and applies the element mask only
on partial ones. The backward recomputes attention tile by tile: a row pass for dQ (same iteration
as the forward) and a column pass for dK/dV (each key block over its non-skipped query blocks).

Heads are grouped by mask head: query head ``n = m·T + x·Gq + g`` (T = N/Hm heads per mask head)
uses mask head ``m`` and kv head ``kv_index[m, x]``, so one tile carries ``[Kh, Gq]`` heads that
share their classification.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _blocks
from ..masks._core import columns_fully_masked

DEFAULT_BLOCK = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_size(requested: int, length: int) -> int:
    # Short sequences get a smaller tile (multiple of 8) instead of padding to the full block.
    return min(requested, 8 * _cdiv(length, 8))


def _head_layout(num_heads: int, num_kv_heads: int, mask_heads: int):
    t = num_heads // mask_heads  # query heads per mask head
    r = num_heads // num_kv_heads  # query heads per kv head
    kh, gq = (t // r, r) if t >= r else (1, t)
    kv_index = (np.arange(mask_heads)[:, None] * t + np.arange(kh)[None, :] * gq) // r
    return kh, gq, kv_index


class _Layout:
    """Tiles of one problem: padding, head grouping and the per-tile classification."""

    def __init__(self, q_shape, kv_shape, bounds, block_q, block_k):
        self.b, self.sq, self.n, self.d = q_shape
        self.sk, self.nkv = kv_shape[1], kv_shape[2]
        self.hm = bounds.shape[1]
        self.kh, self.gq, self.kv_index = _head_layout(self.n, self.nkv, self.hm)
        self.bq, self.bk = _block_size(block_q, self.sq), _block_size(block_k, self.sk)
        self.nq, self.nk = _cdiv(self.sq, self.bq), _cdiv(self.sk, self.bk)
        self.bounds = _blocks.pad_bounds(bounds.astype(jnp.int32), self.nk * self.bk, self.sq)
        self.dead = columns_fully_masked(self.bounds, self.sq)  # [B, Hm, Skp]: masked for every row
        bmin, bmax = _blocks.block_metadata(self.bounds, self.bk)
        self.cls = _blocks.classify(bmin, bmax, self.sq, self.bq, self.nq)  # [B, Hm, nq, nk]

    # -- query-side tensors: [B, Sq, N, ...] <-> tiles [B·Hm·nq, Kh, Gq, bq, ...]
    def q_tiles(self, x, fill=0.0):
        extra = x.shape[3:]
        x = jnp.pad(x, [(0, 0), (0, self.nq * self.bq - self.sq)] + [(0, 0)] * (x.ndim - 2),
                    constant_values=fill)
        x = x.reshape(self.b, self.nq, self.bq, self.hm, self.kh, self.gq, *extra)
        x = jnp.moveaxis(x, 2, 5)  # [B, nq, Hm, Kh, Gq, bq, ...]
        x = jnp.swapaxes(x, 1, 2)  # [B, Hm, nq, Kh, Gq, bq, ...]
        return x.reshape(self.b * self.hm * self.nq, self.kh, self.gq, self.bq, *extra)

    def from_q_tiles(self, x):
        extra = x.shape[4:]
        x = x.reshape(self.b, self.hm, self.nq, self.kh, self.gq, self.bq, *extra)
        x = jnp.swapaxes(x, 1, 2)
        x = jnp.moveaxis(x, 5, 2)  # [B, nq, bq, Hm, Kh, Gq, ...]
        x = x.reshape(self.b, self.nq * self.bq, self.n, *extra)
        return x[:, : self.sq]

    # -- key-side tensors: [B, Sk, K, d] -> [B·Hm, Kh, Skp, d] (kv heads gathered per mask head)
    def kv_heads(self, x):
        """K or V per mask head; rows of key columns masked for every query row are zeroed.

        A partially masked tile multiplies masked cells by P = 0, and 0 * NaN = NaN: zeroing those
        rows once here (O(Sk·d), next to the O(Sq·Sk·d) tiles) keeps padding or unused cache slots
        holding NaN/Inf out of every output and gradient.
        """
        x = jnp.pad(x, [(0, 0), (0, self.nk * self.bk - self.sk), (0, 0), (0, 0)])
        x = x[:, :, self.kv_index]  # [B, Skp, Hm, Kh, d]
        x = jnp.transpose(x, (0, 2, 3, 1, 4))
        x = jnp.where(self.dead[:, :, None, :, None], jnp.zeros((), x.dtype), x)
        return x.reshape(self.b * self.hm, self.kh, self.nk * self.bk, self.d)

    def from_kv_tiles(self, x):
        """[B·Hm·nk, Kh, bk, d] -> [B, Sk, K, d], summing mask heads that share a kv head."""
        x = x.reshape(self.b, self.hm, self.nk, self.kh, self.bk, self.d)
        x = jnp.transpose(x, (0, 2, 4, 1, 3, 5)).reshape(self.b, self.nk * self.bk, self.hm * self.kh, self.d)
        out = jnp.zeros((self.b, self.nk * self.bk, self.nkv, self.d), x.dtype)
        out = out.at[:, :, self.kv_index.ravel()].add(x)
        return out[:, : self.sk]

    def tile_index(self, flat, per_head):
        """Split a flat tile id over (B, Hm, per_head) into (b·Hm + m, i)."""
        return flat // per_head, flat % per_head

    def scores(self, qt, kt, c, bounds_bm, row0, col0, scale, logits_soft_cap=None):
        """Scaled S for one tile ``[Kh, Gq, bq, bk]`` (soft-capped, ``cap·tanh(s/cap)``, when a cap
        is given); masked cells -inf on partial tiles only."""
        s = jnp.einsum("hgqd,hkd->hgqk", qt, kt, preferred_element_type=jnp.float32) * scale
        if logits_soft_cap is not None:
            s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
        tb = jax.lax.dynamic_slice(bounds_bm, (0, col0), (4, self.bk))

        def apply_mask(s):
            return jnp.where(_blocks.element_mask(tb, row0, self.bq), -jnp.inf, s)

        return jax.lax.cond(c == _blocks.PARTIAL, apply_mask, lambda s: s, s)


def _filled(like, value, shape):
    """A float32 constant that carries `like`'s shard_map axes (a loop carry must match them)."""
    return jax.lax.full_like(like, value, jnp.float32, shape)


def _compact(cls):
    """Per row of `cls` [..., n]: indices of non-skipped entries first, and how many there are."""
    order = jnp.argsort(cls == _blocks.SKIP, axis=-1, stable=True).astype(jnp.int32)
    return order, jnp.sum(cls != _blocks.SKIP, axis=-1).astype(jnp.int32)


def forward(q, k, v, bounds, *, scale: float, block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK,
            logits_soft_cap: float | None = None):
    """(out ``[B, Sq, N, d]`` in q.dtype, lse float32 ``[B, Sq, N]``). `logits_soft_cap`: scores
    become ``cap·tanh(s/cap)`` before masking."""
    L = _Layout(q.shape, k.shape, bounds, block_q, block_k)
    kx, vx = L.kv_heads(k), L.kv_heads(v)
    bounds_bm = L.bounds.reshape(L.b * L.hm, 4, -1)
    cls = L.cls.reshape(-1, L.nk)
    order, count = _compact(cls)
    q_tiles = L.q_tiles(q)
    shape = (L.kh, L.gq, L.bq)

    def tile(args):
        flat, qt, order_t, count_t, cls_t = args
        bm, qi = L.tile_index(flat, L.nq)

        def body(t, carry):
            o, m, l = carry
            kb = order_t[t]
            kt = jax.lax.dynamic_slice_in_dim(kx[bm], kb * L.bk, L.bk, axis=1)
            vt = jax.lax.dynamic_slice_in_dim(vx[bm], kb * L.bk, L.bk, axis=1)
            s = L.scores(qt, kt, cls_t[kb], bounds_bm[bm], qi * L.bq, kb * L.bk, scale, logits_soft_cap)
            m_new = jnp.maximum(m, s.max(axis=-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
            alpha = jnp.exp(m - m_safe)
            p = jnp.exp(s - m_safe[..., None])
            l = l * alpha + p.sum(axis=-1)
            pv = jnp.einsum("hgqk,hkd->hgqd", p.astype(vt.dtype), vt, preferred_element_type=jnp.float32)
            return o * alpha[..., None] + pv, m_new, l

        init = (_filled(qt, 0.0, shape + (L.d,)), _filled(qt, -jnp.inf, shape), _filled(qt, 0.0, shape))
        o, m, l = jax.lax.fori_loop(0, count_t, body, init)
        # l is 0 exactly when no key of the row was visible (or every visible score was -inf); a
        # NaN l (NaN/Inf in a visible input) must stay NaN, so test `!= 0`, not `> 0`.
        alive = l != 0
        l_safe = jnp.where(alive, l, 1.0)
        out = jnp.where(alive[..., None], o / l_safe[..., None], 0.0)
        lse = jnp.where(alive, m + jnp.log(l_safe), -jnp.inf)
        return out.astype(q.dtype), lse

    flat = jnp.arange(cls.shape[0], dtype=jnp.int32)
    out, lse = jax.lax.map(tile, (flat, q_tiles, order, count, cls))
    return L.from_q_tiles(out), L.from_q_tiles(lse)


def backward(q, k, v, bounds, out, lse, dout, dlse=None, *, scale: float, deterministic: bool = False,
             block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK, logits_soft_cap: float | None = None):
    """(dq, dk, dv) in the inputs' dtypes. `dlse` is the cotangent of lse (None = zero).

    Order-fixed (einsums, row sums, fixed-order loops) except one reduction: when several mask
    heads share a kv head (Hm > K), dK/dV are folded with a scatter-add whose duplicate indices
    XLA:GPU runs as atomics. `deterministic=True` replaces it: every query head gets its own copy
    of k/v and each GQA group is summed with explicit adds in head order.
    """
    if deterministic and bounds.shape[1] > k.shape[2]:
        K, r = k.shape[2], q.shape[2] // k.shape[2]
        kx, vx = jnp.repeat(k, r, axis=2), jnp.repeat(v, r, axis=2)
        dq, dkx, dvx = backward(q, kx, vx, bounds, out, lse, dout, dlse, scale=scale,
                                block_q=block_q, block_k=block_k, logits_soft_cap=logits_soft_cap)

        def fold(x, dtype):  # [B, S, K*r, d] -> [B, S, K, d], summed over r in head order
            x = x.astype(jnp.float32).reshape(x.shape[:2] + (K, r) + x.shape[3:])
            acc = x[:, :, :, 0]
            for i in range(1, r):
                acc = acc + x[:, :, :, i]
            return acc.astype(dtype)

        return dq, fold(dkx, k.dtype), fold(dvx, v.dtype)
    L = _Layout(q.shape, k.shape, bounds, block_q, block_k)
    # D = rowsum(dO ∘ O) - dlse: the lse cotangent enters dS = P ∘ (dP - D) through D.
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    # Fully-masked rows (lse = -inf) get lse = +inf so that P = exp(S - lse) is exactly 0. Their
    # q, dO and D are zeroed too (O(Sq·d)): P = 0 there, but 0 * NaN = NaN would carry whatever a
    # padding query holds into dK/dV of the keys it shares a tile with.
    dead = jnp.isneginf(lse)  # [B, Sq, N]
    lse = jnp.where(dead, jnp.inf, lse)
    delta = jnp.where(dead, 0.0, delta)
    q = jnp.where(dead[..., None], jnp.zeros((), q.dtype), q)
    dout = jnp.where(dead[..., None], jnp.zeros((), dout.dtype), dout)
    kx, vx = L.kv_heads(k), L.kv_heads(v)
    bounds_bm = L.bounds.reshape(L.b * L.hm, 4, -1)
    q_t, do_t = L.q_tiles(q), L.q_tiles(dout)
    lse_t, delta_t = L.q_tiles(lse, fill=jnp.inf), L.q_tiles(delta)

    def probs_and_ds(qt, kt, vt, dot, lset, dt, c, bm, row0, col0):
        s = L.scores(qt, kt, c, bounds_bm[bm], row0, col0, scale, logits_soft_cap)
        p = jnp.exp(s - lset[..., None])
        dp = jnp.einsum("hgqd,hkd->hgqk", dot, vt, preferred_element_type=jnp.float32)
        ds = p * (dp - dt[..., None])
        if logits_soft_cap is not None:
            # d(cap·tanh(x/cap))/dx = 1 - tanh²; masked cells (s = -inf, p = 0) contribute nothing.
            ds = ds * jnp.where(jnp.isfinite(s), 1.0 - jnp.square(s / logits_soft_cap), 0.0)
        return p, ds

    # Row pass: dQ for each query tile over its non-skipped key blocks.
    cls_rows = L.cls.reshape(-1, L.nk)
    order, count = _compact(cls_rows)

    def dq_tile(args):
        flat, qt, dot, lset, dt, order_t, count_t, cls_t = args
        bm, qi = L.tile_index(flat, L.nq)

        def body(t, dq):
            kb = order_t[t]
            kt = jax.lax.dynamic_slice_in_dim(kx[bm], kb * L.bk, L.bk, axis=1)
            vt = jax.lax.dynamic_slice_in_dim(vx[bm], kb * L.bk, L.bk, axis=1)
            _, ds = probs_and_ds(qt, kt, vt, dot, lset, dt, cls_t[kb], bm, qi * L.bq, kb * L.bk)
            return dq + jnp.einsum("hgqk,hkd->hgqd", ds.astype(kt.dtype), kt,
                                   preferred_element_type=jnp.float32) * scale

        dq = jax.lax.fori_loop(0, count_t, body, _filled(qt, 0.0, qt.shape))
        return dq.astype(q.dtype)

    flat_q = jnp.arange(cls_rows.shape[0], dtype=jnp.int32)
    dq = jax.lax.map(dq_tile, (flat_q, q_t, do_t, lse_t, delta_t, order, count, cls_rows))

    # Column pass: dK, dV for each key block over its non-skipped query blocks.
    cls_cols = jnp.swapaxes(L.cls, -1, -2).reshape(-1, L.nq)
    order_c, count_c = _compact(cls_cols)
    per_bm = lambda x: x.reshape((L.b * L.hm, L.nq) + x.shape[1:])  # noqa: E731
    q_bm, do_bm, lse_bm, delta_bm = per_bm(q_t), per_bm(do_t), per_bm(lse_t), per_bm(delta_t)
    k_tiles = jnp.swapaxes(kx.reshape(L.b * L.hm, L.kh, L.nk, L.bk, L.d), 1, 2).reshape(-1, L.kh, L.bk, L.d)
    v_tiles = jnp.swapaxes(vx.reshape(L.b * L.hm, L.kh, L.nk, L.bk, L.d), 1, 2).reshape(-1, L.kh, L.bk, L.d)

    def dkv_tile(args):
        flat, kt, vt, order_t, count_t, cls_t = args
        bm, kb = L.tile_index(flat, L.nk)

        def body(t, carry):
            dk, dv = carry
            qi = order_t[t]
            qt, dot = q_bm[bm, qi], do_bm[bm, qi]
            p, ds = probs_and_ds(qt, kt, vt, dot, lse_bm[bm, qi], delta_bm[bm, qi], cls_t[qi], bm,
                                 qi * L.bq, kb * L.bk)
            dv = dv + jnp.einsum("hgqk,hgqd->hkd", p.astype(dot.dtype), dot, preferred_element_type=jnp.float32)
            dk = dk + jnp.einsum("hgqk,hgqd->hkd", ds.astype(qt.dtype), qt,
                                 preferred_element_type=jnp.float32) * scale
            return dk, dv

        zeros = _filled(kt, 0.0, kt.shape)
        return jax.lax.fori_loop(0, count_t, body, (zeros, zeros))

    flat_k = jnp.arange(cls_cols.shape[0], dtype=jnp.int32)
    dk, dv = jax.lax.map(dkv_tile, (flat_k, k_tiles, v_tiles, order_c, count_c, cls_cols))
    # Keys masked for every row influence nothing, so their gradient is exactly 0 (a NaN row
    # elsewhere in their tiles would otherwise reach it through 0 * NaN); rows likewise.
    dead_k = L.dead.reshape(L.b * L.hm * L.nk, 1, L.bk, 1)
    dk, dv = jnp.where(dead_k, 0.0, dk), jnp.where(dead_k, 0.0, dv)
    dq = jnp.where(dead[..., None], jnp.zeros((), q.dtype), L.from_q_tiles(dq))
    return dq, L.from_kv_tiles(dk).astype(k.dtype), L.from_kv_tiles(dv).astype(v.dtype)
