"""A/B table of backward timings: `bwd_timing.py --json` files of two settings, rounds alternating.

Usage (any machine): python benchmarks/bwd_ab_table.py --a A1.json A2.json --b B1.json B2.json
    --labels "zero-ahead off" "zero-ahead on" --title "..." --json out.json --md out.md
Each row lists every round's median ms per setting and the gain of B over A (mean of the rounds).
With --impls A_IMPL B_IMPL the rows pair A_IMPL's timings in the A files with B_IMPL's in the B
files (two kernels of one process: pass the same files as --a and --b).
"""
import argparse
import json


def _rows(paths, impl=None):
    """(impl, S, mask) -> [ms of each file, in order]; with `impl`, that impl's rows only."""
    out = {}
    for p in paths:
        for r in json.load(open(p))["rows"]:
            if impl is None or r["impl"] == impl:
                out.setdefault((r["impl"], r["S"], r["mask"]), []).append(r["ms"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--labels", nargs=2, default=["A", "B"])
    ap.add_argument("--title", default="Backward A/B")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--impls", nargs=2, metavar=("A_IMPL", "B_IMPL"))
    args = ap.parse_args()
    ia, ib = args.impls or (None, None)
    a, b = _rows(args.a, ia), _rows(args.b, ib)
    if args.impls:  # pair B_IMPL's rows with A_IMPL's
        b = {(ia, S, m): v for (_, S, m), v in b.items()}
    table = []
    for key in a:
        if key not in b:
            continue
        ma, mb = sum(a[key]) / len(a[key]), sum(b[key]) / len(b[key])
        table.append({"impl": key[0], "S": key[1], "mask": key[2], "a_ms": a[key], "b_ms": b[key],
                      "gain_pct": 100.0 * (ma / mb - 1.0)})
    lines = [f"# {args.title}", "",
             f"| kernel | S | mask | {args.labels[0]} ms | {args.labels[1]} ms | gain |",
             "|---|---|---|---|---|---:|"]
    for t in table:
        fa = " / ".join(f"{x:.2f}" for x in t["a_ms"])
        fb = " / ".join(f"{x:.2f}" for x in t["b_ms"])
        lines.append(f"| {t['impl']} | {t['S'] // 1024}K | {t['mask']} | {fa} | {fb} | {t['gain_pct']:+.1f}% |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.json:
        json.dump({"labels": args.labels, "a_files": args.a, "b_files": args.b, "rows": table},
                  open(args.json, "w"), indent=1)
    if args.md:
        open(args.md, "w").write(md)


if __name__ == "__main__":
    main()
