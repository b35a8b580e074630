"""A/B table of two builds from bench_attention.py JSON files: per (S, d, mask), forward and
forward+backward ms of each build and their ratio, plus the spread of the ratios.

Each build runs in its own process (its install on PYTHONPATH), one JSON file per configuration:

    python benchmarks/ab_compare.py --a new --b old --json ab_new_s32768_d128.json ab_old_s32768_d128.json ...

The label of a file is the first of `--a` / `--b` found in its name; rows are matched by
(S, d, mask). A configuration measured twice by the same build (a later rerun, e.g. `..._again`)
goes into the noise table: the same build against itself is what run-to-run noise is.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(files, labels):
    runs = {}  # (label, S, d, mask) -> [row, ...] in file order
    for f in files:
        label = next((x for x in labels if x in Path(f).stem.split("_")), None)
        if label is None:
            raise SystemExit(f"{f}: its name carries neither label {labels}")
        for r in json.loads(Path(f).read_text())["results"]:
            if r.get("status") == "ok":
                runs.setdefault((label, r["S"], r["d"], r["mask"]), []).append(r)
    return runs


def render(runs, a, b) -> str:
    out = []
    configs = sorted({(S, d) for (_, S, d, _) in runs}, key=lambda x: (x[1] != 128, x[1], x[0]))
    spread = {"fwd": [], "fwdbwd": []}
    for S, d in configs:
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
            out.append(f"{a}/{b} {name} over {len(xs)} cells: {min(xs):.3f}–{max(xs):.3f} "
                       f"(median {statistics.median(xs):.3f})  ")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="label of the build under test (in its files' names)")
    ap.add_argument("--b", required=True, help="label of the baseline build")
    ap.add_argument("--json", nargs="+", required=True)
    args = ap.parse_args(argv)
    print(render(load(args.json, (args.a, args.b)), args.a, args.b), end="")


if __name__ == "__main__":
    main()
