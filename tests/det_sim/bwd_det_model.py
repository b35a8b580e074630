"""Timeline model of the backward's deterministic dQ ordering (issue 4; NOTES_bwd_det.md (the lab notes, now in git history)).

One CTA per (key block n, kv head, batch), one CTA per SM (132 SMs), launched in grid order onto
the first free SM. A CTA walks its kept 64-row query tiles in ascending order:
  consumers:  C_k = max(C_{k-1} + T_k, F_{k-2} + s)    (2 dQ smem buffers: tile k's dQ store
              waits until the writer freed the buffer of tile k-2; s = the store itself)
  dQ writer:  default        F_k = max(C_k, F_{k-1}) + Rr       (bulk reduce issued, smem read)
              deterministic  F_k = max(C_k, F_{k-1}, P_k + poll) + Rc
              where P_k = the time the key block before this one in the tile's fixed order set
              its bit (the next higher key block that keeps the tile; skipped pairs are
              pre-marked at CTA start), Rc = reduce issued + complete in L2 + bit released.
A CTA ends at max(C_last, F_last) + epi; it starts at launch + pro.
Launch orders: "x" = the current one (n descending fastest, then kv head, then batch);
"gG" = G kv heads interleaved (n descending, kv head within a group of G fastest) -- the fix.
Deterministic CTAs only wait on CTAs launched before them, so one pass in launch order with a
min-heap of SM free times is exact for this model.

Usage: python tests/det_sim/bwd_det_model.py [--heads 32] [--masks ...] [--orders x g8] [--nbuf 2 4]
Numbers in NOTES_bwd_det.md come from `python tests/det_sim/bwd_det_model.py` (default arguments)
and `--nbuf 2 4 --orders x g8 --heads 16`. "nowait" = the deterministic writer costs without
any ordering wait (the floor a launch order can reach).
"""
from __future__ import annotations

import argparse
import heapq

import numpy as np

S = 32768
BM, BN = 64, 128
DOCS = [542, 801, 1122, 3278, 3095, 1246, 6418, 241, 3135, 986, 414, 5368, 3261, 2861]  # suite, seed 0


def kept_ranges(mask: str, S: int = S, docs=DOCS):
    """Per key block n: (first, last+1) kept query tile (every mask here keeps a contiguous range),
    and per kept tile whether it is partial (element mask needed)."""
    nblk, mblk = S // BN, S // BM
    starts = np.cumsum([0] + list(docs))
    doc_of = np.searchsorted(starts, np.arange(S), side="right") - 1
    out = []
    for n in range(nblk):
        k0, k1 = n * BN, n * BN + BN - 1
        if mask == "full":
            lo, hi = 0, mblk
        elif mask == "causal":
            lo, hi = k0 // BM, mblk
        elif mask in ("document", "causal_document"):
            d0, d1 = doc_of[k0], doc_of[k1]
            lo = (k0 // BM) if mask == "causal_document" else starts[d0] // BM
            hi = -(-starts[d1 + 1] // BM)
        out.append((int(lo), int(hi)))
    return out


def simulate(mask, det, order="x", heads=16, T=2.77, Tp=3.0, s=0.4, Rr=0.3, Rc=1.2, poll=0.8,
             pro=4.0, epi=3.0, sms=132, nbuf=2, wfix=0.0, nowait=False, pipe=False):
    """Returns total time (us) for `heads` (kv head, batch) pairs."""
    nblk = S // BN
    rng = kept_ranges(mask)
    starts = np.cumsum([0] + DOCS)
    bounds = set(int(x) for x in starts)

    def partial(n, m):
        q0, q1 = m * BM, m * BM + BM
        k0, k1 = n * BN, n * BN + BN
        if mask == "full":
            return False
        if mask == "causal":
            return q0 < k1 and q1 > k0
        cut = any(k0 < b < k1 or q0 < b < q1 for b in bounds)
        if mask == "causal_document":
            cut = cut or (q0 < k1 and q1 > k0)
        return cut

    # per tile m of each head: {key block -> bit time}; the predecessor of n on m = next higher
    # kept key block (descending order)
    items = []
    pred = None  # variant 17: (n, m) -> the key block before n in tile m's summation order
    if order == "x":
        for h in range(heads):
            for x in range(nblk):
                items.append((nblk - 1 - x, h))
    elif order.startswith("pi"):
        # variant 17: per (kv head, batch) pair, key blocks in pi_order (and each tile's dQ summed
        # in that order); pairs one after the other ("pi") or G pairs interleaved ("piG")
        G = int(order[2:]) if len(order) > 2 else 1
        perm = pi_order([lo if hi > lo else S // BM for lo, hi in rng])
        keep = {}
        for nn in perm:
            lo, hi = rng[nn]
            for m in range(lo, hi):
                keep.setdefault(m, []).append(nn)
        pred = {}
        for m, lst in keep.items():  # keepers of tile m in summation (= launch) order
            for i in range(1, len(lst)):
                pred[(lst[i], m)] = lst[i - 1]
        for g0 in range(0, heads, G):
            gs = min(G, heads - g0)
            for r in range(nblk * gs):
                items.append((perm[r // gs], g0 + r % gs))
    elif order.startswith("lv"):
        # variant 17: per (kv head, batch) pair, key blocks by (level, descending key block),
        # pairs one after the other ("lv") or G pairs interleaved level by level ("lvG")
        G = int(order[2:]) if len(order) > 2 else 1
        perm = level_order([(lo, hi - 1) for lo, hi in rng])
        for g0 in range(0, heads, G):
            gs = min(G, heads - g0)
            for r in range(nblk * gs):
                items.append((perm[r // gs], g0 + r % gs))
    else:
        G = int(order[1:])
        for g0 in range(0, heads, G):
            gs = min(G, heads - g0)
            for r in range(nblk * gs):
                items.append((nblk - 1 - r // gs, g0 + r % gs))
    bit = {}  # (h, m, n) -> time the bit of n on m was set
    free = [0.0] * sms
    heapq.heapify(free)
    end = 0.0
    tcache = {}
    for n, h in items:
        t0 = heapq.heappop(free)
        lo, hi = rng[n]
        t = t0 + pro
        if (n, lo, hi) not in tcache:
            tcache[(n, lo, hi)] = [Tp if partial(n, m) else T for m in range(lo, hi)]
        Ts = tcache[(n, lo, hi)]
        C = []
        F = []
        prevC = t
        prevF = t
        prevI = t
        for k, m in enumerate(range(lo, hi)):
            c = prevC + Ts[k]
            if k >= nbuf:
                c = max(c, F[k - nbuf] + s)
            C.append(c)
            if det and not nowait:
                # predecessor: the next higher key block keeping tile m (same head)
                p = -1.0
                nn = n + 1 if pred is None else nblk
                if pred is not None and (n, m) in pred:
                    p = bit[(h, m, pred[(n, m)])]
                while nn < nblk:
                    if rng[nn][0] <= m < rng[nn][1]:
                        p = bit[(h, m, nn)]
                        break
                    if rng[nn][0] > m:  # kept ranges of higher blocks only start later (masks here)
                        break
                    nn += 1
                if pipe:
                    # pipelined writer: tile k's reduce is issued before tile k-1's completes;
                    # k-1's bit (and buffer) follow k's issue (wait_group 1)
                    iss = max(c, prevI + wfix, p + poll if p >= 0 else 0.0)
                    if k > 0:
                        F[k - 1] = max(F[k - 1], iss)
                        bit[(h, m - 1, n)] = F[k - 1]
                    f = iss + Rc
                    prevI = iss
                    bit[(h, m, n)] = f
                else:
                    f = max(c, prevF + wfix, p + poll if p >= 0 else 0.0) + Rc
                    bit[(h, m, n)] = f
            else:
                f = max(c, prevF + (wfix if det else 0.0)) + (Rc if det else Rr)
            F.append(f)
            prevC, prevF = c, f
        te = max(prevC, prevF) + epi if hi > lo else t0 + 1.0
        end = max(end, te)
        heapq.heappush(free, te)
    return end


def levels(hull):
    """Variant 17's chain levels: hull[n] = (first, last) kept query tile of key block n over the
    heads of its kv group (first > last: keeps none). level(n) = 0 if no key block above n has a
    hull meeting n's, else 1 + the largest level among those. A key block waits only for key blocks
    above it that keep one of its tiles, whose hulls meet its own: they all have lower levels."""
    nblk = len(hull)
    lev = [0] * nblk
    for n in range(nblk - 1, -1, -1):
        lo, hi = hull[n]
        best = -1
        if lo <= hi:
            for m in range(n + 1, nblk):
                a, b = hull[m]
                if a <= b and a <= hi and lo <= b:
                    best = max(best, lev[m])
        lev[n] = best + 1
    return lev


def level_order(hull):
    """Key blocks of one pair in variant 17's launch order: ascending level, descending key block
    within a level. Host twin of bwd_level_order_kernel (rank of n = #{level < level(n)} +
    #{m > n, level(m) == level(n)})."""
    lev = levels(hull)
    return sorted(range(len(hull)), key=lambda n: (lev[n], -n))


def pi_order(first):
    """Variant 17's per-pair key-block order (launch order and every query tile's dQ summation
    order). first[n] = the first query tile key block n keeps (over its kv group's heads; mblk if
    none). Key blocks with the same first tile form a group (a document's key blocks; a single one
    per key block on causal / sliding-window masks; all of them on full); r(n) = number of key
    blocks of its group above n. Order: ascending r, then descending first tile, then descending
    key block. Full and causal: descending key block (variant 5's order); documents: round robin
    over the documents (last to first), each walked top down. Host twin of bwd_pi_order_kernel:
    position(n) = #{n' : key(n') < key(n)}."""
    nblk = len(first)
    r = [sum(1 for m in range(n + 1, nblk) if first[m] == first[n]) for n in range(nblk)]
    return sorted(range(nblk), key=lambda n: (r[n], -first[n], -n))


def auto_group(kept, first, nblk, mblk, pairs, cap=8):
    """Host twin of bwd_det_group_kernel (variant 17's launch group size). kept[i] / first[i] = kept
    query tiles / first kept tile of item i = (batch * Hm + mask head) * nblk + key block."""
    cap = max(1, min(cap, pairs))
    tot = sum(kept)
    live = sum(1 for k in kept if k > 0)
    co = sum(1 for i, k in enumerate(kept) if k > 0 and i % nblk + 1 < nblk and first[i] == first[i + 1])
    if live == 0 or 2 * co < live:
        return 1
    g = cap if tot == 0 else mblk * len(kept) // tot
    return max(1, min(g, cap))


def suite_group(mask, pairs=128):
    """Variant 17's G on one of the model's masks (32K, every pair the same mask)."""
    rng = kept_ranges(mask)
    mblk = S // BM
    kept = [hi - lo for lo, hi in rng]
    first = [lo if hi > lo else mblk for lo, hi in rng]
    return auto_group(kept, first, len(rng), mblk, pairs)


def det_group_item(x: int, nblk: int, K: int, B: int, G: int):
    """Host twin of bwd_pp_item for BwdDetGroups (variants 14 / 15, deterministic): grid position
    x -> (key block n, kv head hk, batch b). Same integer arithmetic as the kernel."""
    pairs = K * B
    span = nblk * G
    grp = x // span
    r = x - grp * span
    p0 = grp * G
    gs = min(G, pairs - p0)
    pr = p0 + r % gs
    return nblk - 1 - r // gs, pr % K, pr // K


def order_check(cases=((1, 1, 1, 1), (7, 3, 3, 8), (256, 32, 4, 8), (5, 2, 3, 4), (3, 1, 5, 2),
                       (40, 9, 1, 8), (1, 4, 2, 3))) -> int:
    """For (nblk, K, B, G): the decoding is a bijection of [0, nblk K B) onto the work items, and
    every key block above an item's (same kv head and batch: all it can wait for) sits at a lower
    grid position (the deadlock argument). Returns the number of failures."""
    bad = 0
    for nblk, K, B, G in cases:
        G = max(1, min(G, K * B))
        pos = {}
        for x in range(nblk * K * B):
            it = det_group_item(x, nblk, K, B, G)
            n, hk, b = it
            if not (0 <= n < nblk and 0 <= hk < K and 0 <= b < B) or it in pos:
                bad += 1
            pos[it] = x
        if len(pos) != nblk * K * B:
            bad += 1
        for (n, hk, b), x in pos.items():
            if n + 1 < nblk and pos[(n + 1, hk, b)] >= x:
                bad += 1
    return bad


REGIMES = {
    # writer keeps up (per-tile writer cost Rc = 1.2 us < T): only the chain waits cost
    "latency": dict(Rc=1.2, poll=0.8, wfix=0.0),
    # writer-bound (fence + reduce-to-completion + bit = 3.2 us per tile > T = 2.77 us): fits the
    # measured full / causal losses (-15 % / -10 %)
    "writer": dict(Rc=2.0, poll=0.8, wfix=1.2),
}


# H200 2026-12-01 s6 (32K, B = 4, H = 32, d = 128, bf16, backward TFLOP/s): default-mode bodies
# (variant 10 = 5's ping-pong body with the mask in registers, s5 run 6; variant 13 = lock-step,
# today's protocol run) and deterministic variants 5, 13, 14, 15.
MEASURED = {
    "default_v10": dict(full=491, causal=490, document=440, causal_document=394),
    "default_v13": dict(full=509, causal=504, document=476, causal_document=437),
    "det_v5": dict(full=417, causal=438, document=337, causal_document=358),
    "det_v13": dict(full=398, causal=414, document=352, causal_document=352),
    "det_v14": dict(full=376, document=384, causal_document=344),
    "det_v15": dict(full=403, causal=349, document=383, causal_document=355),
}
# Refit (today): the tile time of each body from its default full rate (10.49 MFLOP per 64 x 128
# tile over 132 SMs), the writer's serial per-tile cost W = wfix + Rc from the deterministic full
# loss of that body (writer-bound: det tile time ~ W): v5 body 417 -> 3.32 us (the 2026-12-01
# fit had 3.2), lock-step body 398 -> 3.48 us (its consumers idle while the writer is late, the
# ping-pong hides part of it). Rc = 2.0 (reduce to completion + release), poll = 0.8 kept.
FIT = {
    "v5body": dict(T=2.82, Tp=3.05, Rc=2.0, poll=0.8, wfix=1.32),
    "v13body": dict(T=2.72, Tp=2.95, Rc=2.0, poll=0.8, wfix=1.48),
}


def fit_table(heads=32, masks=("full", "causal", "document", "causal_document")):
    """Model (time increase over the same body's default) for today's configurations, next to the
    measured increase: v5 / v14 / v15 on the v5 body (vs v10 default), v13 / v17 on the lock-step
    body (vs v13 default); v17 = pipelined writer + G from the device rule (suite_group)."""
    rows = []
    for mk in masks:
        for body, cfgs in (("v5body", (("det_v5", "x", False), ("det_v14", "g8", False),
                                        ("det_v15", "g8", True))),
                           ("v13body", (("det_v13", "x", False), ("det_v17", None, True)))):
            cfg = FIT[body]
            base = simulate(mk, False, "x", heads, **cfg)
            dflt = MEASURED["default_v10" if body == "v5body" else "default_v13"][mk]
            for name, order, pipe in cfgs:
                if order is None:
                    G = suite_group(mk)
                    order = "x" if G == 1 else f"g{G}"
                t = simulate(mk, True, order, heads, pipe=pipe, **cfg)
                model = 100 * (t / base - 1)
                meas = MEASURED.get(name, {}).get(mk)
                rows.append((mk, name, order + ("+pipe" if pipe else ""), model,
                             None if meas is None else 100 * (dflt / meas - 1), dflt / (1 + model / 100)))
    return rows


def chain_table(S=S, docs=DOCS):
    """Per document: key blocks (chain depth), query tiles per CTA, the co-launch fill estimate."""
    rows = []
    for L in docs:
        nk, nq = L / BN, L / BM
        rows.append((L, nk, nq))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--masks", nargs="+", default=["full", "causal", "document", "causal_document"])
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES))
    ap.add_argument("--orders", nargs="+", default=["x", "g2", "g4", "g8", "g16", "g32"])
    ap.add_argument("--nbuf", type=int, nargs="+", default=[2])
    ap.add_argument("--pipe", action="store_true", help="also the pipelined deterministic writer")
    ap.add_argument("--order-check", action="store_true", help="check variant 14's grid decoding")
    ap.add_argument("--fit", action="store_true", help="today's refit: model vs measured, v17")
    ap.add_argument("--v16", action="store_true",
                    help="variant 16 / 19 timeline on the real suite masks (NOTES_detwalk.md); "
                         "--orders x g8 ... (auto: variant 19's rule), --walks asc glast gfirst rot")
    ap.add_argument("--walks", nargs="+", default=["asc"])
    a = ap.parse_args()
    if a.v16:
        regs = {k: v for k, v in REGIMES16.items() if k in a.regimes} or REGIMES16
        masks = a.masks if a.masks != ap.get_default("masks") else list(MEASURED16)
        for mk in masks:
            orders = []
            for o in a.orders:
                if o == "auto":
                    G = suite_group19(mk)[0]
                    o = "x" if G == 1 else f"g{G}"
                orders.append(o)
            table16([mk], regs, list(dict.fromkeys(orders)), a.walks, a.heads)
        return
    if a.fit:
        print(f"{'mask':16s} {'config':8s} {'order':9s} {'model':>8s} {'measured':>9s} {'model TFLOP/s':>14s}")
        for mk, name, order, model, meas, tf in fit_table(a.heads, a.masks):
            ms = "-" if meas is None else f"{meas:+.1f}%"
            print(f"{mk:16s} {name:8s} {order:9s} {model:+7.1f}% {ms:>9s} {tf:14.0f}", flush=True)
        return
    if a.order_check:
        bad = order_check()
        print("order check:", "ok" if bad == 0 else f"{bad} failures")
        return
    print("measured H200 32K B=4 H=32 (TFLOP/s default v10 -> det v5): full 501 -> 426 (+17.6 % time),"
          " causal 493 -> 442 (+11.5 %), document 446 -> 337 (+32.3 %)")
    print("documents (tokens, key blocks = chain depth, 64-row query tiles per CTA):")
    for L, nk, nq in chain_table():
        print(f"  {L:5d} {nk:6.1f} {nq:6.1f}")
    print(f"model: {a.heads} (kv head, batch) pairs, 132 SMs; time increase of deterministic over "
          "default (same model, same pairs); gG = variant 14 with G pairs per launch group")
    for reg in a.regimes:
        cfg = REGIMES[reg]
        for nb in a.nbuf:
            print(f"\n-- regime {reg} {cfg} dQ buffers {nb}")
            for mk in a.masks:
                base = simulate(mk, False, "x", a.heads, **cfg)
                row = [f"{mk:16s} default {base / 1e3:7.2f} ms"]
                for order in a.orders:
                    if order != "x" and int(order[1:]) > a.heads:
                        continue
                    t = simulate(mk, True, order, a.heads, nbuf=nb, **cfg)
                    row.append(f"{order}:{100 * (t / base - 1):+5.1f}%")
                t = simulate(mk, True, "x", a.heads, nbuf=nb, nowait=True, **cfg)
                row.append(f"nowait:{100 * (t / base - 1):+5.1f}%")
                if a.pipe:
                    for order in a.orders:
                        t = simulate(mk, True, order, a.heads, nbuf=nb, pipe=True, **cfg)
                        row.append(f"pipe-{order}:{100 * (t / base - 1):+5.1f}%")
                print("  ".join(row), flush=True)



# ------------------------------------------------------------------------------------------------
# Variant 16 / 19 (80-row query tiles, one dQ smem buffer, serial deterministic writer) on the
# real suite masks (NOTES_detwalk.md (the lab notes, now in git history)). Kept tiles from bwd_mask_model.classify (the
# kernel's bwd_find_kept rule); the summation order per tile is descending key block (the
# predecessor of key block n on tile m = the next higher key block that keeps m), whatever the
# walk order; the launch order is "x" (variant 16: key block descending, pair fastest ... pair
# major) or "gG" (G pairs interleaved, variant 14's decoding).

MEASURED16 = {  # H200, 32K, B = 4, H = 32, d = 128, bf16: variant 16 default -> deterministic
    "full": (529, 458), "causal": (524, 467), "sliding_window": (432, 393),
    "causal_document": (439, 400), "document": (487, 396), "share_question": (384, 355),
    "global_sliding_window": (476, 362), "causal_blockwise": (488, 311),
    "prefix_lm_document": (460, 391), "prefix_lm_causal": (519, 464), "qk_sparse": (517, 464),
    "random_eviction": (504, 465),
}

# Variant 16's writer on the fit: T = 3.27 us per 80 x 128 tile (16's default full 529 TFLOP/s),
# one dQ buffer; the deterministic per-tile period max(s, wfix) + Rc = 3.78 us reproduces the
# -13 % on full; the split between wfix (serial, not on the chain) and Rc (on the chain: link L =
# poll + Rc) is fitted by the chain-bound masks: D (L = 1.98 us) reproduces all twelve measured
# ratios within 0.04, C (L = 2.58 us) brackets it from below.
REGIMES16 = {"C": dict(wfix=2.0, Rc=1.78), "D": dict(wfix=2.6, Rc=1.18)}

_SUITE16 = {}


def suite_tiles(mask: str, S: int = S, Bm: int = 80, seed: int = 0):
    """(kept [nblk] list of ascending kept query tiles, partial [nblk] set of partial tiles, mblk)
    for bwd_timing.py's benchmark_suite(S, 0) mask, Bm-row tiles (cached)."""
    key = (mask, S, Bm, seed)
    if key not in _SUITE16:
        import os
        import sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bwd_mask_model import classify, suite_bounds

        b = suite_bounds(S, seed)[mask]
        skip, part = classify(b, S, Bm)
        kept = [np.nonzero(~skip[n])[0].tolist() for n in range(skip.shape[0])]
        parts = [set(np.nonzero(part[n])[0].tolist()) for n in range(skip.shape[0])]
        _SUITE16[key] = (kept, parts, skip.shape[1])
    return _SUITE16[key]


def walk_order(kept, n, walk, nkeep, nblk, Bm=80):
    """The query tiles of key block n in walk order. asc: ascending (variant 16). glast / gfirst:
    'global' tiles (kept by >= nblk / 2 key blocks) last / first, the others ascending. rot: start
    at the key block's diagonal tile (n * 128 / Bm), wrap."""
    t = kept[n]
    if walk == "asc" or not t:
        return list(t)
    if walk in ("glast", "gfirst"):
        glob = [m for m in t if nkeep[m] >= nblk // 2]
        rest = [m for m in t if nkeep[m] < nblk // 2]
        return rest + glob if walk == "glast" else glob + rest
    if walk == "rot":
        d = n * BN // Bm
        return [m for m in t if m >= d] + [m for m in t if m < d]
    raise ValueError(walk)


# bwd_aux.cu kDetOrderWindow: key blocks per window of variant 21's order
ORDER_WINDOW21 = 256


def kept_rank_order(kept, window=ORDER_WINDOW21):
    """Variant 21's summation and launch order of an inverted pair (arrival order at a shared
    tail): windows of `window` consecutive key blocks, the highest window first; inside a window
    ascending kept-tile count, ties by descending key block. kept = the kept tile lists."""
    return kept_rank_order_counts([len(t) for t in kept], window)


def kept_rank_order_counts(counts, window=ORDER_WINDOW21):
    """kept_rank_order from the kept-tile counts (bwd_aux.cu det_order80): position -> key block."""
    return sorted(range(len(counts)), key=lambda n: (-(n // window), counts[n], -n))


def simulate16(mask, det, order="x", walk="asc", heads=16, T=3.27, Tp=3.5, s=0.4, Rr=0.4, Rc=2.4,
               poll=0.8, wfix=0.4, pro=4.0, epi=3.0, sms=132, nbuf=1, Bm=80, sumorder="desc", S=S,
               window=ORDER_WINDOW21):
    """Total time (us) of `heads` (kv head, batch) pairs, variant 16's CTA timeline (one dQ buffer:
    tile k's dQ store waits until the writer is done with tile k-1). Deterministic writer per tile:
    F_k = max(C_k, F_{k-1} + wfix, P + poll) + Rc, P = the bit time of the predecessor key block
    on the tile; default: F_k = max(C_k, F_{k-1}) + Rr. sumorder: "desc" (descending key block,
    variants 16 / 19) or "kept" (variant 21's kept_rank_order in windows of `window` key blocks),
    the launch order of a pair's key blocks and the per-tile order of the dQ adds."""
    kept, parts, mblk = suite_tiles(mask, S, Bm)
    nblk = len(kept)
    seq = list(range(nblk - 1, -1, -1)) if sumorder == "desc" else kept_rank_order(kept, window)
    nkeep = [0] * mblk
    for t in kept:
        for m in t:
            nkeep[m] += 1
    # predecessor of n on m: the next higher keeper
    pred = {}
    last = {}
    for n in seq:
        for m in kept[n]:
            if m in last:
                pred[(n, m)] = last[m]
            last[m] = n
    walks = [walk_order(kept, n, walk, nkeep, nblk, Bm) for n in range(nblk)]
    tt = [[Tp if m in parts[n] else T for m in w] for n, w in enumerate(walks)]
    if order == "x":
        items = [(seq[x], h) for h in range(heads) for x in range(nblk)]
    else:
        G = int(order[1:])
        items = []
        for g0 in range(0, heads, G):
            gs = min(G, heads - g0)
            items += [(seq[r // gs], g0 + r % gs) for r in range(nblk * gs)]
    bit = [dict() for _ in range(heads)]
    free = [0.0] * sms
    end = 0.0
    for n, h in items:
        t0 = heapq.heappop(free)
        w, Ts = walks[n], tt[n]
        if not w:
            te = t0 + 1.0
            end = max(end, te)
            heapq.heappush(free, te)
            continue
        bh = bit[h]
        prevC = prevF = t0 + pro
        Fs = []
        for k, m in enumerate(w):
            c = prevC + Ts[k]
            if k >= nbuf:
                c = max(c, Fs[k - nbuf] + s)
            if det:
                p = pred.get((n, m))
                f = max(c, prevF + wfix, bh[(m, p)] + poll if p is not None else 0.0) + Rc
                bh[(m, n)] = f
            else:
                f = max(c, prevF) + Rr
            Fs.append(f)
            prevC, prevF = c, f
        te = max(prevC, prevF) + epi
        end = max(end, te)
        heapq.heappush(free, te)
    return end


def table16(masks, regimes, orders, walks, heads):
    print(f"variant 16 model, {heads} pairs, 32K, 80-row tiles; deterministic / default time and "
          "TFLOP/s = measured default / ratio")
    for mk in masks:
        dm, detm = MEASURED16.get(mk, (None, None))
        for rn, cfg in regimes.items():
            base = simulate16(mk, False, "x", "asc", heads, **cfg)
            row = [f"{mk:22s} {rn:8s} meas {detm}/{dm}={detm / dm if dm else 0:.2f}"]
            for o in orders:
                for w in walks:
                    t = simulate16(mk, True, o, w, heads, **cfg)
                    r = base / t
                    row.append(f"{o}/{w}:{r:.2f}({dm * r:.0f})" if dm else f"{o}/{w}:{r:.2f}")
            print("  ".join(row), flush=True)


def group19_stats(kept_lists, mblk):
    """Inputs of variant 19's launch-group rule for one mask head (host twin of
    bwd_det_group80_kernel): (kept tiles, live key blocks, co-starting key blocks, inverted tiles).
    A live key block n 'co-starts' when its first kept tile is that of key block n + 1 (documents,
    global rows); it is 'inverted' when it ends at the same last tile as key block n + 1 but keeps
    fewer tiles: its walk reaches their common tail kept(n + 1) - kept(n) tiles earlier than the
    key block that must add there before it (causal blockwise: the top key block of a document
    below a longer one; the shared tail = the last document's rows)."""
    nblk = len(kept_lists)
    kept = live = co = inv = 0
    for n in range(nblk):
        t = kept_lists[n]
        kept += len(t)
        if not t:
            continue
        live += 1
        if n + 1 < nblk:
            u = kept_lists[n + 1]
            f_next = u[0] if u else mblk
            if t[0] == f_next:
                co += 1
            if u and t[-1] == u[-1] and len(t) < len(u):
                inv += len(u) - len(t)
    return kept, live, co, inv


# bwd_aux.cu kDetGroupTileBudget / kDetGroupInverted (H200 session 11: the G curves in NOTES.md)
TILE_BUDGET19 = 300
INVERTED_G19 = 4


def auto_group19(kept, live, co, inv, items, mblk, pairs, cap=8):
    """Variant 19's G (bwd_det_group80_kernel): co-starting chains (>= half of the live key
    blocks: documents, global + window) keeping on average at most half of the query tiles ->
    G = cap; inverted tails worth >= 1/128 of the kept tiles (causal blockwise) -> G =
    INVERTED_G19; else 1. Then G * (mean kept tiles per live key block) <= TILE_BUDGET19 (the
    group's rows in L2), clamped to [1, min(cap, pairs)]."""
    cap = max(1, min(cap, pairs))
    if live == 0:
        return 1
    g = 1
    branch = rule19_branch(kept, live, co, inv)
    if branch == "costart":
        g = cap if 2 * kept <= mblk * items else 1  # not walks over the whole head (full)
    elif branch == "inverted":
        g = INVERTED_G19
    if kept:
        g = min(g, TILE_BUDGET19 * live // kept)
    return max(1, min(g, cap))


def rule19_branch(kept, live, co, inv):
    """Which branch of variant 19's rule applies: "costart" (>= half of the live key blocks start
    where the one above starts), "inverted" (inverted tails >= 1/128 of the kept tiles: variant 21
    then also reorders the key blocks) or "none"."""
    if live == 0:
        return "none"
    if 2 * co >= live:
        return "costart"
    if 128 * inv >= kept:
        return "inverted"
    return "none"


def suite_group19(mask, pairs=128, Bm=80):
    kept_lists, _, mblk = suite_tiles(mask, S, Bm)
    k, l, c, i = group19_stats(kept_lists, mblk)
    return auto_group19(k, l, c, i, len(kept_lists), mblk, pairs), (k, l, c, i)


if __name__ == "__main__":
    main()
