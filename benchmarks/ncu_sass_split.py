"""Where a kernel's warps spend their time, per SASS instruction, from an ncu source export (no GPU).

Input: `ncu -i R.ncu-rep --page source --csv --print-source sass > R_sass.csv` (optionally
gzipped) of a report taken with `--section SourceCounters`. Each row is one SASS instruction with
its execution count (warp-level) and its warp-state samples by stall reason.

The execution count tells how often an instruction runs, hence what it belongs to: in the forward
kernel, count = tiles x consumer warps for once-per-query-tile code (tile start, epilogue), that
times the loop's trip count for the mainloop, other values for the producer warp. The script prints

* by count: samples of all instructions with the same count (the code's "frequency classes");
* runs: maximal runs of consecutive instructions with one count (a code region) holding at least
  --min-share of the samples, with their commonest opcodes and main stall reasons.

Samples are taken per warp, so shares are shares of warp-time over all resident warps (the
producer's spin loops included), not of the kernel's duration.

    python benchmarks/ncu_sass_split.py benchmarks/results/ncu_2026-12-03s20_fwd11_sw32k_sass.csv.gz
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path: str) -> tuple[list[str], list[list[str]]]:
    """Header and instruction rows of an ncu source CSV (the first line names the kernel)."""
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as fh:
        rows = list(csv.reader(fh))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]


def opcode(sass: str) -> str:
    words = sass.strip().split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")


def split(header: list[str], rows: list[list[str]]) -> dict:
    """Per-count classes and consecutive same-count runs, with samples and stall reasons."""
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col[SAMPLES]]) for r in rows) or 1
    classes: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    runs: list[dict] = []
    for k, r in enumerate(rows):
        count, samples = int(r[col[EXECUTED]]), int(r[col[SAMPLES]])
        classes[count][0] += samples
        classes[count][1] += 1
        if runs and runs[-1]["count"] == count and runs[-1]["last"] == k - 1:
            run = runs[-1]
        else:
            run = {"count": count, "first": k, "samples": 0, "ops": collections.Counter(),
                   "stalls": collections.Counter()}
            runs.append(run)
        run["last"] = k
        run["samples"] += samples
        run["ops"][opcode(r[col["Source"]])] += 1
        for h in reasons:
            run["stalls"][h[len("stall_"):]] += int(r[col[h]])
    return {"total": total, "classes": dict(classes), "runs": runs}


def report(s: dict, min_share: float, top_classes: int) -> str:
    total = s["total"]
    out = [f"samples: {total}", "", "| executions | instructions | share of samples |", "|---:|---:|---:|"]
    for count, (samples, n) in sorted(s["classes"].items(), key=lambda kv: -kv[1][0])[:top_classes]:
        out.append(f"| {count} | {n} | {100 * samples / total:.1f} % |")
    out += ["", "| instructions | executions | share | commonest opcodes | main stalls |", "|---|---:|---:|---|---|"]
    for run in s["runs"]:
        if run["samples"] / total < min_share:
            continue
        ops = " ".join(f"{o}:{c}" for o, c in run["ops"].most_common(5))
        stalls = " ".join(f"{n} {100 * v / run['samples']:.0f}%" for n, v in run["stalls"].most_common(3) if v)
        out.append(f"| {run['first']}-{run['last']} | {run['count']} | {100 * run['samples'] / total:.2f} % "
                   f"| {ops} | {stalls} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    ap.add_argument("--min-share", type=float, default=0.003, help="smallest region shown (fraction of samples)")
    ap.add_argument("--classes", type=int, default=12, help="frequency classes shown")
    args = ap.parse_args(argv)
    for path in args.csv:
        print(f"## {path}\n")
        print(report(split(*load(path)), args.min_share, args.classes))
        print()


if __name__ == "__main__":
    sys.exit(main())
