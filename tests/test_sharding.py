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

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_worker(script: str, *args: str, timeout: int = 900) -> str:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    if importlib.util.find_spec("jax_flashmask") is None:  # not installed: test this checkout
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "done" in proc.stdout, out[-6000:]
    return out


@pytest.mark.parametrize("group", ["layouts_xla", "layouts_reference", "explicit", "cuda_lowering",
                                   "cp_heads"])
def test_sharding(group):
    out = run_worker("_sharding_worker.py", group)
    assert "ok:" in out
