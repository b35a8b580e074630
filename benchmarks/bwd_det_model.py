"""Timeline model of the backward's deterministic dQ ordering (issue 4; benchmarks/NOTES_bwd_det.md).

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

Usage: python benchmarks/bwd_det_model.py [--heads 32] [--masks ...] [--orders x g8] [--nbuf 2 4]
Numbers in NOTES_bwd_det.md come from `python benchmarks/bwd_det_model.py` (default arguments)
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
    if order == "x":
        for h in range(heads):
            for x in range(nblk):
                items.append((nblk - 1 - x, h))
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
                nn = n + 1
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
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
