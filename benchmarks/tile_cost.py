#!/usr/bin/env python3
"""Where a masked run's time goes: a least-squares fit of kernel time to its tiles and work units.

For each timed mask the tiles are classified as the kernels classify them (SPEC §3, per-block
min / max of the canonical bounds): fully visible, partial (element mask) or skipped. The fit is

    time per (batch, head) = a · visible tiles + b · partial tiles + c · work units

with a work unit a query tile (forward: it walks key blocks) or a key block (backward: it walks
query tiles). b / a is what a partial tile costs against a visible one, c / a a unit's fixed cost
(prologue, epilogue, the walk's set-up) in visible tiles. The efficiency column: the time per
computed tile of the full mask in the same file over the mask's (our target is ≥ 0.90); with the
fit, a walk of w visible tiles reaches about w / (w + c / a). The fixed column reads c / a from one
row alone where it has no partial tile: w · (1 / efficiency − 1).

Reads result JSON of bench_attention.py or of kernel_timing.py and rebuilds each row's mask with
that script's own suite (bench_attention.mask_suite; kernel_timing.timing_suite / suite_mask,
"document/L" = equal documents of L tokens).
The suite's masks alone tie partial tiles to short walks; kernel_timing's document/L sweep separates
them (every walk the same length, partial tiles only where the tiles straddle a document edge).

    python benchmarks/tile_cost.py benchmarks/results/h100_2026-12-05_peers.json --S 32768 --d 128
    python benchmarks/tile_cost.py benchmarks/results/h100_2026-12-06_walk_sweep.json --S 32768 --d 128 --bwd

Tile shapes (rows x keys) default to the kernels the config table picks for masks with vectors
(forward d = 64 192 x 128, d = 128 128 x 128, d = 256 128 x 64; backward 128 x 128, 80 x 128,
64 x 64); full and causal run other kernels at d = 256 (80-key blocks), so --tile overrides.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from jax_flashmask import _blocks, masks

TILES = {("fwd", 64): (192, 128), ("fwd", 128): (128, 128), ("fwd", 256): (128, 64),
         ("bwd", 64): (128, 128), ("bwd", 128): (80, 128), ("bwd", 256): (64, 64)}


def tile_classes(ind, causal: bool, S: int, rows: int, keys: int):
    """(visible, partial) booleans [B, Hm, query tiles, key blocks] of the mask (startend row
    indices `ind`, `causal`) at length S, by the classification every blocked path uses
    (jax_flashmask._blocks)."""
    b = masks.canonical_bounds_np(np.asarray(ind), causal=causal, q_len=S)
    nk = -(-b.shape[-1] // keys)
    b = _blocks.pad_bounds(b, nk * keys, S)
    cls = np.asarray(_blocks.classify(*_blocks.block_metadata(b, keys), S, rows, -(-S // rows)))
    return cls == _blocks.VISIBLE, cls == _blocks.PARTIAL


def load(path: str, S: int, d: int, bwd: bool, drop=()):
    """[(mask name, ms per batch row and head, (indices, causal))] of our kernels' rows in `path`
    (not `drop`), each with the mask the script timed."""
    doc = json.load(open(path))
    if "results" in doc:  # bench_attention.py
        import bench_attention

        seed = (doc.get("meta", {}).get("args") or {}).get("seed", 0)
        suite = bench_attention.mask_suite(S, seed)
        key = "bwd_ms" if bwd else "fwd_ms"
        rows = [(r["mask"], r[key], r) for r in doc["results"]
                if r["impl"] == "ours" and r["S"] == S and r["d"] == d and r.get(key)]
        return [(n, ms / (r["B"] * r["H"]), suite[n]) for n, ms, r in rows if n not in drop]
    import kernel_timing  # ours are the rows whose impl is a kernel config

    kind = "bwd_" if bwd else "fwd_"
    suites, out = {}, []  # one suite per (--window, --pad) the rows were timed with
    for r in doc["rows"]:
        if r["impl"].startswith(kind) and r["S"] == S and r["d"] == d and r["mask"] not in drop:
            wp = (r.get("window"), r.get("pad"))
            if wp not in suites:
                suites[wp] = kernel_timing.timing_suite(S, 1, *wp)
            m = kernel_timing.suite_mask(suites[wp], r["mask"], S, 1)
            out.append((r["mask"], r["ms"] / (r["B"] * r["H"]), (m.startend_row_indices, m.causal)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--S", type=int, required=True)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--tile", type=int, nargs=2, metavar=("ROWS", "KEYS"), default=None)
    ap.add_argument("--drop", nargs="*", default=[], help="masks left out of the fit")
    a = ap.parse_args(argv)
    direction = "bwd" if a.bwd else "fwd"
    if a.tile is None and (direction, a.d) not in TILES:
        raise ValueError(f"--d {a.d}: no default tile shape; pass --tile ROWS KEYS")
    rows, keys = a.tile or TILES[(direction, a.d)]
    data = load(a.json, a.S, a.d, a.bwd, a.drop)
    if len(data) < 4:
        raise ValueError(f"{a.json}: {len(data)} rows of ours at S = {a.S}, d = {a.d}; the fit needs 4")
    X, y = [], []
    for name, t, m in data:
        vis, part = tile_classes(*m, a.S, rows, keys)
        heads = vis.shape[0] * vis.shape[1]
        kept = (vis | part).sum(axis=-1 if direction == "fwd" else -2)
        X.append([vis.sum() / heads, part.sum() / heads, (kept > 0).sum() / heads])
        y.append(t)
    X, y = np.array(X), np.array(y)
    (va, pa, ua), *_ = np.linalg.lstsq(X, y, rcond=None)
    err = X @ np.array([va, pa, ua]) / y - 1
    print(f"{a.json}: S = {a.S}, d = {a.d}, {direction}, tiles {rows} x {keys}: a partial tile "
          f"{pa / va:.2f}x a visible one, a work unit's fixed cost {ua / va:.2f} visible tiles "
          f"(fit error rms {np.sqrt((err ** 2).mean()):.3f}, max {np.abs(err).max():.3f})")
    # efficiency: time per computed tile of the full mask in the same run over the mask's
    names = [n for n, _, _ in data]
    per_tile = y[names.index("full")] / X[names.index("full"), 0] if "full" in names else va
    # fixed: with no partial tile, a unit's fixed cost in visible tiles from this row alone,
    # walk · (1 / efficiency − 1) (the equal-walk sweep's reading; noisy where efficiency ≈ 1)
    head = ("visible", "partial", "units", "walk", "efficiency", "fixed", "fit err")
    print(f"{'mask':26s} " + " ".join(f"{h:>{w}s}" for h, w in zip(head, (9, 8, 6, 6, 10, 6, 8))))
    for (name, t, _), x, e in zip(data, X, err):
        walk, eff = (x[0] + x[1]) / x[2], (x[0] + x[1]) * per_tile / t
        fixed = f"{walk * (1 / eff - 1):6.2f}" if x[1] == 0 and name != "full" else f"{'-':>6s}"
        print(f"{name:26s} {x[0]:9.0f} {x[1]:8.0f} {x[2]:6.0f} {walk:6.1f} {eff:10.3f} {fixed} "
              f"{e:+8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
