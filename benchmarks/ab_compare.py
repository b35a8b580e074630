"""A/B table of two builds from bench_attention.py or kernel_timing.py JSON files: per cell, the
time of each build and their ratio.

Each build runs in its own process (its install on PYTHONPATH), one JSON file per run:

    python benchmarks/ab_compare.py --a new --b old --json ab_new_s32768_d128.json ab_old_s32768_d128.json ...

The label of a file is whichever of `--a` / `--b` its name holds (split at "_"); a name holding
both, or neither, is an error.
- bench_attention.py files ("results"): rows are matched by (S, d, mask), forward and
  forward+backward ms. A configuration measured twice by the same build (a later rerun, e.g.
  `..._again`) goes into the noise table: the same build against itself is what run-to-run noise is.
- kernel_timing.py files ("rows"), typically ABBA (`ab_new_1.json ab_old_2.json ...`, one process
  each): rows are matched by (S, d, mask, config) and cuDNN's rows by (S, d, mask); each build's
  samples are listed, the ratio is of their medians, and a cell whose samples of the two builds do
  not overlap is marked. With cuDNN rows, each build's speed against cuDNN in the same runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(files, labels):
    """(kind, runs): kind "bench" (bench_attention.py) or "kernel" (kernel_timing.py); runs maps
    (label, S, d, mask[, impl]) to that build's rows in file order."""
    runs, kinds = {}, set()
    for f in files:
        found = [x for x in labels if x in Path(f).stem.split("_")]
        if not found:
            raise SystemExit(f"{f}: its name carries neither label {labels}")
        if len(found) > 1:  # e.g. --a t64 with files named t64_<build>_N: the build is ambiguous
            raise SystemExit(f"{f}: its name carries both labels {labels}; rename the builds or files")
        label = found[0]
        data = json.loads(Path(f).read_text())
        if "rows" in data:  # kernel_timing.py
            kinds.add("kernel")
            for r in data["rows"]:
                impl = "cudnn" if r["impl"].startswith("cudnn") else r["impl"]
                runs.setdefault((label, r["S"], r["d"], r["mask"], impl), []).append(r)
        else:
            kinds.add("bench")
            for r in data["results"]:
                if r.get("status") == "ok":
                    runs.setdefault((label, r["S"], r["d"], r["mask"]), []).append(r)
    if len(kinds) > 1:
        raise SystemExit("--json: bench_attention.py and kernel_timing.py files mixed; compare one kind")
    return (kinds.pop() if kinds else "bench"), runs


def config_order(S, d):
    """Sort key of an (S, d) pair: d = 128 first, then by d, then by S."""
    return (d != 128, d, S)


def configs(runs):
    """The (S, d) pairs of the runs, in config_order."""
    return sorted({(k[1], k[2]) for k in runs}, key=lambda x: config_order(*x))


def spread_line(what: str, xs) -> str:
    return f"{what} over {len(xs)} cells: {min(xs):.3f}–{max(xs):.3f} (median {statistics.median(xs):.3f})  "


def apart(xs, ys) -> bool:
    """Two builds' samples do not overlap (each with two or more)."""
    return len(xs) > 1 and len(ys) > 1 and (max(xs) < min(ys) or min(xs) > max(ys))


def render_kernel(runs, a, b) -> str:
    out = []
    cells = sorted({k[1:] for k in runs}, key=lambda k: (*config_order(k[0], k[1]), k[2], k[3] == "cudnn", k[3]))
    ratios = []
    for S, d in configs(runs):
        out += [f"### S = {S}, d = {d}", "",
                f"| mask | kernel | ms {a} | ms {b} | {a}/{b} | apart |", "|---|---|---|---|---:|---|"]
        for _, _, m, impl in (c for c in cells if c[:2] == (S, d)):
            xs = [r["ms"] for r in runs.get((a, S, d, m, impl), [])]
            ys = [r["ms"] for r in runs.get((b, S, d, m, impl), [])]
            if not xs or not ys:
                continue
            ratio = statistics.median(xs) / statistics.median(ys)
            if impl != "cudnn":
                ratios.append(ratio)
            out.append(f"| {m} | {impl} | {' / '.join(f'{x:.3f}' for x in xs)} | "
                       f"{' / '.join(f'{y:.3f}' for y in ys)} | {ratio:.3f} | {'yes' if apart(xs, ys) else ''} |")
        out.append("")
    if ratios:
        out.append(spread_line(f"{a}/{b} time", ratios))
    for lab in (a, b):  # speed against cuDNN measured in the same runs
        speed = []
        for S, d, m, impl in cells:
            ours, cud = runs.get((lab, S, d, m, impl), []), runs.get((lab, S, d, m, "cudnn"), [])
            if impl != "cudnn" and ours and cud:
                cud_ms = statistics.median(r["ms"] for r in cud)
                speed.append(f"{m} S={S} d={d} {cud_ms / statistics.median(r['ms'] for r in ours):.3f}")
        if speed:
            out.append(f"{lab} speed / cuDNN (medians): " + ", ".join(speed) + "  ")
    return "\n".join(out) + "\n"


def render(runs, a, b) -> str:
    out = []
    spread = {"fwd": [], "fwdbwd": []}
    for S, d in configs(runs):
        masks = [m for (lab, s, dd, m) in runs if lab == a and (s, dd) == (S, d)]
        out += [f"### S = {S}, d = {d}", "",
                f"| mask | fwd ms {a} | fwd ms {b} | {a}/{b} | fwd+bwd ms {a} | fwd+bwd ms {b} | {a}/{b} | check |",
                "|---|---:|---:|---:|---:|---:|---:|---|"]
        for m in masks:
            ra, rb = runs.get((a, S, d, m), [None])[0], runs.get((b, S, d, m), [None])[0]
            if rb is None:
                continue
            cells = []
            for key in ("fwd_ms", "fwdbwd_ms"):
                x, y = ra.get(key), rb.get(key)
                ratio = x / y if x and y else None
                if ratio:
                    spread["fwd" if key == "fwd_ms" else "fwdbwd"].append(ratio)
                cells += [f"{x:.3f}" if x else "—", f"{y:.3f}" if y else "—", f"{ratio:.3f}" if ratio else "—"]
            out.append(f"| {m} | " + " | ".join(cells) + f" | {ra.get('check')} / {rb.get('check')} |")
        out.append("")
    noise = [(k, v) for k, v in runs.items() if len(v) > 1]
    if noise:
        out += ["### Noise: the same build measured again later in the run", "",
                "| S | d | mask | build | fwd ms first / again | fwd+bwd ms first / again |", "|---:|---:|---|---|---|---|"]
        for (lab, S, d, m), (r0, r1) in ((k, v[:2]) for k, v in sorted(noise)):
            out.append(f"| {S} | {d} | {m} | {lab} | {r0['fwd_ms']:.3f} / {r1['fwd_ms']:.3f} | "
                       f"{r0['fwdbwd_ms']:.2f} / {r1['fwdbwd_ms']:.2f} |")
        out.append("")
    for key, xs in spread.items():
        if xs:
            name = "forward" if key == "fwd" else "forward+backward"
            out.append(spread_line(f"{a}/{b} {name}", xs))
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="label of the build under test (in its files' names)")
    ap.add_argument("--b", required=True, help="label of the baseline build")
    ap.add_argument("--json", nargs="+", required=True)
    args = ap.parse_args(argv)
    if args.a == args.b:
        raise SystemExit(f"--a and --b are both {args.a!r}: name two builds")
    kind, runs = load(args.json, (args.a, args.b))
    print((render_kernel if kind == "kernel" else render)(runs, args.a, args.b), end="")


if __name__ == "__main__":
    main()
