"""Small forward + backward calls of the Hopper kernels on every mask family, for compute-sanitizer.

Each case runs the forward and the backward (default and deterministic mode) of one mask of
`jax_flashmask.masks.benchmark_suite` at a short length that is not a multiple of the tiles, with
GQA, at each head dim given, and checks the output against the float32 reference (so a run that
the sanitizer passes also computed the right thing). Run it under the tools, e.g.

    compute-sanitizer --tool memcheck  --kernel-name regex:flashmask python3 benchmarks/sanitize_cases.py
    compute-sanitizer --tool racecheck --kernel-name regex:flashmask python3 benchmarks/sanitize_cases.py \\
        --dims 128 --masks causal,causal_document

Exit status 1 when an output differs from the reference.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

# Under compute-sanitizer, XLA's GEMM autotuning segfaulted before any of our kernels ran (jax
# 0.11.2, H200): the tool runs XLA's own programs without autotuning.
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0")
# Every buffer its own cudaMalloc: inside XLA's pooled allocator an access past a buffer's end lands
# in the pool and memcheck cannot see it.
os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")


def main(argv=None) -> int:
    import jax
    import jax.numpy as jnp

    import jax_flashmask as jf
    from jax_flashmask import masks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--masks", default="all", help="comma list of benchmark_suite masks, or all")
    ap.add_argument("--seq", type=int, default=328)
    ap.add_argument("--soft-cap", type=float, default=None, help="also run with this logits soft cap")
    a = ap.parse_args(argv)
    S = a.seq
    suite = masks.benchmark_suite(S)
    names = list(suite) if a.masks == "all" else a.masks.split(",")
    rng = np.random.default_rng(0)
    bad = 0
    for d in (int(x) for x in a.dims.split(",")):
        q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                       for s in ((1, S, 4, d), (1, S, 2, d), (1, S, 2, d), (1, S, 4, d)))
        for name in names:
            m = suite[name]
            for cap in (None, a.soft_cap) if a.soft_cap else (None,):
                for det in (False, True):
                    def f(impl, q, k, v):
                        return jf.attention(q, k, v, m, implementation=impl, deterministic=det,
                                            logits_soft_cap=cap)

                    out, vjp = jax.vjp(lambda q, k, v: f("cuda", q, k, v), q, k, v)
                    grads = vjp(do)
                    ref = f("reference", *(x.astype(jnp.float32) for x in (q, k, v)))
                    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
                    finite = all(bool(jnp.isfinite(g).all()) for g in grads)
                    ok = err < 3e-2 and finite
                    bad += not ok
                    print(f"d={d} {name:22s} cap={cap} det={det}: max|out-ref| {err:.2e} "
                          f"grads finite {finite} {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
