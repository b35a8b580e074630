"""Bitwise comparison of the CUDA backward between two builds of the extension (GPU).

`--dump FILE` runs a fixed set of backward calls (fixed inputs: seeded numpy) with the module that
`jax_flashmask` imports and saves every result's raw bits; `--compare A B` compares two dumps.
dK / dV are compared bitwise in every mode (each CTA accumulates them in a fixed order), dQ bitwise
in deterministic mode and, in the default mode (reduce-add order varies), by the max |difference|
against the 2-run spread measured inside each dump. forward out / lse are dumped too (the forward
is not meant to change between the two builds).

Typical use (two module copies, e.g. /tmp/old/jax_flashmask and the working tree):
  PYTHONPATH=$OLD python3 benchmarks/bwd_bitwise_dump.py --dump $OUT/old.npz
  PYTHONPATH=$(pwd) python3 benchmarks/bwd_bitwise_dump.py --dump $OUT/new.npz
  python3 benchmarks/bwd_bitwise_dump.py --compare $OUT/old.npz $OUT/new.npz
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

# (d, variant, deterministic, dq_mode, B, S, N, K, masks)
CASES = [
    (128, 5, 0, 1, 2, 517, 4, 2, ("causal", "sliding_window", "causal_document", "full")),
    (128, 13, 0, 1, 2, 517, 4, 4, ("causal", "sliding_window")),
    (128, 16, 0, 1, 2, 517, 4, 2, ("causal", "sliding_window", "causal_document", "share_question", "full")),
    (128, 16, 0, 0, 1, 1000, 4, 4, ("causal", "document")),
    (128, 16, 1, 1, 2, 517, 4, 2, ("causal", "sliding_window", "causal_document")),
    (128, 17, 1, 1, 2, 517, 4, 2, ("causal", "document")),
    # variant 21 (the deterministic default at d = 128): causal_blockwise is reordered by its pre-pass
    (128, 21, 1, 1, 5, 1600, 8, 8, ("causal_blockwise", "document", "causal")),
    (128, 5, 1, 1, 1, 1000, 4, 1, ("causal", "sliding_window")),
    (64, 5, 0, 1, 2, 517, 4, 2, ("causal", "sliding_window")),
    (64, 7, 0, 1, 2, 517, 4, 2, ("causal", "causal_document")),
    (64, 11, 0, 1, 2, 517, 4, 2, ("causal", "sliding_window", "full")),
    (64, 11, 1, 1, 1, 1000, 4, 4, ("causal", "document")),
    (256, 5, 0, 1, 2, 517, 4, 2, ("causal", "sliding_window")),
    (256, 5, 1, 1, 1, 300, 2, 1, ("causal", "document")),
]


def dump(path: str) -> None:
    import jax.numpy as jnp

    from jax_flashmask import _cuda
    from jax_flashmask import masks as M

    res = {}
    for ci, (d, variant, det, dq_mode, B, S, N, K, names) in enumerate(CASES):
        suite = M.benchmark_suite(S, seed=np.random.SeedSequence([7, S]), batch=B)
        for name in names:
            m = suite[name]
            bounds = np.asarray(M.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S))
            if bounds.shape[0] != B:
                bounds = np.broadcast_to(bounds, (B,) + bounds.shape[1:])
            rng = np.random.default_rng([ci, S, d])
            f = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32), jnp.bfloat16)  # noqa: E731
            q, k, v, do = f(B, S, N, d), f(B, S, K, d), f(B, S, K, d), f(B, S, N, d)
            dlse = jnp.asarray(rng.standard_normal((B, S, N), np.float32))
            bj = jnp.asarray(bounds, jnp.int32)
            scale = float(d ** -0.5)
            out, lse = _cuda.forward(q, k, v, bj, scale=scale)
            key = f"c{ci}_d{d}_v{variant}_det{det}_m{dq_mode}_{name}"
            runs = []
            for _ in range(2):
                g = _cuda._backward_kernel(q, k, v, bj, out, lse, do, dlse, scale=scale,
                                           dq_mode=dq_mode, deterministic=bool(det), variant=variant)
                runs.append([np.asarray(x).view(np.uint16) for x in g])
            res[key + "_out"] = np.asarray(out).view(np.uint16)
            res[key + "_lse"] = np.asarray(lse).view(np.uint32)
            for j, nm in enumerate(("dq", "dk", "dv")):
                res[f"{key}_{nm}"] = runs[0][j]
            res[f"{key}_dq_run2"] = runs[1][0]
            print(key, "done", flush=True)
    np.savez_compressed(path, **res)
    print("wrote", path, len(res), "arrays")


def _f32(bits):
    """bf16 bits (uint16) -> float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    bad = 0
    for key in sorted(a.files):
        if key.endswith("_dq_run2"):
            continue
        if key not in b.files:
            print("MISSING", key); bad += 1; continue
        x, y = a[key], b[key]
        same = x.shape == y.shape and np.array_equal(x, y)
        det = "_det1_" in key
        if key.endswith("_dq") and not det:
            # default mode: dQ's reduce order varies; compare with the run-to-run spread
            fx, fy = _f32(x), _f32(y)
            spread = max(np.abs(_f32(a[key + "_run2"]) - fx).max(), np.abs(_f32(b[key + "_run2"]) - fy).max())
            diff = np.abs(fx - fy).max()
            ok = bool(diff <= max(2 * spread, 1e-6 * max(np.abs(fx).max(), 1.0)))
            print(f"{'ok  ' if ok else 'BAD '} {key}: bitwise={same} max|diff|={diff:.3e} run spread={spread:.3e}")
            bad += not ok
        else:
            print(f"{'ok  ' if same else 'BAD '} {key}: bitwise={same}")
            bad += not same
    print("mismatches:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.dump:
        dump(args.dump)
    if args.compare:
        sys.exit(compare(*args.compare))
