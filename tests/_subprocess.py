"""Run a test worker script in a fresh interpreter with N host CPU devices.

The host device count (``--xla_force_host_platform_device_count``) only takes effect before jax
starts, and other test modules import jax first; distributed checks therefore run as
``python tests/<worker>.py <group>`` in their own process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker_env(devices: int = 8) -> dict:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={devices}").strip()
    # absolute entries: workers may run in another directory
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if importlib.util.find_spec("jax_flashmask") is None:  # not installed: test this checkout
        paths.insert(0, ROOT)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_worker(script: str, *args: str, devices: int = 8, timeout: int = 900) -> str:
    """stdout of ``python tests/<script> <args>``; the test fails with the output's tail otherwise."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), *args], env=worker_env(devices),
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} failed (rc={proc.returncode}):\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}")
    return proc.stdout
