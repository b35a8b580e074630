"""GPU: the logits soft cap (``cap·tanh(s/cap)`` on the scaled scores, before the mask) in the
Hopper forward and backward kernels, against the float32 dense reference on fresh random inputs.

Skipped unless the compiled extension and a Hopper GPU are present. Inputs are scaled so that the
scores reach the cap's nonlinear range (|s| several times the cap): a kernel that ignored the cap,
or applied it after the mask, fails the comparison (checked: the uncapped result is far away).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flashmask as jf
from _gpu_bounds import random_bounds
from jax_flashmask import masks
from jax_flashmask.backends import cuda, reference
from jax_flashmask.backends.cuda import configs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.is_available(), reason=f"CUDA kernels unavailable: {cuda.unavailable_reason()}"),
]

CAP = 2.0


def _seed():
    return int(np.random.SeedSequence().entropy % (2**32))


def _needs(d):
    have = cuda.compiled_configs()
    if configs.forward_config(d, soft_cap=True).name not in have:
        pytest.skip(f"no soft-cap kernels compiled for d={d}")


def _inputs(rng, B, Sq, Sk, N, K, d, amp=3.0):
    mk = lambda *s: jnp.asarray(amp * rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
    return mk(B, Sq, N, d), mk(B, Sk, K, d), mk(B, Sk, K, d), mk(B, Sq, N, d) / amp


def _rel(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    ok = np.isfinite(y)
    return float(np.abs(x - y)[ok].max() / max(np.abs(y[ok]).max(), 1e-6))


def _grads(fn, q, k, v, do):
    (o, lse), vjp = jax.vjp(fn, q, k, v)
    return (o, lse, *vjp((do, jnp.zeros_like(lse))))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", ["causal", "document", "window", "random_gqa"])
def test_soft_cap_matches_reference(d, case):
    _needs(d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, Sq, Sk, N, K = 2, 333, 333, 4, 4
    mask, causal, bounds = None, False, None
    if case == "causal":
        causal = True
    elif case == "document":
        seg = np.repeat(np.arange(5), [90, 17, 130, 60, 36])[None].repeat(B, 0)
        mask = masks.from_segment_ids(seg, causal=True)
    elif case == "window":
        mask = masks.sliding_window(Sq, 96)
    else:  # GQA, Sq != Sk, per-head random bounds with partial and fully masked rows
        Sq, Sk, N, K = 200, 328, 8, 2
        bounds = jnp.asarray(random_bounds(rng, B, N, Sq, Sk))
    q, k, v, do = _inputs(rng, B, Sq, Sk, N, K, d)
    scale = d ** -0.5

    if bounds is None:
        def run(impl, cap):
            return lambda q, k, v: jf.attention(q, k, v, mask, causal=causal, implementation=impl,
                                                logits_soft_cap=cap, return_residual=True)
    else:
        def run(impl, cap):
            if impl == "cuda":
                @jax.custom_vjp
                def f(q, k, v):
                    return cuda.forward(q, k, v, bounds, scale=scale, logits_soft_cap=cap)

                def f_fwd(q, k, v):
                    o, lse = f(q, k, v)
                    return (o, lse), (q, k, v, o, lse)

                def f_bwd(res, ct):
                    q, k, v, o, lse = res
                    return cuda.backward(q, k, v, bounds, o, lse, ct[0], ct[1], scale=scale,
                                         logits_soft_cap=cap)

                f.defvjp(f_fwd, f_bwd)
                return f
            return lambda q, k, v: reference.attention(q, k, v, bounds, scale=scale,
                                                       logits_soft_cap=cap)

    got = _grads(run("cuda", CAP), q, k, v, do)
    want = _grads(run("reference", CAP), *(x.astype(jnp.float32) for x in (q, k, v)),
                  do.astype(jnp.float32))
    plain = _grads(run("reference", None), *(x.astype(jnp.float32) for x in (q, k, v)),
                   do.astype(jnp.float32))
    names = ("out", "lse", "dq", "dk", "dv")
    tol = {"out": 2e-2, "lse": 1e-2, "dq": 5e-2, "dk": 5e-2, "dv": 3e-2}
    for name, x, y, z in zip(names, got, want, plain):
        err = _rel(x, y)
        assert err < tol[name], f"{name}: rel err {err:.3g} (seed {seed}, d={d}, {case})"
        if name in ("out", "dq"):  # the cap matters at these inputs
            assert _rel(z, y) > 10 * tol[name], f"{name}: cap without effect (seed {seed})"
    lse, lse_ref = np.asarray(got[1]), np.asarray(want[1])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_soft_cap_deterministic_is_bitwise_reproducible(d):
    _needs(d)
    rng = np.random.default_rng(_seed())
    q, k, v, do = _inputs(rng, 1, 512, 512, 4, 2, d)

    def grads():
        f = lambda q, k, v: jf.attention(q, k, v, causal=True, implementation="cuda",  # noqa: E731
                                         logits_soft_cap=CAP, deterministic=True)
        _, vjp = jax.vjp(f, q, k, v)
        return [np.asarray(g.astype(jnp.float32)) for g in vjp(do)]

    a, b = grads(), grads()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_soft_cap_nan_reaches_the_rows_that_see_it():
    """The NaN contract holds with the cap too (tanh(NaN) = NaN, before the mask)."""
    _needs(128)
    rng = np.random.default_rng(_seed())
    q, k, v, _ = _inputs(rng, 1, 256, 256, 2, 2, 128)
    q = q.at[0, 100, 1, 3].set(jnp.nan)
    o, lse = jf.attention(q, k, v, causal=True, implementation="cuda", logits_soft_cap=CAP,
                          return_residual=True)
    o, lse = np.asarray(o, np.float32), np.asarray(lse)
    assert np.isnan(o[0, 100, 1]).all() and np.isnan(lse[0, 100, 1])
    clean = np.ones(o.shape[1], bool)
    clean[100] = False
    assert np.isfinite(o[0, clean]).all() and np.isfinite(o[0, :, 0]).all()
