"""CPU (with nvcc): the shared-memory addresses the masked-position zeroing writes
(cc/sm90/unseen.cuh sw128_chunk) are CuTe's swizzled addresses of the tiles' 16-byte chunks.

Compiles and runs tests/cc/sw128_chunk_check.cu on the host (CuTe layouts are host code too).
Skipped without nvcc or the CUTLASS headers (the nvidia-cutlass wheel, or
$JAX_FLASHMASK_CUTLASS_INCLUDE, as CMakeLists.txt finds them).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _cutlass_include():
    env = os.environ.get("JAX_FLASHMASK_CUTLASS_INCLUDE")
    if env:
        return env
    try:
        import cutlass_library
    except ImportError:
        return None
    return os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")


def test_sw128_chunk_matches_cute(tmp_path):
    nvcc = shutil.which("nvcc")
    inc = _cutlass_include()
    if nvcc is None or inc is None or not os.path.exists(os.path.join(inc, "cute", "tensor.hpp")):
        pytest.skip("needs nvcc and the CUTLASS headers")
    exe = tmp_path / "check"
    build = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{ROOT / 'cc' / 'sm90'}",
                            f"-isystem={inc}", "-o", str(exe), str(ROOT / "tests" / "cc" / "sw128_chunk_check.cu")],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
