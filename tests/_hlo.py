"""Collectives in a compiled XLA program, for the sharding tests (CPU and multi-GPU)."""

from __future__ import annotations

import math
import re

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
_LINE = re.compile(r"=\s*(?P<type>\(?[a-z0-9]+\[[^=]*?\]\S*?)\s+(?P<op>" + "|".join(COLLECTIVES)
                   + r")(-start)?\(")
_SHAPE = re.compile(r"[a-z0-9]+\[([0-9,]*)\]")


def collectives(hlo_text: str):
    """[(op, largest element count among its results)] for every collective in `hlo_text`
    (`jax.jit(f).lower(...).compile().as_text()`)."""
    found = []
    # XLA writes /*index=N*/ inside the tuple types of combined collectives: drop the comments.
    hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)
    for line in hlo_text.splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        sizes = [math.prod(int(d) for d in dims.split(",") if d) for dims in _SHAPE.findall(m["type"])]
        found.append((m["op"], max(sizes, default=1)))
    return found


def large_collectives(hlo_text: str, min_elements: int = 2):
    """The collectives that move at least `min_elements` elements (scalar reductions excluded)."""
    return [c for c in collectives(hlo_text) if c[1] >= min_elements]
