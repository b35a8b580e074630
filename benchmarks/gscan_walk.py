"""Replay of the forward's key-block walk (variant 3) and group walk (variant 7) per query tile.

CPU only (numpy). benchmarks/NOTES_gscan.md explains the numbers.

For every query tile of a mask the walk of `KeptBlocks<Bn, kGroups>` (cc/sm90/fwd_kernel.cuh) is
replayed statement for statement and each dependent metadata step (a block scan: 8 LDG + 2
ballots; a group ballot: 1 LDG.128 + ballots) is recorded with its *position*:

* ``pre``: in the constructor, before the first kept block is known;
* ``first``: in the first ``next()`` (the lookahead for block 1, before block 0's QK^T / TMA);
* ``mid``: in ``next()`` of a later block that is not the last (the lookahead crossing a group /
  chunk boundary: it delays that block's QK^T on the consumers and its K TMA on the producer);
* ``trail``: in ``next()`` of the last kept block (the lookahead that finds no more blocks).

Every warp (producer warp 0, the 8 consumer warps) runs the same walk, so the counts are per warp.
The steps are dependent: a step's loads decide whether the next step exists.

On top of the counts, a footprint model: the metadata lines (128 B) each step reads (a block scan
reads 8 rows x 32 blocks = one line per row; a group ballot reads 16 B per group), replayed per SM
in the persistent grid's tile order through an LRU of `--l1-lines` lines (L1 left next to the
kernel's ~197 KB of shared memory: 256 - 228 KB = 28 KB = 224 lines), producer first, then the
consumers of the same tile. A step whose lines are all resident is an L1 hit (tens of cycles), else
an L2 round trip (hundreds). This is what separates 32K (a batch's block metadata, 8 KB, stays in
L1 under variant 3's full walk) from 128K (32 KB per tile walk: larger than L1, every step of
variant 3's walk misses).

Usage: python benchmarks/gscan_walk.py [--seqs 32768 131072] [--masks ...] [--l1-lines 224]
       [--tiles-per-sm N] [--check]
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

from bwd_mask_model import suite_bounds  # noqa: E402
from fwd_mask_model import (BM, H, SMS, TOKENS, _meta, group_bits, group_meta,  # noqa: E402
                            random_walk_case, scan_bits)

MASKS = ["full", "causal", "sliding_window", "causal_document", "document", "share_question",
         "prefix_lm_document", "random_eviction"]
POS = ("pre", "first", "mid", "trail")


def walk_trace(meta: np.ndarray, gm, ms: int, me: int, Sk: int, bn: int, groups: bool,
               merged: bool = True):
    """KeptBlocks in Python with step positions. Returns (blocks [(n, partial)], steps) where
    steps = [(kind, position, lines)] in execution order; kind 's' (block scan of the 32 blocks at
    base) or 'g' (group ballot of the chunk of 32 groups at group c, with merged=True (the fixed
    kernel) together with the block scan of group c in the same step; merged=False: the measured
    variant 7, ballot alone, then the scans); lines = metadata line ids ('b', row, base // 32) /
    ('g', c * 16 // 128 + k). gm None: the kernel's goff == 0 (no group metadata, every existing
    group a candidate, no group loads)."""
    nblk = meta.shape[1]
    ngrp = -(-nblk // 32)
    st = dict(base=0, keep=0, part=0, gmask=0)
    steps = []
    pos = ["pre"]

    def scan(extra=None):
        base = st["base"]
        st["keep"], st["part"] = scan_bits(meta, base, ms, me, Sk, bn)
        lines = [("b", r, base // 32) for r in range(8)]
        if extra is None:
            steps.append(("s", pos[0], lines))
        else:  # merged group step: one round trip for the group ballot and this scan
            steps.append(("g", pos[0], extra + lines))

    def gscan(c):
        """(candidate mask of groups c .. c + 31, their metadata lines)"""
        ng = min(32, ngrp - c)
        m = (1 << ng) - 1 if gm is None else group_bits(gm, c, ms, me, nblk)
        lines = [] if gm is None else [("g", (16 * c) // 128 + k) for k in range(-(-16 * ng // 128))]
        return m, lines

    def advance():
        if groups:
            while st["keep"] == 0:
                if st["gmask"]:
                    bit = (st["gmask"] & -st["gmask"]).bit_length() - 1
                    st["gmask"] &= st["gmask"] - 1
                    st["base"] = 32 * (((st["base"] >> 10) << 5) + bit)
                    scan()
                else:
                    c = ((st["base"] >> 10) + 1) << 5
                    if 32 * c >= nblk:
                        return -1, False
                    st["base"] = 32 * c
                    m, lines = gscan(c)
                    if merged:
                        scan(extra=lines)
                        st["gmask"] = m & ~1
                    else:
                        steps.append(("g", pos[0], lines))
                        st["gmask"] = m
        else:
            while st["keep"] == 0:
                st["base"] += 32
                if st["base"] >= nblk:
                    return -1, False
                scan()
        bit = (st["keep"] & -st["keep"]).bit_length() - 1
        st["keep"] &= st["keep"] - 1
        return st["base"] + bit, bool((st["part"] >> bit) & 1)

    if groups:
        st["base"] = -32
    else:
        scan()
    out = []
    nxt = advance()
    k = 0
    while nxt[0] >= 0:
        out.append(nxt)
        n0 = len(steps)
        pos[0] = "first" if k == 0 else "mid"
        nxt = advance()
        if nxt[0] < 0:  # the lookahead of the last block: its steps are trailing
            steps[n0:] = [(a, "trail", c) for a, _, c in steps[n0:]]
        k += 1
    return out, steps


def tile_walks(S: int, name: str, bn: int = 128, seed=0):
    """Per query tile m: (blocks, v3 steps, measured v7 steps, fixed v7 steps); masks of
    benchmark_suite(S, 0) as kernel_timing.py builds them (one mask for every batch and head)."""
    b = suite_bounds(S, seed)[name]
    meta = _meta(b, bn)
    gm = group_meta(meta)
    ngrp = -(-meta.shape[1] // 32)
    gm_used = gm if ngrp >= 3 else None  # launch_fwd: group level only from 3 groups on
    res = []
    for m in range(-(-S // BM)):
        ms, me = m * BM, min(m * BM + BM, S)
        r3, s3 = walk_trace(meta, gm_used, ms, me, S, bn, False)
        r7, s7 = walk_trace(meta, gm_used, ms, me, S, bn, True, merged=False)
        r7f, s7f = walk_trace(meta, gm_used, ms, me, S, bn, True, merged=True)
        assert r3 == r7 == r7f, (name, S, m)
        res.append((r3, s3, s7, s7f))
    return res


def counts(steps) -> dict:
    return {p: sum(1 for _, q, _ in steps if q == p) for p in POS}


def check(seed: int = 0, rand_cases: int = 150, seqs=(4096, 16384, 32768)) -> int:
    """The fixed group walk yields variant 3's (block, partial) sequence, and per query tile at
    most variant 3's number of dependent steps at every position (pre / first / mid / trail):
    the suite masks at 4K, 16K, 32K (Bn 64 and 128) and random bounds (ragged Sk, more than 32
    groups, runs of identical columns, empty tiles), with and without group metadata (goff 0)."""
    rng = np.random.default_rng(seed)
    bad = worse = tiles = cases = 0
    old_worse = 0

    def one(bounds, Sq, bn):
        nonlocal bad, worse, tiles, cases, old_worse
        Sk = bounds.shape[1]
        meta = _meta(bounds, bn)
        gm = group_meta(meta)
        cases += 1
        for m in range(-(-Sq // BM)):
            ms, me = m * BM, min(m * BM + BM, Sq)
            r3, s3 = walk_trace(meta, None, ms, me, Sk, bn, False)
            c3 = counts(s3)
            for g in (gm, None):
                rf, sf = walk_trace(meta, g, ms, me, Sk, bn, True, merged=True)
                ro, so = walk_trace(meta, g, ms, me, Sk, bn, True, merged=False)
                tiles += 1
                bad += (rf != r3) + (ro != r3)
                cf, co = counts(sf), counts(so)
                worse += any(cf[p] > c3[p] for p in POS)
                old_worse += any(co[p] > c3[p] for p in POS)
                if g is None:  # no group level: the fixed walk is variant 3's, step for step
                    bad += cf != c3
    for S in seqs:
        for name, b in suite_bounds(S).items():
            for bn in (64, 128):
                one(b, S, bn)
    for _ in range(rand_cases):
        one(*random_walk_case(rng))
    print(f"check: {cases} bound sets, {tiles} (tile, group level on/off) walks: {bad} mismatches "
          f"(blocks, order, partial flags; steps with the group level off); tiles where the fixed "
          f"walk takes more dependent steps than variant 3 at some position: {worse} "
          f"(measured variant 7's walk: {old_worse})")
    return bad + worse


def schedule_lists(cost: np.ndarray, sms: int = SMS):
    """Per CTA, its tiles in order: the dynamic persistent grid (a CTA claims its next tile when it
    starts one; fwd_mask_model.schedule with lookahead 1)."""
    import heapq

    n = len(cost)
    ctas = min(sms, n)
    tiles = [[i] for i in range(ctas)]
    nxt = ctas
    heap = [(0.0, i) for i in range(ctas)]
    heapq.heapify(heap)
    cur = list(range(ctas))
    while heap:
        start, c = heapq.heappop(heap)
        end = start + float(cost[cur[c]])
        if nxt < n:
            tiles[c].append(nxt)
            cur[c] = nxt
            nxt += 1
            heapq.heappush(heap, (end, c))
    return tiles


def l1_replay(S: int, walks, idx: int, l1_lines: int, tiles_per_sm: int | None = None):
    """LRU replay of the metadata lines per SM. Returns per position the mean L2 round trips per
    tile for the producer warp and for a consumer warp (L1 misses of a step = one round trip)."""
    mblk = len(walks)
    B = max(1, TOKENS // S)
    ntiles = mblk * H * B
    # tile cost for the schedule (fitted d = 128 terms of fwd_mask_model, µs): only the order matters
    kept = np.array([len(w[0]) for w in walks])
    part = np.array([sum(p for _, p in w[0]) for w in walks])
    t = np.arange(ntiles)
    m_of = mblk - 1 - (t % mblk)
    b_of = (t // mblk) // H
    cost = 3.01 + 1.806 * kept[m_of] + 0.755 * part[m_of]
    lists = schedule_lists(cost)
    miss = {("p", p): 0 for p in POS} | {("c", p): 0 for p in POS}
    steps_n = {p: 0 for p in POS}
    done = 0
    for tl in lists:
        lru: OrderedDict = OrderedDict()

        def touch(key):
            hit = key in lru
            if hit:
                lru.move_to_end(key)
            else:
                lru[key] = True
                if len(lru) > l1_lines:
                    lru.popitem(last=False)
            return hit

        for k, tile in enumerate(tl):
            if tiles_per_sm is not None and k >= tiles_per_sm:
                break
            m, b = m_of[tile], b_of[tile]
            steps = walks[m][idx]
            for who in ("p", "c"):  # producer first (it walks the tile ahead), then the consumers
                for kind, pos, lines in steps:
                    hits = [touch((b,) + ln) for ln in lines]
                    if not all(hits):
                        miss[(who, pos)] += 1
                    if who == "p":
                        steps_n[pos] += 1
            done += 1
    return {k: v / done for k, v in miss.items()}, {k: v / done for k, v in steps_n.items()}


def summary(S: int, name: str, l1_lines: int, tiles_per_sm: int | None):
    walks = tile_walks(S, name)
    mblk = len(walks)
    kept = np.array([len(w[0]) for w in walks])
    part = np.array([sum(p for _, p in w[0]) for w in walks])
    row = dict(mask=name, S=S, kept=kept.mean(), part=part.mean())
    for v, idx in (("3", 1), ("7", 2), ("7f", 3)):
        cnt = {p: 0 for p in POS}
        for w in walks:
            for _, pos, _ in w[idx]:
                cnt[pos] += 1
        row[f"v{v}"] = {p: cnt[p] / mblk for p in POS}
        row[f"v{v}_l1"] = l1_replay(S, walks, idx, l1_lines, tiles_per_sm)[0] if l1_lines else None
        row[f"v{v}_more"] = sum(any(counts(w[idx])[p] > counts(w[1])[p] for p in POS) for w in walks) / mblk
    return row


# The first measurement of variant 7 (lead, 2026-12-01, H200, kernel_timing.py --variants 3 7,
# bf16, d = 128, H = 32, B = 131072 / S, TFLOP/s FlashMask convention): (v3, v7) per (S, mask).
MEASURED = {
    (32768, "full"): (597.3, 611.1), (32768, "causal"): (580.0, 582.4),
    (32768, "sliding_window"): (512.7, 451.5), (32768, "causal_document"): (495.2, 522.2),
    (32768, "document"): (512.0, 514.7), (32768, "share_question"): (389.5, 440.4),
    (32768, "prefix_lm_document"): (513.3, 501.4), (32768, "random_eviction"): (448.7, 429.4),
    (131072, "full"): (591.2, 598.9), (131072, "sliding_window"): (519.0, 554.6),
    (131072, "causal_document"): (519.8, 552.5), (131072, "share_question"): (349.3, 562.7),
    (131072, "prefix_lm_document"): (505.6, 463.4),
}
# fwd_mask_model.py's fitted d = 128 terms (µs): per tile, per kept block, per partial block, per step
F_US, TBLK_US, DP_US, CG_US = 3.01, 1.806, 0.755, 0.428


def predict(seqs, masks, steps_cost=(0.1, CG_US)):
    """Per mask: tile time = F + t_blk kept + dP partial + c steps (steps = all dependent metadata
    steps of the walk; the kernel's tile order and grid do not change between the variants, the
    tail is < 2 %), for a step cost c between an L1 hit (0.1 µs) and the fitted 0.43 µs; gain of
    the fixed variant 7 over variant 3, and the TF/s that gives from the measured variant 3."""
    print("prediction (written before any device run of this build): gain of v7f over v3 = "
          "T3 / T7f per tile, for a step cost c (µs); 'implied' = what the measured v7 / v3 ratio "
          "means in µs per tile")
    print(f"{'S':>6s} {'mask':20s} {'steps v3':>8s} {'v7':>5s} {'v7f':>5s} | " +
          " | ".join(f"c={c:.2f}: gain  TF/s" for c in steps_cost) + " | measured v3 -> v7 (ratio), implied µs/tile")
    for S in seqs:
        for name in masks:
            walks = tile_walks(S, name)
            kept = np.array([len(w[0]) for w in walks], float)
            part = np.array([sum(p for _, p in w[0]) for w in walks], float)
            st = {v: np.array([len(w[i]) for w in walks], float) for v, i in (("3", 1), ("7", 2), ("7f", 3))}
            base = F_US + TBLK_US * kept + DP_US * part
            cells = []
            meas = MEASURED.get((S, name))
            for c in steps_cost:
                t3 = (base + c * st["3"]).sum()
                t7 = (base + c * st["7f"]).sum()
                g = t3 / t7
                cells.append(f"{100 * (g - 1):+5.1f} % {meas[0] * g if meas else float('nan'):6.1f}")
            tail = ""
            if meas:
                t3 = (base + CG_US * st["3"]).mean()
                tail = f"{meas[0]:.1f} -> {meas[1]:.1f} ({meas[1] / meas[0]:.3f}), {t3 * (1 - meas[0] / meas[1]):+5.1f}"
            print(f"{S:6d} {name:20s} {st['3'].mean():8.2f} {st['7'].mean():5.2f} {st['7f'].mean():5.2f} | "
                  + " | ".join(cells) + " | " + tail, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--masks", nargs="+", default=MASKS)
    ap.add_argument("--l1-lines", type=int, default=224, help="0: no L1 replay")
    ap.add_argument("--tiles-per-sm", type=int, default=None,
                    help="replay only the first N tiles of every SM (faster; default all)")
    ap.add_argument("--check", action="store_true", help="identity and step dominance check, then exit")
    ap.add_argument("--predict", action="store_true", help="per-mask prediction of the fixed walk, then exit")
    a = ap.parse_args()
    if a.check:
        return 1 if check() else 0
    if a.predict:
        predict(a.seqs, a.masks)
        return 0
    for S in a.seqs:
        print(f"S = {S}, Bn = 128, 128-row query tiles: dependent metadata steps per tile and warp "
              f"(pre / first / mid / trail); v7 = the measured group walk, v7f = the fixed one; "
              f"'more' = share of tiles with more steps than v3 at some position")
        hdr = f"{'mask':20s} {'kept':>6s} {'part':>6s} | {'v3':>22s} | {'v7':>22s} {'more':>5s} | {'v7f':>22s} {'more':>5s}"
        if a.l1_lines:
            hdr += f" | L2 round trips per tile, producer / consumer warp (L1 model, {a.l1_lines} lines): v3, v7, v7f"
        print(hdr)
        for name in a.masks:
            r = summary(S, name, a.l1_lines, a.tiles_per_sm)
            f = {v: " ".join(f"{r['v' + v][p]:5.2f}" for p in POS) for v in ("3", "7", "7f")}
            line = (f"{name:20s} {r['kept']:6.1f} {r['part']:6.2f} | {f['3']:>22s} | {f['7']:>22s} {r['v7_more']:5.2f} | "
                    f"{f['7f']:>22s} {r['v7f_more']:5.2f}")
            if a.l1_lines:
                for v in ("3", "7", "7f"):
                    l1 = r[f"v{v}_l1"]
                    line += f" | {sum(l1[('p', p)] for p in POS):5.2f} / {sum(l1[('c', p)] for p in POS):5.2f}"
            print(line, flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
