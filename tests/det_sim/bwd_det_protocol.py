"""Host simulation of the backward's wait / signal protocol (flashmask_bwd_pp_kernel, variants 5, 13,
14, 15 and 17; cc/sm90/bwd_kernel.cuh), to find deadlocks without a GPU (NOTES_bwd_det.md (the lab notes, now in git history),
"The variant 15 hang").

It mirrors the kernel code, not the design notes: every CTA runs four actors, each a transcription
of one role of the kernel, and every wait of the kernel is a wait here on the same object with the
same parity:

* producer (warp 0, lane 0): K/V once (`kv_full`), then per kept tile `empty[stage]` (parity
  phase ^ 1) -> `full[stage]` (TMA bytes land at once);
* consumer warpgroups 0 and 1 (128 threads each, one actor each): the ping-pong loop with its
  "sections" on named barriers 1 / 2 (`bar.sync` / `bar.arrive`, 256 threads), `ds_full` /
  `ds_empty`, `full` / `empty`, and `put_dq` (`dq_empty` wait, `dq_full` arrive), the last section
  with the dQ tiles t-1 and t back to back in one turn (split_last: variant 15 since the fix, in
  deterministic mode with t >= 2, tile t in a turn of its own);
* dQ writer (warp 1, dq_mode 1): per kept tile `dq_full[buf]` (parity phase), in deterministic mode
  the ordering bits of all key blocks above it on the tile, then one of the writer codes below;
* warp 2 (deterministic mode): marks the skipped tiles at CTA start (bwd_mark_skipped).

Writer codes ("writer" argument):
  "v5":        variant 5 / 14: reduce, wait for its completion, own bit, free the buffer.
  "pipe":      variant 15 (detdoc, unchanged by the fix): issue tile k, then (wait_group 1) tile
               k-1's bit and only then free tile k-1's buffer; the last tile's bit and buffer after
               the walk.
  "pipe_readfree": an alternative fix, not taken: as "pipe" but tile k's buffer freed once its
               reduce has read it (wait_group.read 0). Deadlock-free, but on sm_90a ptxas emits the
               same DEPBAR.LE SB0, 0x0 for wait_group.read 0 as for wait_group 0, so the writer
               would wait for each reduce again and lose the pipelining.
Kernel configurations ("config" of simulate; CONFIGS): v5, v14, v15_hang (pipe writer, last section
in one turn: the code that hung on the H200), v15 (pipe writer + split_last: the fixed kernel),
v15_readfree; with the lock-step consumers of variants 12 / 13 (consumer_lockstep: per tile
`full`, the dS barrier bar.sync 1 of both warpgroups, put_dq of the same tile, `empty`): v13
(variant 5's writer and grid) and v17 (pipe writer; deterministic grid = variant 14's with G from
Problem.auto_group, the host twin of bwd_aux.cu bwd_det_group_kernel).
In the default mode (deterministic=False) every writer code runs the default-mode writer (reduce,
wait for the smem read, free the buffer), as the kernel does.

Bulk reduces and TMA loads complete without waiting on anything (their latency does not matter for
a deadlock). CTAs are launched in linear block-index order (blockIdx.x fastest) onto at most
`resident` slots (one CTA per SM: 132 on the H200), a slot freed when its CTA ends. The grid
decoding is bwd_pp_item's: variant 5 (nblk, K, B) with key block nblk - 1 - x in deterministic
mode; variants 14 / 15 in deterministic mode the interleaved 1-D order (bwd_det_model.det_group_item,
G = min(pairs, 8)). The block metadata and the tile walk are those of the kernel (bwd_mask_model
key_block_meta / next_kept = bwd_find_kept; tiles over the query heads of the kv group).

simulate(...) returns a dict: ok (every CTA ended), steps, and for a deadlock `blocked`, one line per
waiting actor (what it waits for), plus `kind`: "intra-CTA" when some launched CTA waits only on
itself (no wait for another CTA's bit), "residency" when a CTA waits for a bit of a CTA that is not
launched. Usage: python tests/det_sim/bwd_det_protocol.py [--configs v5 v14 v15_hang v15 v15_readfree] [--cases ...] [--resident R]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


_mask = _load("bwd_mask_model")
_det = _load("bwd_det_model")

BM, BN = 64, 128  # kBwdBlockM, kBwdBlockN (variants 5, 14, 15 at d = 64 and 128)
DET_GROUP_PAIRS = 8  # kDetGroupPairs
# config -> (variant whose grid decoding it uses, deterministic writer code, split_last,
# lock-step consumers)
CONFIGS = {
    "v5": (5, "v5", False, False),
    "v14": (14, "v5", False, False),
    "v15_hang": (15, "pipe", False, False),
    "v15": (15, "pipe", True, False),
    "v15_readfree": (15, "pipe_readfree", False, False),
    "v13": (13, "v5", False, True),
    "v17": (17, "pipe", False, True),
    # variant 16: 13 with 80-row tiles and ONE dQ smem buffer (variant 5's writer); 19: 16 with the
    # deterministic launch groups of bwd_det_group80_kernel (host twin Problem.auto_group19)
    "v16": (16, "v5", False, True),
    "v19": (19, "v5", False, True),
    # variant 21: 19 with the pre-pass's key-block order (launch + summation) on inverted tails
    "v21": (21, "v5", False, True),
    # variant 11 (d = 64): 5 with 128-row tiles (and the element mask in registers) whose
    # (nblk, K, B) launch takes 21's order on inverted tails (bwd_det_order_sm90, session 25)
    "v11": (11, "v5", False, False),
}
CONFIG_BM = {"v16": 80, "v19": 80, "v21": 80, "v11": 128}  # query tile rows (others: BM)
CONFIG_DQBUFS = {"v16": 1, "v19": 1, "v21": 1}  # fp32 dQ smem buffers (others: 2)
# the kernels as they are (the protocol check runs these in every mode)
KERNEL_CONFIGS = ("v5", "v14", "v15", "v13", "v17", "v16", "v19", "v21", "v11")


class MBar:
    """mbarrier: `count` arrivals complete a phase; wait(P) passes once the phase of parity P has
    completed, i.e. while the current phase's parity differs from P (try_wait.parity)."""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.phase = name, count, count, 0

    def arrive(self, k=1):
        self.pending -= k
        assert self.pending >= 0, f"{self.name}: too many arrivals"
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def ready(self, parity):
        return (self.phase & 1) != parity


class NamedBar:
    """bar.sync / bar.arrive id, 256: a generation completes when 256 threads arrived."""

    def __init__(self, name, count=256):
        self.name, self.count, self.arrived, self.gen = name, count, 0, 0

    def arrive(self, k=128):
        self.arrived += k
        if self.arrived >= self.count:
            self.arrived -= self.count
            self.gen += 1


class Wait:
    """One blocking point of an actor: pred() true -> it may go on; desc says what it waits for;
    bit = (b, h, m, needed key blocks) when it waits for ordering bits of other CTAs."""

    __slots__ = ("pred", "desc", "bit")

    def __init__(self, pred, desc, bit=None):
        self.pred, self.desc, self.bit = pred, desc, bit


class Problem:
    def __init__(self, bounds, Sq, N, K, Bm=BM, Bn=BN):
        bounds = np.asarray(bounds)
        self.B, self.Hm, _, self.Sk = bounds.shape
        self.Sq, self.N, self.K, self.Bm, self.Bn = Sq, N, K, Bm, Bn
        self.nblk = -(-self.Sk // Bn)
        self.mblk = -(-Sq // Bm)
        self.hpk, self.hpm = N // K, N // self.Hm
        self.meta = [[_mask.key_block_meta(bounds[b, hm], Bn) for hm in range(self.Hm)]
                     for b in range(self.B)]

    def find_kept(self, b, hk, n, g, m):
        """bwd_find_kept: (have, g, m) of the first kept tile at or after (g, m)."""
        while g < self.hpk:
            h = hk * self.hpk + g
            if m < self.mblk:
                m2 = _mask.next_kept(m, self.meta[b][h // self.hpm][n], self.Sq, self.Bm, self.mblk)
                if m2 < self.mblk:
                    return True, g, m2
            g, m = g + 1, 0
        return False, g, m

    def auto_group(self, cap=DET_GROUP_PAIRS):
        """Variant 17's launch group size: bwd_det_group_kernel on this launch's block metadata."""
        kept, first = [], []
        for b in range(self.B):
            for hm in range(self.Hm):
                for n in range(self.nblk):
                    row = self.meta[b][hm][n]
                    l1, h1 = self._inside(int(row[1]), int(row[2]))
                    l2, h2 = self._inside(int(row[5]), int(row[6]))
                    c1, c2 = max(h1 - l1 + 1, 0), max(h2 - l2 + 1, 0)
                    c12 = max(min(h1, h2) - max(l1, l2) + 1, 0)
                    kept.append(max(self.mblk - (c1 + c2 - c12), 0))
                    m = 0
                    for lo, hi in ((l1, h1), (l2, h2), (l1, h1)):
                        if lo <= m <= hi:
                            m = hi + 1
                    first.append(m)
        return _det.auto_group(kept, first, self.nblk, self.mblk, self.K * self.B, cap)

    def auto_group19(self, cap=DET_GROUP_PAIRS):
        """Variant 19's launch group size: bwd_det_group80_kernel on this launch's block metadata
        (kept / first / last kept tile per item at self.Bm rows; rule: bwd_det_model.auto_group19)."""
        kept, live, co, inv, _ = self._stats19()
        return _det.auto_group19(kept, live, co, inv, self.B * self.Hm * self.nblk, self.mblk,
                                 self.K * self.B, cap)

    def order21(self):
        """Variant 21's key-block order per (batch, mask head) -- position -> key block, ascending
        kept tiles, ties descending key block -- when the rule takes its inverted-tails branch
        (bwd_det_group80_kernel with perm); None otherwise (descending key block)."""
        kept, live, co, inv, counts = self._stats19()
        if _det.rule19_branch(kept, live, co, inv) != "inverted":
            return None
        return {bh: _det.kept_rank_order_counts(c) for bh, c in counts.items()}

    def _stats19(self):
        kept = live = co = inv = 0
        counts = {}
        for b in range(self.B):
            for hm in range(self.Hm):
                rows = []
                for n in range(self.nblk):
                    row = self.meta[b][hm][n]
                    l1, h1 = self._inside(int(row[1]), int(row[2]))
                    l2, h2 = self._inside(int(row[5]), int(row[6]))
                    c1, c2 = max(h1 - l1 + 1, 0), max(h2 - l2 + 1, 0)
                    c12 = max(min(h1, h2) - max(l1, l2) + 1, 0)
                    k = max(self.mblk - (c1 + c2 - c12), 0)
                    f, la = 0, self.mblk - 1
                    for lo, hi in ((l1, h1), (l2, h2), (l1, h1)):
                        if lo <= f <= hi:
                            f = hi + 1
                        if lo <= la <= hi:
                            la = lo - 1
                    rows.append((k, f, la))
                counts[(b, hm)] = [r[0] for r in rows]
                for n, (k, f, la) in enumerate(rows):
                    kept += k
                    if k > 0:
                        live += 1
                        if n + 1 < self.nblk:
                            ku, fu, lau = rows[n + 1]
                            co += f == fu
                            if ku > k and la == lau:
                                inv += ku - k
        return kept, live, co, inv, counts

    def _inside(self, lo_key, hi_key):  # bwd_aux.cu sched_inside
        lo = (max(lo_key, 0) + self.Bm - 1) // self.Bm
        hi = self.mblk - 1 if hi_key >= self.Sq else max(hi_key, 0) // self.Bm - 1
        return lo, hi

    def skipped(self, b, hk, n):
        """bwd_mark_skipped: the (h, m) whose bit key block n sets at CTA start."""
        out = []
        for g in range(self.hpk):
            h = hk * self.hpk + g
            row = self.meta[b][h // self.hpm][n]
            lts_mx, lte_mn, uts_mx, ute_mn = (int(row[i]) for i in (1, 2, 5, 6))
            for m in range(self.mblk):
                ms, me = m * self.Bm, min(m * self.Bm + self.Bm, self.Sq)
                if (ms >= lts_mx and me <= lte_mn) or (ms >= uts_mx and me <= ute_mn):
                    out.append((h, m))
        return out


def grid_items(P: Problem, variant: int, det: bool, G: int | None = None):
    """(n, hk, b) per linear block index, as bwd_pp_item decodes it for the launch grid of
    launch_bwd_impl (1-D for variants 14 / 15 in deterministic mode, else (nblk, K, B))."""
    return [it[:3] for it in grid_slots(P, variant, det, G)]


def grid_slots(P: Problem, variant: int, det: bool, G: int | None = None):
    """(n, hk, b, slot) per linear block index: grid_items plus the CTA's ordering slot (its bit;
    n except for variant 21's reordered pairs)."""
    if variant in (14, 15, 17, 19, 21) and det:
        pairs = P.K * P.B
        if variant == 17 and not (G and G > 0):
            G = P.auto_group()
        if variant in (19, 21) and not (G and G > 0):
            G = P.auto_group19()
        G = max(1, min(pairs, G if G and G > 0 else DET_GROUP_PAIRS))
        order = P.order21() if variant == 21 else None
        out = []
        for x in range(P.nblk * P.K * P.B):
            slot, hk, b = _det.det_group_item(x, P.nblk, P.K, P.B, G)
            n = slot
            if order is not None:
                n = order[(b, hk * P.hpk // P.hpm)][P.nblk - 1 - slot]
            out.append((n, hk, b, slot))
        return out
    # variants 7 / 11 in deterministic mode: launch position x of a pair holds slot nblk - 1 - x
    # and the key block at position x of 21's order where it applies (bwd_det_key_block)
    order = P.order21() if variant in (7, 11) and det else None
    out = []
    for z in range(P.B):
        for y in range(P.K):
            for x in range(P.nblk):
                if not det:
                    out.append((x, y, z, x))
                    continue
                n = order[(z, y * P.hpk // P.hpm)][x] if order is not None else P.nblk - 1 - x
                out.append((n, y, z, P.nblk - 1 - x))
    return out


class Cta:
    def __init__(self, sim, idx, item):
        self.sim, self.idx, self.item = sim, idx, item
        self.slot = sim.slot[item]
        n, hk, b = item
        self.full = [MBar(f"full[{s}]", 1) for s in range(2)]
        self.empty = [MBar(f"empty[{s}]", 256) for s in range(2)]
        self.dq_full = [MBar(f"dq_full[{s}]", 256) for s in range(2)]
        self.dq_empty = [MBar(f"dq_empty[{s}]", 1) for s in range(2)]
        self.ds_full = [MBar(f"ds_full[{s}]", 256) for s in range(2)]
        self.ds_empty = [MBar(f"ds_empty[{s}]", 256) for s in range(2)]
        self.kv_full = MBar("kv_full", 1)
        self.bar = {1: NamedBar("bar 1"), 2: NamedBar("bar 2")}
        self.have0 = sim.P.find_kept(b, hk, n, 0, 0)
        cons = self.consumer_lockstep if sim.lockstep else self.consumer
        self.actors = {"producer": self.producer(), "wg0": cons(0), "wg1": cons(1)}
        if sim.dq_bulk:
            self.actors["writer"] = self.writer()
        if sim.det:
            self.actors["warp2"] = self.warp2()
        self.waiting = {k: None for k in self.actors}

    # ---- warp 0 lane 0: K/V, then the Q / dO ring
    def producer(self):
        P, (n, hk, b) = self.sim.P, self.item
        have, g, m = self.have0
        if not have:
            return
        self.kv_full.arrive(1)  # arrive_and_expect_tx + the K / V bytes
        stage, phase = 0, 0
        while have:
            e = self.empty[stage]
            yield Wait(lambda e=e, p=phase ^ 1: e.ready(p), f"producer: empty[{stage}] parity {phase ^ 1}")
            self.full[stage].arrive(1)  # arrive_and_expect_tx + Q, dO, lse2, D bytes
            stage += 1
            if stage == 2:
                stage, phase = 0, phase ^ 1
            have, g, m = P.find_kept(b, hk, n, g, m + 1)

    # ---- warp 2: skipped tiles' bits at CTA start (relaxed red.or)
    def warp2(self):
        P, (n, hk, b), s = self.sim.P, self.item, self.slot
        for h, m in P.skipped(b, hk, n):
            self.sim.bits.setdefault((b, h, m), set()).add(s)
        return
        yield  # noqa: unreachable (generator)

    # ---- consumer warpgroup wg (non-lockstep path of flashmask_bwd_pp_kernel)
    def consumer(self, wg):
        P, (n, hk, b) = self.sim.P, self.item
        have, g, m = self.have0
        bar = self.bar
        name = f"wg{wg}"

        def turn_begin(where):
            nb = bar[1] if wg == 0 else bar[2]
            g0 = nb.gen
            nb.arrive(128)
            return Wait(lambda: nb.gen > g0, f"{name}: bar.sync {1 if wg == 0 else 2} ({where})")

        def turn_end(last):
            if wg == 0:
                bar[2].arrive(128)
            elif not last:
                bar[1].arrive(128)

        def put_dq(buf, par, where):
            if self.sim.dq_bulk:
                e = self.dq_empty[buf]
                yield Wait(lambda: e.ready(par ^ 1), f"{name}: put_dq {where}: dq_empty[{buf}] parity {par ^ 1}")
                self.dq_full[buf].arrive(128)

        if not have:
            return
        yield Wait(lambda: self.kv_full.ready(0), f"{name}: kv_full")
        if wg == 1:
            bar[1].arrive(128)  # warpgroup 0 goes first
        t = 0
        while True:
            st, par = t & 1, (t >> 1) & 1
            yield turn_begin(f"section {t}")
            if t >= 2:
                d = self.ds_full[st]
                yield Wait(lambda d=d, p=par ^ 1: d.ready(p), f"{name}: ds_full[{st}] (tile {t - 2})")
                self.ds_empty[st].arrive(128)
                yield from put_dq(st, par ^ 1, f"tile {t - 2} in section {t}")
            f = self.full[st]
            yield Wait(lambda f=f, p=par: f.ready(p), f"{name}: full[{st}] (tile {t})")
            turn_end(False)
            d = self.ds_empty[st]
            yield Wait(lambda d=d, p=par ^ 1: d.ready(p), f"{name}: ds_empty[{st}] (tile {t})")
            self.ds_full[st].arrive(128)
            self.empty[st].arrive(128)
            have, g, m = P.find_kept(b, hk, n, g, m + 1)
            if not have:
                break
            t += 1
        # last section: dQ GEMMs of tiles t-1 and t in one turn
        yield turn_begin(f"last section, tiles {t - 1}, {t}")
        for u in (1, 0):
            if self.sim.split_last and u == 0 and self.sim.det and t >= 2:
                turn_end(False)
                yield turn_begin(f"last section, tile {t} in its own turn")
            tu = t - u
            if tu >= 0:
                st, par = tu & 1, (tu >> 1) & 1
                d = self.ds_full[st]
                yield Wait(lambda d=d, p=par: d.ready(p), f"{name}: ds_full[{st}] (tile {tu}, last section)")
                yield from put_dq(st, par, f"tile {tu} in the last section")
        turn_end(True)

    # ---- consumer warpgroup wg, lock-step path (variants 12 / 13 / 17): per tile full[st] ->
    # S/dP, exp, dS -> dS store -> bar.sync 1, 256 (both warpgroups) -> dQ, dK -> put_dq(t) in
    # iteration t -> empty[st]; the tile info comes from the producer with full[st]
    def consumer_lockstep(self, wg):
        P, (n, hk, b) = self.sim.P, self.item
        have, g, m = self.have0
        name = f"wg{wg}"
        if not have:
            return
        yield Wait(lambda: self.kv_full.ready(0), f"{name}: kv_full")
        t = 0
        while True:
            st, par = t & 1, (t >> 1) & 1
            f = self.full[st]
            yield Wait(lambda f=f, p=par: f.ready(p), f"{name}: full[{st}] (tile {t})")
            nb = self.bar[1]
            g0 = nb.gen
            nb.arrive(128)
            yield Wait(lambda nb=nb, g0=g0: nb.gen > g0, f"{name}: bar.sync 1 (dS of tile {t})")
            if self.sim.dq_bulk:
                # dQ buffer and parity of tile t (variant 16 / 19: one buffer, parity t % 2)
                qb, qp = (st, par) if self.sim.dqbufs == 2 else (0, t & 1)
                e = self.dq_empty[qb]
                yield Wait(lambda e=e, p=qp: e.ready(p ^ 1),
                           f"{name}: put_dq tile {t}: dq_empty[{qb}] parity {qp ^ 1}")
                self.dq_full[qb].arrive(128)
            self.empty[st].arrive(128)
            have, g, m = P.find_kept(b, hk, n, g, m + 1)  # the `last` flag of the tile info
            if not have:
                break
            t += 1

    # ---- warp 1: dQ writer
    def writer(self):
        sim, P, (n, hk, b), s = self.sim, self.sim.P, self.item, self.slot
        have, g, m = self.have0
        code = sim.writer if sim.det else "default"
        buf, phase = 0, 0
        pend = None  # (b, h, m, buf) of the tile whose bit is owed (pipelined writers)
        k = 0
        while have:
            h = hk * P.hpk + g
            f = self.dq_full[buf]
            yield Wait(lambda f=f, p=phase: f.ready(p), f"writer: dq_full[{buf}] (tile {k})")
            if sim.det:
                need = set(range(s + 1, P.nblk))
                key = (b, h, m)
                yield Wait(lambda key=key, need=need: need <= sim.bits.get(key, set()),
                           f"writer: ordering bits of slots {s + 1}..{P.nblk - 1} on (b {b}, h {h}, m {m})",
                           bit=(b, h, m, need))
            # bulk reduce issued (and, below, complete whenever waited for)
            if code == "v5":
                sim.bits.setdefault((b, h, m), set()).add(s)
                self.dq_empty[buf].arrive(1)
            elif code == "pipe":
                if pend is not None:
                    sim.bits.setdefault(pend[:3], set()).add(s)
                    self.dq_empty[pend[3]].arrive(1)
                pend = (b, h, m, buf)
            elif code == "pipe_readfree":
                if pend is not None:
                    sim.bits.setdefault(pend[:3], set()).add(s)
                self.dq_empty[buf].arrive(1)
                pend = (b, h, m, buf)
            else:  # default mode
                self.dq_empty[buf].arrive(1)
            buf += 1
            if buf == sim.dqbufs:
                buf, phase = 0, phase ^ 1
            k += 1
            have, g, m = P.find_kept(b, hk, n, g, m + 1)
        if pend is not None:
            sim.bits.setdefault(pend[:3], set()).add(s)
            if code == "pipe":
                self.dq_empty[pend[3]].arrive(1)


class Sim:
    def __init__(self, P, config, det, dq_mode=1, resident=132, G=None, items=None):
        self.P, self.det = P, det
        self.variant, self.writer, self.split_last, self.lockstep = CONFIGS[config]
        self.dqbufs = CONFIG_DQBUFS.get(config, 2)
        assert P.Bm == CONFIG_BM.get(config, BM), (config, P.Bm)
        self.dq_bulk = dq_mode == 1
        self.resident = resident
        slots = grid_slots(P, self.variant, det, G) if items is None else [(*it, it[0]) for it in items]
        self.items = [it[:3] for it in slots]
        self.slot = {it[:3]: it[3] for it in slots}
        self.pos = {it: x for x, it in enumerate(self.items)}
        self.pos_of_slot = {(it[3], it[1], it[2]): x for x, it in enumerate(slots)}
        self.bits = {}

    def run(self, max_steps=50_000_000):
        live, nxt, done, steps = [], 0, 0, 0
        total = len(self.items)
        while True:
            while len(live) < self.resident and nxt < total:
                live.append(Cta(self, nxt, self.items[nxt]))
                nxt += 1
            progress = False
            for cta in list(live):
                for name, gen in list(cta.actors.items()):
                    while True:
                        w = cta.waiting[name]
                        if w is not None and not w.pred():
                            break
                        try:
                            cta.waiting[name] = next(gen)
                            steps += 1
                            progress = True
                        except StopIteration:
                            del cta.actors[name]
                            del cta.waiting[name]
                            progress = True
                            break
                if not cta.actors:
                    live.remove(cta)
                    done += 1
            if done == total:
                return dict(ok=True, steps=steps, ctas=total)
            if not progress or steps > max_steps:
                return self._report(live, nxt, done, steps)

    def _report(self, live, nxt, done, steps):
        blocked, cross, unlaunched = [], False, False
        for cta in live:
            for name, w in cta.waiting.items():
                n, hk, b = cta.item
                line = f"CTA {cta.idx} (key block {n}, kv head {hk}, batch {b}) {w.desc}"
                if w.bit is not None:
                    bb, h, m, need = w.bit
                    miss = sorted(need - self.bits.get((bb, h, m), set()))
                    if miss:
                        cross = True
                        owners = [self.pos_of_slot[(x, hk, bb)] for x in miss]
                        if any(o >= nxt for o in owners):
                            unlaunched = True
                        line += f"; missing bits of slots {miss} (grid positions {owners})"
                blocked.append(line)
        own = [c for c in live if all(w.bit is None or not (w.bit[3] - self.bits.get(w.bit[:3], set()))
                                     for w in c.waiting.values())]
        kind = "residency" if unlaunched else ("intra-CTA" if own else "cross-CTA")
        return dict(ok=False, steps=steps, ctas=len(self.items), done=done, launched=nxt,
                    kind=kind, self_blocked=[c.idx for c in own], blocked=blocked)


def simulate(bounds, Sq, N, K, config, det, dq_mode=1, resident=132, G=None, items=None):
    """Runs kernel configuration `config` (CONFIGS) on one launch; see the module docstring."""
    return Sim(Problem(bounds, Sq, N, K, Bm=CONFIG_BM.get(config, BM)), config, det, dq_mode,
               resident, G, items).run()


# ----------------------------------------------------------------------------------------- cases

# the GPU tests' bounds (tests/gpu/_gpu_bounds.py), so the cases draw the same masks
_bounds = importlib.util.module_from_spec(
    importlib.util.spec_from_file_location("_gpu_bounds", HERE.parent / "gpu" / "_gpu_bounds.py"))
_bounds.__spec__.loader.exec_module(_bounds)


def _causal(B, Sq, Sk):
    return _bounds.causal_bounds(B, 1, Sq, Sk)


_random = _bounds.random_bounds


def _documents(B, S, docs):
    starts = np.cumsum([0] + list(docs))
    b = np.zeros((B, 1, 4, S), np.int32)
    for d0, d1 in zip(starts[:-1], starts[1:]):
        b[:, :, 0, d0:d1] = d1  # rows below the document masked (LTS = doc end, LTE = S)
        b[:, :, 1, d0:d1] = S
        b[:, :, 2, d0:d1] = 0   # rows above the document masked (UTS = 0, UTE = doc start)
        b[:, :, 3, d0:d1] = d0
    return b


def cases():
    """(name, bounds, Sq, N, K): the launches that hung on the H200 (bwd_timing.py --small's first
    case; test_deterministic_bitwise[causal]) and shapes of tests/gpu/test_cuda_backward.py's
    deterministic / det_groups tests (their mask families, at the same B, Sq, Sk, N, K)."""
    out = []
    rng = np.random.default_rng(0)  # bwd_timing.small_cases' first case: Sq 129, Sk 200, N 4, K 2
    Sq, Sk = 129, 200
    rng.standard_normal((1, Sq, 4, 128)); rng.standard_normal((1, Sk, 2, 128))
    rng.standard_normal((1, Sq, 4, 128))
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 0] = rng.integers(0, Sq + 1, Sk)
    b[:, :, 1] = Sq
    out.append(("small_d128", b, Sq, 4, 2))
    out.append(("det_bitwise_causal", _causal(2, 900, 900), 900, 4, 2))
    full = np.zeros((2, 1, 4, 900), np.int32)
    full[:, :, :2] = 900
    out.append(("det_bitwise_full", full, 900, 4, 2))
    r = np.random.default_rng(7)
    out.append(("det_bitwise_random_gqa", _random(r, 2, 2, 900, 900), 900, 8, 2))
    out.append(("det_bitwise_many_words", _random(r, 1, 1, 200, 4500, 0.8), 200, 2, 1))
    out.append(("det_groups_doc_many_pairs", _documents(3, 5000, [700, 1300, 450, 2550]), 5000, 3, 3))
    out.append(("det_groups_random_gqa_ragged", _random(r, 2, 8, 1100, 1301), 1100, 8, 2))
    out.append(("det_groups_one_pair", _causal(1, 2000, 2000), 2000, 1, 1))
    e = np.zeros((2, 1, 4, 1500), np.int32)
    e[:, :, 1] = 700
    e[:, :, :, 300:900] = np.array([700, 700, 0, 0], np.int32)[None, None, :, None]
    out.append(("det_groups_empty_items", e, 700, 4, 2))
    # variant 17's grouped launch: many short documents, 9 pairs -> G = 8 (two groups, 8 + 1)
    dr = np.random.default_rng(11)
    docs, t = [], 0
    while t < 4096:
        docs.append(int(min(dr.integers(150, 420), 4096 - t)))
        t += docs[-1]
    out.append(("v17_small_docs_groups", _documents(3, 4096, docs), 4096, 3, 3))
    # one tile / two tiles per CTA (the deadlock needs three kept tiles)
    out.append(("one_tile", _causal(1, 64, 256), 64, 1, 1))
    out.append(("two_tiles", np.zeros((1, 1, 4, 256), np.int32) + np.array([128, 128, 0, 0], np.int32)[None, None, :, None], 128, 1, 1))
    return out


def protocol_check(names=None, resident=132) -> list[str]:
    """Failures (empty: all as expected) over cases(): the kernel as it is now (v5, v14, v15, and the
    lock-step v13 / v17) ends
    in every mode; the code that hung on the H200 (v15_hang) deadlocks in deterministic mode,
    inside single CTAs."""
    bad = []
    for name, b, Sq, N, K in cases():
        if names and name not in names:
            continue
        for cfg in KERNEL_CONFIGS:
            for det, mode in ((False, 1), (False, 0), (True, 1)):
                r = simulate(b, Sq, N, K, cfg, det, mode, resident)
                if not r["ok"]:
                    bad.append(f"{name} {cfg} det={det} dq_mode={mode}: {r['kind']} deadlock: {r['blocked'][:3]}")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--cases", nargs="+", default=None)
    ap.add_argument("--resident", type=int, default=132)
    a = ap.parse_args()
    bad = 0
    for name, b, Sq, N, K in cases():
        if a.cases and name not in a.cases:
            continue
        for cfg in a.configs:
            for det, mode in ((False, 1), (False, 0), (True, 1)):
                if det is False and cfg not in KERNEL_CONFIGS:
                    continue  # the default mode does not use the deterministic writer
                r = simulate(b, Sq, N, K, cfg, det, mode, a.resident)
                tag = f"{name:30s} {cfg:13s} det={int(det)} dq_mode={mode}"
                if r["ok"]:
                    print(f"{tag} ok ({r['ctas']} CTAs, {r['steps']} steps)")
                else:
                    print(f"{tag} DEADLOCK ({r['kind']}; {r['done']}/{r['ctas']} CTAs ended, "
                          f"{r['launched']} launched)")
                    for line in r["blocked"][:6]:
                        print("    " + line)
                    bad += cfg != "v15_hang"
    print("expected: deadlocks only for v15_hang" if bad == 0 else f"{bad} unexpected deadlocks")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
