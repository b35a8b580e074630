"""The Flax NNX and Equinox attention layers in a jitted optax train step with sharded activations,
on 8 host CPU devices (SPEC §8; each group in its own interpreter: tests/_layers_worker.py).

Data parallel over 8 and 4 devices (parameters replicated; also on Explicit mesh axes, with the
mask sharded like the batch), batch x heads on 2 x 4 (tensor parallel, Megatron-split
projections) and Equinox's vmap style: loss, gradients and updated
parameters equal the single-device step, and the compiled step holds no all-gather — only the
parameters' gradient all-reduces (and, with heads split, the output projection's all-reduce).
"""

from __future__ import annotations

import pytest

from test_sharding import run_worker


@pytest.mark.parametrize("group", ["flax", "equinox", "equinox_vmap"])
def test_sharded_layers(group):
    pytest.importorskip("optax")
    pytest.importorskip("flax.nnx" if group == "flax" else "equinox")
    out = run_worker("_layers_worker.py", group)
    assert "ok:" in out
