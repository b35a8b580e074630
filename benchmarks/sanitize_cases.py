"""Every compiled Hopper kernel on every mask family at a small length, for compute-sanitizer.

The kernels are launched straight from the extension (`launch_forward` / `launch_backward`) on
buffers torch allocates, each its own cudaMalloc (torch's caching allocator is off), so memcheck
sees every access past a buffer's end and the sanitized process runs nothing of XLA on the GPU:
JAX stays on the CPU, where it builds the masks and the float32 reference. (Under the tools, XLA's
GPU compiler segfaulted: jax 0.11.2, H100 / H200.)

Each forward configuration runs each mask (the structure a configuration is chosen for only makes
it the fastest; any bounds are exact), on the full grid and on two CTAs (a large sm_margin: each
walks several tiles); each backward call the config table makes (configuration, deterministic
mode, sm_margin) runs each mask on the output of the general forward of its head dim. Lengths are not
multiples of the tiles, heads are GQA (4 query heads, 2 kv heads), soft-cap configurations get
`--soft-cap`. Besides the suite's masks, "causal_padding" (causal, the last S / 16 positions
padding) holds NaN in q, k, v and dout at its padded positions: the tiles whose masked rows the
kernels zero in shared memory (README "Guarantees"). Outputs and gradients are checked against
the reference, so a run the tool passes also computed the right thing. Run it under the tools,
e.g.

    compute-sanitizer --tool memcheck  --kernel-name kns=jfm python3 benchmarks/sanitize_cases.py
    compute-sanitizer --tool racecheck --kernel-name kns=jfm python3 benchmarks/sanitize_cases.py \\
        --dims 128 --masks causal,causal_document

Needs torch with CUDA and the built extension. Exit status 1 when a result differs from the
reference or a launch fails.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import numpy as np  # noqa: E402

TOL_OUT = 3e-2   # max |out - ref| on unit-variance inputs, bf16 operands
TOL_GRAD = 5e-2  # max |g - ref| / max |ref| per gradient


def problem(seed: int, S: int, d: int, heads: int = 4, kv_heads: int = 2):
    """q, k, v, dout of one case: float32 host arrays holding bf16 values (what the kernels get)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    shapes = ((1, S, heads, d), (1, S, kv_heads, d), (1, S, kv_heads, d), (1, S, heads, d))
    return [rng.standard_normal(s).astype(ml_dtypes.bfloat16).astype(np.float32) for s in shapes]


def kernel_bounds(mask, S: int) -> np.ndarray:
    """The int32 [B, Hm, 4, Sk] bounds the kernels take, made as the FFI path makes them."""
    from jax_flashmask.backends.cuda.ops import _kernel_bounds
    from jax_flashmask.masks import canonical_bounds

    b = canonical_bounds(mask.startend_row_indices, causal=mask.causal, q_len=S)
    return np.asarray(_kernel_bounds(b, S))


def reference(q, k, v, do, mask, cap):
    """float32 output and gradients of the dense reference (JAX on the CPU)."""
    import jax
    import jax.numpy as jnp

    import jax_flashmask as jf

    def f(q, k, v):
        return jf.attention(q, k, v, mask, implementation="reference", logits_soft_cap=cap)

    out, vjp = jax.vjp(f, *(jnp.asarray(x) for x in (q, k, v)))
    return [np.asarray(x) for x in (out, *vjp(jnp.asarray(do)))]


class Launcher:
    """Device buffers (torch) and the extension's direct launches."""

    def __init__(self):
        import torch

        from jax_flashmask import _flashmask_cuda as ext

        self.torch, self.ext = torch, ext
        self.dev = torch.device("cuda")

    def put(self, x, dtype):
        return self.torch.as_tensor(np.ascontiguousarray(x)).to(self.dev, dtype)

    def empty(self, n, dtype):
        return self.torch.empty(int(n), dtype=dtype, device=self.dev)

    def sms(self) -> int:
        return self.torch.cuda.get_device_properties(self.dev).multi_processor_count

    def forward(self, cfg, q, k, v, bounds, scale, cap, sm_margin=0):
        t = self.torch
        B, S, N, d = q.shape
        K, Hm = k.shape[2], bounds.shape[1]
        words = cfg.workspace_words(B, Hm, S)
        qd, kd, vd = (self.put(x, t.bfloat16) for x in (q, k, v))
        bd = self.put(bounds, t.int32)
        o, lse, meta = self.empty(q.size, t.bfloat16), self.empty(B * S * N, t.float32), self.empty(words, t.int32)
        err = self.ext.launch_forward(dict(
            q=qd.data_ptr(), k=kd.data_ptr(), v=vd.data_ptr(), bounds=bd.data_ptr(), o=o.data_ptr(),
            lse=lse.data_ptr(), meta=meta.data_ptr(), meta_capacity=words, B=B, Sq=S, Sk=S, N=N,
            K=K, Hm=Hm, d=d, scale=scale, dtype="bfloat16", config=cfg.name, sm_margin=sm_margin,
            softcap=cap or 0.0))
        return err, (o, lse)

    def backward(self, cfg, q, k, v, bounds, fwd, do, scale, cap, deterministic, sm_margin):
        t = self.torch
        B, S, N, d = q.shape
        K, Hm = k.shape[2], bounds.shape[1]
        ws = {n: int(np.prod(s)) for n, s in cfg.workspace_shapes(B, S, S, N, K, Hm, deterministic).items()}
        qd, kd, vd, dod = (self.put(x, t.bfloat16) for x in (q, k, v, do))
        bd = self.put(bounds, t.int32)
        o, lse = fwd
        dlse = t.zeros(B * S * N, dtype=t.float32, device=self.dev)
        dq, dk, dv = (self.empty(x.size, t.bfloat16) for x in (q, k, v))
        buf = {n: self.empty(ws[n], t.int32 if n in ("meta", "dq_sem") else t.float32) for n in ws}
        err = self.ext.launch_backward(dict(
            q=qd.data_ptr(), k=kd.data_ptr(), v=vd.data_ptr(), bounds=bd.data_ptr(), o=o.data_ptr(),
            lse=lse.data_ptr(), dout=dod.data_ptr(), dlse=dlse.data_ptr(), dq=dq.data_ptr(),
            dk=dk.data_ptr(), dv=dv.data_ptr(), dq_accum=buf["dq_accum"].data_ptr(),
            dq_accum_capacity=ws["dq_accum"], rowstats=buf["rowstats"].data_ptr(),
            rowstats_capacity=ws["rowstats"], meta=buf["meta"].data_ptr(), meta_capacity=ws["meta"],
            B=B, Sq=S, Sk=S, N=N, K=K, Hm=Hm, d=d, scale=scale, dtype="bfloat16",
            deterministic=int(deterministic), dq_sem=buf["dq_sem"].data_ptr(),
            dq_sem_capacity=ws["dq_sem"], config=cfg.name, sm_margin=sm_margin, softcap=cap or 0.0))
        return err, (dq, dk, dv)

    def host(self, x, shape):
        return x.float().cpu().numpy().reshape(shape)


def max_err(got, ref, relative: bool) -> float:
    if not np.isfinite(got).all():
        return float("inf")
    e = float(np.max(np.abs(got - ref))) if got.size else 0.0
    return e / max(float(np.max(np.abs(ref))), 1e-6) if relative else e


def main(argv=None) -> int:
    from jax_flashmask import masks
    from jax_flashmask.backends.cuda import configs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--masks", default="all", help="comma list of benchmark_suite masks, or all")
    ap.add_argument("--seq", type=int, default=328)
    ap.add_argument("--soft-cap", type=float, default=5.0, help="the cap of the soft-cap configurations")
    ap.add_argument("--configs", default="all", help="comma list of kernel config names, or all")
    a = ap.parse_args(argv)
    S = a.seq
    suite = masks.benchmark_suite(S)
    pad = S // 16
    suite["causal_padding"] = masks.from_segment_ids(
        np.concatenate([np.zeros(S - pad, np.int32), -np.ones(pad, np.int32)]), causal=True)
    names = list(suite) if a.masks == "all" else a.masks.split(",")
    dims = [int(x) for x in a.dims.split(",")]
    wanted = None if a.configs == "all" else set(a.configs.split(","))
    run = Launcher()
    # a margin that leaves two CTAs of the persistent grids: each walks several work items
    margin = max(0, run.sms() - 2)
    bad = 0

    def report(what, err, checks):
        nonlocal bad
        ok = not err and all(e <= tol for e, tol in checks)
        bad += not ok
        detail = err or " ".join(f"{e:.2e}" for e, _ in checks)
        print(f"{what}: {detail} {'ok' if ok else 'FAIL'}", flush=True)

    for d in dims:
        clean = problem(d, S, d)
        scale = float(1.0 / np.sqrt(d))
        for name in names:
            mask, bounds = suite[name], kernel_bounds(suite[name], S)
            q, k, v, do = (x.copy() for x in clean)
            if name == "causal_padding":
                for x in (q, k, v, do):
                    x[:, S - pad:] = np.nan
            for cap in (None, a.soft_cap):
                ref = reference(q, k, v, do, mask, cap)
                for cfg in configs.FORWARD_CONFIGS:
                    if cfg.head_dim != d or cfg.soft_cap != (cap is not None) or (wanted and cfg.name not in wanted):
                        continue
                    for sm_margin in (0, margin):
                        err, (o, _) = run.forward(cfg, q, k, v, bounds, scale, cap, sm_margin)
                        checks = [] if err else [(max_err(run.host(o, q.shape), ref[0], False), TOL_OUT)]
                        report(f"{cfg.name} margin={sm_margin} {name}", err, checks)
                general = configs.forward_config(d, "general", cap is not None)
                err, fwd = run.forward(general, q, k, v, bounds, scale, cap)
                if err:
                    report(f"{general.name} {name} (for the backward)", err, [])
                    continue
                for cfg, det, with_margin in configs.backward_calls(d, cap is not None):
                    sm_margin = margin if with_margin else 0
                    if wanted and cfg.name not in wanted:
                        continue
                    err, grads = run.backward(cfg, q, k, v, bounds, fwd, do, scale, cap, det, sm_margin)
                    checks = [] if err else [
                        (max_err(run.host(g, r.shape), r, True), TOL_GRAD) for g, r in zip(grads, ref[1:])]
                    report(f"{cfg.name} det={int(det)} margin={sm_margin} {name}", err, checks)
    print(f"{bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
