"""Cycle-stepped timeline model of one backward CTA at d = 128 (Bm = 64, Bn = 128): variant 5
(ping-pong consumer warpgroups) against variant 12 (lock-step consumers, FlashAttention-3's
order). Written for benchmarks/NOTES_bwd_full.md; no GPU needed.

What is modelled, per CTA (one SM):
* the tensor pipe: one in-order queue of wgmma groups shared by both consumer warpgroups; a group
  starts `START` cycles after its issue and no earlier than the end of the group ahead of it,
  runs `dur` cycles (8 HGMMA 64x64x16 = 256 nominal, times SS_SLOW for the smem-bound SS GEMMs
  S, dP, dQ; 4 HGMMA 64x128x16 = 256 times RS_SLOW for dV, dK) and becomes visible to
  `wgmma.wait_group` `DONE` cycles after it ends;
* instruction issue: each consumer warp sits on its own SM sub-partition beside the other
  warpgroup's warp (one issue slot per cycle per sub-partition), so ALU work of the two
  warpgroups is processor-shared when both have some; MUFU.EX2 (8 cycles per warp instruction
  per sub-partition) likewise;
* named barriers (bar.sync / bar.arrive, 2 warpgroups) and the dS mbarriers of variant 5;
* the Q/dO producer, the dQ writer and L2 are assumed never to stall the consumers (the tiles of
  a full mask stream from L2 at ~4 % of its bandwidth).
Instruction counts per phase are those of the SASS (cuobjdump of the bf16 d = 128 kernels, a
full tile's path: benchmarks/NOTES_bwd_full.md lists them). Free parameters: ipc (instructions
per cycle of one warp alone: its dependency latencies; variant 3 -> 5 removed ~400 instructions
per warp and tile and saved ~900 cycles, so ~0.3-0.45 on that code), ss_slow (SS GEMMs at N = 64
need the whole 128 B/clk of shared memory), done (wgmma completion latency). The default set
puts variant 5 near its measured tile (~5,600-6,000 cycles at 8K full); --grid prints the
spread of the variant 12 / variant 5 ratio over the plausible range.
Calibration check (prog_v8): variant 8 measured within ±0.5 % of variant 5. With the FIFO tensor
queue the model gives 8 a 3-18 % gain at every parameter set, so that queue is wrong or the
schedule is not what binds; with --tensor shared (each warpgroup's groups in order, the two
warpgroups' running groups sharing the pipe) 8 = 5 only where the SS GEMMs run at ~half rate
(ss_slow 2.0: the tile is tensor/smem-bound), and there 12 = 5 too (benchmarks/NOTES_bwd_full.md).
Usage: python benchmarks/bwd_lockstep_model.py [--tiles 12] [--grid] [--tensor fifo|shared]
"""

from __future__ import annotations

import argparse
import itertools

NOMINAL = 256  # cycles of one warpgroup's 64x64x128 / 64x128x64 GEMM at the dense peak

# per-warp instruction counts of a full tile (SASS, bf16 d = 128; see the NOTES)
N_SDP_ISSUE = 150   # S / dP descriptors + 16 HGMMA
N_EXP_ALU = 110     # FFMA, LDS of lse2, the `partial` branches (not taken)
N_EXP_MUFU = 32     # MUFU.EX2
N_DS_DV = 200       # LDS of D, dS math, F2FP packs, 4 HGMMA (dV)
N_DS_STORE = 70     # 32 STS.U16 + PRMT + MEMBAR / fence
N_DQ_ISSUE = 64     # 8 HGMMA (dQ) + descriptors
N_DK_ISSUE = 14
N_DQ_STORE = 30     # 16 STS.64 + fence + mbarrier ops
N_WALK = 140        # empty arrive, bwd_find_kept (integer division, 8 metadata loads), loop
N_WALK_V12 = 20     # variant 12: empty arrive, the tile info (one LDS after the full wait), loop
N_MEMBAR = 80       # extra latency of MEMBAR.ALL.CTA (fence.proxy.async) after smem stores


class Sim:
    def __init__(self, progs, ss_slow, rs_slow, start, done, ipc=1.0, tensor="fifo"):
        self.progs = progs
        self.pc = [0, 0]
        self.rem = [None, None]  # remaining work of the current op
        self.t = 0
        self.queue = []  # [wg, dur_left, issue_t, started]
        self.outstanding = [[], []]  # completion times (None until known) per wg, in order
        self.groups = []  # (wg, finish_visible) per issued group
        self.bar = {}  # (id) -> arrivals in the current phase; phase counter
        self.bar_phase = {}
        self.waiting_bar = [None, None]
        self.mbar = {}
        self.ss, self.rs, self.start, self.done = ss_slow, rs_slow, start, done
        self.ipc = ipc  # instructions per cycle of one warp alone (dependency latencies)
        # "fifo": one in-order queue for both warpgroups' wgmma groups; "shared": each warpgroup's
        # groups run in its own order and the two warpgroups' running groups share the pipe
        self.tensor = tensor
        self.tensor_busy = 0
        self.finish = [None, None]

    def _dur(self, kind):
        return NOMINAL * (self.ss if kind in ("S", "dP", "dQ") else self.rs)

    def run(self, limit=10**6):
        while any(f is None for f in self.finish) and self.t < limit:
            self.step()
        return max(self.finish)

    def step(self):
        t = self.t
        # tensor pipe
        if self.tensor == "fifo":
            heads = self.queue[:1]
        else:  # the oldest unfinished group of each warpgroup
            heads = [next((g for g in self.queue if g["wg"] == w), None) for w in (0, 1)]
            heads = [g for g in heads if g is not None]
        heads = [g for g in heads if t >= g["issue"] + self.start]
        for g in heads:
            g["left"] -= 1.0 / len(heads)
            if g["left"] <= 0:
                g["visible"] = t + self.done
                self.queue.remove(g)
        if heads:
            self.tensor_busy += 1
        # which warpgroups compete for issue / MUFU this cycle
        alu = [w for w in (0, 1) if self._cur(w) and self._cur(w)[0] in ("alu", "issue", "exp")
               and self._alu_left(w) > 0]
        mufu = [w for w in (0, 1) if self._cur(w) and self._cur(w)[0] == "exp"
                and self.rem[w]["mufu"] > 0]
        for w in (0, 1):
            self._advance(w, len(alu), len(mufu), w in alu, w in mufu)
        self.t += 1

    def _cur(self, w):
        p = self.progs[w]
        return p[self.pc[w]] if self.pc[w] < len(p) else None

    def _alu_left(self, w):
        op = self._cur(w)
        if self.rem[w] is None:
            self._init(w, op)
        return self.rem[w]["alu"]

    def _init(self, w, op):
        kind = op[0]
        if kind in ("alu", "issue"):
            self.rem[w] = {"alu": float(op[1]), "mufu": 0.0}
        elif kind == "exp":
            self.rem[w] = {"alu": float(op[1]), "mufu": float(op[2]) * 8}
        else:
            self.rem[w] = {"alu": 0.0, "mufu": 0.0}

    def _advance(self, w, n_alu, n_mufu, in_alu, in_mufu):
        op = self._cur(w)
        if op is None:
            if self.finish[w] is None:
                self.finish[w] = self.t
            return
        if self.rem[w] is None:
            self._init(w, op)
        kind = op[0]
        r = self.rem[w]
        if kind in ("alu", "issue", "exp"):
            if in_alu:
                r["alu"] -= min(self.ipc, 1.0 / n_alu)
            if in_mufu:
                r["mufu"] -= 1.0 / n_mufu
            if r["alu"] <= 0 and r["mufu"] <= 0:
                if kind == "issue":
                    g = {"wg": w, "left": self._dur(op[2]), "issue": self.t, "visible": None}
                    self.queue.append(g)
                    self.outstanding[w].append(g)
                self._next(w)
        elif kind == "wait":
            out = [g for g in self.outstanding[w] if g["visible"] is None or g["visible"] > self.t]
            self.outstanding[w] = out
            if len(out) <= op[1]:
                self._next(w)
        elif kind in ("bsync", "barrive"):
            bid = op[1]
            if self.waiting_bar[w] is None:
                ph = self.bar_phase.get(bid, 0)
                n = self.bar.get(bid, 0) + 1
                if n == 2:
                    self.bar[bid] = 0
                    self.bar_phase[bid] = ph + 1
                else:
                    self.bar[bid] = n
                if kind == "barrive":
                    self._next(w)
                    return
                self.waiting_bar[w] = (bid, ph)
            bid, ph = self.waiting_bar[w]
            if self.bar_phase.get(bid, 0) > ph:
                self.waiting_bar[w] = None
                self._next(w)
        elif kind == "marrive":
            self.mbar[op[1]] = self.mbar.get(op[1], 0) + 1
            self._next(w)
        elif kind == "mwait":
            if self.mbar.get(op[1], 0) >= 2:
                self._next(w)

    def _next(self, w):
        self.pc[w] += 1
        self.rem[w] = None


def prog_v5(w, T):
    """Variant 5's consumer warpgroup w over T tiles (bwd_kernel.cuh, the ping-pong loop)."""
    p = []
    if w == 1:
        p.append(("barrive", 1))
    mine, other = (1, 2) if w == 0 else (2, 1)
    for t in range(T):
        p.append(("bsync", mine))
        if t >= 2:
            p += [("mwait", ("full", t - 2)), ("issue", N_DQ_ISSUE, "dQ"), ("wait", 0),
                  ("marrive", ("empty", t - 2)), ("alu", N_DQ_STORE + N_MEMBAR)]
        p += [("issue", N_SDP_ISSUE // 2, "S"), ("issue", N_SDP_ISSUE // 2, "dP")]
        p.append(("barrive", other))
        p += [("wait", 1), ("exp", N_EXP_ALU, N_EXP_MUFU), ("wait", 0),
              ("issue", N_DS_DV, "dV")]
        if t >= 2:
            p.append(("mwait", ("empty", t - 2)))
        p += [("alu", N_DS_STORE + N_MEMBAR), ("marrive", ("full", t)),
              ("issue", N_DK_ISSUE, "dK"), ("wait", 0), ("alu", N_WALK)]
    p.append(("bsync", mine))
    for u in (T - 2, T - 1):
        if u >= 0:
            p += [("mwait", ("full", u)), ("issue", N_DQ_ISSUE, "dQ"), ("wait", 0),
                  ("alu", N_DQ_STORE + N_MEMBAR)]
    if w == 0:
        p.append(("barrive", other))
    return p


def prog_v8(w, T):
    """Variant 8 (measured ±0.5 % against 5 on the H200, then removed): variant 5 with the dQ GEMM
    of tile t-1 issued in the math of tile t behind dK; the turn holds the S/dP issue only. A
    calibration check of the model: it should find 8 about equal to 5 where 5 matches its
    measurement."""
    p = []
    if w == 1:
        p.append(("barrive", 1))
    mine, other = (1, 2) if w == 0 else (2, 1)
    for t in range(T):
        p += [("bsync", mine), ("issue", N_SDP_ISSUE // 2, "S"), ("issue", N_SDP_ISSUE // 2, "dP"),
              ("barrive", other)]
        p += [("wait", 1), ("exp", N_EXP_ALU, N_EXP_MUFU), ("wait", 0),
              ("issue", N_DS_DV, "dV")]
        if t >= 2:
            p.append(("mwait", ("empty", t - 2)))
        p += [("alu", N_DS_STORE + N_MEMBAR), ("marrive", ("full", t)),
              ("issue", N_DK_ISSUE, "dK")]
        if t >= 1:
            p += [("wait", 1), ("mwait", ("full", t - 1)), ("issue", N_DQ_ISSUE, "dQ"),
                  ("wait", 0), ("marrive", ("empty", t - 1)), ("alu", N_DQ_STORE + N_MEMBAR)]
        else:
            p.append(("wait", 0))
        p.append(("alu", N_WALK))
    p.append(("bsync", mine))
    p += [("mwait", ("full", T - 1)), ("issue", N_DQ_ISSUE, "dQ"), ("wait", 0),
          ("alu", N_DQ_STORE + N_MEMBAR)]
    if w == 0:
        p.append(("barrive", other))
    return p


def prog_v12(w, T):
    """Variant 12's consumer warpgroup w over T tiles (lock-step, FlashAttention-3's order)."""
    p = []
    for t in range(T):
        p += [("issue", N_SDP_ISSUE // 2, "S"), ("issue", N_SDP_ISSUE // 2, "dP"),
              ("wait", 1), ("exp", N_EXP_ALU, N_EXP_MUFU), ("wait", 0),
              ("issue", N_DS_DV, "dV"), ("alu", N_DS_STORE + N_MEMBAR), ("bsync", 1),
              ("issue", N_DQ_ISSUE, "dQ"), ("wait", 1), ("issue", N_DK_ISSUE, "dK"),
              ("wait", 1), ("alu", N_DQ_STORE + N_MEMBAR), ("wait", 0), ("alu", N_WALK_V12)]
    return p


def per_tile(prog, T, **kw):
    """Steady-state cycles per tile: (time of T tiles - time of T/2 tiles) / (T/2)."""
    a = Sim([prog(0, T), prog(1, T)], **kw)
    ta = a.run()
    h = T // 2
    b = Sim([prog(0, h), prog(1, h)], **kw)
    tb = b.run()
    return (ta - tb) / (T - h), a.tensor_busy / ta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", type=int, default=12)
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--tensor", choices=("fifo", "shared"), default="fifo")
    a = ap.parse_args()
    base = dict(ss_slow=1.2, rs_slow=1.0, start=40, done=150, ipc=0.27, tensor=a.tensor)
    print("cycles per 64x128 tile (tensor work at the nominal peak: 2560); tensor-pipe busy share")
    for name, prog in (("v5 (ping-pong)", prog_v5), ("v8 (5, dQ in math)", prog_v8),
                       ("v12 (lock-step)", prog_v12)):
        c, busy = per_tile(prog, a.tiles, **base)
        print(f"  {name:18s} {c:7.0f}   busy {busy:.2f}   params {base}")
    if a.grid:
        print("grid: ipc ss_slow rs_slow done -> v5, v8, v12 cycles per tile, v5 / v8, v5 / v12"
              " (* = v8 within 3 % of v5, as measured on the H200)")
        for ipc, ss, rs, dn in itertools.product((0.3, 0.5), (1.2, 1.6, 2.0), (1.0, 1.3), (150, 400)):
            kw = dict(ss_slow=ss, rs_slow=rs, start=40, done=dn, ipc=ipc, tensor=a.tensor)
            c5, _ = per_tile(prog_v5, a.tiles, **kw)
            c8, _ = per_tile(prog_v8, a.tiles, **kw)
            c12, _ = per_tile(prog_v12, a.tiles, **kw)
            mark = " *" if abs(c5 / c8 - 1) < 0.03 else ""
            print(f"  {ipc:.2f} {ss:.1f} {rs:.1f} {dn:3d} -> {c5:6.0f} {c8:6.0f} {c12:6.0f}"
                  f"  x{c5 / c8:.2f} x{c5 / c12:.2f}{mark}")


if __name__ == "__main__":
    main()
