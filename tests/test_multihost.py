"""Multi-host on one machine: 2 processes x 4 host CPU devices joined by `jax.distributed` on
localhost, gloo collectives between them (tests/_multihost_worker.py).

Both processes run batch-sharded `attention` (the batch over all 8 devices) and
`context_parallel_attention(comm="hierarchical")` with the process as the slow axis, forward and
gradients, and check the shards they hold against the single-device result. The coordinator port
comes from binding port 0; both processes are killed on timeout or when either one fails.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NUM_PROCESSES = 2
TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(port: int, logs):
    env = dict(os.environ)
    if importlib.util.find_spec("jax_flashmask") is None:  # not installed: test this checkout
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["JAX_PLATFORMS"] = "cpu"
    return [subprocess.Popen([sys.executable, os.path.join(HERE, "_multihost_worker.py"), str(i),
                              str(NUM_PROCESSES), str(port)],
                             env=env, cwd=ROOT, stdout=logs[i], stderr=subprocess.STDOUT, text=True)
            for i in range(NUM_PROCESSES)]


def test_two_processes_batch_and_hierarchical_context_parallel(tmp_path):
    logs = [open(tmp_path / f"process{i}.log", "w+") for i in range(NUM_PROCESSES)]
    procs = launch(free_port(), logs)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            # one process failing leaves the other waiting in a collective: stop both
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
        f.close()
    report = "\n".join(f"--- process {i} (exit {p.returncode}) ---\n{o[-4000:]}"
                       for i, (p, o) in enumerate(zip(procs, outs)))
    if all("SKIP:" in o for o in outs):
        pytest.skip(next(line for line in outs[0].splitlines() if "SKIP:" in line))
    assert all(p.returncode == 0 for p in procs), report
    for i, out in enumerate(outs):
        assert "done" in out, report
        assert f"[process {i}] batch sharded" in out and f"[process {i}] context parallel" in out, report
