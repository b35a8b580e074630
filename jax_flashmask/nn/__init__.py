"""Attention layers for Flax NNX and Equinox on top of `jax_flashmask.attention`.

The layers live in submodules that import their framework, so this package imports without
either installed:

* ``jax_flashmask.nn.flax.FlashMaskAttention`` — Flax NNX (``pip install 'jax_flashmask[flax]'``)
* ``jax_flashmask.nn.equinox.FlashMaskAttention`` — Equinox (``pip install 'jax_flashmask[equinox]'``)

Both do Q/K/V/O projections, grouped-query attention (``num_kv_heads``), optional rotary
embeddings and take a mask (`FlashMask`, ``startend_row_indices`` or None) per call. The shared,
framework-free math (`apply_rope`, head reshapes, `multihead_attention`) is re-exported here.
"""

from __future__ import annotations

import importlib

from ._common import (
    apply_rope,
    check_head_config,
    merge_heads,
    multihead_attention,
    resolve_mask,
    rope_angles,
    split_heads,
)

__all__ = [
    "apply_rope",
    "check_head_config",
    "merge_heads",
    "multihead_attention",
    "resolve_mask",
    "rope_angles",
    "split_heads",
    "flax",
    "equinox",
]

_LAZY = ("flax", "equinox")


def __getattr__(name):
    if name in _LAZY:  # imported on first access; raises ImportError naming the extra if missing
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
