"""Quick timing of the sm_90a backward kernel against cuDNN's backward (same run).

Protocol as benchmarks/kernel_timing.py: bf16, H=32, d=128, B = tokens/S. Ours: the backward
custom call alone (forward outputs precomputed). cuDNN: jax.vjp of dot_product_attention(cudnn),
fwd+bwd timed, minus its forward timed alone. TFLOP/s with 2.5 x the forward FlashMask convention
4*B*H*S*S*d*(1-rho) (rho = fully masked 128x128 tiles).
Usage: python benchmarks/bwd_timing.py --seqs 8192 --masks full causal document --cudnn --json out.json
       [--variants 5 6 7 10 11 12 13] [--det 0 1] (kernel variants; default and deterministic mode;
       7, 11: --d 64 only; 12, 13: d 128 only)
       [--sm-margin 0 8] (SMs left free; variant 6 only, the others ignore it and run once)
       [--d 256 --heads 16] [--portable] (head dim; also time the portable XLA backward)
Validation in the same run: every configuration of a (S, mask) is compared with the first one
timed in the same mode (default / deterministic; e.g. `--variants 5 6`: variant 6 against 5):
dq/dk/dv relative error (< 1e-2 or `CHECK FAILED`), and whether they are bitwise equal (expected
for 6, 10, 12 and 13 vs 5, 11 vs 7: dk/dv always, dq in deterministic mode) -- the `check` field of each
row.
cuDNN covers full, causal and sliding_window (local_window_size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jax_flashmask import _cuda, masks
from kernel_timing import json_rows, timing_suite  # a sibling script (benchmarks/ is sys.path[0])

_bwd = _cuda.backward


def timeit(f, *args, iters=10, warmup=2):
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def small_cases(variants=None):
    """A few small launches (both dQ modes, d 64/128/256, ragged, GQA) for compute-sanitizer.
    variants: kernel variants to run (default: all compiled; d=256: the first one only, one kernel
    for every variant number; variants 7 and 11: the d=64 cases only, incl. a bf16 GQA case with
    three 128-row query tiles, the last one partial), then a deterministic causal_blockwise launch
    (B = 2, S = 1200, GQA 4 / 2) that the deterministic pre-passes reorder: of the 80-row variants
    (variant 21) at d = 128, of variants 7 / 11 at d = 64 and of the d = 256 kernel."""
    import numpy as np
    rng = np.random.default_rng(0)
    rows128 = tuple(getattr(_cuda, "BWD_ROWS128_VARIANTS", (getattr(_cuda, "BWD_ROWS128_VARIANT", None),)))
    for (Sq, Sk, N, K, d, dt) in [(129, 200, 4, 2, 128, jnp.bfloat16), (70, 333, 2, 1, 64, jnp.float16),
                                  (300, 333, 4, 2, 64, jnp.bfloat16),
                                  (150, 197, 4, 2, 256, jnp.bfloat16),
                                  # d = 128 fp16 GQA with several query tiles, the last partial
                                  # (80-row tiles of variant 16: 7, the last of 41 rows)
                                  (521, 400, 4, 2, 128, jnp.float16)]:
        q = jnp.asarray(rng.standard_normal((1, Sq, N, d)), dt)
        k = jnp.asarray(rng.standard_normal((1, Sk, K, d)), dt)
        do = jnp.asarray(rng.standard_normal((1, Sq, N, d)), dt)
        b = np.zeros((1, 1, 4, Sk), np.int32)
        b[:, :, 0] = rng.integers(0, Sq + 1, Sk)
        b[:, :, 1] = Sq
        b = jnp.asarray(b)
        out, lse = _cuda.forward(q, k, k, b, scale=0.1)
        vs = variants or getattr(_cuda, "BWD_VARIANTS", (1,))
        vs = [x for x in vs if x not in rows128 or d == 64]  # variants 7, 11: d = 64 only
        lockstep = tuple(getattr(_cuda, "LOCKSTEP_BWD_VARIANTS", ()))
        vs = [x for x in vs if x not in lockstep or d != 64]  # variants 12, 13: d = 128 (256: own kernel)
        rows80 = tuple(getattr(_cuda, "BWD_ROWS80_VARIANTS", ()))
        vs = [x for x in vs if x not in rows80 or d == 128]  # variant 16: d = 128 only
        if not vs:
            continue
        for variant in (vs[:1] if d == 256 else vs):  # d=256: one kernel for every variant
            for mode, det in ((1, False), (0, False), (1, True)):
                # variant 6 also with 4 CTAs (sm_margin): several items per CTA, both slots
                for margin in ((0, 128) if variant == 6 else (0,)):
                    jax.block_until_ready(_bwd(q, k, k, b, out, lse, do, None, scale=0.1,
                                               dq_mode=mode, deterministic=det, variant=variant,
                                               sm_margin=margin))
    print("sanitize case done", flush=True)
    # a causal_blockwise launch that the deterministic pre-passes reorder: variant 21's (80-row
    # variants, d = 128), bwd_det_order_sm90's (variants 7 / 11 at d = 64, the d = 256 kernel)
    from jax_flashmask import masks
    rows80 = tuple(getattr(_cuda, "BWD_ROWS80_VARIANTS", ()))
    chosen = variants or getattr(_cuda, "BWD_VARIANTS", ())
    B, S, N, K = 2, 1200, 4, 2
    m = masks.benchmark_suite(S, 0, batch=B)["causal_blockwise"]
    b = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)  # [B, 1, 4, S]
    for d, vs in ((128, [x for x in chosen if x in rows80]), (64, [x for x in chosen if x in rows128]),
                  (256, list(chosen[:1]))):
        if not vs:
            continue
        q = jnp.asarray(rng.standard_normal((B, S, N, d)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((B, S, K, d)), jnp.bfloat16)
        out, lse = _cuda.forward(q, k, k, b, scale=0.1)
        for variant in vs:
            jax.block_until_ready(_bwd(q, k, k, b, out, lse, q, None, scale=0.1,
                                       deterministic=True, variant=variant))
    print("sanitize case done (causal_blockwise, deterministic)", flush=True)


def _compare(first, tag, det, g):
    """Relative errors of g = (dq, dk, dv) against the first configuration's, and bitwise flags.
    Variants with the same per-item math (5, 6; 3, 4, 5) give bitwise equal dk/dv always and dq
    too when both are deterministic; in the default mode dq differs by fp32 summation order."""
    import numpy as np
    ftag, fdet, fg = first
    out = {"vs": ftag}
    for name, x, y in zip(("dq", "dk", "dv"), g, fg):
        x = np.asarray(x.astype(jnp.float32), np.float64)
        y = np.asarray(y.astype(jnp.float32), np.float64)
        den = np.linalg.norm(y)
        out[f"{name}_relerr"] = float(np.linalg.norm(x - y) / (den if den > 0 else 1.0))
        out[f"{name}_bitwise"] = bool(np.array_equal(x, y))
        out[f"{name}_finite"] = bool(np.isfinite(x).all())
    out["ok"] = (all(out[f"{n}_finite"] for n in ("dq", "dk", "dv"))
                 and all(out[f"{n}_relerr"] < 1e-2 for n in ("dq", "dk", "dv")))
    return out


def main():
    if "--small" in sys.argv:  # [--variants V ...] restricts the variants
        av = sys.argv
        vs = ([int(x) for x in av[av.index("--variants") + 1:] if x.isdigit()]
              if "--variants" in av else None)
        return small_cases(vs)
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192])
    ap.add_argument("--masks", nargs="+", default=["full", "causal"])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--dq-modes", type=int, nargs="+", default=[1])
    ap.add_argument("--variants", type=int, nargs="+", default=[None])
    ap.add_argument("--det", type=int, nargs="+", default=[0], help="0: default, 1: deterministic")
    ap.add_argument("--sm-margin", type=int, nargs="+", default=[0],
                    help="SMs variant 6 leaves free (other variants ignore it and run once)")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the first config")
    ap.add_argument("--portable", action="store_true",
                    help="also time the portable XLA backward (_xla.backward, the d=256 fallback before "
                         "the d=256 kernel)")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--window", type=int, default=None, help="sliding_window's width (default S / 16)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dtype = jnp.bfloat16
    rows, emit = json_rows(a.json)

    for S in a.seqs:
        B = max(1, a.tokens // S)
        H, d = a.heads, a.d
        scale = d ** -0.5
        kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(S), 4)
        q = jax.random.normal(kq, (B, S, H, d), dtype)
        k = jax.random.normal(kk, (B, S, H, d), dtype)
        v = jax.random.normal(kv, (B, S, H, d), dtype)
        do = jax.random.normal(kd, (B, S, H, d), dtype)
        suite = timing_suite(S, B, a.window)
        for name in a.masks:
            m = suite[name]
            bounds = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
            rho = float(masks.block_sparsity(m, S, 128))
            flops = 2.5 * 4.0 * B * H * S * S * d * (1 - rho)
            out, lse = jax.block_until_ready(_cuda.forward(q, k, v, bounds, scale=scale))
            # det -> (tag, det, grads) of the first configuration of that mode: the reference; a
            # variant with a bitwise twin (_cuda.MASK_REGS_BWD_VARIANTS: 10 -> 5, 11 -> 7) is checked
            # against the twin's first configuration when that was timed before it
            first = {}
            twin_of = getattr(_cuda, "MASK_REGS_BWD_VARIANTS", {})
            by_variant = {}
            configs = [(vr, det, mode, mg) for vr in a.variants for det in a.det for mode in a.dq_modes
                       for mg in (a.sm_margin if vr == 6 else [0]) if not (det and mode != 1)]
            for variant, det, mode, margin in configs:
                f = jax.jit(lambda q, k, v, b, o, l, g, mode=mode, det=det, variant=variant,
                            margin=margin: _bwd(q, k, v, b, o, l, g, None, scale=scale, dq_mode=mode,
                                                deterministic=bool(det), variant=variant,
                                                sm_margin=margin))
                vr = variant if variant is not None else _cuda.resolve_bwd_variant(None, d, margin, bool(det))
                tag = (f"flashmask_bwd_v{vr}"
                       f"{'_det' if det else ''}_dq{mode}{f'_m{margin}' if margin else ''}")
                try:
                    t, tmin = timeit(f, q, k, v, bounds, out, lse, do, iters=a.iters)
                    r = dict(impl=tag, S=S, B=B, H=H, d=d, mask=name, rho=rho,
                             window=a.window if name == "sliding_window" else None,
                             ms=t * 1e3, ms_min=tmin * 1e3, tflops_fm=flops / t / 1e12)
                    if not a.no_check:
                        g = jax.block_until_ready(f(q, k, v, bounds, out, lse, do))
                        ref = by_variant.get((det, mode, twin_of.get(vr)), first.get(det))
                        by_variant.setdefault((det, mode, vr), (tag, det, g))
                        if det not in first:
                            first[det] = (tag, det, g)
                        elif ref is not None:
                            r["check"] = _compare(ref, tag, det, g)
                            if not r["check"]["ok"]:
                                print(f"CHECK FAILED S={S} {name} {tag} vs {ref[0]}: "
                                      f"{r['check']}", flush=True)
                        g = None
                    emit(r)
                except Exception as e:  # noqa: BLE001
                    print(f"ours S={S} {name} {tag}: FAILED {e}", flush=True)
            if a.portable:
                from jax_flashmask import _xla
                fx = jax.jit(lambda q, k, v, b, o, l, g: _xla.backward(q, k, v, b, o, l, g, None,
                                                                       scale=scale))
                try:
                    t, tmin = timeit(fx, q, k, v, bounds, out, lse, do, iters=a.iters)
                    r = dict(impl="xla_portable_bwd", S=S, B=B, H=H, d=d, mask=name, rho=rho,
                             ms=t * 1e3, ms_min=tmin * 1e3, tflops_fm=flops / t / 1e12)
                    emit(r)
                except Exception as e:  # noqa: BLE001
                    print(f"portable S={S} {name}: FAILED {e}", flush=True)
            del out, lse, first, by_variant
            if a.cudnn and name in ("full", "causal", "sliding_window"):
                kw = dict(is_causal=name != "full", implementation="cudnn")
                if name == "sliding_window":  # the window the bounds hold (LTS[0] = w + 1)
                    kw["local_window_size"] = (int(bounds[0, 0, 0, 0]) - 1, 0)
                att = lambda q, k, v, kw=kw: jax.nn.dot_product_attention(q, k, v, **kw)  # noqa: E731
                fwd = jax.jit(att)
                fb = jax.jit(lambda q, k, v, g: jax.vjp(att, q, k, v)[1](g))
                try:
                    tf, _ = timeit(fwd, q, k, v, iters=a.iters)
                    tfb, _ = timeit(fb, q, k, v, do, iters=a.iters)
                    t = tfb - tf
                    r = dict(impl="cudnn_bwd", S=S, B=B, H=H, d=d, mask=name, rho=rho, ms=t * 1e3,
                             ms_fwd_bwd=tfb * 1e3, tflops_fm=flops / t / 1e12)
                    emit(r)
                except Exception as e:  # noqa: BLE001
                    print(f"cudnn {name} S={S}: FAILED {e}", flush=True)
        del q, k, v, do
    print("\nimpl                        S      mask       ms      TFLOP/s")
    for r in rows:
        print(f"{r['impl']:26s} {r['S']:6d} {r['mask']:9s} {r['ms']:8.2f} {r['tflops_fm']:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
