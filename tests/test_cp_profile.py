"""benchmarks/cp_profile.py on the CPU: the trace parser on a synthetic GPU-shaped trace (kernel
classes, overlap, idle, launch delay, critical path), and the tool end to end on 2 host devices
with the XLA implementation (small sizes, well under a minute)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("cp_profile", ROOT / "benchmarks" / "cp_profile.py")
prof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prof)

FWD = "void flashmask::flashmask_fwd_kernel<Traits<cutlass::bfloat16_t, 128>>(KArgs, TmaQ, TmaK, TmaV)"
BWD = "void flashmask_bwd_persist_kernel<BT<128>>(BwdArgs, TmaQ, TmaQ, TmaK, TmaK)"
NCCL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def test_classify_and_short_names():
    assert prof.classify(FWD) == "fwd" and prof.short_kernel(FWD) == "flashmask_fwd_kernel"
    assert prof.classify(BWD) == "bwd" and prof.short_kernel(BWD) == "flashmask_bwd_persist_kernel"
    assert prof.classify("void bwd_prep_kernel<float>(int)") == "bwd_aux"
    assert prof.classify("void bwd_convert_kernel<__nv_bfloat16>(float const*)") == "bwd_aux"
    assert prof.classify("block_meta_kernel(int const*)") == "meta"
    assert prof.classify(NCCL) == "comm" and prof.classify("ncclKernel_AllGather_RING_LL") == "comm"
    assert prof.classify("MemcpyDtoH") == "memcpy" and prof.classify("Memset") == "memset"
    assert prof.classify("loop_convert_fusion") == "xla"
    assert prof.classify("ppermute.13", "ppermute.13", cpu=True) == "comm"
    assert prof.classify("collective-permute-start", "collective-permute-start", cpu=True) == "comm"


def _x(pid, tid, name, ts, dur, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


def _gpu_trace(path):
    """Two steps (host windows [0, 1000) and [1000, 2000) us) on two GPUs, perfetto JSON."""
    ev = [{"ph": "M", "pid": p, "name": "process_name", "args": {"name": n}}
          for p, n in ((1, "/host:CPU"), (2, "/device:GPU:0"), (3, "/device:GPU:1"))]
    ev += [{"ph": "M", "pid": p, "tid": t, "name": "thread_name", "args": {"name": n}}
           for p, t, n in ((1, 1, "python"), (1, 2, "cupti"), (2, 13, "Stream #13(compute)"),
                           (2, 20, "Stream #20(nccl)"), (2, 99, "XLA Ops"), (3, 13, "Stream #13(compute)"))]
    for s in range(2):
        o = 1000.0 * s
        ev += [_x(1, 1, "cpprof_step", o, 990, step_num=s),
               _x(1, 2, "cuLaunchKernelEx", o + 120, 5, correlation_id=7 + 100 * s),
               # GPU 0: fwd [100, 400), nccl [150, 450) (launched at 120), idle [450, 470),
               # fusion [470, 500), bwd [500, 900)
               _x(2, 13, FWD, o + 100, 300, hlo_op="ffi_call.52"),
               _x(2, 20, NCCL, o + 150, 300, hlo_op="collective-permute-start", correlation_id=7 + 100 * s),
               _x(2, 13, "loop_pad_fusion", o + 470, 30, hlo_op="loop_pad_fusion"),
               _x(2, 13, BWD, o + 500, 400, hlo_op="ffi_call.53"),
               _x(2, 99, "ffi_call.52", o + 100, 300),  # a derived line: ignored
               # GPU 1: prep [50, 60), meta [60, 70), memcpy [100, 110)
               _x(3, 13, "void bwd_prep_kernel<float>(int)", o + 50, 10),
               _x(3, 13, "block_meta_kernel(int const*)", o + 60, 10),
               _x(3, 13, "MemcpyDtoH", o + 100, 10)]
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": ev}, f)


def test_summary_of_gpu_shaped_trace(tmp_path):
    _gpu_trace(tmp_path / "plugins" / "profile" / "x" / "perfetto_trace.json.gz")
    s = prof.summarize(tmp_path)
    assert s["found"]["mode"] == "gpu" and s["found"]["source"] == "perfetto"
    assert s["found"]["step_split"]["GPU:0"] == "host step windows"
    g0, g1 = s["devices"]["GPU:0"], s["devices"]["GPU:1"]
    assert len(g0["steps"]) == 2
    m = g0["mean"]
    approx = pytest.approx
    assert m["span_ms"] == approx(0.8) and m["idle_ms"] == approx(0.02) and m["busy_ms"] == approx(0.78)
    assert m["comm_busy_ms"] == approx(0.3) and m["comm_overlap_ours_ms"] == approx(0.25)
    assert m["comm_alone_ms"] == approx(0.05) and m["host_ms"] == approx(0.99)
    bc = m["by_class"]
    assert bc["fwd"]["ms"] == approx(0.3) and bc["bwd"]["ms"] == approx(0.4) and bc["comm"]["ms"] == approx(0.3)
    assert bc["xla"]["ms"] == approx(0.03) and bc["fwd"]["n"] == 1  # the derived "XLA Ops" line is not counted
    med = g0["median_step"]
    c = med["comm_kernels"][0]
    assert c["op"] == "collective-permute-start" and c["t_ms"] == approx(0.05)
    assert c["with_ours_ms"] == approx(0.25) and c["launch_to_start_ms"] == approx(0.03)
    assert c["ours_running_at_start"] == "ffi_call.52" and c["since_last_ours_end_ms"] is None
    # critical path: the transfer, the idle gap, the fusion waiting on it, then the backward
    assert [x["cls"] for x in med["critical_path"]] == ["comm", "xla", "bwd"]
    assert med["critical_path"][0]["gap_after_ms"] == approx(0.02)
    assert med["critical_path_gaps_ms"] == approx(0.02)
    assert [x["cls"] for x in med["timeline"]] == ["fwd", "comm", "idle", "bwd"]  # 0.03 ms fusion < min_op_ms
    assert med["timeline_omitted"]["n"] == 1
    assert set(g1["mean"]["by_class"]) == {"bwd_aux", "meta", "memcpy"}
    md = prof.render({"devices": "2 x test"}, {"cp": {"summary": s, "untraced_ms": 1.0}})
    assert "| Σ comm ms (n) |" in md and "collective-permute-start" in md


def test_step_split_falls_back_to_gaps():
    evs = [dict(t0=t, t1=t + 10.0) for t in (0.0, 20.0, 1000.0, 1020.0, 5000.0)]
    groups, how = prof.split_steps(evs, [(0, 10**9, 10**9 + 1), (1, 10**9 + 2, 10**9 + 3), (2, 10**9 + 4, 10**9 + 5)])
    assert how.startswith("longest gaps") and [len(x) for x in groups] == [2, 2, 1]


def test_cp_profile_cpu_end_to_end(tmp_path):
    """All four programs traced and summarised on 2 host devices; the raw traces tarred; the tar
    re-parses with --parse-only."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    env.pop("JAX_ENABLE_PGLE", None)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cp_profile.py"), "--tokens-per-device", "256",
           "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--chunks-per-rank", "2",
           "--implementation", "xla", "--warmup", "1", "--iters", "1", "--steps", "2",
           "--out-dir", str(tmp_path), "--out-prefix", "p", "--trace-dir", str(tmp_path / "tr")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "p.json").read_text())
    assert set(res["programs"]) == {"cp", "one", "compute", "comm"}
    for name, p in res["programs"].items():
        assert "error" not in p and "parse_error" not in p, (name, p)
        s = p["summary"]
        assert s["found"]["mode"] == "cpu" and s["found"]["host_steps"] == 2, name
        devs = {"CPU:0"} if name == "one" else {"CPU:0", "CPU:1"}
        assert set(s["devices"]) == devs, name
        for d in s["devices"].values():
            assert len(d["steps"]) == 2 and d["mean"]["span_ms"] > 0, name
            assert "comm" in d["mean"]["by_class"] if name in ("cp", "comm") else "comm" not in d["mean"]["by_class"]
    assert "## Comparison" in (tmp_path / "p.md").read_text()
    tar = tmp_path / "p_traces.tar.gz"
    assert res["env"]["traces_tar"]["files"] >= 4
    with tarfile.open(tar) as t:
        t.extractall(tmp_path / "x")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cp_profile.py"), "--parse-only",
                           str(tmp_path / "x" / "tr"), "--out-dir", str(tmp_path), "--out-prefix", "q"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((tmp_path / "q.json").read_text())["programs"]
    assert set(again) == {"cp", "one", "compute", "comm"}
    assert "comm" in again["cp"]["summary"]["devices"]["CPU:1"]["mean"]["by_class"]
