"""The main job: the twelve benchmark masks through `jax_flashmask.attention`, checked and timed.

    python -m jax_flashmask.demo [--seq-len S] [--heads H] [--head-dim d] [--png masks.png]

Builds FlashMask's twelve masks at a size that suits the backend, runs attention with the best
available implementation, checks each result against the dense reference (on the first heads,
so the check stays small), and prints mask, block sparsity, time, TFLOP/s (FlashMask convention
``4·B·H·S²·d·(1−ρ)``), the largest absolute error and the relative error (which decides the
check). Writes a PNG picture of the twelve masks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flashmask as jf
from jax_flashmask import masks

CHECK_HEADS = 2  # heads compared against the dense reference


def _default_size(platform: str):
    # (S, heads, head_dim, dtype): a few seconds on a CPU, the benchmark protocol's shape on a GPU.
    if platform == "gpu":
        return 8192, 32, 128, jnp.bfloat16
    return 1024, 4, 64, jnp.float32


def _median_seconds(fn, *args, repeats: int):
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    platform = jax.default_backend()
    s0, h0, d0, dt0 = _default_size(platform)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=s0)
    ap.add_argument("--heads", type=int, default=h0)
    ap.add_argument("--head-dim", type=int, default=d0)
    ap.add_argument("--dtype", default=jnp.dtype(dt0).name, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--implementation", default=None, choices=["cuda", "xla", "reference"])
    ap.add_argument("--repeats", type=int, default=3 if platform == "cpu" else 10)
    ap.add_argument("--png", default="flashmask_masks.png", help="where to write the picture ('' = none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    s, h, d, dtype = args.seq_len, args.heads, args.head_dim, jnp.dtype(args.dtype)
    suite = masks.benchmark_suite(s, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    q, k, v = (jnp.asarray(rng.standard_normal((1, s, h, d)), jnp.float32).astype(dtype) for _ in range(3))
    check = lambda x: x[:, :, :CHECK_HEADS].astype(jnp.float32)  # noqa: E731
    qc, kc, vc = check(q), check(k), check(v)
    tol = 1e-4 if dtype == jnp.float32 else 2e-2

    print(f"jax_flashmask demo: backend={platform} ({jax.devices()[0].device_kind}), "
          f"B=1 S={s} H={h} d={d} {dtype.name}, implementation={args.implementation or 'best'}")
    header = (f"{'mask':<22}{'causal/D':>9}{'sparsity':>10}{'time ms':>10}{'TFLOP/s':>9}"
              f"{'max err':>10}{'rel err':>10}  ok")
    print(header + "\n" + "-" * len(header))
    failures = 0
    for name, mask in suite.items():
        fn = jax.jit(lambda q, k, v, m: jf.attention(q, k, v, m, implementation=args.implementation))
        seconds = _median_seconds(fn, q, k, v, mask, repeats=args.repeats)
        rho = masks.block_sparsity(mask)
        tflops = 4 * s * s * h * d * (1 - rho) / seconds / 1e12
        got = check(fn(q, k, v, mask))
        want = jf.attention(qc, kc, vc, mask, implementation="reference")
        max_err = float(jnp.max(jnp.abs(got - want)))
        err = float(jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30))
        ok = bool(np.isfinite(err) and err < tol)
        failures += not ok
        mode = f"{'T' if mask.causal else 'F'}/{mask.shape[-1]}"
        print(f"{name:<22}{mode:>9}{rho:>10.3f}{seconds * 1e3:>10.2f}{tflops:>9.2f}{max_err:>10.1e}{err:>10.1e}  "
              f"{'yes' if ok else 'NO'}")
    if args.png:
        masks.plot_suite(masks.benchmark_suite(min(s, 1024), seed=args.seed), args.png)
        print(f"wrote {args.png}")
    if failures:
        raise SystemExit(f"{failures} mask(s) did not match the reference")


if __name__ == "__main__":
    main()
