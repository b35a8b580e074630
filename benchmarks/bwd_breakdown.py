"""Where one d = 128 backward call spends its time on short windows (benchmarks/NOTES_bwd_short.md).

CPU part (no GPU, numpy only; tests/test_bench_smoke.py runs it):
* ``piece_bytes``: HBM bytes of every pass of one `_cuda.backward` call (XLA fill of dlse, block
  metadata, bwd_prep, the dQ-accumulator memset, the main kernel's per-token traffic, the dQ
  convert) and their time at a given bandwidth;
* ``tile_counts``: kept / partial 80-row query tiles per 128-key block (bwd_mask_model.stats);
* ``model``: the fitted split T = K0 + (t_tile * kept + dP * partial) / 132 of the protocol
  times (NOTES_bwd_short.md section 2), K0 split into the passes (bytes at `bw`) and the rest
  (per-CTA fixed cost).

Device part (``--device``): medians of back-to-back calls (jit, block_until_ready) of
  1. the backward custom call alone (forward outputs precomputed; dlse = zeros made inside);
  2. stand-ins of the per-call passes, timed as XLA programs of the same bytes: a zero fill of the
     fp32 dQ accumulator [B, N, sq_pad, d], rowsum(dO * O) over [B, S, N, d], the fp32
     [B, N, sq_pad, d] -> bf16 [B, S, N, d] transpose-convert;
and prints them next to the model. ``--once``: inputs, forward, one backward, nothing else (for
``ncu --metrics gpu__time_duration.sum``; the commands are in NOTES_bwd_short.md section 4).

Usage: python benchmarks/bwd_breakdown.py [--seqs 8192 32768] [--masks sliding_window ...] [--fit]
       [--device [--variant 16] [--iters 10]] [--once]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

TOKENS, H, D, SMS = 131072, 32, 128, 132
BM, BN = 80, 128  # variant 16: 80-row query tiles, 128-key blocks
BW = 4.0e12  # achievable HBM bytes/s on the H200 (read + write)
# Fit of NOTES_bwd_short.md section 2 (24 protocol points of session 7, variant 16): us, us/tile
FIT = dict(K0=5047.0, t_tile=3.2415, dP=0.186)
FIT_SHORT = dict(K0=4599.0, t_tile=3.2249, dP=0.614)  # the 7 windowed / document masks only
SHORT_MASKS = ("sliding_window", "causal_document", "document", "share_question",
               "global_sliding_window", "causal_blockwise", "prefix_lm_document")


def piece_bytes(S: int, B: int | None = None, h: int = H, d: int = D, bm: int = BM,
                bn: int = BN, bw: float = BW) -> list[dict]:
    """[{name, read, write, ms}] for one backward call at (S, B); ms = (read + write) / bw.
    The main kernel's row is its per-token traffic only (Q, dO, K, V read once, dK / dV written,
    the dQ accumulator read and written back once by the L2 reductions): overlapped with its
    tiles, listed for the bandwidth picture, not added to the passes."""
    B = TOKENS // S if B is None else B
    rows = B * S * h                      # query rows (b, i, h)
    sq_pad = -(-S // bm) * bm
    prow = B * h * sq_pad                 # padded rows of the workspaces
    nblk = -(-S // bn)
    e = 2                                 # bf16
    acc = prow * d * 4                    # fp32 dQ accumulator
    out = [
        dict(name="XLA fill: dlse = zeros [B,S,N] f32", read=0, write=rows * 4),
        dict(name="block_meta (bounds -> [B,Hm,8,nblk])", read=B * 4 * S * 4, write=B * 8 * nblk * 4),
        dict(name="bwd_prep: D = rowsum(dO*O) - dlse, lse*log2e", read=2 * rows * d * e + 2 * rows * 4,
             write=2 * prow * 4),
        dict(name="cudaMemsetAsync dq_accum (fp32)", read=0, write=acc),
        dict(name="bwd_convert80: dq_accum -> dq bf16", read=acc, write=rows * d * e),
        dict(name="main kernel, per-token traffic (overlapped)", read=4 * rows * d * e + acc,
             write=2 * rows * d * e + acc),
    ]
    for p in out:
        p["ms"] = (p["read"] + p["write"]) / bw * 1e3
    return out


def passes_ms(S: int, bw: float = BW) -> float:
    """The separate per-call passes (every row of piece_bytes but the main kernel's), ms."""
    return sum(p["ms"] for p in piece_bytes(S, bw=bw) if not p["name"].startswith("main"))


def tile_counts(S: int, bm: int = BM) -> dict:
    """{mask: (key blocks, kept tiles, partial tiles)} per (batch, head) for the benchmark suite
    (bench_attention.py's seed), the backward's 80-row tiles per 128-key block."""
    import bwd_mask_model as mm

    return {name: (int(s["nblk"]), int(s["kept"].sum()), int(s["part"].sum()))
            for name, s in mm.stats(S, bm).items()}


def model(S: int, mask: str, fit: dict = FIT, bw: float = BW, counts: dict | None = None) -> dict:
    """Model ms of the protocol backward at (S, mask): K0 = passes (bytes at bw) + per-CTA rest,
    tiles, partial tiles; and the per-CTA fixed cost in us that the rest implies."""
    counts = counts or tile_counts(S)
    nblk, kept, part = counts[mask]
    heads = (TOKENS // S) * H
    ctas_per_sm = nblk * heads / SMS
    p = passes_ms(S, bw)
    k0 = fit["K0"] / 1e3
    tiles = fit["t_tile"] * kept * heads / SMS / 1e3
    partial = fit["dP"] * part * heads / SMS / 1e3
    return dict(total=k0 + tiles + partial, passes=p, per_cta=k0 - p, tiles=tiles, partial=partial,
                per_cta_us=(k0 - p) * 1e3 / ctas_per_sm, ctas_per_sm=ctas_per_sm)


PROTOCOL_FILES = ("results/h200_2026-12-01s7_fwdbwd_8k.json", "results/h200_2026-12-01s7_fwdbwd_32k.json")


def fit_protocol(files=PROTOCOL_FILES, masks=None, impl: str = "ours", d: int = D, bm: int = BM) -> dict:
    """Least squares (relative errors) of T = K0 + (t_tile * kept + dP * partial) / 132 on
    bench_attention.py JSONs (bwd_ms = fwd+bwd - fwd; rows of `impl` at head dim d; `masks`: a
    subset, default all). Returns dict(K0 us, t_tile us, dP us, rms, rows=[(S, mask, meas ms,
    model ms)]). FIT / FIT_SHORT above are this on the session-7 files (all masks / the short ones)."""
    import json

    import bwd_mask_model as mm

    here = Path(__file__).resolve().parent
    counts, A, y, keys = {}, [], [], []
    for f in files:
        f = Path(f)
        for r in json.loads((f if f.is_absolute() else here / f).read_text())["results"]:
            if r.get("impl") != impl or r.get("d") != d or not r.get("bwd_ms"):
                continue
            if masks is not None and r["mask"] not in masks:
                continue
            S = r["S"]
            if S not in counts:
                counts[S] = tile_counts(S, bm)
            _, kept, part = counts[S][r["mask"]]
            heads = r["B"] * r["H"]
            A.append([1.0, kept * heads / SMS, part * heads / SMS])
            y.append(r["bwd_ms"] * 1e3)
            keys.append((S, r["mask"]))
    A, y = np.array(A), np.array(y)
    coef, pred = mm.relative_lstsq(A, y)
    return dict(K0=float(coef[0]), t_tile=float(coef[1]), dP=float(coef[2]),
                rms=float(np.sqrt(np.mean((pred / y - 1) ** 2))),
                rows=[(S, m, yy / 1e3, pp / 1e3) for (S, m), yy, pp in zip(keys, y, pred)])


def print_model(seqs, masks, bw=BW):
    for S in seqs:
        print(f"S = {S}, B = {TOKENS // S}, H = {H}, d = {D}: passes at {bw / 1e12:.1f} TB/s")
        for p in piece_bytes(S, bw=bw):
            print(f"  {p['name']:46s} read {p['read'] / 1e9:6.3f} GB  write {p['write'] / 1e9:6.3f} GB"
                  f"  {p['ms']:6.3f} ms")
        counts = tile_counts(S)
        for m in masks:
            r = model(S, m, bw=bw, counts=counts)
            t = r["total"]
            print(f"  {m:22s} model {t:7.2f} ms: passes {r['passes']:5.2f} ({100 * r['passes'] / t:4.1f} %), "
                  f"per-CTA {r['per_cta']:5.2f} ({100 * r['per_cta'] / t:4.1f} %, {r['per_cta_us']:4.1f} us x "
                  f"{r['ctas_per_sm']:.0f}/SM), tiles {r['tiles']:6.2f} ({100 * r['tiles'] / t:4.1f} %), "
                  f"partial {r['partial']:4.2f}")


# ----------------------------------------------------------------------------------- device


def _median_ms(fn, args, iters: int) -> float:
    """Median ms of `fn(*args)` by the protocol's timing rule (bench_attention.time_jax)."""
    from bench_attention import time_jax

    return time_jax(fn, args, iters=iters, min_iters=min(3, iters), budget_s=3.0, out_bytes=1 << 30)


def _problem(S: int, mask: str, variant):
    import jax
    import jax.numpy as jnp

    from jax_flashmask import _cuda
    from jax_flashmask.masks import benchmark_suite, canonical_bounds

    B = TOKENS // S
    m = benchmark_suite(S, seed=np.random.SeedSequence([0, S]))[mask]
    bounds = canonical_bounds(jnp.asarray(np.asarray(m.startend_row_indices, np.int32)),
                              causal=bool(m.causal), q_len=S)
    bounds = jnp.broadcast_to(bounds, (B,) + bounds.shape[1:]).astype(jnp.int32)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, (B, S, H, D), jnp.bfloat16) for kk in ks)
    scale = 1.0 / D ** 0.5
    out, lse = jax.jit(lambda q, k, v, b: _cuda.forward(q, k, v, b, scale=scale))(q, k, v, bounds)
    bwd = jax.jit(lambda q, k, v, b, o, l, g: _cuda.backward(q, k, v, b, o, l, g, None, scale=scale,
                                                             variant=variant))
    return (q, k, v, bounds, out, lse, do), bwd


def run_device(seqs, masks, variant, iters: int):
    import jax
    import jax.numpy as jnp

    for S in seqs:
        B = TOKENS // S
        sq_pad = -(-S // BM) * BM
        # stand-ins of the passes: XLA programs moving the same bytes
        fill = jax.jit(lambda: jnp.zeros((B, H, sq_pad, D), jnp.float32))
        x = jax.random.normal(jax.random.key(1), (B, S, H, D), jnp.bfloat16)
        y = jax.random.normal(jax.random.key(2), (B, S, H, D), jnp.bfloat16)
        rowsum = jax.jit(lambda o, g: jnp.sum(o.astype(jnp.float32) * g.astype(jnp.float32), -1))
        acc = jnp.ones((B, H, sq_pad, D), jnp.float32)
        conv = jax.jit(lambda a: (jnp.transpose(a[:, :, :S], (0, 2, 1, 3)) * 0.088).astype(jnp.bfloat16))
        stand = {"fill dq_accum (memset stand-in)": (fill, ()),
                 "rowsum(dO*O) (bwd_prep stand-in)": (rowsum, (x, y)),
                 "f32 -> bf16 transpose (convert stand-in)": (conv, (acc,))}
        bytes_ = {p["name"]: p for p in piece_bytes(S)}
        print(f"S = {S}, B = {B}: stand-ins (median ms, GB/s)")
        for (name, (fn, args)), key in zip(stand.items(), ("cudaMemsetAsync dq_accum (fp32)",
                                                           "bwd_prep: D = rowsum(dO*O) - dlse, lse*log2e",
                                                           "bwd_convert80: dq_accum -> dq bf16")):
            ms = _median_ms(fn, args, iters)
            gb = (bytes_[key]["read"] + bytes_[key]["write"]) / 1e9
            print(f"  {name:42s} {ms:7.3f} ms  ({gb / ms:6.0f} GB/s on the kernel's {gb:.2f} GB)")
        del acc, x, y
        counts = tile_counts(S)
        for mask in masks:
            args, bwd = _problem(S, mask, variant)
            ms = _median_ms(bwd, args, iters)
            r = model(S, mask, counts=counts)
            print(f"  backward call {mask:22s} {ms:7.2f} ms (protocol model {r['total']:.2f}: passes "
                  f"{r['passes']:.2f} + per-CTA {r['per_cta']:.2f} + tiles {r['tiles']:.2f} + partial "
                  f"{r['partial']:.2f})")
            del args


def run_once(S: int, mask: str, variant):
    import jax

    args, bwd = _problem(S, mask, variant)
    jax.block_until_ready(args)
    jax.block_until_ready(bwd(*args))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--masks", nargs="+", default=["sliding_window", "causal_document", "share_question",
                                                   "document", "causal", "full"])
    ap.add_argument("--bw", type=float, default=BW / 1e12, help="TB/s for the bytes model")
    ap.add_argument("--device", action="store_true", help="time the call and the stand-ins on a GPU")
    ap.add_argument("--once", action="store_true", help="one backward call of seqs[0], masks[0] (for ncu)")
    ap.add_argument("--fit", action="store_true", help="refit the model on the session-7 protocol JSONs")
    ap.add_argument("--variant", type=int, default=None)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args(argv)
    if a.once:
        run_once(a.seqs[0], a.masks[0], a.variant)
        return 0
    if a.fit:
        for name, sel in (("all masks", None), ("short masks", SHORT_MASKS)):
            r = fit_protocol(masks=sel)
            print(f"fit ({name}, {len(r['rows'])} points): K0 = {r['K0'] / 1e3:.3f} ms, t_tile = {r['t_tile']:.3f} us, "
                  f"dP = {r['dP']:.3f} us, rms {100 * r['rms']:.2f} %")
            for S, m, meas, mod in r["rows"]:
                print(f"  {S:6d} {m:22s} {meas:8.2f} ms  model {mod:8.2f} ({100 * (mod / meas - 1):+5.1f} %)")
    print_model(a.seqs, a.masks, a.bw * 1e12)
    if a.device:
        run_device(a.seqs, a.masks, a.variant, a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
