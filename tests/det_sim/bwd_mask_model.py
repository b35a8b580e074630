"""Where the masked backward's time goes: tile statistics, a fitted time model, and the O(1) tile walk.

CPU only (numpy). NOTES_bwd_partial.md (the lab notes, now in git history) explains the numbers.

* ``stats``: per key block of Bn keys (one CTA of flashmask_bwd_pp_kernel per key block and head),
  the query tiles of Bm rows that `bwd_find_kept` (cc/sm90/bwd_kernel.cuh) keeps, the partial ones
  among them, and the skipped ones its linear scan walks over (every tile of the key block is
  visited once: skipped = mblk - kept).
* ``fit``: least squares on measured backward times (bench_attention.py JSON, rows of impl "ours")
  of  T = K0 + (t_tile * kept + dP * partial + c_scan * skipped) / 132  (sums over all CTAs; K0 =
  per-call passes + per-CTA fixed cost, the same for every mask when the token count and the CTA
  count are). Two sequence lengths with the same tokens separate c_scan from K0.
* ``walk_check``: the O(1) walk of bwd_find_kept (`next_kept`: at most three jumps over the two
  skip ranges; the only walk of every backward kernel since 2026-12-01) visits exactly the tiles of
  the old scan, for the benchmark masks and random bounds (ragged Sq, out-of-range values), at the
  kernels' tile shapes (Bm, Bn) = (64, 128) variants 5 / 6, (128, 128) variant 7, (64, 64) d = 256;
  and it catches a dropped third jump and an off-by-one in the range ends.
* ``rot_walk_check``: bwd_group_skips_none (which key blocks of variants 16 / 19 / 21 walk
  clocked) agrees with the tile classification, and the clocked walk visits every tile of every
  head once, in its promised order.

* ``mask_check``: variants 10 / 11's element-mask bits (bwd_col_mask: the thread's query columns
  below each bound, bmsk.clamp) equal the per-element test of variants 5 / 7.
* ``predict``: the model's times on bwd_timing.py's masks with the scan, with the O(1) walk, and
  with the partial path scaled (``--dp-ratio``), from the fitted coefficients (PRESETS).

Usage: python tests/det_sim/bwd_mask_model.py [--S 32768] [--bm 64] [--fit FILE ...] [--walk-check]
       [--rot-walk-check] [--mask-check]
       [--predict d128 d64 d64r128 [--dp-ratio R] [--masks ...]]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BN = 128  # kBwdBlockN
SMS = 132



def relative_lstsq(A: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of A @ coef ~ y on relative errors (each row weighted 1 / y): (coef, A @ coef)."""
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    return coef, A @ coef

def key_block_meta(bounds: np.ndarray, Bn: int = BN) -> np.ndarray:
    """[nblk, 8] int64: (LTS, LTE, UTS, UTE) x (min, max) per key block (block_meta.cu)."""
    sk = bounds.shape[1]
    nblk = -(-sk // Bn)
    out = np.empty((nblk, 8), np.int64)
    for n in range(nblk):
        sl = bounds[:, n * Bn:min((n + 1) * Bn, sk)].astype(np.int64)
        out[n, 0::2] = sl.min(axis=1)
        out[n, 1::2] = sl.max(axis=1)
    return out


def classify(bounds: np.ndarray, Sq: int, Bm: int, Bn: int = BN):
    """(skip [nblk, mblk] bool, partial [nblk, mblk] bool): bwd_find_kept's rule per tile."""
    meta = key_block_meta(bounds, Bn)
    sk = bounds.shape[1]
    mblk = -(-Sq // Bm)
    ms = np.arange(mblk) * Bm
    me = np.minimum(ms + Bm, Sq)
    lts_mn, lts_mx, lte_mn, lte_mx, uts_mn, uts_mx, ute_mn, ute_mx = (meta[:, i:i + 1] for i in range(8))
    skip = ((ms >= lts_mx) & (me <= lte_mn)) | ((ms >= uts_mx) & (me <= ute_mn))
    ragged = ((np.arange(len(meta)) + 1) * Bn > sk)[:, None]
    part = ragged | ((ms < lte_mx) & (me > lts_mn)) | ((ms < ute_mx) & (me > uts_mn))
    return skip, part & ~skip


def suite_bounds(S: int, seed="bench"):
    """{mask: canonical bounds [4, S]} of the benchmark suite. seed "bench": bench_attention.py's
    SeedSequence([0, S]); an int: bwd_timing.py's benchmark_suite(S, seed)."""
    from jax_flashmask.masks import benchmark_suite, canonical_bounds_np

    ss = np.random.SeedSequence([0, S]) if seed == "bench" else seed
    out = {}
    for name, m in benchmark_suite(S, seed=ss).items():
        sri = np.asarray(m.startend_row_indices, np.int32)
        out[name] = canonical_bounds_np(sri, causal=bool(m.causal), q_len=S)[0, 0]
    return out


def stats(S: int, Bm: int, seed="bench") -> dict:
    res = {}
    for name, b in suite_bounds(S, seed).items():
        skip, part = classify(b, S, Bm)
        kept = (~skip).sum(axis=1)
        res[name] = dict(kept=kept, part=part.sum(axis=1), mblk=skip.shape[1], nblk=skip.shape[0])
    return res


def print_stats(S: int, Bm: int, seed="bench"):
    st = stats(S, Bm, seed)
    print(f"S = {S}, Bm = {Bm}, Bn = {BN}: per key block (CTA)")
    print(f"{'mask':22s} {'kept':>6s} {'partial':>7s} {'part/kept':>9s} {'kept/CTA':>8s} {'min':>4s} {'max':>4s} {'skipped/CTA':>11s}")
    for name, s in st.items():
        k, p = s["kept"], s["part"]
        print(f"{name:22s} {k.sum():6d} {p.sum():7d} {p.sum() / k.sum():9.3f} {k.mean():8.1f} {k.min():4d} {k.max():4d} "
              f"{s['mblk'] - k.mean():11.1f}")


def fit(files: list[str], Bm: int = 64, d: int = 128, H: int = 32):
    """Least-squares fit of the time model on bench_attention.py JSON results (impl "ours")."""
    rows, y, keys = [], [], []
    cache = {}
    for f in files:
        for r in json.load(open(f))["results"]:
            if r.get("impl") != "ours" or r.get("d") != d or not r.get("bwd_ms"):
                continue
            S, B = r["S"], r["B"]
            if S not in cache:
                cache[S] = stats(S, Bm)
            s = cache[S][r["mask"]]
            heads = B * H
            kept, part = s["kept"].sum() * heads, s["part"].sum() * heads
            skipped = (s["mblk"] * s["nblk"] - s["kept"].sum()) * heads
            rows.append([1.0, kept / SMS, part / SMS, skipped / SMS])
            y.append(r["bwd_ms"] * 1e3)
            keys.append((S, r["mask"]))
    A, y = np.array(rows), np.array(y)
    coef, pred = relative_lstsq(A, y)
    print(f"fit (d = {d}, Bm = {Bm}, {len(y)} points): K0 = {coef[0] / 1e3:.2f} ms, t_tile = {coef[1]:.3f} us, "
          f"dP = {coef[2]:.3f} us per partial tile, c_scan = {1e3 * coef[3]:.1f} ns per skipped tile; "
          f"rms rel. err {np.sqrt(np.mean((pred / y - 1) ** 2)):.3f}")
    print(f"{'S':>6s} {'mask':22s} {'meas ms':>8s} {'model':>6s} {'tiles':>6s} {'partial':>7s} {'scan':>5s} {'K0':>5s}")
    for (S, name), yy, pp, a in zip(keys, y, pred, A):
        sh = [100 * a[i] * coef[i] / yy for i in (1, 2, 3)] + [100 * coef[0] / yy]
        print(f"{S:6d} {name:22s} {yy / 1e3:8.2f} {100 * (pp / yy - 1):+5.1f}% {sh[0]:5.1f}% {sh[1]:6.1f}% {sh[2]:4.1f}% {sh[3]:4.1f}%")
    return coef


# ----------------------------------------------------------------------------- O(1) tile walk


def skip_range(lo_key: int, hi_key: int, Sq: int, Bm: int, mblk: int) -> tuple[int, int]:
    """Tiles [s, e) lying entirely inside rows [lo_key, hi_key): ms >= lo_key and me <= hi_key
    (as bwd_sched_kernel's sched_inside, half-open). C integer arithmetic on non-negative values."""
    s = 0 if lo_key <= 0 else (lo_key + Bm - 1) // Bm
    e = mblk if hi_key >= Sq else (0 if hi_key <= 0 else hi_key // Bm)
    return s, e


def next_kept(m: int, meta_row, Sq: int, Bm: int, mblk: int, third: bool = True,
              e_off: int = 0) -> int:
    """First tile >= m that the scan keeps (mblk when none), as bwd_find_kept (cc/sm90/bwd_kernel.cuh,
    every backward kernel since 2026-12-01) finds it: m is tested as the scan's first iteration
    would; only a skipped m jumps over the two skip ranges, three jumps at most. third / e_off: the
    mutations the check must catch (no third jump; e off by e_off)."""
    if m >= mblk:
        return mblk
    ms, me = m * Bm, min(m * Bm + Bm, Sq)
    lts_mx, lte_mn, uts_mx, ute_mn = (int(meta_row[i]) for i in (1, 2, 5, 6))
    if (ms >= lts_mx and me <= lte_mn) or (ms >= uts_mx and me <= ute_mn):
        s1, e1 = skip_range(lts_mx, lte_mn, Sq, Bm, mblk)  # LTSmax, LTEmin
        s2, e2 = skip_range(uts_mx, ute_mn, Sq, Bm, mblk)  # UTSmax, UTEmin
        e1, e2 = e1 + e_off, e2 + e_off
        if s1 <= m < e1:
            m = e1
        if s2 <= m < e2:
            m = e2
        if third and s1 <= m < e1:
            m = e1
    return min(m, mblk)


def _check_one(bounds, Sq, Bm, Bn=BN, **mut) -> int:
    skip, _ = classify(bounds, Sq, Bm, Bn)
    meta = key_block_meta(bounds, Bn)
    mblk = skip.shape[1]
    bad = 0
    for n in range(len(meta)):
        kept = np.flatnonzero(~skip[n])
        # scan answer for every start m: the first kept tile >= m
        nxt = np.full(mblk + 1, mblk)
        for t in kept[::-1]:
            nxt[: t + 1] = t
        for m in range(mblk + 1):
            bad += next_kept(m, meta[n], Sq, Bm, mblk, **mut) != nxt[m]
    return bad


# (Bm, Bn) of the kernels: d = 64 / 128 (variants 5, 6: Bm 64; variant 7: Bm 128) at 128 keys per
# block, d = 256 at 64 keys per block
TILE_SHAPES = ((64, 128), (128, 128), (64, 64))


def _random_bounds(rng):
    Sq = int(rng.integers(1, 1200))
    Sk = int(rng.integers(1, 700))
    b = np.empty((4, Sk), np.int64)
    for r in (0, 2):  # ranges of random widths, some empty or reversed, some out of [0, Sq]
        lo = rng.integers(-70, Sq + 70, Sk)
        hi = lo + rng.integers(-50, Sq + 1, Sk)
        if rng.random() < 0.5:  # smooth (document-like) columns: long skip ranges
            lo = np.full(Sk, rng.integers(-10, Sq + 1)) + rng.integers(0, 3, Sk)
            hi = np.full(Sk, rng.integers(0, Sq + 130)) + rng.integers(0, 3, Sk)
        b[r], b[r + 1] = lo, hi
    return b, Sq


def walk_check(sizes=(4096, 8192), rand_cases=300, seed=0) -> int:
    """0 mismatches expected; the mutated walks (no third jump, e off by one) must mismatch."""
    rng = np.random.default_rng(seed)
    cases = []
    for S in sizes:
        for name, b in suite_bounds(S).items():
            for Bm, Bn in TILE_SHAPES:
                cases.append((b, S, Bm, Bn))
    for i in range(rand_cases):
        b, Sq = _random_bounds(rng)
        Bm, Bn = TILE_SHAPES[i % len(TILE_SHAPES)]
        cases.append((b, Sq, Bm, Bn))
    # the third jump: the upper range ends inside the lower one, which starts above m
    third = np.array([[200] * 5, [600] * 5, [0] * 5, [300] * 5])
    for Bm, Bn in TILE_SHAPES:
        cases.append((third, 1000, Bm, Bn))
    bad = sum(_check_one(*c) for c in cases)
    per_shape = {sh: sum(1 for c in cases if c[2:] == sh) for sh in TILE_SHAPES}
    print(f"O(1) walk vs scan: {len(cases)} cases (12 masks x {len(sizes)} lengths + {rand_cases} random + "
          f"the third-jump case, each at (Bm, Bn) = {', '.join(f'{k}: {v}' for k, v in per_shape.items())}), "
          f"{bad} mismatching start tiles")
    caught = {}
    for label, mut in (("no third jump", dict(third=False)), ("e - 1", dict(e_off=-1)),
                       ("e + 1", dict(e_off=1))):
        caught[label] = sum(_check_one(*c, **mut) for c in cases)
    print("mutations caught (mismatching start tiles): "
          + ", ".join(f"{k} {v}" for k, v in caught.items()))
    if not all(caught.values()):
        print("walk check is blind to a mutation")
        return bad + 1
    return bad


# ----------------------------------------------------------------------------- clocked walk


def skips_none(meta_row, Sq: int, Bm: int, mblk: int, strict: bool = False) -> bool:
    """One head's part of bwd_group_skips_none: the key block skips no query tile (both skip
    ranges empty). strict: the mutation the check must catch."""
    lts_mx, lte_mn, uts_mx, ute_mn = (int(meta_row[i]) for i in (1, 2, 5, 6))
    s1, e1 = skip_range(lts_mx, lte_mn, Sq, Bm, mblk)
    s2, e2 = skip_range(uts_mx, ute_mn, Sq, Bm, mblk)
    return (e1 < s1 and e2 < s2) if strict else (e1 <= s1 and e2 <= s2)


def clocked_walk(n_heads: int, mblk: int, r: int, head_step: bool = True) -> list:
    """The (head g, tile m) sequence of a clocked walk (variants 16 / 19 / 21, next_kept with rot
    = r >= 0, for a key block that skips nothing): from (0, r), m + 1 wrapping at mblk, the next
    head when m is back at r. head_step: the mutation the check must catch (no head advance)."""
    out, g, m = [], 0, r
    while g < n_heads and len(out) <= 2 * mblk * n_heads:
        out.append((g, m))
        m = 0 if m + 1 == mblk else m + 1
        if m == r and head_step:
            g += 1
    return out


def rot_walk_check(sizes=(2048,), rand_cases=60, seed=0) -> int:
    """bwd_group_skips_none against the classification (a key block is clocked iff no head of its
    group skips a tile of it), for the benchmark masks (one head) and random bounds (three heads,
    as a GQA group with a mask head per query head), at Bm = 80; and the clocked walk visits each
    tile of each head once, head by head, tiles >= r then tiles < r, at several r. 0 mismatches
    expected; the mutations (strict range test, no head advance) must mismatch."""
    rng = np.random.default_rng(seed)
    Bm = 80
    cases = [([b], S) for S in sizes for b in suite_bounds(S).values()]
    full = np.stack([np.full(sizes[0], sizes[0]), np.full(sizes[0], sizes[0]),
                     np.full(sizes[0], sizes[0]), np.full(sizes[0], sizes[0])])
    cases.append(([full, full], sizes[0]))  # a group whose key blocks all skip nothing
    for _ in range(rand_cases):
        b, Sq = _random_bounds(rng)
        # two more heads on the same keys: its columns shuffled, its bounds shifted
        cases.append(([b, b[:, rng.permutation(b.shape[1])], b + rng.integers(-60, 60, b.shape)], Sq))

    def run_none(strict=False) -> tuple:  # (wrong answers, clocked key blocks)
        bad = clocked = 0
        for heads, Sq in cases:
            skips = [classify(b, Sq, Bm, BN)[0] for b in heads]
            metas = [key_block_meta(b, BN) for b in heads]
            mblk = skips[0].shape[1]
            for n in range(skips[0].shape[0]):
                got = all(skips_none(mt[n], Sq, Bm, mblk, strict) for mt in metas)
                want = not any(sk[n].any() for sk in skips)
                bad += got != want
                clocked += want
        return bad, clocked

    def run_walk(**mut) -> int:
        bad = 0
        for n_heads in (1, 3):
            for mblk in (1, 2, 7, 26):
                for r in sorted({0, 1 % mblk, mblk // 2, mblk - 1}):
                    want = [(g, m) for g in range(n_heads)
                            for m in list(range(r, mblk)) + list(range(r))]
                    bad += clocked_walk(n_heads, mblk, r, **mut) != want
        return bad

    (bad_none, clocked), bad_walk = run_none(), run_walk()
    caught = {"strict range test": run_none(strict=True)[0], "no head advance": run_walk(head_step=False)}
    print(f"clocked walk: {len(cases)} cases, {clocked} clocked key blocks, {bad_none} wrong "
          f"bwd_group_skips_none, {bad_walk} wrong walks; mutations caught: "
          + ", ".join(f"{k} {v}" for k, v in caught.items()))
    return bad_none + bad_walk + (0 if all(caught.values()) and clocked else 1)


# ----------------------------------------------------------------------------- element mask bits


def bmsk_clamp(pos: int, width: int) -> int:
    """PTX bmsk.clamp.b32 (pos, width as u32): bits [pos, pos + width), clamped at bit 31."""
    pos, width = pos & 0xFFFFFFFF, width & 0xFFFFFFFF
    mask0 = 0 if pos >= 32 else (0xFFFFFFFF << pos) & 0xFFFFFFFF
    a1, b1 = pos & 31, width & 31
    if a1 + b1 >= 32 or pos >= 32 or width >= 32:
        mask1 = 0
    elif b1 == 0:
        mask1 = 0xFFFFFFFF
    else:
        mask1 = (0xFFFFFFFF << (a1 + b1)) & 0xFFFFFFFF
    return mask0 & ~mask1 & 0xFFFFFFFF


def cols_below(x: int, lo: int, Bm: int) -> int:
    """bwd_cols_below: the thread's query columns lo + 8*kk + j below x."""
    y = min(max(x, lo), lo + Bm) - lo
    return 2 * (y >> 3) + min(y & 7, 2)


def col_mask(lts: int, lte: int, uts: int, ute: int, lo: int, Bm: int) -> int:
    """bwd_col_mask (variants 10 / 11): bit 2*kk + j <=> lo + 8*kk + j in [lts, lte) u [uts, ute)."""
    a1, b1 = cols_below(lts, lo, Bm), cols_below(lte, lo, Bm)
    a2, b2 = cols_below(uts, lo, Bm), cols_below(ute, lo, Bm)
    return bmsk_clamp(a1, max(b1 - a1, 0)) | bmsk_clamp(a2, max(b2 - a2, 0))


def mask_check(cases: int = 20000, seed: int = 0) -> int:
    """col_mask against the per-element test of variants 5 / 7, `koob || (lts <= q && q < lte) ||
    (uts <= q && q < ute)` (koob folded into [INT_MIN, INT_MAX), [0, 0)), for every element of a
    thread (Bm 64 and 128, col_base 0/2/4/6): random tiles and bounds around the tile, empty and
    reversed ranges, int32 extremes; and that a wrong count (min(r, 1)) or bmsk without the
    max(., 0) would be caught. Returns the number of mismatching elements."""
    rng = np.random.default_rng(seed)
    I32 = (-(2 ** 31), 2 ** 31 - 1)
    bad = wrong_cnt = wrong_w = 0
    for c in range(cases):
        Bm = 64 if c % 2 else 128
        ms = int(rng.integers(0, 4000)) * Bm
        cb = 2 * int(rng.integers(0, 4))
        lo = ms + cb

        def bound():
            r = rng.random()
            if r < 0.05:
                return int(rng.choice(I32))
            if r < 0.15:
                return int(rng.integers(-3 * Bm, 3 * Bm)) + ms
            return ms + int(rng.integers(-10, Bm + 10))

        koob = rng.random() < 0.03
        b = (I32[0], I32[1], 0, 0) if koob else tuple(bound() for _ in range(4))
        mk = col_mask(*b, lo, Bm)
        for kk in range(Bm // 8):
            for j in range(2):
                q = lo + 8 * kk + j
                want = (b[0] <= q < b[1]) or (b[2] <= q < b[3])
                bad += bool(mk >> (2 * kk + j) & 1) != want
        # the mutations
        def cb1(x):
            y = min(max(x, lo), lo + Bm) - lo
            return 2 * (y >> 3) + min(y & 7, 1)
        a1, b1 = cb1(b[0]), cb1(b[1])
        wrong_cnt += bmsk_clamp(a1, max(b1 - a1, 0)) != bmsk_clamp(
            cols_below(b[0], lo, Bm), max(cols_below(b[1], lo, Bm) - cols_below(b[0], lo, Bm), 0))
        a1, b1 = cols_below(b[0], lo, Bm), cols_below(b[1], lo, Bm)
        wrong_w += bmsk_clamp(a1, b1 - a1) != bmsk_clamp(a1, max(b1 - a1, 0))
    print(f"element mask bits (variants 10 / 11) vs the per-element test: {cases} thread-tiles x 16 / 32 "
          f"elements, {bad} mismatches; caught: min(r, 1) count {wrong_cnt}, width without max {wrong_w}")
    return bad + (wrong_cnt == 0) + (wrong_w == 0)


# ----------------------------------------------------------------------------- predictions

# Fitted coefficients (us per tile / partial tile / skipped tile per SM, K0 in us per call) of
# T = K0 + (t_tile * kept + dP * partial + c_scan * skipped) / 132 for 128K tokens, H = 32:
#  d128: variant 5, 24 points at 32K + 128K (NOTES_bwd_partial.md section 4);
#  d64: variant 5, 8K + 32K (same section);
#  d64r128: variant 7 (Bm = 128), the 4 points of bwd_dev_2026-11-30s4_run1_v5v7v8_d64.json (8K,
#  bwd_timing.py masks) with K0 and c_scan taken from d64 (4 points cannot separate them):
#  t_tile = 3.31 us per 128-row tile, dP = 2.14 us (NOTES_bwd_walkall.md).
PRESETS = {
    "d128": dict(d=128, Bm=64, t=2.96, dP=0.49, c=0.053, K0=4700.0),
    "d64": dict(d=64, Bm=64, t=2.16, dP=0.74, c=0.059, K0=4300.0),
    "d64r128": dict(d=64, Bm=128, t=3.31, dP=2.14, c=0.059, K0=4300.0),
}


def predict(S: int, preset: str, masks=None, dp_ratio: float = 1.0, seed=0, tokens=131072, H=32,
            dp: float | None = None):
    """Model times (ms) and TFLOP/s (bwd_timing.py's convention) on bwd_timing.py's masks
    (benchmark_suite(S, seed)): `scan` = the tile-by-tile scan (the kernels before 2026-12-01),
    `walk` = the O(1) walk (c_scan term gone), `walk+mask` = the walk and dP scaled by dp_ratio
    (the cheaper partial-tile mask: ratio of the partial path's extra instructions)."""
    from jax_flashmask import masks as Mk

    c = dict(PRESETS[preset])
    if dp is not None:  # another partial-tile cost than the preset's fit
        c["dP"] = dp
    B = max(1, tokens // S)
    suite = Mk.benchmark_suite(S, seed, batch=1)
    st = stats(S, c["Bm"], seed)
    rows = []
    for name in masks or list(st):
        s = st[name]
        heads = B * H
        kept, part = s["kept"].sum() * heads, s["part"].sum() * heads
        skipped = (s["mblk"] * s["nblk"] - s["kept"].sum()) * heads
        base = c["K0"] + (c["t"] * kept + c["dP"] * part) / SMS
        scan = base + c["c"] * skipped / SMS
        walk = base
        cheap = walk - c["dP"] * (1 - dp_ratio) * part / SMS
        rho = float(Mk.block_sparsity(suite[name], S, 128))
        flops = 2.5 * 4.0 * B * H * S * S * c["d"] * (1 - rho)
        rows.append((name, scan / 1e3, walk / 1e3, cheap / 1e3, flops))
    print(f"S = {S}, preset {preset} ({c}), dP ratio {dp_ratio:.3f}")
    print(f"{'mask':22s} {'scan ms':>8s} {'walk ms':>8s} {'+mask ms':>8s}  {'TFLOP/s scan -> walk -> +mask':>30s}  "
          f"{'walk':>6s} {'mask':>6s}")
    for name, a, b, cc, fl in rows:
        print(f"{name:22s} {a:8.2f} {b:8.2f} {cc:8.2f}  {fl / a / 1e9:8.1f} -> {fl / b / 1e9:6.1f} -> {fl / cc / 1e9:6.1f}  "
              f"{100 * (a / b - 1):+5.1f}% {100 * (b / cc - 1):+5.1f}%")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--S", type=int, nargs="*", default=[32768])
    ap.add_argument("--bm", type=int, default=64)
    ap.add_argument("--fit", nargs="*", default=[])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--walk-check", action="store_true")
    ap.add_argument("--rot-walk-check", action="store_true",
                    help="the clocked walk (variants 16 / 19 / 21) against the tile classification")
    ap.add_argument("--mask-check", action="store_true",
                    help="variants 10 / 11's element-mask bits against the per-element test")
    ap.add_argument("--predict", nargs="*", default=[], choices=sorted(PRESETS),
                    help="model predictions at each --S on bwd_timing.py's masks")
    ap.add_argument("--dp-ratio", type=float, default=1.0,
                    help="with --predict: partial-path cost of the new mask / the old one")
    ap.add_argument("--dp", type=float, default=None,
                    help="with --predict: dP (us per partial tile) instead of the preset's")
    ap.add_argument("--masks", nargs="*", default=None)
    a = ap.parse_args()
    if a.predict:
        for S in a.S:
            for pr in a.predict:
                predict(S, pr, a.masks, a.dp_ratio, dp=a.dp)
        return 0
    for S in a.S:
        print_stats(S, a.bm)
    if a.fit:
        fit(a.fit, a.bm, a.d)
    bad = 0
    if a.walk_check:
        bad += walk_check()
    if a.rot_walk_check:
        bad += rot_walk_check()
    if a.mask_check:
        bad += mask_check()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
