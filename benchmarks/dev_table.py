"""Markdown tables of the JSON files kernel_timing.py / bwd_timing.py write (no GPU needed).

    python benchmarks/dev_table.py benchmarks/results/fwd_dev_*.json > table.md

One table per file: a row per (S, d, mask), a column per implementation, TFLOP/s in the FlashMask
convention; an implementation timed more than once in a run (e.g. ``--variants 3 7 3 7``) shows
every sample, in order. A backward variant timed in both modes (``--det 0 1``) also gets the
deterministic / default ratio (worst sample over best); so does every deterministic one in a file
with a single default-mode implementation (variant None: 16 and 21 at d = 128).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(path: Path) -> str:
    rows = json.loads(path.read_text())["rows"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cells: dict = {}
    for r in rows:
        key = (r.get("S"), r.get("d"), r["mask"])
        cells.setdefault(key, {}).setdefault(r["impl"], []).append(r["tflops_fm"])
    # a backward variant timed in both modes (bwd_timing.py --det 0 1): also det / default
    pairs = [(i, i.replace("_det_", "_")) for i in impls if "_det_" in i and i.replace("_det_", "_") in impls]
    # variant=None in both modes runs another variant per mode (16 / 21 at d = 128): a file with one
    # default-mode implementation pairs every deterministic one with it
    plain = [i for i in impls if "_det_" not in i]
    if not pairs and len(plain) == 1:
        pairs = [(i, plain[0]) for i in impls if "_det_" in i]
    heads = impls + [f"{a} / {b}" for a, b in pairs]
    out = [f"### {path.name}", "", "| S | d | mask | " + " | ".join(heads) + " |",
           "|---|---|---|" + "---:|" * len(heads)]
    for (S, d, mask), by_impl in cells.items():
        vals = [" / ".join(f"{t:.0f}" for t in by_impl.get(i, [])) or "–" for i in impls]
        for a, b in pairs:
            ta, tb = by_impl.get(a), by_impl.get(b)
            vals.append(f"{min(ta) / max(tb):.3f}" if ta and tb else "–")
        out.append(f"| {S} | {d} | {mask} | " + " | ".join(vals) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print("\n".join(table(Path(p)) for p in argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
