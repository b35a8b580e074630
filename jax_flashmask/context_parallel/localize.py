"""Zero-communication localization of a FlashMask to one context-parallel rank.

A rank that owns the sorted chunks ``c_0 < ... < c_{m-1}`` (each ``C`` tokens) holds the query rows
``c_0*C .. c_0*C+C-1, c_1*C .. , ...`` in that order. Because the map local row -> global row is
increasing, a global row boundary ``r`` (a start or an end of a masked row range of the canonical
D=4 form) becomes the number of local rows whose global index is below ``r``::

    r_loc = sum_b clip(r - c_b*C, 0, C)

(FlashMask-3 writes it as "clip-shift-max"). Applied to all four canonical vectors (LTS, LTE, UTS,
UTE) it gives a non-causal D=4 mask over the local rows that masks exactly the same cells: no
communication, every rank holds the O(S) global vectors. Columns are not remapped: they are simply
the key positions the rank holds (gathered from other ranks), in whatever order they arrive, with
the bounds of their global columns - attention does not depend on the key order.

Everything here works on traced arrays (the plan is data: a new plan does not recompile) and, with
``xp=numpy``, on the host.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..masks._core import columns_fully_masked

__all__ = [
    "chunk_token_index",
    "localize_rows",
    "localize_rows_sum",
    "localize_bounds",
    "columns_fully_masked",
    "bounds_to_indices",
    "masked_bounds",
]


def chunk_token_index(chunks, chunk_size: int, xp=jnp):
    """Global token positions of `chunks` (``[..., m]`` chunk ids) -> ``[..., m*chunk_size]``."""
    chunks = xp.asarray(chunks)
    pos = chunks[..., None] * chunk_size + xp.arange(chunk_size, dtype=chunks.dtype)
    return pos.reshape(chunks.shape[:-1] + (chunks.shape[-1] * chunk_size,))


def localize_rows_sum(r, chunks, chunk_size: int, xp=jnp):
    """The defining formula ``sum_b clip(r - c_b*C, 0, C)`` (O(m) per element; reference)."""
    r = xp.asarray(r)
    off = xp.asarray(chunks) * chunk_size
    return xp.clip(r[..., None] - off, 0, chunk_size).sum(-1).astype(r.dtype)


def localize_rows(r, chunks, chunk_size: int, xp=jnp):
    """Number of local rows with global index < `r`, for a rank owning sorted `chunks` ``[m]``.

    Same value as `localize_rows_sum` in O(log m) per element: with ``q = r // C``, the chunks
    below ``q`` count fully and chunk ``q`` (if owned) counts ``r % C`` rows.
    """
    r = xp.asarray(r)
    chunks = xp.asarray(chunks).astype(r.dtype)
    m = chunks.shape[-1]
    q = r // chunk_size
    rem = r - q * chunk_size
    if xp is np:
        below = np.searchsorted(chunks, q, side="left").astype(r.dtype)
    else:  # m is small: compare against every chunk start (vectorizes well on accelerators)
        method = "compare_all" if m <= 32 else "scan_unrolled"
        below = jnp.searchsorted(chunks, q, side="left", method=method).astype(r.dtype)
    owned = chunks[xp.minimum(below, m - 1)] == q
    return below * chunk_size + xp.where(owned, rem, 0).astype(r.dtype)


def localize_bounds(bounds, chunks, chunk_size: int, columns=None, xp=jnp):
    """Canonical global bounds ``[B, Hm, 4, S]`` -> the rank's local bounds ``[B, Hm, 4, L]``.

    `chunks`: the rank's sorted chunk ids ``[m]`` (its rows); `columns`: int positions ``[L]`` of
    the keys the rank attends to (default: all ``S``). The result masks cell (i_loc, col) exactly
    when the global mask masks (global row of i_loc, columns[col]); rows are ``m*chunk_size``.
    """
    bounds = xp.asarray(bounds)
    if columns is not None:
        bounds = xp.take(bounds, xp.asarray(columns), axis=-1)
    return localize_rows(bounds, chunks, chunk_size, xp=xp)


def masked_bounds(local_bounds, drop, n_rows, xp=jnp):
    """Replace the columns where `drop` (broadcastable to ``[..., L]``) holds by 'fully masked'."""
    drop = xp.asarray(drop)[..., None, :]
    full = xp.asarray([0, n_rows, 0, 0], dtype=local_bounds.dtype)[:, None]
    return xp.where(drop, full, local_bounds)


def bounds_to_indices(local_bounds, xp=jnp):
    """``[B, Hm, 4, L]`` -> non-causal D=4 ``startend_row_indices`` ``[B, Hm, L, 4]``."""
    return xp.swapaxes(xp.asarray(local_bounds), -1, -2)
