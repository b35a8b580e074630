"""Sustained A/B of forward kernel variants at the power cap (issue 3 analysis).

Short timing loops run at whatever clock the GPU starts with; sustained runs on the H200 are held
at its 700 W cap (1.6-1.8 GHz), where a kernel's memory traffic costs clock (benchmarks/NOTES.md,
session 15). This script times each variant for --secs seconds per phase, alternating the
variants over --rounds rounds per mask (so drift hits all of them alike), samples SM clock and
power (power_probe.ClockSampler), and checks once per mask that every variant's O and LSE equal
the first variant's bit for bit (--check).
Usage (H200): python benchmarks/variant_ab.py --seq 32768 --variants 11 19 --masks full causal --json out.json
Tables of saved runs (any machine): python benchmarks/variant_ab.py --render a.json b.json --md out.md
  (two builds, same variant numbers: --render main_r1.json exp_r1.json main_r2.json exp_r2.json
   --labels main exp main exp)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jax_flashmask import _cuda, masks
from power_probe import ClockSampler, sustained  # a sibling script (benchmarks/ is sys.path[0])


def load_runs(paths, labels=None) -> list[dict]:
    """Saved runs, each with its module label: a file is one run (this script's JSON) or a list of
    ``{"module": label, "data": run}`` (runs of several modules gathered in one file). --labels
    name the files' runs in order (one label per file) and override stored ones."""
    if labels and len(labels) != len(paths):
        raise SystemExit(f"--labels: {len(labels)} labels for {len(paths)} files")
    runs = []
    for i, path in enumerate(paths):
        doc = json.load(open(path))
        for item in doc if isinstance(doc, list) else [doc]:
            run = dict(item["data"]) if "data" in item else dict(item)
            run["module"] = labels[i] if labels else item.get("module", run.get("module", ""))
            runs.append(run)
    return runs


def table_md(runs) -> str:
    """Markdown table of saved runs (the JSON this script writes): per (S, d, mask, variant, module)
    the median TFLOP/s over its phases and each run's own median (runs in order), the change
    against the first module (one module: against the first variant), SM clock and TFLOP/s per
    GHz. Runs of one module with the same (S, d, mask, variant) are repeats (alternated processes)."""
    modules = list(dict.fromkeys(r.get("module", "") for r in runs))
    cols = "| S | d | mask | variant |" + (" module |" if len(modules) > 1 else "")
    lines = [cols + " TFLOP/s | per run | vs first | MHz | TFLOP/s per GHz | bit-identical |",
             "|" + "---|" * (cols.count("|") - 1) + "---:|---|---:|---:|---:|---|"]
    groups: dict = {}  # (S, d, mask, variant, module) -> [(run index, phase)]
    checks = {}
    for i, run in enumerate(runs):
        for p in run["phases"]:
            key = (run["S"], run.get("d", 0), p["mask"], p["variant"], run.get("module", ""))
            groups.setdefault(key, []).append((i, p))
        for name, ok in run.get("checks", {}).items():
            checks[(run["S"], run.get("d", 0), run.get("module", ""), name)] = ok
    base = {}
    for key, xs in groups.items():
        S, d, mask, var, mod = key
        tf = statistics.median(p["tflops"] for _, p in xs)
        ref = (S, d, mask) + ((var,) if len(modules) > 1 else ())
        base.setdefault(ref, tf)
        per_run = " / ".join(f"{statistics.median(p['tflops'] for j, p in xs if j == i):.1f}"
                             for i in dict.fromkeys(j for j, _ in xs))
        mhz = statistics.median(p.get("mhz", 0.0) for _, p in xs)
        tpg = statistics.median(p.get("tflops_per_ghz", 0.0) for _, p in xs)
        same = checks.get((S, d, mod, f"{mask}:v{var}"), "")
        row = f"| {S} | {d} | {mask} | {var} |" + (f" {mod} |" if len(modules) > 1 else "")
        lines.append(f"{row} {tf:.1f} | {per_run} | {tf / base[ref] - 1:+.1%} | {mhz:.0f} | {tpg:.0f} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--masks", nargs="+", default=["full", "causal"])
    ap.add_argument("--variants", type=int, nargs="+")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None, help="also write the markdown table here")
    ap.add_argument("--render", nargs="+", default=None, help="only tabulate these saved JSON runs")
    ap.add_argument("--labels", nargs="+", default=None,
                    help="with --render: one module label per file (A/B of builds that share variant numbers)")
    a = ap.parse_args(argv)
    if a.render:
        text = table_md(load_runs(a.render, a.labels))
        if a.md:
            with open(a.md, "w") as fh:
                fh.write(text)
        print(text, end="")
        return 0
    if not a.variants:
        ap.error("--variants is required (unless --render)")

    S, H, d = a.seq, a.heads, a.d
    B = max(1, a.tokens // S)
    q, k, v = (jax.random.normal(kk, (B, S, H, d), jnp.bfloat16) for kk in jax.random.split(jax.random.PRNGKey(S), 3))
    suite = masks.benchmark_suite(S, 0, batch=B)
    smi = ClockSampler()
    phases, checks = [], {}
    for name in a.masks:
        m = suite[name]
        bounds = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
        flops = 4.0 * B * H * S * S * d * (1 - float(masks.block_sparsity(m, S, 128)))
        fns = {var: jax.jit(lambda q, k, v, b, var=var: _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=var))
               for var in a.variants}
        if a.check:
            o0, l0 = fns[a.variants[0]](q, k, v, bounds)
            for var in a.variants[1:]:
                o, l = fns[var](q, k, v, bounds)
                checks[f"{name}:v{var}"] = bool(jnp.array_equal(o, o0) & jnp.array_equal(l, l0))
                print(f"{name}: v{var} bitwise equal to v{a.variants[0]}: {checks[f'{name}:v{var}']}", flush=True)
            del o0, l0
        for rnd in range(a.rounds):
            for var in (a.variants if rnd % 2 == 0 else a.variants[::-1]):
                ph = sustained(fns[var], (q, k, v, bounds), a.secs)
                phases.append(dict(mask=name, variant=var, round=rnd, **ph, tflops=flops / ph["ms"] / 1e9))
                time.sleep(0.5)
    smi.stop()
    print(f"S={S} B={B} H={H} d={d}")
    print(f"{'mask':16s} {'var':>4s} {'rnd':>3s} {'ms':>8s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>5s} {'TF/GHz':>7s}")
    for p in phases:
        smi.annotate(p)
        print(f"{p['mask']:16s} {p['variant']:4d} {p['round']:3d} {p['ms']:8.3f} {p['tflops']:8.1f} "
              f"{p.get('mhz', 0):6.0f} {p.get('watts', 0):5.0f} {p.get('tflops_per_ghz', 0):7.1f}")
    run = dict(device=str(jax.devices()[0]), B=B, S=S, H=H, d=d, argv=sys.argv, checks=checks, phases=phases)
    text = table_md([run])  # the per-variant medians, also the summary on the console
    print(text, end="")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(run, fh, indent=1)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
