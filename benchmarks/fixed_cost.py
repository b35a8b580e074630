"""Fixed cost per work item of a masked run, from a protocol JSON (no GPU).

For each mask of a `bench_attention.py` result file (impl "ours", d = 128), the time one SM spends
per work item, minus its kept tiles at the full mask's rate of the same run and its partial tiles'
extra cost, is the item's fixed cost F:

* forward: an item is a query tile of 128 rows against key blocks of 128;
* backward: an item is a CTA, one key block of 128 against query tiles of 80 rows (variant 16);
  the prep / convert passes (`--passes-ms` per call) come off every mask's time and the full
  mask's first.

Kept / partial tiles come from SPEC section 3's block test (`bwd_mask_model.classify`, the kernels'
rule) on the protocol's own masks (`bench_attention.mask_suite`, same seed). Every protocol point
has 32,768 items per call (B * H * S / 128 at 128K tokens), so time per item per SM = ms * 132 /
items. benchmarks/NOTES.md (session 19) tabulates the output for 8K / 32K / 128K.

Read F as "what the kept tiles at the full mask's rate do not explain", not as a per-item constant:
the full mask runs at a lower clock than the sparse ones at the power cap and its rate includes
its own per-item cost, so F absorbs both. Session 19's F grew with S because the protocol's
sliding window grows as S / 16; with the window fixed the masked rate is flat over S (session 20,
`results/h200_2026-12-03s20_fixed_window_2048.json`).

    python benchmarks/fixed_cost.py benchmarks/results/h200_2026-12-03s18_fwdbwd_32k.json

``--flex-ratios CONVERT_MS PREP_MS`` prints instead each mask's backward ratio to Flex as measured,
without the convert pass and without both passes (each taken off our time at zero cost elsewhere):
what fusing them could give (benchmarks/NOTES.md session 23, at 8K).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

SMS = 132
SHAPES = {"fwd": (128, 128), "bwd": (80, 128)}  # (query rows, keys) of a tile


def fixed_costs(doc: dict, partial_us: dict, passes_ms: float) -> list[dict]:
    """Per (S, direction, mask): time per item per SM, kept / partial tiles per item and F (us)."""
    from bench_attention import mask_suite
    from bwd_mask_model import classify
    from jax_flashmask.masks import canonical_bounds_np

    seed = doc["meta"]["args"]["seed"]
    ours = [r for r in doc["results"] if r["impl"] == "ours" and r["d"] == 128
            and r.get("fwd_ms") and r.get("bwd_ms")]
    out = []
    for S in sorted({r["S"] for r in ours}):
        rs = {r["mask"]: r for r in ours if r["S"] == S}
        if "full" not in rs:
            continue
        suite = mask_suite(S, seed)
        for direction, (rows, keys) in SHAPES.items():
            items = rs["full"]["B"] * rs["full"]["H"] * (-(-S // (rows if direction == "fwd" else keys)))
            off = passes_ms if direction == "bwd" else 0.0
            per_item = {}
            for name, r in rs.items():
                sri, causal = suite[name]
                bounds = canonical_bounds_np(sri, causal=causal, q_len=S)[0, 0]
                skip, part = classify(bounds, S, rows, keys)
                kept, part = int((~skip).sum()), int(part.sum())
                heads = r["B"] * r["H"]
                per_item[name] = ((r[f"{direction}_ms"] - off) * 1e3 * SMS / items,
                                  kept * heads / items, part * heads / items)
            t_full, kept_full, _ = per_item["full"]
            t_tile = t_full / kept_full
            for name, (t, kept, part) in per_item.items():
                F = t - kept * t_tile - part * partial_us[direction]
                out.append({"S": S, "direction": direction, "mask": name, "us_per_item": t,
                            "kept_per_item": kept, "partial_per_item": part, "us_per_tile_full": t_tile,
                            "F_us": F, "F_share": F / t, "passes_share": off / rs[name][f"{direction}_ms"]})
    return out


def flex_ratios(doc: dict, convert_ms: float, prep_ms: float) -> list[dict]:
    """Per (S, mask) at d = 128: backward ms of ours and Flex, their ratio, and the ratio with our
    convert pass / convert and prep passes taken off our time."""
    bwd = {(r["impl"], r["S"], r["mask"]): r["bwd_ms"] for r in doc["results"]
           if r["d"] == 128 and r.get("bwd_ms")}
    out = []
    for (impl, S, mask), ours in sorted(bwd.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        flex = bwd.get(("flex", S, mask))
        if impl != "ours" or flex is None:
            continue
        out.append({"S": S, "mask": mask, "ours_ms": ours, "flex_ms": flex, "ratio": flex / ours,
                    "ratio_no_convert": flex / (ours - convert_ms),
                    "ratio_no_passes": flex / (ours - convert_ms - prep_ms)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="bench_attention.py result JSON files")
    ap.add_argument("--fwd-partial-us", type=float, default=0.35, help="extra us per partial forward tile")
    ap.add_argument("--bwd-partial-us", type=float, default=0.17, help="extra us per partial backward tile")
    ap.add_argument("--passes-ms", type=float, default=1.4, help="backward prep + convert per call (ms)")
    ap.add_argument("--masks", default="sliding_window,causal_document,share_question")
    ap.add_argument("--flex-ratios", nargs=2, type=float, metavar=("CONVERT_MS", "PREP_MS"),
                    help="print backward ratios to Flex without the convert / both passes instead")
    args = ap.parse_args(argv)
    if args.flex_ratios:
        for path in args.json:
            print(f"\n{path}\n{'S':>6s} {'mask':22s} {'ours ms':>8s} {'Flex ms':>8s} {'ratio':>6s} "
                  f"{'-convert':>8s} {'-both':>6s}")
            for r in flex_ratios(json.loads(Path(path).read_text()), *args.flex_ratios):
                print(f"{r['S']:6d} {r['mask']:22s} {r['ours_ms']:8.2f} {r['flex_ms']:8.2f} {r['ratio']:6.3f} "
                      f"{r['ratio_no_convert']:8.3f} {r['ratio_no_passes']:6.3f}")
        return 0
    keep = set(args.masks.split(",")) | {"full"}
    for path in args.json:
        rows = fixed_costs(json.loads(Path(path).read_text()),
                           {"fwd": args.fwd_partial_us, "bwd": args.bwd_partial_us}, args.passes_ms)
        print(f"\n{path}")
        print(f"{'S':>6s} {'dir':3s} {'mask':22s} {'us/item':>8s} {'kept':>6s} {'part':>5s} {'us/tile':>7s} "
              f"{'F us':>6s} {'F %':>5s} {'passes %':>8s}")
        for r in rows:
            if r["mask"] in keep:
                print(f"{r['S']:6d} {r['direction']:3s} {r['mask']:22s} {r['us_per_item']:8.2f} "
                      f"{r['kept_per_item']:6.2f} {r['partial_per_item']:5.2f} {r['us_per_tile_full']:7.3f} "
                      f"{r['F_us']:6.2f} {100 * r['F_share']:5.1f} {100 * r['passes_share']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
