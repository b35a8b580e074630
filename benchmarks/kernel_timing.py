"""Quick timing of the sm_90a forward kernel (and cuDNN on full/causal, same run).

Protocol as in SPEC §5: bf16, H=32, d=128 (unless --d), B = tokens/S, masks of the 12-mask
suite. Wall-clock median of --iters runs after warm-up, block_until_ready each. TFLOP/s with the
FlashMask convention 4*B*H*S*S*d*(1-rho) (rho = fully masked 128x128 tiles) and with exact
visible-area FLOPs.
Usage: python benchmarks/kernel_timing.py --seqs 8192 32768 --masks full causal document --json out.json
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

from jax_flashmask import _cuda, masks


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
    JSON file after every row (a run cut by its timeout keeps what it timed). bwd_timing.py too."""
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
        if path:
            with open(path, "w") as fh:
                json.dump(dict(device=str(jax.devices()[0]), rows=rows), fh, indent=1)

    return rows, emit


def timing_suite(S: int, B: int, window: int | None = None) -> dict:
    """The twelve masks at S (`masks.benchmark_suite(S, 0)`, batch B); `window` replaces the
    sliding window's S / 16 (a fixed window over several S keeps the kept blocks per tile: what
    grows with S alone then shows). bwd_timing.py too."""
    suite = masks.benchmark_suite(S, 0, batch=B)
    if window is not None:
        suite["sliding_window"] = masks.sliding_window(S, window, batch=B)
    return suite


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192])
    ap.add_argument("--masks", nargs="+", default=["full", "causal"])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", type=int, nargs="+", default=[2])
    ap.add_argument("--sm-margin", type=int, default=0, help="SMs the persistent variants leave free")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="per mask: whether each variant's O and LSE equal the first variant's bit for bit")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--window", type=int, default=None, help="sliding_window's width (default S / 16)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    rows, emit = json_rows(a.json)

    for S in a.seqs:
        B = max(1, a.tokens // S)
        H, d = a.heads, a.d
        key = jax.random.PRNGKey(S)
        kq, kk, kv = jax.random.split(key, 3)
        q = jax.random.normal(kq, (B, S, H, d), dtype)
        k = jax.random.normal(kk, (B, S, H, d), dtype)
        v = jax.random.normal(kv, (B, S, H, d), dtype)
        suite = timing_suite(S, B, a.window)
        for name in a.masks:
            m = suite[name]
            bounds = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
            rho = float(masks.block_sparsity(m, S, 128))
            vis = float(masks.visible_fraction(m, S))
            flops_fm = 4.0 * B * H * S * S * d * (1 - rho)
            flops_exact = 4.0 * B * H * S * S * d * vis
            first = None
            for var in a.variants:
                f = jax.jit(lambda q, k, v, b, var=var: _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=var,
                                                                      sm_margin=a.sm_margin))
                try:
                    t = timeit(f, q, k, v, bounds, iters=a.iters)
                except Exception as e:  # noqa: BLE001
                    print(f"S={S} {name} variant={var}: FAILED {e}", flush=True)
                    continue
                r = dict(impl=f"flashmask_sm90_v{var}" + (f"_m{a.sm_margin}" if a.sm_margin else ""), S=S, B=B, H=H, d=d, mask=name,
                         window=a.window if name == "sliding_window" else None, rho=rho,
                         visible=vis, ms=t * 1e3, tflops_fm=flops_fm / t / 1e12,
                         tflops_exact=flops_exact / t / 1e12)
                if a.check:
                    o, l = f(q, k, v, bounds)
                    if first is None:
                        first = (var, o, l)
                    else:
                        r[f"bitwise_vs_v{first[0]}"] = bool(jnp.array_equal(o, first[1]) & jnp.array_equal(l, first[2]))
                    del o, l
                emit(r)
            if a.cudnn and name in ("full", "causal", "sliding_window"):
                kw = dict(is_causal=name != "full", implementation="cudnn")
                if name == "sliding_window":  # the window the vectors hold: LTS[0] = w + 1
                    kw["local_window_size"] = (int(np.asarray(bounds)[0, 0, 0, 0]) - 1, 0)
                g = jax.jit(lambda q, k, v, kw=kw: jax.nn.dot_product_attention(q, k, v, **kw))
                try:
                    t = timeit(g, q, k, v, iters=a.iters)
                    r = dict(impl="cudnn", S=S, B=B, H=H, d=d, mask=name, rho=rho, visible=vis,
                             ms=t * 1e3, tflops_fm=flops_fm / t / 1e12, tflops_exact=flops_exact / t / 1e12)
                    emit(r)
                except Exception as e:  # noqa: BLE001
                    print(f"cudnn {name} S={S}: FAILED {e}", flush=True)
        del q, k, v


if __name__ == "__main__":
    sys.exit(main())
