"""`attention` under jit with NamedSharding on 8 host CPU devices (SPEC §8).

Each group runs in its own interpreter (tests/_sharding_worker.py): the host device count only
takes effect before jax starts. For every layout — batch, heads, batch x heads, sequence, Sq != Sk,
sequence x heads, batch x sequence, head_dim (gathered), an uneven split (gathered), MQA — out,
lse, dq, dk and dv equal the unsharded call, the outputs keep the inputs' shardings, and the
compiled program holds no collective for batch / head layouts and none as large as q for sequence
layouts. Also: explicit mesh axes, the CUDA lowering carrying the rule around the FFI calls, and
context parallelism composed with batch and head axes.
"""

from __future__ import annotations

import pytest

from _subprocess import run_worker


@pytest.mark.parametrize("group", ["layouts_xla", "layouts_reference", "explicit", "cuda_lowering",
                                   "cp_heads"])
def test_sharding(group):
    out = run_worker("_sharding_worker.py", group)
    assert "ok:" in out and "done" in out
