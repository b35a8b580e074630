"""Block metadata and tile classification (SPEC §3), shared by every blocked implementation.

Per key block of width `block_k` the metadata holds the min and max of each canonical vector
(LTS, LTE, UTS, UTE). A query tile ``[ms, me)`` against key block ``n`` is then

* fully masked (skipped) when ``(ms >= LTSmax and me <= LTEmin) or (ms >= UTSmax and me <= UTEmin)``,
* partially masked (element mask applied) when ``(ms < LTEmax and me > LTSmin) or (ms < UTEmax and me > UTSmin)``,
* fully visible otherwise (no mask arithmetic at all).
"""

from __future__ import annotations

import jax.numpy as jnp

SKIP, PARTIAL, VISIBLE = 0, 1, 2


def pad_bounds(bounds, kv_len_padded: int, q_len: int):
    """Extend ``[B, Hm, 4, Sk]`` bounds to `kv_len_padded` columns that mask every row."""
    extra = kv_len_padded - bounds.shape[-1]
    if extra == 0:
        return bounds
    b, hm = bounds.shape[:2]
    fill = jnp.array([0, q_len, 0, 0], jnp.int32)[None, None, :, None]
    return jnp.concatenate([bounds, jnp.broadcast_to(fill, (b, hm, 4, extra))], axis=-1)


def block_metadata(bounds, block_k: int):
    """``[B, Hm, 4, Sk]`` (Sk a multiple of `block_k`) -> (min, max), each ``[B, Hm, 4, Sk/block_k]``."""
    b, hm, _, sk = bounds.shape
    blocks = bounds.reshape(b, hm, 4, sk // block_k, block_k)
    return blocks.min(axis=-1), blocks.max(axis=-1)


def classify(bmin, bmax, q_len: int, block_q: int, num_q_blocks: int):
    """Tile classes ``[B, Hm, nq, nk]`` (SKIP / PARTIAL / VISIBLE) for query tiles of `block_q` rows.

    The last query tile is clipped to `q_len`, so padded rows never prevent a skip.
    """
    ms = (jnp.arange(num_q_blocks, dtype=jnp.int32) * block_q)[:, None]
    me = jnp.minimum(ms + block_q, q_len)
    lo = [bmin[:, :, k, None, :] for k in range(4)]  # [B, Hm, 1, nk]
    hi = [bmax[:, :, k, None, :] for k in range(4)]
    lts_min, lte_min, uts_min, ute_min = lo
    lts_max, lte_max, uts_max, ute_max = hi
    skip = ((ms >= lts_max) & (me <= lte_min)) | ((ms >= uts_max) & (me <= ute_min))
    partial = ((ms < lte_max) & (me > lts_min)) | ((ms < ute_max) & (me > uts_min))
    return jnp.where(skip, SKIP, jnp.where(partial, PARTIAL, VISIBLE)).astype(jnp.int32)


def element_mask(tile_bounds, row0, num_rows: int):
    """Boolean ``[num_rows, bk]`` (True = masked) for rows ``row0 + [0, num_rows)``.

    `tile_bounds` is the ``[4, bk]`` slice of the canonical bounds for the tile's key columns.
    """
    i = row0 + jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    lts, lte, uts, ute = (tile_bounds[k][None, :] for k in range(4))
    return ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))
