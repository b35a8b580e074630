"""Variant 11 (the d = 128 forward default): refit of the tile-cost model on today's measurements,
where the gap to 90 % of full goes per mask, and the variant-16 prediction.

CPU only; reuses benchmarks/fwd_mask_model.py (tile statistics, persistent-grid schedule, fit).
benchmarks/NOTES_fwd90.md explains the numbers.

    tile cost = F + t_blk * kept + dP * partial + c_g * metadata scans (variant 7's walk)
    T = K0 + makespan of the dynamic persistent schedule (132 CTAs, lookahead 1)

Points (variant 11 only): bench_attention.py s6 at 32K (12 masks, bench masks) and kernel_timing.py
s6 runs at 8K / 32K / 128K (seed-0 masks). Usage:
    python benchmarks/fwd90_model.py [--stats] [--fit] [--predict F_SAVED_US ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fwd_mask_model as fm  # noqa: E402

BENCH_V11 = ["h200_2026-12-01s6_fwdbwd_32k.json"]
KT_V11 = ["h200_2026-12-01s6_fwd_8k_v3v10v11.json", "h200_2026-12-01s6_fwd_v7v11_32k.json",
          "h200_2026-12-01s6_fwd_v7v11_128k.json"]
FULL_TF = {}  # (harness, S) -> measured full-mask TF/s


def points(d: int = 128):
    pts = fm.load_points(d, files=BENCH_V11)
    for p in pts:
        p["h"] = "bench"
    kt = fm.load_kt_points(d, files=KT_V11, variant=11)
    for p in kt:
        p["h"] = "k_timing"
    return pts + kt


def fit(pts, d=128, pin_cg=None):
    # variant 11 walks like variant 7 (group level from 3 groups on)
    orig = fm.features

    def feat(st, heads, variant=3):
        return orig(st, heads, variant=7)

    fm.features = feat
    try:
        coef, _ = fm.fit(d, pts=pts, fixed=None if pin_cg is None else {3: pin_cg})
    finally:
        pass
    return coef


def shares(p, coef, d=128):
    r_last, r_mean, mk, fin = fm.point_rows(p, d, coef)
    meas = p["ms"] * 1e3
    pred = fm.K0_US + mk
    tail = mk - float(r_mean @ coef)
    sh = {n: r_mean[i] * coef[i] / meas for i, n in enumerate(fm.NAMES)}
    sh["tail"] = tail / meas
    sh["K0"] = fm.K0_US / meas
    return pred, meas, sh


def kept_quantiles(st):
    k = st["kept"]
    return np.percentile(k, [10, 50, 90]).astype(int), k.mean()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--predict", type=float, nargs="*", default=None,
                    help="variant 16: fractions of the scan term c_g removed, e.g. 0.4 0.7")
    ap.add_argument("--pin-cg", type=float, default=None, help="pin c_g (us), e.g. 0.428 (v3 fit)")
    a = ap.parse_args()
    pts = points()
    coef = fit(pts, pin_cg=a.pin_cg)
    print(f"variant 11, d = 128: F = {coef[0]:.3f} us/tile, t_blk = {coef[1]:.4f} us/kept block, "
          f"dP = {coef[2]:.3f} us/partial block, c_g = {coef[3]:.3f} us/scan; K0 = {fm.K0_US} us; "
          f"{len(pts)} points")
    rows = []
    for p in pts:
        pred, meas, sh = shares(p, coef)
        rows.append((p, pred, meas, sh))
    err = np.array([r[1] / r[2] - 1 for r in rows])
    print(f"rms rel err {np.sqrt(np.mean(err ** 2)):.4f}, max |err| {np.abs(err).max():.4f}")
    # full-mask rate of each harness / length: TF/s of the kept blocks alone at t_blk
    for p, pred, meas, sh in rows:
        if p["mask"] == "full":
            FULL_TF.setdefault((p["h"], p["S"]), []).append(p["tflops"])
    print(f"\n{'harness':8s} {'S':>6s} {'mask':22s} {'TF/s':>6s} {'/full':>6s} {'err':>6s} {'kept/t':>6s} "
          f"{'p10/50/90':>12s} {'blocks':>6s} {'partial':>7s} {'tileF':>6s} {'scan':>5s} {'tail':>5s} {'K0':>4s}"
          f"  {'gap to 0.9 full (pts of time)':s}")
    seen = set()
    for p, pred, meas, sh in rows:
        key = (p["h"], p["S"], p["mask"])
        if key in seen:
            continue
        seen.add(key)
        st = fm.tile_stats(p["S"], 128, p["seed"])[p["mask"]]
        q, km = kept_quantiles(st)
        full = np.mean(FULL_TF.get((p["h"], p["S"]), [np.nan]))
        print(f"{p['h']:8s} {p['S']:6d} {p['mask']:22s} {p['tflops']:6.1f} {p['tflops'] / full:6.3f} "
              f"{100 * (pred / meas - 1):+5.1f}% {km:6.1f} {q[0]:4d}/{q[1]:3d}/{q[2]:3d} "
              f"{100 * sh['t_blk']:5.1f}% {100 * sh['dP']:6.1f}% {100 * sh['F']:5.1f}% "
              f"{100 * sh['c_g']:4.1f}% {100 * sh['tail']:4.1f}% {100 * sh['K0']:3.1f}%")
    if a.stats:
        for S, seed in ((8192, 0), (32768, 0), (32768, "bench")):
            print(f"\nkept key blocks per query tile, S = {S}, masks {seed}: histogram (bins of kept blocks)")
            for name, st in fm.tile_stats(S, 128, seed).items():
                k = st["kept"]
                bins = [1, 2, 4, 8, 16, 32, 64, 128, 257]
                h, _ = np.histogram(k, bins=bins)
                print(f"  {name:22s} mean {k.mean():6.1f}  " +
                      " ".join(f"[{bins[i]},{bins[i + 1]}):{h[i] / len(k):4.2f}" for i in range(len(h))))
    if a.predict:
        print("\nvariant 16 prediction: scan term c_g x scans reduced by the fraction x (TF/s = measured x T11 / T16)")
        seen = set()
        for p, pred, meas, sh in rows:
            key = (p["h"], p["S"], p["mask"])
            if key in seen or p["S"] == 131072:
                continue
            seen.add(key)
            t11 = fm.K0_US + fm.point_rows(p, 128, coef)[2]
            cells = []
            for x in a.predict:
                c2 = coef.copy()
                c2[3] = c2[3] * (1.0 - x)
                t16 = fm.K0_US + fm.point_rows(p, 128, c2)[2]
                cells.append(f"{p['tflops'] * t11 / t16:6.1f} ({100 * (t11 / t16 - 1):+4.1f}%)")
            print(f"{p['h']:8s} {p['S']:6d} {p['mask']:22s} {p['tflops']:6.1f} -> " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
