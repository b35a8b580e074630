"""Forward at d = 64 / 256: checks and a what-if model for variants 12, 13 and 14 (CPU only).

benchmarks/NOTES_fwd_hd.md explains the numbers.

* ``--walk-check``: variant 14's reversed `KeptBlocks` walk (kRev, rev = true), statement for
  statement in Python, yields exactly the forward walk's (block, partial) sequence reversed, for the
  benchmark masks and random bounds (ragged Sk, several chunks of 32 blocks, empty tiles); and its
  tile order (pairs heaviest / lightest inside a head) is a permutation of the tiles in which every
  causal pair holds the same number of key blocks.
* ``--l2``: the K/V reads of the persistent grid, block by block: 132 CTAs, one key block per step
  each (a uniform block time), tiles claimed in the kernel's order (variant 3: heaviest first inside
  a head; variant 14: pairs, the second walked backwards), every read of (head, key block) through
  an LRU cache of C MB (K + V bytes of the block). Prints the miss rate and the HBM read rate it
  implies at the measured block time, and the spread of the CTAs' key positions (in query tiles).
* ``--predict``: TF/s of variants 12 / 13 / 14 from the fitted tile model of fwd_mask_model.py with
  the new tile geometry (stats recomputed at Bm = 192 or Bn = 80) and stated per-block factors.
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import fwd_mask_model as fm  # noqa: E402
from bwd_mask_model import classify, suite_bounds  # noqa: E402

SMS, H, TOKENS = fm.SMS, fm.H, fm.TOKENS  # the H200 and the protocol's token count


# ------------------------------------------------------------------------------ the reversed walk


def walk_rev(meta: np.ndarray, ms: int, me: int, Sk: int, bn: int):
    """KeptBlocks<Bn, false, true> with rev = true, as written in fwd_kernel.cuh."""
    nblk = meta.shape[1]
    st = dict(base=((nblk - 1) >> 5) << 5, keep=0, part=0)

    def scan():
        keep = part = 0
        for lane in range(32):
            n = st["base"] + lane
            if n < nblk:
                lts_mn, lts_mx, lte_mn, lte_mx, uts_mn, uts_mx, ute_mn, ute_mx = meta[:, n]
                skip = (ms >= lts_mx and me <= lte_mn) or (ms >= uts_mx and me <= ute_mn)
                p = (ms < lte_mx and me > lts_mn) or (ms < ute_mx and me > uts_mn) or ((n + 1) * bn > Sk)
                keep |= (not skip) << lane
                part |= bool(p) << lane
        st["keep"], st["part"] = keep, part

    def advance():
        step = -32
        while st["keep"] == 0:
            st["base"] += step
            if st["base"] < 0 or st["base"] >= nblk:
                return -1, False
            scan()
        bit = st["keep"].bit_length() - 1  # 31 - clz
        st["keep"] &= ~(1 << bit)
        return st["base"] + bit, bool((st["part"] >> bit) & 1)

    scan()
    out = []
    nxt = advance()
    while nxt[0] >= 0:
        out.append(nxt)
        nxt = advance()
    return out


def paired_order(mblk: int, heads: int):
    """Variant 14's decode: global tile t -> (head, query tile, reversed)."""
    t = np.arange(mblk * heads)
    hb, j = t // mblk, t % mblk
    m = np.where(j & 1, j >> 1, mblk - 1 - (j >> 1))
    return hb, m, (t & 1).astype(bool)


def walk_check(seed: int = 0, rand_cases: int = 120) -> int:
    rng = np.random.default_rng(seed)
    bad = cases = tiles = 0
    BM = 128

    def one(bounds, Sq, bn):
        nonlocal bad, cases, tiles
        Sk = bounds.shape[1]
        meta = fm._meta(bounds, bn)
        cases += 1
        for m in range(-(-Sq // BM)):
            ms, me = m * BM, min(m * BM + BM, Sq)
            fwd, _, _ = fm.walk(meta, ms, me, Sk, bn, False)
            tiles += 1
            bad += walk_rev(meta, ms, me, Sk, bn) != fwd[::-1]

    for S in (4096, 12800):
        for name, b in suite_bounds(S).items():
            one(b, S, 64)
    for _ in range(rand_cases):
        Sq = int(rng.integers(1, 700))
        bn = int(rng.choice([64, 80, 128]))
        Sk = int(rng.integers(1, 9000))
        b = np.empty((4, Sk), np.int64)
        for r in (0, 2):
            lo = rng.integers(-50, Sq + 50, Sk)
            hi = lo + rng.integers(-30, Sq + 1, Sk)
            if rng.random() < 0.6:
                cuts = np.sort(rng.integers(0, Sk, int(rng.integers(1, 8))))
                lo = np.zeros(Sk, np.int64)
                hi = np.full(Sk, Sq + 10, np.int64)
                for c in cuts:
                    lo[c:] = rng.integers(-5, Sq + 5)
                    hi[c:] = lo[c] + rng.integers(0, Sq + 20)
            b[r], b[r + 1] = lo, hi
        one(b, Sq, bn)
    # tile order: a permutation, and causal pairs of equal length (even mblk)
    for mblk in (1, 2, 3, 4, 5, 16, 17, 256):
        for heads in (1, 3):
            hb, m, rev = paired_order(mblk, heads)
            ok = all(sorted(m[hb == h].tolist()) == list(range(mblk)) for h in range(heads))
            bad += not ok
            if mblk % 2 == 0:
                lens = (m + 1).reshape(-1, 2).sum(axis=1)  # causal: tile m keeps m + 1 blocks (Bm = Bn)
                bad += len(set(lens.tolist())) != 1
            bad += bool(rev[0::2].any()) + (not rev[1::2].all())
    print(f"reversed walk vs forward walk reversed: {cases} bound sets, {tiles} query tiles; tile "
          f"order checks: 16 (mblk, heads); {bad} mismatches")
    return bad


# ------------------------------------------------------------------------------ K/V reads and L2


def l2_sim(S: int, d: int, bm: int, bn: int, variant: int, cap_mb, heads_sim: int = 0,
           mask: str = "causal"):
    """LRU misses of the K/V block reads of the persistent grid (uniform block time)."""
    B = TOKENS // S
    nheads = B * H if heads_sim <= 0 else heads_sim
    b = suite_bounds(S)[mask]
    skip, _ = classify(b, S, bm, bn)  # [nblk, mblk]
    mblk = skip.shape[1]
    kept = [np.nonzero(~skip[:, m])[0] for m in range(mblk)]
    total = mblk * nheads
    if variant == 14:
        hb, mm, rev = paired_order(mblk, nheads)
    else:
        t = np.arange(total)
        hb, mm, rev = t // mblk, mblk - 1 - (t % mblk), np.zeros(total, bool)
    blk_bytes = bn * d * 2 * 2
    caps = [int(c * 2**20 // blk_bytes) for c in cap_mb]
    lru = [OrderedDict() for _ in caps]
    miss = [0] * len(caps)
    reads = 0
    ctas = min(SMS, total if variant != 14 else -(-total // 2))
    # per CTA: current tile, position in its block list
    cur = []
    nxt = 0
    for c in range(ctas):
        t0 = 2 * c if variant == 14 else c
        cur.append([t0, 0])
    nxt = ctas  # next claim (tile index for 3, pair index for 14)
    spread = []
    active = list(range(ctas))
    step = 0
    while active:
        still = []
        pos = []
        for c in active:
            t, i = cur[c]
            blocks = kept[mm[t]]
            if rev[t]:
                blocks = blocks[::-1]
            if i < len(blocks):
                key = (int(hb[t]), int(blocks[i]))
                reads += 1
                pos.append(int(blocks[i]) * bn / bm)
                for k, (cache, cap) in enumerate(zip(lru, caps)):
                    if key in cache:
                        cache.move_to_end(key)
                    else:
                        miss[k] += 1
                        cache[key] = None
                        if len(cache) > cap:
                            cache.popitem(last=False)
                cur[c][1] = i + 1
                still.append(c)
            else:  # tile done: next tile (this step idles, like a tile boundary)
                if variant == 14 and t % 2 == 0 and t + 1 < total:
                    cur[c] = [t + 1, 0]
                    still.append(c)
                elif variant == 14 and 2 * nxt < total:
                    cur[c] = [2 * nxt, 0]
                    nxt += 1
                    still.append(c)
                elif variant != 14 and nxt < total:
                    cur[c] = [nxt, 0]
                    nxt += 1
                    still.append(c)
        if step % 64 == 0 and len(pos) > 8:
            spread.append(np.std(pos))
        active = still
        step += 1
    return dict(reads=reads, miss=[m / max(1, reads) for m in miss], spread=float(np.median(spread)),
                blk_bytes=blk_bytes)


def l2_report(heads_sim: int):
    # (S, d, Bm, Bn, t_blk us per block from the fitted model, variants)
    cases = [(8192, 256, 128, 64, 1.814, (3, 14)), (32768, 256, 128, 64, 1.814, (3, 14)),
             (32768, 128, 128, 128, 1.806, (3,)), (131072, 128, 128, 128, 1.806, (3,)),
             (32768, 64, 128, 128, 1.292, (3,)), (32768, 64, 192, 128, 1.292 * 1.5 / 1.15, (3,))]
    caps = (12.5, 25, 50)
    print(f"\nK/V block reads through an LRU of C MB, causal mask, persistent grid of {SMS} CTAs, one "
          f"block per step; HBM = miss rate x {SMS} x block bytes / t_blk (H200: 4.8 TB/s peak)")
    print(f"{'S':>6s} {'d':>4s} {'Bm':>4s} {'Bn':>4s} {'order':>10s} {'reads':>9s} "
          + " ".join(f"{'miss@' + format(c, 'g') + 'MB':>12s}" for c in caps)
          + f" {'HBM@25MB TB/s':>14s} {'spread':>7s}")
    for S, d, bm, bn, tb, variants in cases:
        for v in variants:
            r = l2_sim(S, d, bm, bn, v, caps, heads_sim=heads_sim)
            hbm = r["miss"][1] * SMS * r["blk_bytes"] / (tb * 1e-6) / 1e12
            name = "pairs" if v == 14 else "heavy-1st"
            print(f"{S:6d} {d:4d} {bm:4d} {bn:4d} {name:>10s} {r['reads']:9d} "
                  + " ".join(f"{100 * m:11.2f}%" for m in r["miss"])
                  + f" {hbm:14.2f} {r['spread']:7.1f}")


# ------------------------------------------------------------------------------ predictions


def _stats(S, bm, bn, seed="bench"):
    res = {}
    for name, b in suite_bounds(S, seed).items():
        skip, part = classify(b, S, bm, bn)
        nblk = skip.shape[0]
        res[name] = dict(kept=(~skip).sum(axis=0).astype(np.int64),
                         part=part.sum(axis=0).astype(np.int64), nblk=nblk,
                         groups=-(-nblk // 32), groups7=np.zeros(skip.shape[1], np.int64))
    return res


def _time(st, heads, coef):
    f = fm.features(st, heads)
    cost = f @ coef
    mk, _, _ = fm.schedule(cost)
    return fm.K0_US + mk


def predict():
    """Measured TF/s x T(variant 3, model) / T(new variant, model)."""
    masks = ["full", "causal", "sliding_window", "causal_document", "document", "share_question"]
    print("\nPredictions (model ratios applied to the measured variant-3 TF/s; r = per-row-block "
          "rate factor of the new kernel, low / mid / high)")
    for d, var, bm, bn, factors in [
        (64, 12, 192, 128, dict(low=1.05, mid=1.15, high=1.25)),
        (256, 13, 128, 80, dict(low=1.00, mid=1.04, high=1.07)),
    ]:
        coef, pts = fm.fit(d, verbose=False, fixed={3: 0.428} if d == 256 else None)
        print(f"\nd = {d}, variant {var} (Bm = {bm}, Bn = {bn}); fitted v3 terms F {coef[0]:.3f}, "
              f"t_blk {coef[1]:.3f}, dP {coef[2]:.3f}, c_g {coef[3]:.3f} us")
        for S in (8192, 32768):
            heads = (TOKENS // S) * H
            st3 = fm.tile_stats(S, d)
            stn = _stats(S, bm, bn)
            for mask in masks:
                meas = [p for p in pts if p["S"] == S and p["mask"] == mask]
                if not meas:
                    continue
                t3 = _time(st3[mask], heads, coef)
                row = []
                for k, r in factors.items():
                    c = coef.copy()
                    if var == 12:
                        # a 192 x 128 block: 1.5x the work of a 128 x 128 block at rate r; the first
                        # QK^T / last PV / epilogue of three warpgroups: F x 1.3; a partial block
                        # masks 192 rows (1.5x) in parallel over the warpgroups like the softmax
                        c[1] *= 1.5 / r
                        c[2] *= 1.5 / r
                        c[0] *= 1.3
                    else:
                        # 80-key blocks: 1.25x the work per block at rate r; the mask is per element
                        c[1] *= 1.25 / r
                        c[2] *= 1.25
                    row.append(meas[0]["tflops"] * t3 / _time(stn[mask], heads, c))
                print(f"  {S:6d} {mask:18s} measured {meas[0]['tflops']:6.1f} -> "
                      + " / ".join(f"{x:6.1f}" for x in row))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--walk-check", action="store_true")
    ap.add_argument("--l2", action="store_true")
    ap.add_argument("--l2-heads", type=int, default=8, help="heads simulated (0 = all B * H)")
    ap.add_argument("--predict", action="store_true")
    a = ap.parse_args()
    rc = 0
    if a.walk_check:
        rc |= walk_check() != 0
    if a.l2:
        l2_report(a.l2_heads)
    if a.predict:
        predict()
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main())
