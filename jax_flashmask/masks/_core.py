"""The FlashMask representation: column-wise row boundaries, their validation and canonical form.

`startend_row_indices` is int32 ``[B, Hm, Sk, D]``: for every key column ``j`` it stores query-row
boundaries (starts inclusive, ends exclusive). With ``delta = Sk - Sq`` (causal is aligned
bottom-right), cell ``(i, j)`` is masked when

=========== ================= ===============================================
mode        vectors            masked when
=========== ================= ===============================================
causal D=1  LTS                ``i < j - delta`` or ``i >= LTS[j]``
causal D=2  LTS, LTE           ``i < j - delta`` or ``LTS[j] <= i < LTE[j]``
full   D=2  LTS, UTE           ``i >= LTS[j]`` or ``i < UTE[j]``
full   D=4  LTS, LTE, UTS, UTE ``LTS[j] <= i < LTE[j]`` or ``UTS[j] <= i < UTE[j]``
=========== ================= ===============================================

Every mode is a special case of the D=4 form. `canonical_bounds` turns any of them into the
``[B, Hm, 4, Sk]`` (LTS, LTE, UTS, UTE) array that the block metadata and every kernel consume, so
the kernels have one code path.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "FlashMask",
    "ALLOWED_D",
    "validate",
    "canonical_bounds",
    "unmasked_bounds",
    "dense_from_bounds",
    "to_dense",
]

# (causal, D) pairs of SPEC §1 and the name of each vector they carry.
ALLOWED_D = {
    True: {1: ("LTS",), 2: ("LTS", "LTE")},
    False: {2: ("LTS", "UTE"), 4: ("LTS", "LTE", "UTS", "UTE")},
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FlashMask:
    """A mask as data: the boundary vectors (a traced leaf) and `causal` (static).

    `jax_flashmask.attention` accepts it in place of ``startend_row_indices``; a new mask every
    step does not recompile as long as its shape stays the same.
    """

    startend_row_indices: jax.Array
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def shape(self):
        return self.startend_row_indices.shape

    def to_dense(self, q_len: int | None = None) -> jax.Array:
        return to_dense(self.startend_row_indices, causal=self.causal, q_len=q_len)


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def validate(
    startend_row_indices,
    *,
    causal: bool,
    q_len: int,
    kv_len: int | None = None,
    batch: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    check_values: bool = True,
) -> None:
    """Raise ``ValueError`` when the indices do not describe a mask for this problem.

    Shapes, dtype and the (causal, D) pair are always checked; values (in ``[0, q_len]``, and each
    range's start no larger than its end) only when the array is concrete and `check_values`.
    `q_len` (the query length Sq, an int >= 1) is required: ``None`` raises ``TypeError``.
    """
    if isinstance(q_len, (bool, np.bool_)) or not isinstance(q_len, (int, np.integer)):
        raise TypeError(
            f"validate needs q_len, the number of query rows (query.shape[1]) as an int, got "
            f"{q_len!r}: every boundary is checked against it"
        )
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1 (the number of query rows), got {q_len}")
    x = startend_row_indices
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(
            f"startend_row_indices must be an int32 array of shape [B, Hm, Sk, D], got {type(x).__name__}"
        )
    if x.ndim != 4:
        raise ValueError(
            f"startend_row_indices must have rank 4 [B, Hm, Sk, D], got shape {tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"startend_row_indices must be int32, got dtype {x.dtype}")
    b, hm, sk, d = x.shape
    if d not in ALLOWED_D[bool(causal)]:
        allowed = ", ".join(
            f"D={k} ({'/'.join(v)})" for k, v in ALLOWED_D[bool(causal)].items()
        )
        raise ValueError(
            f"startend_row_indices has D={d}, which is not allowed with causal={bool(causal)}: "
            f"use {allowed}" + (" or set causal=False" if causal else " or set causal=True")
        )
    if kv_len is not None and sk != kv_len:
        raise ValueError(
            f"startend_row_indices has Sk={sk} columns but the keys have length {kv_len}: "
            "there must be one column of boundaries per key position"
        )
    if batch is not None and b not in (1, batch):
        raise ValueError(
            f"startend_row_indices has batch {b} but the query has batch {batch} "
            "(use the same batch, or 1 to share one mask across the batch)"
        )
    if num_heads is not None:
        allowed_h = sorted({1, num_kv_heads or 1, num_heads})
        if hm not in allowed_h:
            raise ValueError(
                f"startend_row_indices has Hm={hm} mask heads; it must be one of {allowed_h} "
                f"(1 = shared by all heads, {num_kv_heads} = per kv head, {num_heads} = per query head)"
            )
    if check_values and _is_concrete(x):
        v = np.asarray(x)
        if v.size and (v.min() < 0 or v.max() > q_len):
            raise ValueError(
                f"startend_row_indices values must lie in [0, Sq={q_len}] (row boundaries), "
                f"got values in [{v.min()}, {v.max()}]"
            )
        names = ALLOWED_D[bool(causal)][d]
        for lo, hi in (("LTS", "LTE"), ("UTS", "UTE")):
            if lo in names and hi in names:
                a, c = v[..., names.index(lo)], v[..., names.index(hi)]
                if np.any(a > c):
                    raise ValueError(
                        f"startend_row_indices: {lo} must be <= {hi} in every column "
                        f"(found {int(np.sum(a > c))} columns with {lo} > {hi})"
                    )


def canonical_bounds(startend_row_indices, *, causal: bool, q_len: int) -> jax.Array:
    """The D=4 form as int32 ``[B, Hm, 4, Sk]`` holding (LTS, LTE, UTS, UTE).

    Cell (i, j) is masked iff ``LTS[j] <= i < LTE[j]`` or ``UTS[j] <= i < UTE[j]``. With
    ``startend_row_indices=None`` the result masks nothing (or only the causal upper triangle);
    pass an array for that case through `unmasked_bounds`.
    """
    x = jnp.asarray(startend_row_indices).astype(jnp.int32)
    b, hm, sk, d = x.shape
    if d not in ALLOWED_D[bool(causal)]:
        raise ValueError(f"invalid (causal={causal}, D={d}); see jax_flashmask.masks.validate")
    # The constant components are made like the mask's first vector, so that they carry its
    # sharding (a stack of differently sharded arrays is refused on Explicit mesh axes).
    zero = jnp.zeros_like(x[..., 0])
    full = zero + jnp.int32(q_len)
    if causal:
        j = jnp.arange(sk, dtype=jnp.int32)
        ute = zero + jnp.clip(j - (sk - q_len), 0, q_len).astype(jnp.int32)
        lts = x[..., 0]
        lte = x[..., 1] if d == 2 else full
        uts = zero
    elif d == 2:
        lts, lte, uts, ute = x[..., 0], full, zero, x[..., 1]
    else:
        lts, lte, uts, ute = x[..., 0], x[..., 1], x[..., 2], x[..., 3]
    return jnp.stack([lts, lte, uts, ute], axis=2)


def unmasked_bounds(batch: int, kv_len: int, *, causal: bool, q_len: int) -> jax.Array:
    """Canonical bounds of 'no mask beyond `causal`', shaped ``[batch, 1, 4, kv_len]``."""
    ind = jnp.full((batch, 1, kv_len, 1 if causal else 2), 0, jnp.int32)
    ind = ind.at[..., 0].set(q_len)  # LTS = Sq: the lower-triangle range is empty
    return canonical_bounds(ind, causal=causal, q_len=q_len)


def dense_from_bounds(bounds, q_len: int) -> jax.Array:
    """Boolean ``[B, Hm, Sq, Sk]`` (True = masked) from canonical bounds ``[B, Hm, 4, Sk]``."""
    i = jnp.arange(q_len, dtype=jnp.int32)[:, None]
    lts, lte, uts, ute = (bounds[:, :, k, None, :] for k in range(4))
    return ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))


def columns_fully_masked(bounds, n_rows, xp=jnp):
    """``[..., L]`` bool from canonical bounds ``[..., 4, L]``: is every one of the `n_rows` rows
    masked in this column?

    The union of ``[LTS, LTE)`` and ``[UTS, UTE)`` covers ``[0, n_rows)`` (empty ranges never help).
    `xp` is accepted for symmetry with the host (numpy) callers; the arithmetic works on both.
    """
    del xp
    lts, lte, uts, ute = (bounds[..., k, :] for k in range(4))
    lo_ok = lts < lte
    up_ok = uts < ute
    a = lo_ok & (lts <= 0) & (lte >= n_rows)
    b = up_ok & (uts <= 0) & (ute >= n_rows)
    c = lo_ok & up_ok & (lts <= 0) & (lte >= uts) & (ute >= n_rows)
    d = lo_ok & up_ok & (uts <= 0) & (ute >= lts) & (lte >= n_rows)
    return a | b | c | d | (n_rows <= 0)


def to_dense(startend_row_indices, *, causal: bool | None = None, q_len: int | None = None) -> jax.Array:
    """The dense view: boolean ``[B, Hm, Sq, Sk]``, True where the cell is masked.

    `causal` comes with a `FlashMask`; a raw index array needs it. For tests, pictures and small
    problems only: it is O(Sq·Sk).
    """
    if isinstance(startend_row_indices, FlashMask):
        if causal is not None and bool(causal) != startend_row_indices.causal:
            raise ValueError(f"causal={causal} conflicts with a FlashMask built with "
                             f"causal={startend_row_indices.causal}")
        causal = startend_row_indices.causal
        startend_row_indices = startend_row_indices.startend_row_indices
    elif causal is None:
        raise TypeError("to_dense(startend_row_indices, causal=...) needs causal for a raw index "
                        "array (a FlashMask carries its own)")
    sk = startend_row_indices.shape[2]
    q_len = sk if q_len is None else q_len
    validate(startend_row_indices, causal=causal, q_len=q_len)
    return _dense(startend_row_indices, causal=causal, q_len=q_len)


@functools.partial(jax.jit, static_argnames=("causal", "q_len"))
def _dense(startend_row_indices, *, causal, q_len):
    return dense_from_bounds(canonical_bounds(startend_row_indices, causal=causal, q_len=q_len), q_len)
