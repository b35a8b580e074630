"""Sustained A/B of forward kernel variants at the power cap (issue 3 analysis).

Short timing loops run at whatever clock the GPU starts with; sustained runs on the H200 are held
at its 700 W cap (1.6-1.8 GHz), where a kernel's memory traffic costs clock (benchmarks/NOTES.md,
session 15). This script times each variant for --secs seconds per phase, alternating the
variants over --rounds rounds per mask (so drift hits all of them alike), samples SM clock and
power (power_probe.ClockSampler), and checks once per mask that every variant's O and LSE equal
the first variant's bit for bit (--check).
Usage (H200): python benchmarks/variant_ab.py --seq 32768 --variants 11 19 --masks full causal --json out.json
Tables of saved runs (any machine): python benchmarks/variant_ab.py --render a.json b.json --md out.md
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


def table_md(runs) -> str:
    """Markdown table of saved runs (the JSON this script writes): per (S, mask), each variant's
    median TFLOP/s over its phases (change against the first variant), SM clock and TFLOP/s per GHz."""
    lines = ["| S | mask | variant | TFLOP/s | vs first | MHz | TFLOP/s per GHz | bit-identical |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        ph, checks = run["phases"], run.get("checks", {})
        variants = list(dict.fromkeys(p["variant"] for p in ph))
        for mask in dict.fromkeys(p["mask"] for p in ph):
            base = None
            for var in variants:
                xs = [p for p in ph if p["mask"] == mask and p["variant"] == var]
                tf = statistics.median(p["tflops"] for p in xs)
                mhz = statistics.median(p.get("mhz", 0.0) for p in xs)
                tpg = statistics.median(p.get("tflops_per_ghz", 0.0) for p in xs)
                base = tf if base is None else base
                same = checks.get(f"{mask}:v{var}", "")
                lines.append(f"| {run['S']} | {mask} | {var} | {tf:.1f} | {tf / base - 1:+.1%} | {mhz:.0f} | "
                             f"{tpg:.0f} | {same} |")
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
    a = ap.parse_args(argv)
    if a.render:
        runs = [json.load(open(path)) for path in a.render]
        text = table_md(runs)
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
