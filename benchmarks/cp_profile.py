#!/usr/bin/env python3
"""Per-GPU timeline of the context-parallel fwd+bwd program: where each rank's step time goes.

Builds the programs of benchmarks/cp_bench.py (same builders, same options), warms each up (with
``JAX_ENABLE_PGLE=true`` the profiling runs and the profile-guided recompile happen there), times a
few untraced calls, then traces ``--steps`` calls with ``jax.profiler`` and parses the trace in the
same process into a compact summary, per program, per device, per step:

- the sum of kernel time per class: ``fwd`` / ``bwd`` / ``bwd_aux`` / ``meta`` (our kernels, by name:
  ``flashmask_fwd*``, ``flashmask_bwd*``, ``bwd_prep|bwd_convert|bwd_sched``, ``block_meta|group_meta``),
  ``comm`` (NCCL kernels ``nccl*`` on GPU; collective thunks on CPU), ``xla`` (fusions and every
  other XLA kernel), ``memcpy``, ``memset``;
- the GPU's span (first kernel start to last kernel end), busy time (union of all kernels), idle
  time (span - busy), the union of the communication kernels, how much of it runs beside our
  kernels / beside any compute kernel, and how much runs alone (exposed on the GPU's timeline);
- each communication kernel: op, start, duration, overlap with our kernels, and the launch-to-start
  delay where the trace correlates it with its host-side launch;
- the main ops in time order (ops >= ``--min-op-ms`` plus idle gaps), and a critical path walked
  back from the last kernel (each step: the op that ended last before this one started); idle gaps
  are listed from ``--min-op-ms`` / 5.

Programs (``--programs``): ``cp`` (the real CP program), ``one`` (single-device attention on device
0, the baseline), ``compute`` (cp with every collective replaced by a local stand-in: cp_bench's
compute-alone probe) and ``comm`` (cp with the attention replaced by a stand-in: communication
alone). Outputs under ``--out-dir``: ``<prefix>.json``, ``<prefix>.md`` and
``<prefix>_traces.tar.gz`` (the raw traces, at most ``--max-tar-mib``; re-parse them anywhere with
``--parse-only DIR``). A failure in one program or in the parser is recorded and the rest goes on.

GPU (see benchmarks/NOTES_cp_profile.md for the device command)::

    XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true JAX_ENABLE_PGLE=true \\
    JAX_PGLE_PROFILING_RUNS=1 NCCL_NVLS_ENABLE=0 python3 benchmarks/cp_profile.py \\
        --tokens-per-device 65536 --comm ring-pruned --mask causal_document --chunks-per-rank 2

CPU dry run: ``XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu python3
benchmarks/cp_profile.py --tokens-per-device 256 --heads 2 --kv-heads 1 --head-dim 32
--implementation xla``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402

_spec = importlib.util.spec_from_file_location("cp_bench", REPO / "benchmarks" / "cp_bench.py")
cb = importlib.util.module_from_spec(_spec)  # the shared program builders
_spec.loader.exec_module(cb)

STEP_NAME = "cpprof_step"
PROGRAMS = ("cp", "one", "compute", "comm")
CLASSES = ("fwd", "bwd", "bwd_aux", "meta", "comm", "xla", "memcpy", "memset")
OURS = ("fwd", "bwd", "bwd_aux", "meta")
# lines of a device plane that XLA / xprof derive from the kernels (not kernels themselves)
DERIVED_LINES = ("xla modules", "xla ops", "steps", "tensorflow name scope", "tensorflow ops",
                 "framework name scope", "framework ops", "source code", "xla tracemes", "launch stats",
                 "sparsecore", "async xla ops")
COMM_OPS = re.compile(r"ppermute|collective-permute|all-gather|all-reduce|reduce-scatter|all-to-all|"
                      r"\bsend\b|\brecv\b|send-done|recv-done|ncclsend|ncclrecv|collective", re.I)


# ---- classification ---------------------------------------------------------------------------------


def short_kernel(name: str) -> str:
    """'void ns::flashmask_fwd_kernel<Traits<...>>(KArgs, ...)' -> 'flashmask_fwd_kernel'."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    depth, out = 0, []
    for ch in n:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    n = "".join(out).split("(")[0].strip()
    n = n.split("::")[-1] if "::" in n else n
    return n[:80] or name[:80]


def classify(name: str, hlo_op: str = "", cpu: bool = False) -> str:
    n = name.lower()
    h = (hlo_op or "").lower()
    if "nccl" in n:
        return "comm"
    if "flashmask_fwd" in n or "fwd_sm90" in n:
        return "fwd"
    if "flashmask_bwd" in n or "bwd_sm90" in n:
        return "bwd"
    if re.search(r"bwd_(prep|convert|sched)", n):
        return "bwd_aux"
    if "block_meta" in n or "group_meta" in n:
        return "meta"
    if n.startswith("memset") or "memset" in n:
        return "memset"
    if n.startswith("memcpy") or "memcpy" in n:
        return "memcpy"
    if cpu and (COMM_OPS.search(h) or COMM_OPS.search(n)):
        return "comm"
    return "xla"


# ---- interval arithmetic (ns) ---------------------------------------------------------------------


def union(iv):
    out = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def measure(u):
    return sum(b - a for a, b in u)


def intersect(u, w):
    """Intersection of two merged (sorted, disjoint) interval lists."""
    out, i, j = [], 0, 0
    while i < len(u) and j < len(w):
        a, b = max(u[i][0], w[j][0]), min(u[i][1], w[j][1])
        if a < b:
            out.append([a, b])
        if u[i][1] < w[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_with(a, b, u):
    return measure(intersect([[a, b]], u))


# ---- trace loading ----------------------------------------------------------------------------------


def _stats_dict(stats):
    d = {}
    try:
        for k, v in stats:
            d[str(k)] = v
    except Exception:  # noqa: BLE001  (older/newer bindings)
        pass
    return d


def find_trace_files(trace_dir):
    xp = sorted(glob.glob(os.path.join(str(trace_dir), "**", "*.xplane.pb"), recursive=True))
    pf = sorted(glob.glob(os.path.join(str(trace_dir), "**", "perfetto_trace.json.gz"), recursive=True))
    tj = sorted(glob.glob(os.path.join(str(trace_dir), "**", "*.trace.json.gz"), recursive=True))
    return xp, pf, tj


def load_xplane(path):
    """Raw events from an XSpace file through jax.profiler.ProfileData (no TensorBoard/protobuf)."""
    from jax.profiler import ProfileData
    pd = ProfileData.from_file(str(path))
    planes = []
    for pl in pd.planes:
        lines = []
        for ln in pl.lines:
            evs = [(e.name, float(e.start_ns), float(e.duration_ns), _stats_dict(e.stats)) for e in ln.events]
            lines.append((ln.name, evs))
        planes.append((pl.name, lines))
    return planes


def load_trace_json(path):
    """Raw events from a Chrome/Perfetto trace JSON (gzip): planes = processes, lines = threads."""
    with gzip.open(path, "rt") as f:
        tr = json.load(f)
    evs = tr["traceEvents"] if isinstance(tr, dict) else tr
    pname, tname = {}, {}
    for e in evs:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e.get("args", {}).get("name", str(e["pid"]))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", str(e.get("tid")))
    planes = {}
    for e in evs:
        if e.get("ph") != "X":
            continue
        pid, tid = e.get("pid"), e.get("tid")
        p = planes.setdefault(pname.get(pid, str(pid)), {})
        p.setdefault(tname.get((pid, tid), str(tid)), []).append(
            (e.get("name", ""), float(e["ts"]) * 1e3, float(e.get("dur", 0)) * 1e3, dict(e.get("args") or {})))
    return [(pn, list(lines.items())) for pn, lines in planes.items()]


def extract(planes):
    """Kernel events per device, host step windows, host launch times, and what was found."""
    found = dict(planes=[p for p, _ in planes], device_lines={}, stat_keys=set(), mode=None)
    devices, steps, launches = {}, [], {}
    gpu_re = re.compile(r"/device:(GPU|TPU):(\d+)")
    for pn, lines in planes:
        m = gpu_re.search(pn)
        if m:
            dev = f"{m.group(1)}:{m.group(2)}"
            names = [ln for ln, _ in lines]
            stream_lines = [ln for ln in names if ln.lower().startswith("stream")]
            keep = stream_lines or [ln for ln in names if ln.lower() not in DERIVED_LINES]
            found["device_lines"][dev] = names
            for ln, evs in lines:
                if ln not in keep:
                    continue
                for name, t0, dur, st in evs:
                    found["stat_keys"].update(st.keys())
                    op = st.get("hlo_op") or st.get("tf_op") or st.get("level 0") or ""
                    devices.setdefault(dev, []).append(dict(
                        name=name, t0=t0, t1=t0 + dur, line=ln, hlo_op=str(op),
                        corr=st.get("correlation_id"), details=st.get("kernel_details")))
        else:  # host planes: step annotations, launch API calls (with a correlation id)
            for ln, evs in lines:
                for name, t0, dur, st in evs:
                    if name == STEP_NAME:
                        steps.append((int(st.get("step_num", len(steps))), t0, t0 + dur))
                    elif "correlation_id" in st and re.search(r"launch", name, re.I):
                        launches[st["correlation_id"]] = (t0, name)
    if devices:
        found["mode"] = "gpu"
    else:  # CPU backend: XLA thunks on the host plane carry hlo_op and device_ordinal
        found["mode"] = "cpu"
        for pn, lines in planes:
            if not pn.startswith("/host"):
                continue
            for ln, evs in lines:
                for name, t0, dur, st in evs:
                    if "hlo_op" not in st or name.startswith("end: "):
                        continue
                    found["stat_keys"].update(st.keys())
                    dev = f"CPU:{st.get('device_ordinal', 0)}"
                    found["device_lines"].setdefault(dev, [])
                    if ln not in found["device_lines"][dev]:
                        found["device_lines"][dev].append(ln)
                    devices.setdefault(dev, []).append(dict(
                        name=str(st.get("hlo_op") or name), t0=t0, t1=t0 + dur, line=ln,
                        hlo_op=str(st.get("hlo_op", "")), corr=None))
    cpu = found["mode"] == "cpu"
    if cpu:  # control-flow thunks (while, conditional, call) contain their bodies' thunks: keep the leaves
        for dev, evs in devices.items():
            keep = []
            for ln in {e["line"] for e in evs}:
                le = sorted((e for e in evs if e["line"] == ln), key=lambda e: (e["t0"], -e["t1"]))
                for i, e in enumerate(le):
                    nxt = le[i + 1] if i + 1 < len(le) else None
                    if not (nxt is not None and nxt["t0"] < e["t1"] and nxt["t1"] <= e["t1"]):
                        keep.append(e)
            found.setdefault("dropped_parent_thunks", {})[dev] = len(evs) - len(keep)
            devices[dev] = keep
    names, details = {}, {}
    for evs in devices.values():
        for e in evs:
            e["cls"] = classify(e["name"], e["hlo_op"], cpu=cpu)
            e["kernel"] = short_kernel(e["name"]) if not cpu else e["name"]
            names.setdefault(e["cls"], set()).add(e["kernel"])
            if e.get("details") and e["cls"] != "xla":
                ds = details.setdefault(e["kernel"], [])
                if str(e["details"]) not in ds and len(ds) < 3:
                    ds.append(str(e["details"]))
    found["kernel_details"] = details
    found["stat_keys"] = sorted(found["stat_keys"])
    found["kernel_names_by_class"] = {c: sorted(v)[:25] for c, v in sorted(names.items())}
    found["host_steps"] = len(steps)
    found["host_launch_events"] = len(launches)
    return devices, sorted(steps), launches, found


def load_events(trace_dir):
    xp, pf, tj = find_trace_files(trace_dir)
    errors = []
    for kind, paths, loader in (("xplane", xp, load_xplane), ("perfetto", pf, load_trace_json),
                                ("trace.json", tj, load_trace_json)):
        if not paths:
            continue
        try:
            planes = []
            for p in paths:  # one file per host
                planes += loader(p)
            devices, steps, launches, found = extract(planes)
            if devices:
                found["source"] = kind
                found["files"] = [os.path.relpath(p, trace_dir) for p in paths]
                found["loader_errors"] = errors
                return devices, steps, launches, found
            errors.append(f"{kind}: no device events")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{kind}: {type(e).__name__}: {e}")
    raise RuntimeError(f"no usable trace under {trace_dir}: files xplane={len(xp)} perfetto={len(pf)} "
                       f"trace.json={len(tj)}; {errors}")


# ---- analysis ---------------------------------------------------------------------------------------


def split_by_gaps(evs, n):
    """n groups cut at the n - 1 longest gaps in the device's busy time."""
    u = union([[e["t0"], e["t1"]] for e in evs])
    if n <= 1 or len(u) < n:
        return [evs]
    gaps = sorted(range(len(u) - 1), key=lambda i: -(u[i + 1][0] - u[i][1]))[:n - 1]
    cuts = sorted(u[i + 1][0] for i in gaps)
    out = [[] for _ in range(n)]
    for e in evs:
        out[int(np.searchsorted(cuts, e["t0"], side="right"))].append(e)
    return out


def split_steps(evs, steps):
    """Kernel events per traced step: by the host step windows (each step blocks until ready, so a
    step's kernels start after its window opens and before the next one opens). If that leaves a
    step empty or > 5 % of the kernels outside every window (clocks not aligned), cut at the
    longest idle gaps instead. Returns (groups, method)."""
    if not steps:
        return [evs], "one window (no host step annotations)"
    starts = [s[1] for s in steps]
    out = [[] for _ in steps]
    outside = 0
    for e in evs:
        i = int(np.searchsorted(starts, e["t0"], side="right")) - 1
        if i >= 0:
            out[i].append(e)
        else:
            outside += 1
    if outside <= 0.05 * len(evs) and all(out):
        return out, "host step windows"
    return split_by_gaps(evs, len(steps)), f"longest gaps ({outside} kernels before the first host step)"


def critical_path(evs, tol_ns=2000.0):
    """Walk back from the last kernel: each predecessor is the kernel that ended last before (or
    within tol of) the current one's start. Returns the chain oldest first, with the gap before each."""
    if not evs:
        return []
    by_end = sorted(evs, key=lambda e: e["t1"])
    ends = [e["t1"] for e in by_end]
    cur = by_end[-1]
    chain = [(cur, 0.0)]
    for _ in range(len(evs)):
        i = int(np.searchsorted(ends, cur["t0"] + tol_ns, side="right")) - 1
        while i >= 0 and (by_end[i] is cur or by_end[i]["t0"] >= cur["t0"]):
            i -= 1
        if i < 0:
            break
        prev = by_end[i]
        chain[-1] = (cur, max(0.0, cur["t0"] - prev["t1"]))
        chain.append((prev, 0.0))
        cur = prev
    chain.reverse()
    return chain


def _label(e):
    return e["hlo_op"] or e["kernel"]


def analyse_step(evs, host_ms=None, min_op_ms=0.05):
    if not evs:
        return None
    t_start = min(e["t0"] for e in evs)
    t_end = max(e["t1"] for e in evs)
    span = t_end - t_start
    u_all = union([[e["t0"], e["t1"]] for e in evs])
    u_comm = union([[e["t0"], e["t1"]] for e in evs if e["cls"] == "comm"])
    u_ours = union([[e["t0"], e["t1"]] for e in evs if e["cls"] in OURS])
    u_comp = union([[e["t0"], e["t1"]] for e in evs if e["cls"] != "comm"])
    ms = 1e-6
    by_class = {c: dict(ms=0.0, n=0) for c in CLASSES}
    kernels, ops = {}, {}
    for e in evs:
        d = (e["t1"] - e["t0"]) * ms
        by_class[e["cls"]]["ms"] += d
        by_class[e["cls"]]["n"] += 1
        k = kernels.setdefault(e["kernel"], dict(cls=e["cls"], ms=0.0, n=0))
        k["ms"] += d
        k["n"] += 1
        if e["hlo_op"]:
            o = ops.setdefault(e["hlo_op"], dict(cls=e["cls"], ms=0.0, n=0))
            o["ms"] += d
            o["n"] += 1
    comm_with_ours = measure(intersect(u_comm, u_ours))
    comm_with_comp = measure(intersect(u_comm, u_comp))
    r = dict(
        host_ms=host_ms, span_ms=span * ms, busy_ms=measure(u_all) * ms, idle_ms=(span - measure(u_all)) * ms,
        compute_busy_ms=measure(u_comp) * ms, ours_busy_ms=measure(u_ours) * ms,
        comm_busy_ms=measure(u_comm) * ms, comm_overlap_ours_ms=comm_with_ours * ms,
        comm_overlap_compute_ms=comm_with_comp * ms, comm_alone_ms=(measure(u_comm) - comm_with_comp) * ms,
        comm_hidden_frac=(comm_with_comp / measure(u_comm)) if u_comm else None,
        by_class={c: v for c, v in by_class.items() if v["n"]},
        n_kernels=len(evs), streams=sorted({e["line"] for e in evs}))
    r["kernels"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["ms"])[:25])
    r["ops"] = dict(sorted(ops.items(), key=lambda kv: -kv[1]["ms"])[:25])
    # each communication kernel, with what ran beside it
    comm = []
    ours_evs = [e for e in evs if e["cls"] in OURS]
    for e in sorted((e for e in evs if e["cls"] == "comm"), key=lambda e: e["t0"]):
        # a transfer whose start sits right at the end of one of our kernels may have waited for SMs
        ends = [o["t1"] for o in ours_evs if o["t1"] <= e["t0"] + 1000.0]
        at_start = [_label(o) for o in ours_evs if o["t0"] < e["t0"] < o["t1"]]
        comm.append(dict(op=_label(e), kernel=e["kernel"], t_ms=(e["t0"] - t_start) * ms,
                         ms=(e["t1"] - e["t0"]) * ms, with_ours_ms=overlap_with(e["t0"], e["t1"], u_ours) * ms,
                         with_compute_ms=overlap_with(e["t0"], e["t1"], u_comp) * ms,
                         launch_to_start_ms=e.get("launch_delay_ms"),
                         ours_running_at_start=at_start[0] if at_start else None,
                         since_last_ours_end_ms=(e["t0"] - max(ends)) * ms if ends else None))
    r["comm_kernels"] = comm
    # main ops in time order, with idle gaps
    tl, small_n, small_ms = [], 0, 0.0
    for e in sorted(evs, key=lambda e: e["t0"]):
        d = (e["t1"] - e["t0"]) * ms
        if d < min_op_ms and e["cls"] not in ("comm",) + OURS:
            small_n += 1
            small_ms += d
            continue
        other = u_ours if e["cls"] == "comm" else u_comm
        tl.append(dict(t_ms=round((e["t0"] - t_start) * ms, 4), ms=round(d, 4), cls=e["cls"], op=_label(e),
                       kernel=e["kernel"], stream=e["line"],
                       overlap_ms=round(overlap_with(e["t0"], e["t1"], other) * ms, 4)))
    for (a0, a1), (b0, b1) in zip(u_all, u_all[1:]):
        if (b0 - a1) * ms >= min_op_ms / 5:  # idle gaps from 10 us (default)
            tl.append(dict(t_ms=round((a1 - t_start) * ms, 4), ms=round((b0 - a1) * ms, 4), cls="idle", op="(idle)",
                           kernel="", stream="", overlap_ms=0.0))
    tl.sort(key=lambda x: x["t_ms"])
    r["timeline"] = tl
    r["timeline_omitted"] = dict(n=small_n, ms=small_ms)
    # critical path; consecutive ops of one class on one stream with gaps < min_op_ms / 5 merged
    cpath, segs = critical_path(evs), []
    cp_class = {}
    for e, gap in cpath:  # gap: idle time on the path just before e
        d, gap = (e["t1"] - e["t0"]) * ms, gap * ms
        cp_class[e["cls"]] = cp_class.get(e["cls"], 0.0) + d
        if segs and segs[-1]["cls"] == e["cls"] and segs[-1]["stream"] == e["line"] and gap < min_op_ms / 5:
            s = segs[-1]
            s["ms"] += d
            s["small_gaps_ms"] += gap
            s["n"] += 1
            s["last"] = _label(e)
        else:
            if segs:
                segs[-1]["gap_after_ms"] = gap
            segs.append(dict(t_ms=(e["t0"] - t_start) * ms, cls=e["cls"], stream=e["line"], first=_label(e),
                             last=_label(e), n=1, ms=d, small_gaps_ms=0.0, gap_after_ms=0.0))
    r["critical_path"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()} for s in segs]
    r["critical_path_ms_by_class"] = cp_class
    r["critical_path_gaps_ms"] = sum(g for _, g in cpath) * ms
    return r


SCALARS = ("host_ms", "span_ms", "busy_ms", "idle_ms", "compute_busy_ms", "ours_busy_ms", "comm_busy_ms",
           "comm_overlap_ours_ms", "comm_overlap_compute_ms", "comm_alone_ms", "critical_path_gaps_ms")


def summarize(trace_dir, min_op_ms=0.05, skip_steps=0, platform=None):
    devices, steps, launches, found = load_events(trace_dir)
    if platform == "gpu" and found["mode"] != "gpu":
        raise RuntimeError(f"no GPU device planes in the trace (CUPTI not loaded?); planes {found['planes']}")
    for evs in devices.values():
        for e in evs:
            if e["corr"] is not None and e["corr"] in launches:
                e["launch_delay_ms"] = (e["t0"] - launches[e["corr"]][0]) * 1e-6
    out = dict(found=found, devices={})
    host = {s[0]: (s[2] - s[1]) * 1e-6 for s in steps}
    for dev in sorted(devices):
        per, method = split_steps(devices[dev], steps)
        found.setdefault("step_split", {})[dev] = method
        if len(per) != len(steps):
            steps_d = []
        else:
            steps_d = steps
        res = []
        for i, evs in enumerate(per):
            if i < skip_steps and len(per) > skip_steps:
                continue
            r = analyse_step(evs, host_ms=host.get(steps_d[i][0]) if steps_d else None, min_op_ms=min_op_ms)
            if r is not None:
                r["step"] = steps_d[i][0] if steps_d else i
                res.append(r)
        if not res:
            continue
        mean = {}
        for k in SCALARS:
            vals = [r[k] for r in res if r.get(k) is not None]
            if vals:
                mean[k] = statistics.fmean(vals)
                mean[k + "_min"], mean[k + "_max"] = min(vals), max(vals)
        mean["by_class"] = {c: dict(ms=statistics.fmean([r["by_class"].get(c, {}).get("ms", 0.0) for r in res]),
                                    n=statistics.fmean([r["by_class"].get(c, {}).get("n", 0) for r in res]))
                            for c in CLASSES if any(c in r["by_class"] for r in res)}
        mean["critical_path_ms_by_class"] = {
            c: statistics.fmean([r["critical_path_ms_by_class"].get(c, 0.0) for r in res])
            for c in CLASSES if any(c in r["critical_path_ms_by_class"] for r in res)}
        med = sorted(res, key=lambda r: r["span_ms"])[len(res) // 2]
        out["devices"][dev] = dict(
            steps=[{k: r.get(k) for k in SCALARS + ("step", "n_kernels", "by_class")} for r in res],
            mean=mean, median_step=med)
    return out


# ---- markdown -----------------------------------------------------------------------------------------


def _f(x, spec="{:.3f}"):
    return "–" if x is None else spec.format(x)


def derived(progs):
    """The differences that answer 'where do the exposed communication and the compute overhead go'."""
    def mean(p, dev):
        return (((progs.get(p) or {}).get("summary") or {}).get("devices") or {}).get(dev, {}).get("mean")

    def cls(mm, *cs):
        return sum(mm["by_class"].get(c, {}).get("ms", 0.0) for c in cs) if mm else None

    cp_devs = sorted((((progs.get("cp") or {}).get("summary") or {}).get("devices") or {}))
    one = mean("one", cp_devs[0] if cp_devs else "")
    if not cp_devs:
        return []
    P = len(cp_devs)
    rows = []

    def row(label, fn):
        vals = []
        for dev in cp_devs:
            try:
                v = fn(dev)
            except (TypeError, KeyError, ZeroDivisionError):
                v = None
            vals.append(_f(v))
        rows.append(f"| {label} | " + " | ".join(vals) + " |")

    c, k, m = (lambda d: mean("cp", d)), (lambda d: mean("compute", d)), (lambda d: mean("comm", d))
    row("cp span − compute-alone span (exposed comm + interference)", lambda d: c(d)["span_ms"] - k(d)["span_ms"])
    row("cp comm kernels running alone (exposed on this GPU)", lambda d: c(d)["comm_alone_ms"])
    row("cp idle − compute-alone idle (waits: transfers, host, syncs)", lambda d: c(d)["idle_ms"] - k(d)["idle_ms"])
    row("cp our kernels − compute-alone our kernels (slowdown beside NCCL)",
        lambda d: cls(c(d), *OURS) - cls(k(d), *OURS))
    row("cp comm kernels − comm-alone comm kernels (NCCL slowdown beside attention)",
        lambda d: cls(c(d), "comm") - cls(m(d), "comm"))
    row(f"compute-alone our kernels − one-GPU our kernels / {P} (split overhead of the kernels)",
        lambda d: cls(k(d), *OURS) - cls(one, *OURS) / P)
    row(f"compute-alone xla+memcpy+memset − one-GPU's / {P} (merge, slicing, copies)",
        lambda d: cls(k(d), "xla", "memcpy", "memset") - cls(one, "xla", "memcpy", "memset") / P)
    row(f"compute-alone span − one-GPU span / {P}", lambda d: k(d)["span_ms"] - one["span_ms"] / P)
    row("cp comm kernels beside our kernels / all comm kernel time",
        lambda d: c(d)["comm_overlap_ours_ms"] / c(d)["comm_busy_ms"])
    return ["## Derived (ms per step unless a ratio; means over traced steps)", "",
            "| figure | " + " | ".join(cp_devs) + " |", "|---|" + "---:|" * len(cp_devs)] + rows + [""]


def render(env, progs):
    out = [f"# CP profile, {env.get('devices')}", "",
           "Per device, mean over the traced steps, ms per step. `comm` = NCCL kernels (GPU) / collective "
           "thunks (CPU); `fwd`/`bwd`/`bwd_aux`/`meta` = our kernels; `xla` = fusions and other XLA kernels. "
           "busy = union of all kernels, idle = span - busy, comm alone = comm time with no other kernel "
           "on that device. Untraced step time is the median of the timed calls without the profiler.", "",
           "```", json.dumps({k: env[k] for k in sorted(env) if k != "args"}, default=str), "```", ""]
    cols = []
    for p, s in progs.items():
        for dev, d in (s.get("summary", {}).get("devices") or {}).items():
            cols.append((p, dev, d["mean"]))
    if cols:
        out += ["## Comparison", "",
                "| | " + " | ".join(f"{p} {dev}" for p, dev, _ in cols) + " |",
                "|---|" + "---:|" * len(cols)]
        out.append("| untraced step ms | " + " | ".join(_f(progs[p].get("untraced_ms")) for p, _, _ in cols) + " |")
        for k in SCALARS:
            out.append(f"| {k} | " + " | ".join(_f(m.get(k)) for _, _, m in cols) + " |")
        for c in CLASSES:
            if any(c in m["by_class"] for _, _, m in cols):
                out.append(f"| Σ {c} ms (n) | " + " | ".join(
                    (f"{m['by_class'][c]['ms']:.3f} ({m['by_class'][c]['n']:.0f})" if c in m["by_class"] else "–")
                    for _, _, m in cols) + " |")
        for c in CLASSES:
            if any(c in m.get("critical_path_ms_by_class", {}) for _, _, m in cols):
                out.append(f"| critical path: {c} | " + " | ".join(
                    _f(m.get("critical_path_ms_by_class", {}).get(c)) for _, _, m in cols) + " |")
        out.append("")
    out += derived(progs)
    for p, s in progs.items():
        out += [f"## Program `{p}`", ""]
        for k in ("untraced_ms", "traced_host_ms", "error", "parse_error", "trace_files"):
            if s.get(k) is not None:
                out.append(f"- {k}: {s[k]}")
        summ = s.get("summary")
        if not summ:
            out.append("")
            continue
        fd = summ["found"]
        out += [f"- trace: {fd.get('source')} ({fd.get('mode')}), host steps {fd.get('host_steps')}, host launch "
                f"events {fd.get('host_launch_events')}, stat keys {fd.get('stat_keys')}",
                f"- kernel names by class: {json.dumps(fd.get('kernel_names_by_class'))[:1500]}",
                f"- kernel details (grid, block, registers, smem; ours / comm / copies): "
                f"{json.dumps(fd.get('kernel_details'))[:2000]}",
                f"- steps split by: {fd.get('step_split')}", ""]
        for dev, d in summ["devices"].items():
            m = d["median_step"]
            out += [f"### {p} {dev} (median step {m['step']}: span {m['span_ms']:.3f} ms, busy {m['busy_ms']:.3f}, "
                    f"idle {m['idle_ms']:.3f}, comm {m['comm_busy_ms']:.3f} of which alone {m['comm_alone_ms']:.3f}, "
                    f"{m['n_kernels']} kernels on {len(m['streams'])} streams)", "",
                    "| kernel | class | ms | n |", "|---|---|---:|---:|"]
            out += [f"| `{k}` | {v['cls']} | {v['ms']:.3f} | {v['n']} |" for k, v in list(m["kernels"].items())[:15]]
            if m["comm_kernels"]:
                out += ["", "| comm op | start ms | ms | beside ours ms | beside compute ms | launch→start ms | "
                        "ours running at start | since last ours end ms |", "|---|---:|---:|---:|---:|---:|---|---:|"]
                out += [f"| {c['op']} | {c['t_ms']:.3f} | {c['ms']:.3f} | {c['with_ours_ms']:.3f} | "
                        f"{c['with_compute_ms']:.3f} | {_f(c['launch_to_start_ms'])} | {c['ours_running_at_start'] or '–'} | "
                        f"{_f(c['since_last_ours_end_ms'])} |" for c in m["comm_kernels"]]
            out += ["", f"Critical path (gaps {m['critical_path_gaps_ms']:.3f} ms):", "",
                    "| start ms | class | stream | ops | n | kernel ms | small gaps ms | gap after ms |",
                    "|---:|---|---|---|---:|---:|---:|---:|"]
            out += [f"| {c['t_ms']:.3f} | {c['cls']} | {c['stream'][:24]} | {c['first']}"
                    f"{' … ' + c['last'] if c['n'] > 1 else ''} | {c['n']} | {c['ms']:.3f} | {c['small_gaps_ms']:.3f} | "
                    f"{c['gap_after_ms']:.3f} |" for c in m["critical_path"][:60]]
            tl = m["timeline"]
            out += ["", f"Main ops in time order ({len(tl)}; {m['timeline_omitted']['n']} small XLA ops, "
                        f"{m['timeline_omitted']['ms']:.3f} ms, left out):", "",
                    "| start ms | ms | class | op | stream | overlap ms |", "|---:|---:|---|---|---|---:|"]
            out += [f"| {x['t_ms']:.3f} | {x['ms']:.3f} | {x['cls']} | {x['op'][:48]} | {x['stream'][:24]} | "
                    f"{x['overlap_ms']:.3f} |" for x in tl[:120]]
            out.append("")
    return "\n".join(out) + "\n"


# ---- driver -------------------------------------------------------------------------------------------


def tar_traces(trace_root, dest, max_mib):
    """The raw traces in one archive (the device run returns at most 8 files), within max_mib:
    xplane first, then the JSON traces while they fit."""
    files = sorted(glob.glob(os.path.join(str(trace_root), "**", "*"), recursive=True))
    files = [f for f in files if os.path.isfile(f)]
    order = sorted(files, key=lambda f: (not f.endswith(".xplane.pb"), "perfetto" in f, os.path.getsize(f)))
    budget, kept, dropped = max_mib * 2**20, [], []
    for f in order:  # gzip shrinks the xplane a lot; count raw size / 3 as an estimate
        est = os.path.getsize(f) if f.endswith(".gz") else os.path.getsize(f) / 3
        if est <= budget:
            kept.append(f)
            budget -= est
        else:
            dropped.append(os.path.relpath(f, trace_root))
    with tarfile.open(dest, "w:gz") as t:
        for f in kept:
            t.add(f, arcname=os.path.relpath(f, os.path.dirname(str(trace_root).rstrip("/"))))
    return dict(path=str(dest), files=len(kept), dropped=dropped, mib=os.path.getsize(dest) / 2**20)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens-per-device", type=int, default=65536)
    ap.add_argument("--mask", default="causal_document")
    ap.add_argument("--comm", default="ring-pruned", choices=list(cb.COMMS))
    cb.add_program_args(ap)
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma list of " + ", ".join(PROGRAMS))
    ap.add_argument("--fwd-only", action="store_true", help="profile the forward program instead of fwd+bwd")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untraced calls before timing (default: JAX_PGLE_PROFILING_RUNS + 2, at least 3)")
    ap.add_argument("--iters", type=int, default=3, help="untraced timed calls (no profiler)")
    ap.add_argument("--steps", type=int, default=3, help="traced calls")
    ap.add_argument("--min-op-ms", type=float, default=0.05, help="timeline: leave out smaller XLA ops")
    ap.add_argument("--time-limit-s", type=float, default=150, help="start no new program after this")
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--out-prefix", default=None)
    ap.add_argument("--trace-dir", default=None, help="where the raw traces go (default OUT_DIR/<prefix>_traces)")
    ap.add_argument("--max-tar-mib", type=float, default=15)
    ap.add_argument("--no-tar", action="store_true")
    ap.add_argument("--parse-only", default=None,
                    help="no run: summarise the traces under this dir (one subdir per program, as written)")
    a = ap.parse_args()
    P = jax.device_count()
    prefix = a.out_prefix or f"cp_profile_{P}x_{time.strftime('%Y-%m-%d')}"
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_root = Path(a.trace_dir or (out_dir / f"{prefix}_traces"))

    if a.parse_only:
        progs = {}
        for d in sorted(Path(a.parse_only).iterdir()):
            if d.is_dir():
                try:
                    progs[d.name] = dict(summary=summarize(d, a.min_op_ms))
                except Exception as e:  # noqa: BLE001
                    progs[d.name] = dict(parse_error=f"{type(e).__name__}: {e}")
        env = dict(devices="(parsed offline)", parsed=str(a.parse_only))
        (out_dir / f"{prefix}.json").write_text(json.dumps(dict(env=env, programs=progs), indent=1, default=str))
        (out_dir / f"{prefix}.md").write_text(render(env, progs))
        print(f"wrote {out_dir / prefix}.json/.md")
        return

    t_start = time.time()
    pgle_runs = int(os.environ.get("JAX_PGLE_PROFILING_RUNS", "0") or 0) \
        if os.environ.get("JAX_ENABLE_PGLE", "").lower() in ("1", "true", "yes") else 0
    warmup = a.warmup if a.warmup is not None else max(3, pgle_runs + 2)
    impl, cp_kwargs, pruned_kwargs = cb.program_kwargs(a)
    devs = np.array(jax.devices())
    mesh = Mesh(devs, ("cp",))
    dev0 = devs[0]
    m, L = a.chunks_per_rank, a.tokens_per_device
    S = P * L
    dt = jax.numpy.dtype(a.dtype)
    env = dict(devices=f"{P} x {dev0.device_kind}", platform=dev0.platform, jax=jax.__version__, S=S,
               tokens_per_device=L, H=a.heads, K=a.kv_heads, d=a.head_dim, dtype=a.dtype, mask=a.mask,
               comm=a.comm, plan=a.plans.split(",")[0], chunks_per_rank=m, implementation=a.implementation,
               sm_margin=a.sm_margin, overlap_margin=a.overlap_margin, schedule_hints=a.schedule_hints,
               skip_masked=not a.no_skip_masked, piece_vjp=not a.autodiff_merge, phase="fwd" if a.fwd_only else "fwdbwd",
               warmup=warmup, iters=a.iters, steps=a.steps, xla_flags=os.environ.get("XLA_FLAGS", ""),
               pgle=os.environ.get("JAX_ENABLE_PGLE", ""), pgle_runs=os.environ.get("JAX_PGLE_PROFILING_RUNS", ""),
               nccl_nvls=os.environ.get("NCCL_NVLS_ENABLE"))
    print("env:", env, flush=True)
    progs = {}

    def save():
        (out_dir / f"{prefix}.json").write_text(json.dumps(dict(env=env, programs=progs), indent=1, default=str))
        (out_dir / f"{prefix}.md").write_text(render(env, progs))

    q, k, v, g = cb.make_inputs(S, a.heads, a.kv_heads, a.head_dim, dt, a.seed, dev0)
    mk = jf.masks.benchmark_suite(S, seed=a.seed)[a.mask]
    mask_ind = jax.device_put(mk.startend_row_indices, dev0)
    plan, loads, need = cb.cp_plan(mk, P, m, env["plan"])
    env.update(plan_loads=[float(x) for x in loads], plan=plan.tolist())
    plan_j = jax.numpy.asarray(plan)
    shard = NamedSharding(mesh, PS(None, "cp"))
    qp, kp, vp, gp = (jax.device_put(cp.permute_tokens(x, plan_j), shard) for x in (q, k, v, g))
    ind_r = jax.device_put(mask_ind, NamedSharding(mesh, PS()))
    sched = cb.cp_schedule(a.comm, P, m, plan, need)

    def build(name):
        """(callable, args, context manager) of one program."""
        if name == "one":
            f1, b1 = cb.one_gpu_programs(mk, impl)
            return ((f1, (q, k, v, mask_ind)) if a.fwd_only else (b1, (q, k, v, mask_ind, g))), contextlib.nullcontext
        ctx = cb.collectives_off if name == "compute" else contextlib.nullcontext
        fn = cb.attention_off if name == "comm" else None
        with ctx():  # the stand-ins must be in place while the program is traced
            f, b = cb.cp_programs(mesh, mk, a.comm, sched, impl, cp_kwargs, pruned_kwargs, attention_fn=fn)
        return ((f, (qp, kp, vp, ind_r, plan_j)) if a.fwd_only else (b, (qp, kp, vp, ind_r, plan_j, gp))), ctx

    opts = jax.profiler.ProfileOptions()
    try:
        opts.python_tracer_level = 0  # no Python frames: small traces
    except Exception:  # noqa: BLE001
        pass
    for name in a.programs.split(","):
        if a.time_limit_s and time.time() - t_start > a.time_limit_s:
            progs[name] = dict(error=f"skipped: time limit {a.time_limit_s} s")
            save()
            continue
        rec = progs.setdefault(name, {})
        tdir = trace_root / name
        shutil.rmtree(tdir, ignore_errors=True)  # no stale trace from an earlier run
        t0 = time.time()
        try:
            (fn, args), ctx = build(name)
            with ctx():
                for _ in range(warmup):
                    jax.block_until_ready(fn(*args))
                rec["warmup_s"] = time.time() - t0
                ts = []
                for _ in range(a.iters):
                    t = time.perf_counter()
                    jax.block_until_ready(fn(*args))
                    ts.append(time.perf_counter() - t)
                rec["untraced_ms"] = float(np.median(ts)) * 1e3 if ts else None
                host = []
                with jax.profiler.trace(str(tdir), create_perfetto_trace=True, profiler_options=opts):
                    for i in range(a.steps):
                        t = time.perf_counter()
                        with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=i):
                            jax.block_until_ready(fn(*args))
                        host.append((time.perf_counter() - t) * 1e3)
                rec["traced_host_ms"] = [round(x, 3) for x in host]
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        # whatever was written, also when the call failed (e.g. the xplane before a failed JSON export)
        files = {os.path.relpath(p, trace_root): os.path.getsize(p)
                 for p in glob.glob(str(tdir / "**" / "*"), recursive=True) if os.path.isfile(p)}
        if files:
            rec["trace_files"] = files
        rec["wall_s"] = time.time() - t0
        if "trace_files" in rec:
            try:
                rec["summary"] = summarize(trace_root / name, a.min_op_ms, platform=dev0.platform)
            except Exception as e:  # noqa: BLE001  (the raw traces still go into the archive)
                rec["parse_error"] = f"{type(e).__name__}: {str(e)[:400]}"
                traceback.print_exc()
        line = {k: rec.get(k) for k in ("untraced_ms", "traced_host_ms", "wall_s", "error", "parse_error")}
        for dev, d in (rec.get("summary") or {}).get("devices", {}).items():
            mm = d["mean"]
            line[dev] = {k: round(mm[k], 3) for k in ("span_ms", "busy_ms", "idle_ms", "comm_busy_ms",
                                                       "comm_alone_ms") if k in mm}
            line[dev]["by_class"] = {c: round(v["ms"], 3) for c, v in mm["by_class"].items()}
        print(name, json.dumps(line, default=str), flush=True)
        save()
    if not a.no_tar and trace_root.exists():
        try:
            env["traces_tar"] = tar_traces(trace_root, out_dir / f"{prefix}_traces.tar.gz", a.max_tar_mib)
        except Exception as e:  # noqa: BLE001
            env["traces_tar"] = f"failed: {type(e).__name__}: {e}"
    env["total_s"] = time.time() - t_start
    save()
    print(f"wrote {out_dir / prefix}.json, .md; traces {env.get('traces_tar')}; {env['total_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
