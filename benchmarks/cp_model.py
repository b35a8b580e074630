"""Context-parallel compute model: per-rank pieces of the scheduled ring, their tile statistics and
the fitted forward / backward kernel models applied to them (CPU only, numpy).

Target (issue): causal_document, S = 131072 (2 x 64K), B = 1, H = K = 32, d = 128, bf16, P = 2
H200, fwd+bwd >= 1.85x one GPU with >= 75 % of the communication hidden.

What it does (benchmarks/NOTES_cp_model.md explains the numbers):

* builds the mask exactly as cp_bench.py does (`benchmark_suite(S, seed=0)`), the balanced plan
  (`chunk_workloads` + `balanced_plan`) and the pruned needs (`needed_chunks`) for m chunks per rank;
* per rank, the pieces `attention._scheduled` builds for a P = 2 ring: piece 0 = own rows x own
  key chunks, piece 1 = own rows x the other rank's chunks (pruned chunks force-masked with
  `masked_bounds`), bounds from `localize_bounds` (rows localized, columns gathered);
* per piece: forward tile statistics (128-row query tiles x 128-key blocks, KeptBlocks' rule =
  bwd_mask_model.classify transposed) and the persistent-grid makespan with the fitted d = 128
  forward terms (fwd_mask_model.fit); backward statistics per key block (CTA) of 128 keys over
  64-row query tiles (computed / partial / skipped) and the fitted backward model
  T = K0_call + n_CTA * k_cta / 132 + (t_tile*computed + dP*partial + c_scan*skipped) / 132, with
  c_scan = 53 ns (variant 5) or 0 (variant 9);
* the elementwise passes the piece path adds (K/V stack, concatenation, LSE merge, dQ sum, dK/dV
  stack) as HBM traffic at ~3.5 TB/s;
* the one-GPU call (one kernel over the full problem) with the same models.

Usage: PYTHONPATH=. python benchmarks/cp_model.py [--m 2 4 8] [--hbm-tbs 3.5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bwd_mask_model as bwm  # noqa: E402
import fwd_mask_model as fwm  # noqa: E402

S = fwm.TOKENS  # 131072 = 2 x 64K, B = 1
H, SMS = fwm.H, fwm.SMS  # 32 heads, 132 SMs
D, P = 128, 2
BYTES = 2  # bf16

# backward model (NOTES_bwd_partial.md section 4, d = 128, Bm = 64)
T_TILE = 2.96  # us per computed 64 x 128 tile
DP_B = 0.49  # us per partial tile
C_SCAN = {5: 0.053, 9: 0.0}  # us per skipped tile
K_CTA = 11.0  # us per CTA (fixed: K/V load, fill, epilogue)
K0_FULL = 4700.0  # us, fitted per-call constant at 128K x 32 heads (per-call passes + CTAs)
N_CTA_FULL = (S // bwm.BN) * H  # 32768
K_CALL_FULL = K0_FULL - K_CTA * N_CTA_FULL / SMS  # ~1.97 ms: dQ memset, bwd_prep, bwd_convert

# measured (benchmarks/results/h200x2_2026-11-30s4_cp_*.json; NOTES.md Session 4), ms
MEAS = {
    "one_gpu_fwdbwd": (143.71, 145.8),
    "one_gpu_fwd": (30.3, 31.8),
    "m2_noskip_compute": 79.00,  # h200x2_2026-11-30s4_cp_m2_noskip.json (no lax.cond skip of empty pieces)
    2: dict(total=78.61, compute=77.15, compute_range=(75.9, 79.4), fwd_compute=(16.1, 17.7), comm=6.42,
            mib=512),
    4: dict(total=86.44, compute=79.67, fwd_compute=(16.99, 16.99), comm=10.65, mib=768),
}


def mask_bounds():
    """cp_bench.py's causal_document mask at S (seed 0): (FlashMask, canonical bounds [4, S])."""
    import jax_flashmask as jf
    from jax_flashmask.masks import canonical_bounds_np

    mk = jf.masks.benchmark_suite(S, seed=0)["causal_document"]
    sri = np.asarray(mk.startend_row_indices, np.int32)
    return mk, canonical_bounds_np(sri, causal=bool(mk.causal), q_len=S)[0, 0].astype(np.int64)


def plan_for(mk, m):
    from jax_flashmask import context_parallel as cp

    work = cp.chunk_workloads(mk, P * m)
    plan = np.sort(np.asarray(cp.balanced_plan(work, P).plan, np.int64), axis=1)
    need = np.asarray(cp.needed_chunks(mk, plan))
    return plan, need, cp.plan_loads(plan, work)


def rank_pieces(bounds, plan, need, p, compact=False):
    """[(name, local bounds [4, L], received slots)] of rank p (P = 2 ring, attention._scheduled).

    compact=True (a what-if, not what the code does): the remote piece spans only the received
    chunks' columns (no force-masked zero slots), and is dropped when nothing is received.
    compact="spmd" (what the code does since the compaction commit, same shapes on every rank): the
    remote piece spans the slots *any* rank receives; slots this rank does not receive stay,
    zero-filled and force-masked."""
    if compact == "spmd":
        from jax_flashmask.context_parallel.localize import chunk_token_index, localize_bounds, masked_bounds

        m = plan.shape[1]
        c = S // (P * m)
        out = []
        for src in [p] + [q for q in range(P) if q != p]:
            if src == p:
                cols = chunk_token_index(plan[p], c, xp=np)
                out.append(("local", localize_bounds(bounds, plan[p], c, columns=cols, xp=np),
                            np.ones(m, bool)))
                continue
            # slot b is kept when any rank receives slot b in this round (P = 2: rank r from 1 - r)
            anyone = np.array([any(need[r][plan[1 - r][b]] for r in range(P)) for b in range(m)])
            if not anyone.any():
                continue
            rec = need[p][plan[src]][anyone]
            cols = chunk_token_index(plan[src][anyone], c, xp=np)
            lb = localize_bounds(bounds, plan[p], c, columns=cols, xp=np)
            if not rec.all():
                lb = masked_bounds(lb, np.repeat(~rec, c), m * c, xp=np)
            out.append((f"remote<-{src}", lb, rec))
        return out
    from jax_flashmask.context_parallel.localize import chunk_token_index, localize_bounds, masked_bounds

    m = plan.shape[1]
    c = S // (P * m)
    lq = m * c
    out = []
    for src in [p] + [q for q in range(P) if q != p]:
        cols = chunk_token_index(plan[src], c, xp=np)
        lb = localize_bounds(bounds, plan[p], c, columns=cols, xp=np)
        rec = np.array([True] * m) if src == p else need[p][plan[src]]
        if compact and src != p:
            if not rec.any():
                continue
            cols = chunk_token_index(plan[src][rec], c, xp=np)
            lb = localize_bounds(bounds, plan[p], c, columns=cols, xp=np)
            out.append((f"remote<-{src}", lb, rec))
            continue
        if not rec.all():
            lb = masked_bounds(lb, np.repeat(~rec, c), lq, xp=np)
        out.append(("local" if src == p else f"remote<-{src}", lb, rec))
    return out


def fully_masked(lb, lq):
    """attention._scheduled wraps every remote piece in a lax.cond that skips it when fully masked."""
    from jax_flashmask.context_parallel.localize import columns_fully_masked

    return bool(np.all(columns_fully_masked(lb, lq, xp=np)))


# ----------------------------------------------------------------------------- kernel models


def fwd_stats(lb, sq):
    skip, part = bwm.classify(lb, sq, fwm.BM, 128)  # [nblk, mblk]
    nblk = skip.shape[0]
    return dict(kept=(~skip).sum(axis=0).astype(np.int64), part=part.sum(axis=0).astype(np.int64),
                nblk=nblk, groups=-(-nblk // 32))


def fwd_time(st, coef, heads=H):
    """us: K0 + makespan of the persistent grid (variant 3 walk: every tile scans all groups)."""
    mblk = len(st["kept"])
    order = fwm.tile_order(mblk, heads)
    f = np.empty((len(order), 4))
    f[:, 0] = 1.0
    f[:, 1] = st["kept"][order]
    f[:, 2] = st["part"][order]
    f[:, 3] = st["groups"]
    mk, _, _ = fwm.schedule(f @ coef)
    return fwm.K0_US + mk, dict(kept=int(st["kept"].sum()), part=int(st["part"].sum()), tiles=mblk)


def bwd_stats(lb, sq):
    skip, part = bwm.classify(lb, sq, 64)  # [nblk, mblk]
    kept = (~skip).sum(axis=1)
    return dict(kept=kept, part=part.sum(axis=1), mblk=skip.shape[1], nblk=skip.shape[0])


def bwd_time(st, variant, sq, heads=H):
    """us, summed over CTAs / 132 (the backward's CTAs are uniform enough that the tail is ignored,
    as in the fit)."""
    kept = st["kept"].sum() * heads
    part = st["part"].sum() * heads
    skipped = (st["mblk"] * st["nblk"] - st["kept"].sum()) * heads
    n_cta = st["nblk"] * heads
    k_call = K_CALL_FULL * (sq * heads) / (S * H)
    t = k_call + (K_CTA * n_cta + T_TILE * kept + DP_B * part + C_SCAN[variant] * skipped) / SMS
    return t, dict(computed=int(kept), partial=int(part), skipped=int(skipped), ctas=int(n_cta),
                   scan_us=C_SCAN[variant] * skipped / SMS, k_us=k_call + K_CTA * n_cta / SMS)


def piece_path_passes_us(lq, n_pieces, tbs):
    """Elementwise HBM passes of the fused piece path that the one-GPU call has no counterpart of.
    One [L, N, d] bf16 array = A bytes; K/V [2, L, K, d] = 2A.
      forward: stack K,V (read 2A write 2A), concat the received piece (2A + 2A), LSE merge
               (read n*A o_i + lse, write A; o_i is bf16 in the kernel output), ~ (n + 1) A;
      backward: dQ sum in f32 (read n A, write A), dK/dV stack per piece (2A + 2A each).
    Returns (fwd_us, bwd_us)."""
    a = lq * H * D * BYTES
    fwd = 4 * a + 4 * a * (n_pieces - 1) + (n_pieces + 1) * a
    bwd = (n_pieces + 1) * a + 4 * a * n_pieces
    return fwd / (tbs * 1e6), bwd / (tbs * 1e6)


def piece_path_bytes(sched, p, skipped, code="cpfast", dtype_bytes=BYTES):
    """Bytes (read + written) of the elementwise passes rank p runs outside the attention kernels,
    (fwd, bwd), read off the optimized GPU HLO of the m = 2 program (/work/cp_hlo, s5int) and the
    CPU HLO of this branch (XLA:CPU, pure_callback stand-ins for the kernels; NOTES_cpfast.md).

    ``sched``: the pruned P = 2 `comm.Schedule`; ``skipped``: whether rank p's remote piece is fully
    masked (its cond takes the skip branch). A = one ``[L, N, d]`` array (L = m*C local rows), cb =
    one chunk of K (or V) ``[C, K, d]``; everything SPMD (a rank builds the payloads of every own
    slot any rank receives even if it sends none).

    s5int: fwd: payload stack+slice 4cb per sent slot; pad/concat of the remote piece to m*C keys
      (read 2cb per received slot, write 2A); skip: zero out (A); LSE merge (read 2A, write A).
      bwd: skip: zero f32 dQ (2A) + zero stacked dK/dV (2A); computed: dQ -> f32 (A + 2A) and the
      dK/dV stack (2A + 2A); slice of each transfer's dK/dV (4cb); dQ f32 sum (read 2A + A, write
      A); dK/dV add over all rows (read 2A + 2cb per slot, write 2A).
    cpfast: fwd: payloads 4cb per sent slot; remote piece = the kept slots (w keys; one slot: the
      received buffer itself, else a concatenation 4w); skip: nothing (the local out/lse pass
      through); computed: the LSE merge inside the cond (3A). bwd: skip: zero dQ in the kernel dtype
      (A) + zero dK/dV (2w, stacked when the piece is one transfer's payload, else + a 4w stack
      pass); computed: the dK/dV stack (4w, fused with the slices of the transfers); dQ sum inside a
      cond: skip nothing, computed read 2A write A; dK/dV of each sent slot added in place
      (read 2cb + 2cb, write 2cb)."""
    m = sched.m
    c = S // (P * m)
    a = (m * c) * H * D * dtype_bytes
    cb = c * H * D * dtype_bytes
    sent = len({t.slot for t in sched.transfers if t.via == -1})
    n_tr = len(sched.transfers)
    remote = sched.pieces[1] if len(sched.pieces) > 1 else None
    if code == "s5int":
        fwd = 4 * cb * sent
        bwd = 0
        if remote is not None:
            recv = sum(1 for tid in remote.slots if tid >= 0)
            fwd += 2 * cb * recv + 2 * a + (a if skipped else 0) + 3 * a
            bwd += (4 * a) if skipped else (3 * a + 4 * a)
            bwd += 4 * cb * n_tr + 4 * a + (4 * a + 2 * cb * sent)
        return fwd, bwd
    fwd = 4 * cb * sent
    bwd = 6 * cb * sent
    if remote is not None:
        kept = [tid for tid in remote.slots if tid != -2]
        w = len(kept) * cb
        single = len(kept) == 1 and kept[0] >= 0
        fwd += 0 if single else 4 * w
        if skipped:
            bwd += a + 2 * w + (0 if single else 4 * w)
        else:
            fwd += 3 * a
            bwd += 4 * w + 3 * a
    return fwd, bwd


def model_plan(mk, bounds, plan, m, coef, tbs, compact=False, verbose=True, passes="cpfast"):
    """Per-rank modelled compute of one plan: dict(c={5: ms, 9: ms} (max over ranks), noskip,
    fwd, mib, ranks)."""
    from jax_flashmask import context_parallel as cp

    need = np.asarray(cp.needed_chunks(mk, plan))
    lq = S // P
    if verbose:
        work = cp.chunk_workloads(mk, P * m)
        loads = cp.plan_loads(plan, work)
        print(f"\n== m = {m}: plan {plan.tolist()}, tile loads {np.round(loads / loads.mean(), 4).tolist()}, "
              f"needed {need.astype(int).tolist()} ==")
    per_rank = {5: [], 9: []}
    noskip = {5: [], 9: []}
    fwd_rank = []
    moved = []
    for p in range(P):
        pcs = rank_pieces(bounds, plan, need, p, compact=compact)
        moved.append(int(pcs[1][2].sum()) if len(pcs) > 1 else 0)
        tf = 0.0
        tb = {5: 0.0, 9: 0.0}
        empty = {5: 0.0, 9: 0.0}  # cost of the skipped (fully masked) pieces if run anyway
        for i, (name, lb, rec) in enumerate(pcs):
            fst = fwd_stats(lb, lq)
            ft, fi = fwd_time(fst, coef)
            bst = bwd_stats(lb, lq)
            skipped_piece = i > 0 and fully_masked(lb, lq)
            if skipped_piece:
                name += " SKIPPED"
                for v in (5, 9):
                    empty[v] += ft + bwd_time(bst, v, lq)[0]
            else:
                tf += ft
            line = (f"  rank {p} {name:10s} recv {rec.astype(int).tolist()} keys {lb.shape[1]}: fwd kept "
                    f"{fi['kept']:6d} part {fi['part']:5d} {ft / 1e3:6.2f} ms | bwd computed/head "
                    f"{bst['kept'].sum():6d} partial {bst['part'].sum():5d} skipped "
                    f"{bst['mblk'] * bst['nblk'] - bst['kept'].sum():6d}")
            for v in (5, 9):
                bt, bi = bwd_time(bst, v, lq)
                tb[v] += 0.0 if skipped_piece else bt
                line += f" v{v} {bt / 1e3:6.2f}"
            if verbose:
                print(line + " ms")
        if passes == "guess":  # the pre-cpfast sizing guess
            pf, pb = piece_path_passes_us(lq, len(pcs), tbs)
        else:
            sched = cp.make_schedule(P, m, "ring", plan=plan, needed=need)
            skipped = len(pcs) > 1 and fully_masked(pcs[1][1], lq)
            pf, pb = (x / (tbs * 1e6) for x in piece_path_bytes(sched, p, skipped, passes))
        fwd_rank.append((tf + pf) / 1e3)
        for v in (5, 9):
            per_rank[v].append((tf + pf + tb[v] + pb) / 1e3)
            noskip[v].append(per_rank[v][-1] + empty[v] / 1e3)
        if verbose:
            print(f"  rank {p}: fwd kernels {tf / 1e3:.2f} + passes {pf / 1e3:.2f} ms; bwd kernels v5 "
                  f"{tb[5] / 1e3:.2f} / v9 {tb[9] / 1e3:.2f} + passes {pb / 1e3:.2f} ms; fwd+bwd v5 "
                  f"{per_rank[5][-1]:.2f}, v9 {per_rank[9][-1]:.2f} ms")
    chunk_mib = (S // (P * m)) * H * D * BYTES * 2 / 2 ** 20
    mib = max(moved) * chunk_mib  # cp_bench's recv_MiB_per_rank: the larger receiver
    c = {v: max(per_rank[v]) for v in (5, 9)}
    if verbose:
        meas = MEAS.get(m)
        msg = f"  compute alone (max rank): v5 {c[5]:.2f} ms"
        if meas:
            msg += f" (measured {meas['compute']:.2f}, residual {100 * (c[5] / meas['compute'] - 1):+.1f} %)"
        msg += f"; fwd {max(fwd_rank):.2f} ms"
        if meas:
            msg += f" (measured {meas['fwd_compute'][0]:.1f}-{meas['fwd_compute'][1]:.1f})"
        print(msg + f"; v9 {c[9]:.2f} ms; received {mib:.0f} MiB (larger rank)")
        ns5 = max(noskip[5])
        if ns5 > c[5] + 1e-9:
            print(f"  without the empty-piece skip: v5 {ns5:.2f} ms" + (
                f" (measured {MEAS['m2_noskip_compute']:.2f}, residual "
                f"{100 * (ns5 / MEAS['m2_noskip_compute'] - 1):+.1f} %)" if m == 2 else "")
                + f", v9 {max(noskip[9]):.2f} ms")
    return dict(c=c, noskip={v: max(noskip[v]) for v in (5, 9)}, fwd=max(fwd_rank), mib=mib,
                ranks=per_rank)


# ----------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--hbm-tbs", type=float, default=3.5)
    ap.add_argument("--no-alt-plans", dest="alt_plans", action="store_false",
                    help="skip the other two m = 2 plans")
    ap.add_argument("--no-compact", dest="compact", action="store_false",
                    help="skip the 'compact' what-if: a remote piece over its received chunks only")
    ap.add_argument("--passes", choices=("cpfast", "s5int", "guess"), default="cpfast",
                    help="elementwise passes of the piece path: this branch's (cpfast), the s5int "
                         "program's (both read off the HLO, piece_path_bytes) or the old sizing guess")
    ap.add_argument("--bytes-only", action="store_true",
                    help="print the per-rank pass bytes (s5int vs cpfast) at m = 2 and 4 and exit")
    a = ap.parse_args()
    if a.bytes_only:
        return bytes_table(a.hbm_tbs)

    coef, _ = fwm.fit(D)
    print(f"forward terms (fwd_mask_model.fit, d = {D}): F = {coef[0]:.3f} us, t_blk = {coef[1]:.3f} us, "
          f"dP = {coef[2]:.3f} us, c_g = {coef[3]:.3f} us, K0 = {fwm.K0_US:g} us")
    print(f"backward terms: t_tile = {T_TILE} us, dP = {DP_B} us, c_scan = {C_SCAN[5] * 1e3:.0f} ns (v5) / 0 (v9), "
          f"k_cta = {K_CTA} us, per-call passes = {K_CALL_FULL / 1e3:.2f} ms at {S} x {H} heads (scaled by rows)")
    mk, bounds = mask_bounds()

    # one GPU
    fs = fwd_stats(bounds, S)
    f1, fi = fwd_time(fs, coef)
    bs = bwd_stats(bounds, S)
    one = {}
    print(f"\n== one GPU (one call, Sq = Sk = {S}) ==")
    print(f"fwd: kept blocks {fi['kept']}, partial {fi['part']} -> {f1 / 1e3:.2f} ms (measured "
          f"{MEAS['one_gpu_fwd'][0]:.1f}-{MEAS['one_gpu_fwd'][1]:.1f})")
    for v in (5, 9):
        b1, bi = bwd_time(bs, v, S)
        one[v] = (f1 + b1) / 1e3
        print(f"bwd v{v}: computed {bi['computed']}, partial {bi['partial']}, skipped {bi['skipped']} -> "
              f"{b1 / 1e3:.2f} ms (scan {bi['scan_us'] / 1e3:.2f}, fixed {bi['k_us'] / 1e3:.2f});  fwd+bwd "
              f"{one[v]:.2f} ms" + (f"  (measured v5 {MEAS['one_gpu_fwdbwd'][0]}-{MEAS['one_gpu_fwdbwd'][1]})"
                                    if v == 5 else ""))

    summary = []
    for m in a.m:
        plan, need, loads = plan_for(mk, m)
        plans = [("balanced", plan)]
        if a.alt_plans and m == 2:  # the other two splits of 4 chunks
            plans += [("alt", np.array([[0, 2], [1, 3]])), ("alt", np.array([[0, 3], [1, 2]]))]
        for pname, pl in plans:
            for compact in ((False, True) if a.compact else (False,)):
                if pname != "balanced" and compact:
                    continue
                r = model_plan(mk, bounds, pl, m, coef, a.hbm_tbs,
                               compact=("spmd" if a.passes == "cpfast" and not compact else compact),
                               verbose=(pname == "balanced" and not compact), passes=a.passes)
                tag = pname + (" compact" if compact else "")
                summary.append((m, tag, r))
                if not (pname == "balanced" and not compact):
                    print(f"  m = {m} {tag} plan {pl.tolist()}: compute v5 {r['c'][5]:.2f}, v9 {r['c'][9]:.2f} ms, "
                          f"received {r['mib']:.0f} MiB")
    # calibration: the model's residual on the measured v5 points (one GPU; CP m = 2 compute alone)
    k1 = np.mean(MEAS["one_gpu_fwdbwd"]) / one[5]
    # calibrate against the code that was measured (MEAS: full-width pieces, the s5int passes)
    plan2, _, _ = plan_for(mk, 2)
    meas_code = model_plan(mk, bounds, plan2, 2, coef, a.hbm_tbs, compact=False, verbose=False,
                           passes="s5int" if a.passes != "guess" else "guess")
    kcp = MEAS[2]["compute"] / meas_code["c"][5]
    print(f"\n== prediction (exposed comm = PGLE m = 2's {MEAS[2]['total'] - MEAS[2]['compute']:.2f} ms "
          f"scaled by received bytes; speedup raw = model / model, cal = one GPU x {k1:.3f} and CP x {kcp:.3f}, "
          f"the v5 residuals) ==")
    print(f"{'m':>2s} {'plan':18s} {'bwd':>4s} {'compute':>8s} {'total':>7s} {'one GPU':>8s} {'raw':>7s} "
          f"{'cal':>7s} {'hidden':>7s} {'MiB':>5s}")
    for m, tag, r in summary:
        mib = r["mib"]
        expo = (MEAS[2]["total"] - MEAS[2]["compute"]) * mib / MEAS[2]["mib"]
        comm = MEAS[2]["comm"] * mib / MEAS[2]["mib"]
        for v in (5, 9):
            cc = r["c"][v]
            tot = cc + expo
            cal = one[v] * k1 / (cc * kcp + expo)
            print(f"{m:2d} {tag:18s} {'v' + str(v):>4s} {cc:8.2f} {tot:7.2f} {one[v]:8.2f} {one[v] / tot:6.3f}x "
                  f"{cal:6.3f}x {100 * (1 - expo / comm):6.1f}% {mib:5.0f}")
    print(f"1.85x needs, with v9 and the calibrated one GPU ({one[9] * k1:.1f} ms): total <= "
          f"{one[9] * k1 / 1.85:.1f} ms")
    return 0


def bytes_table(tbs):
    """Per-rank elementwise pass bytes, s5int vs cpfast, for the benchmark's plans (m = 2, 4)."""
    from jax_flashmask import context_parallel as cp

    mk, bounds = mask_bounds()
    print(f"elementwise passes per rank (GiB, ms at {tbs} TB/s), causal_document S = {S}")
    for m in (2, 4):
        plan, need, _ = plan_for(mk, m)
        sched = cp.make_schedule(P, m, "ring", plan=plan, needed=need)
        print(f"m = {m}: plan {plan.tolist()}, remote slots {[pc.slots for pc in sched.pieces[1:]]}")
        for p in range(P):
            pcs = rank_pieces(bounds, plan, need, p, compact="spmd")
            skipped = len(pcs) > 1 and fully_masked(pcs[1][1], m * (S // (P * m)))
            row = []
            for code in ("s5int", "cpfast"):
                f, b = piece_path_bytes(sched, p, skipped, code)
                row.append((f / 2 ** 30, b / 2 ** 30, (f + b) / (tbs * 1e9)))
            (f0, b0, t0), (f1, b1, t1) = row
            print(f"  rank {p} ({'skips' if skipped else 'computes'} its remote piece): s5int fwd {f0:.2f} + "
                  f"bwd {b0:.2f} GiB = {t0:.2f} ms; cpfast fwd {f1:.2f} + bwd {b1:.2f} GiB = {t1:.2f} ms; "
                  f"saved {t0 - t1:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
