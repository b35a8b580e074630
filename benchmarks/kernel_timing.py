"""Timing of the sm_90a kernels, forward and backward, by named config (and cuDNN, same run).

Protocol as in SPEC §5: bf16, H=32, d=128 (unless --d), B = tokens/S, masks of the 12-mask
suite. Wall-clock median of --iters runs after warm-up, block_until_ready each. TFLOP/s with the
FlashMask convention 4*B*H*S*S*d*(1-rho) (rho = fully masked 128x128 tiles; x2.5 backward) and
(forward) with exact visible-area FLOPs.

--configs: kernel configs by name (jax_flashmask.backends.cuda.configs; default: the table's
choice per mask); several forward configs of one head dim are compared bit for bit with --check.
--bwd: time the backward (its configs: the table's for --det / --sm-margin, or --configs bwd_*).
Masks "document/L" and "causal_document/L": equal documents of L tokens (the last one shorter where
L does not divide S). With L a multiple of the kernels' tile sides every kept tile is fully visible
(document) or only the diagonal ones are partial (causal_document), and every walk has the same
length, so a sweep over L separates a work unit's fixed cost from its tiles' cost.
Usage: python benchmarks/kernel_timing.py --seqs 8192 32768 --masks full causal document \
           [--bwd --det 0 1] [--configs fwd_d256_bn80_wg2 fwd_d256_bn64_wg2_walk_bits] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

from jax_flashmask import masks
from jax_flashmask.backends import cuda
from jax_flashmask.backends.cuda import configs


def timeit(f, *args, iters=10, warmup=3):
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def json_rows(path):
    """(rows, emit): emit(r) appends r, prints it as a JSON line and, with a path, rewrites the
    JSON file after every row (a run cut by its timeout keeps what it timed)."""
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
        if path:
            with open(path, "w") as fh:
                json.dump(dict(device=str(jax.devices()[0]), rows=rows), fh, indent=1)

    return rows, emit


def timing_suite(S: int, B: int, window: int | None = None, pad: int | None = None) -> dict:
    """The twelve masks at S (`masks.benchmark_suite(S, 0)`, batch B); `window` replaces the
    sliding window's S / 16. Also "causal_padding": causal with the last `pad` positions (default
    S / 16) padding (segment id -1): fully masked query rows and key columns no row reads, the
    positions the kernels zero in shared memory (docs/decisions.md#nan-guarantee-cuda)."""
    suite = masks.benchmark_suite(S, 0, batch=B)
    if window is not None:
        suite["sliding_window"] = masks.sliding_window(S, window, batch=B)
    p = S // 16 if pad is None else pad
    seg = np.concatenate([np.zeros(S - p, np.int32), -np.ones(p, np.int32)])
    suite["causal_padding"] = masks.from_segment_ids(np.tile(seg, (B, 1)), causal=True)
    return suite


def suite_mask(suite: dict, name: str, S: int, B: int):
    """`suite[name]`, or for "document/L" / "causal_document/L" equal documents of L tokens."""
    base, sep, n = name.partition("/")
    if not sep:
        return suite[name]
    if base not in ("document", "causal_document") or not n.isdigit() or not 0 < int(n) <= S:
        raise ValueError(f"--masks {name!r}: only document/L and causal_document/L, 0 < L <= S")
    L = int(n)
    lens = [L] * (S // L) + ([S % L] if S % L else [])
    return getattr(masks, base)(lens, batch=B)


def structure(name: str) -> str:
    return name if name in ("full", "causal") else "general"


def cudnn_row(a, emit, name, bounds, q, k, v, do, base, flops):
    kw = dict(is_causal=name != "full", implementation="cudnn")
    if name == "sliding_window":  # the window the bounds hold: LTS[0] = w + 1
        kw["local_window_size"] = (int(np.asarray(bounds)[0, 0, 0, 0]) - 1, 0)
    att = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, **kw)  # noqa: E731
    try:
        tf = timeit(jax.jit(att), q, k, v, iters=a.iters)
        if a.bwd:
            tfb = timeit(jax.jit(lambda q, k, v, g: jax.vjp(att, q, k, v)[1](g)), q, k, v, do,
                         iters=a.iters)
            emit(dict(base, impl="cudnn_bwd", ms=(tfb - tf) * 1e3, tflops_fm=flops / (tfb - tf) / 1e12))
        else:
            emit(dict(base, impl="cudnn", ms=tf * 1e3, tflops_fm=flops / tf / 1e12))
    except Exception as e:  # noqa: BLE001
        print(f"cudnn {name} S={base['S']}: FAILED {e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192])
    ap.add_argument("--masks", nargs="+", default=["full", "causal"])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--configs", nargs="+", default=None, help="kernel configs by name")
    ap.add_argument("--bwd", action="store_true", help="time the backward")
    ap.add_argument("--det", type=int, nargs="+", default=[0], help="backward: 0 default, 1 deterministic")
    ap.add_argument("--sm-margin", type=int, default=0, help="SMs left free")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="each config's results against the first config's, bit for bit")
    ap.add_argument("--soft-cap", type=float, default=30.0,
                    help="the logits soft cap given to the soft-cap configs (others get none)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--window", type=int, default=None, help="sliding_window's width (default S / 16)")
    ap.add_argument("--pad", type=int, default=None,
                    help="causal_padding's trailing padding positions (default S / 16)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    named = [configs.config_by_name(n) for n in a.configs] if a.configs else None
    rows, emit = json_rows(a.json)

    for S in a.seqs:
        B = max(1, a.tokens // S)
        H, d = a.heads, a.d
        scale = d ** -0.5
        kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(S), 4)
        q = jax.random.normal(kq, (B, S, H, d), dtype)
        k = jax.random.normal(kk, (B, S, H, d), dtype)
        v = jax.random.normal(kv, (B, S, H, d), dtype)
        do = jax.random.normal(kd, (B, S, H, d), dtype) if a.bwd else None
        suite = timing_suite(S, B, a.window, a.pad)
        for name in a.masks:
            m = suite_mask(suite, name, S, B)
            bounds = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
            rho = float(masks.block_sparsity(m, S, 128))
            vis = float(masks.visible_fraction(m, S))
            flops = (2.5 if a.bwd else 1.0) * 4.0 * B * H * S * S * d * (1 - rho)
            base = dict(S=S, B=B, H=H, d=d, mask=name, rho=rho, visible=vis,
                        window=a.window if name == "sliding_window" else None,
                        pad=a.pad if name == "causal_padding" else None)
            if a.bwd:
                runs = [(c or configs.backward_config(d, bool(det), a.sm_margin), bool(det))
                        for c in (named or [None]) for det in a.det]
                # out / lse of the forward with the cap each backward takes (only those run)
                fw = {cap: jax.block_until_ready(cuda.forward(
                    q, k, v, bounds, scale=scale, structure=structure(name), logits_soft_cap=cap))
                    for cap in {a.soft_cap if c.soft_cap else None for c, _ in runs}}
            else:
                runs = [(c, False) for c in (named or [configs.forward_config(d, structure(name))])]
            first = {}
            for cfg, det in runs:
                cap = a.soft_cap if cfg.soft_cap else None
                if a.bwd:
                    f = jax.jit(lambda q, k, v, b, o, l, g, cfg=cfg, det=det, cap=cap: cuda.run_backward(
                        cfg, q, k, v, b, o, l, g, scale=scale, deterministic=det,
                        sm_margin=a.sm_margin, logits_soft_cap=cap))
                    args = (q, k, v, bounds, *fw[cap], do)
                else:
                    f = jax.jit(lambda q, k, v, b, cfg=cfg, cap=cap: cuda.run_forward(
                        cfg, q, k, v, b, scale=scale, sm_margin=a.sm_margin, logits_soft_cap=cap))
                    args = (q, k, v, bounds)
                tag = cfg.name + ("_det" if det else "") + (f"_m{a.sm_margin}" if a.sm_margin else "")
                try:
                    t = timeit(f, *args, iters=a.iters)
                except Exception as e:  # noqa: BLE001
                    print(f"S={S} {name} {tag}: FAILED {e}", flush=True)
                    continue
                r = dict(base, impl=tag, ms=t * 1e3, tflops_fm=flops / t / 1e12,
                         tflops_exact=None if a.bwd else 4.0 * B * H * S * S * d * vis / t / 1e12)
                if a.check:
                    res = jax.block_until_ready(f(*args))
                    if det not in first:
                        first[det] = (tag, res)
                    else:
                        r[f"bitwise_vs_{first[det][0]}"] = all(
                            bool(jnp.array_equal(x, y)) for x, y in zip(res, first[det][1]))
                    del res
                emit(r)
            first.clear()
            if a.cudnn and name in ("full", "causal", "sliding_window"):
                cudnn_row(a, emit, name, bounds, q, k, v, do, base, flops)
        del q, k, v, do
    print("\nimpl                                        S      mask            ms  TFLOP/s")
    for r in rows:
        print(f"{r['impl']:42s} {r['S']:6d} {r['mask']:14s} {r['ms']:8.2f} {r['tflops_fm']:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
