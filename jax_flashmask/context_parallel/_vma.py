"""Helpers for code that runs inside ``shard_map`` across jax versions: the ``shard_map`` entry
point, an axis's size, and the varying-manual-axes (vma) bookkeeping that ``lax.cond`` branches and
loop carries need under ``check_vma=True``."""

from __future__ import annotations

import jax
from jax import lax

try:  # jax >= 0.6
    shard_map = jax.shard_map
except AttributeError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map  # type: ignore

__all__ = ["shard_map", "axis_size", "match_vma", "vma"]


def axis_size(name) -> int:
    try:
        return int(lax.axis_size(name))
    except Exception:  # pragma: no cover
        return int(lax.psum(1, name))


def vma(x) -> set:
    """The manual mesh axes `x` varies over (empty outside shard_map / with check_vma=False)."""
    try:
        t = jax.typeof(x)
    except AttributeError:  # pragma: no cover - very old jax
        return set()
    v = getattr(t, "vma", None)
    if v is None:
        mat = getattr(t, "manual_axis_type", None)
        v = getattr(mat, "varying", None) if mat is not None else None
    return set(v or ())


def match_vma(x, *refs):
    """Make `x` varying over every manual mesh axis any of `refs` varies over."""
    want = set()
    for r in refs:
        want |= vma(r)
    missing = tuple(sorted(want - vma(x), key=str))
    return lax.pcast(x, missing, to="varying") if missing else x
