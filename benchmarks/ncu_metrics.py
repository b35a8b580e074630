"""Table of `ncu --metrics ...` readings (its plain-text report) from several runs, one row each.

    ncu --clock-control none -k regex:flashmask_bwd_pp --launch-skip 1 --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,... python benchmarks/bwd_timing.py ... > a.txt
    python benchmarks/ncu_metrics.py --runs "128K full=a.txt" "32K full=b.txt" --json out.json --md out.md

Each run is LABEL=FILE; the first kernel reported in FILE is read. Values are converted to fixed
units (bytes -> GB, time -> ms, frequency -> GHz) so that rows compare; other units are kept.
"""

from __future__ import annotations

import argparse
import json
import re

_SCALE = {  # unit -> (fixed unit, factor)
    "byte": ("GB", 1e-9), "Kbyte": ("GB", 1e-6), "Mbyte": ("GB", 1e-3), "Gbyte": ("GB", 1.0),
    "Tbyte": ("GB", 1e3),
    "ns": ("ms", 1e-6), "us": ("ms", 1e-3), "usecond": ("ms", 1e-3), "ms": ("ms", 1.0),
    "msecond": ("ms", 1.0), "s": ("ms", 1e3), "second": ("ms", 1e3),
    "hz": ("GHz", 1e-9), "Khz": ("GHz", 1e-6), "Mhz": ("GHz", 1e-3), "Ghz": ("GHz", 1.0),
}
_ROW = re.compile(r"^\s+([a-z][\w.]+)\s+(\S+)\s+([\d.,]+)\s*$")


def read(text: str) -> dict:
    """{metric: (value, unit)} of the first kernel in an ncu text report."""
    out = {}
    for line in text.splitlines():
        if out and not line.strip():  # the first kernel's table ended
            break
        m = _ROW.match(line)
        if not m:
            continue
        name, unit, value = m.group(1), m.group(2), float(m.group(3).replace(",", ""))
        fixed, f = _SCALE.get(unit, (unit, 1.0))
        out[name] = (value * f, fixed)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True, metavar="LABEL=FILE")
    ap.add_argument("--title", default="ncu metrics")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    rows = []
    for spec in a.runs:
        label, path = spec.rsplit("=", 1)  # labels may hold "=", file names do not
        rows.append({"run": label, "file": path, "metrics": read(open(path).read())})
    names = sorted({n for r in rows for n in r["metrics"]})
    units = {n: next(r["metrics"][n][1] for r in rows if n in r["metrics"]) for n in names}
    head = "| run | " + " | ".join(f"{n} ({units[n]})" for n in names) + " |"
    lines = [f"## {a.title}", "", head, "|" + "---|" * (len(names) + 1)]
    for r in rows:
        cells = [f"{r['metrics'][n][0]:.4g}" if n in r["metrics"] else "-" for n in names]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if a.json:
        json.dump({"title": a.title, "rows": rows}, open(a.json, "w"), indent=1)
    if a.md:
        open(a.md, "w").write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
