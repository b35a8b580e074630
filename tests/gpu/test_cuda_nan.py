"""GPU: the NaN / masked-position contract of README "Guarantees" for implementation="cuda".

Same checks as tests/test_reliability.py runs on the portable and reference paths. Skipped unless
the compiled extension and a Hopper GPU are present.

* NaN/Inf in a row's visible inputs reaches that row's out, lse (NaN, never the -inf of a fully
  masked row) and gradients; rows that do not see it are untouched.
* Fully masked rows: out 0, lse -inf, dq 0.
* Positions masked for every row (padding keys, padding queries) holding NaN/Inf: not guaranteed
  on the Hopper kernels yet (P = 0 times a NaN row of K/V/Q in their GEMMs): expected failures
  until the kernels zero them as the portable path does (a pre-pass in XLA costs too much:
  docs/decisions.md#nan-guarantee-cuda). Strict: a kernel that starts to hold it must drop the mark.
* Second derivatives through the kernels raise NotImplementedError naming jax_flashmask.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flashmask as jf
from jax_flashmask import backends, masks

_REASON = backends.cuda_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=f"CUDA kernels unavailable: {_REASON}")]

D = 128
DTYPE = jnp.bfloat16


def _qkv(seed, B, Sq, Sk, N, K):
    rng = np.random.default_rng(seed)
    mk = lambda *s: jnp.asarray(rng.standard_normal(s), DTYPE)  # noqa: E731
    return mk(B, Sq, N, D), mk(B, Sk, K, D), mk(B, Sk, K, D)


def _run(q, k, v, mask=None, causal=False):
    co = jnp.asarray(np.random.default_rng(7).standard_normal(q.shape), DTYPE)

    def f(q, k, v):
        return jf.attention(q, k, v, mask, causal=causal, implementation="cuda", return_residual=True)

    (o, lse), vjp = jax.vjp(f, q, k, v)
    grads = vjp((co, jnp.zeros_like(lse)))
    return np.asarray(o, np.float32), np.asarray(lse), [np.asarray(g, np.float32) for g in grads]


@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_in_visible_input_reaches_the_rows_that_see_it(where):
    S, j = 512, 300  # several 128-row tiles; row / key 300 sits inside one
    q, k, v = _qkv(0, 1, S, S, 4, 2)
    o0, lse0, _ = _run(q, k, v, causal=True)
    if where == "q":
        q = q.at[0, j, 1, 5].set(jnp.nan)
        rows, heads = [j], [1]
    else:
        k = k.at[0, j, 0, 5].set(jnp.nan)
        rows, heads = list(range(j, S)), [0, 1]  # kv head 0 serves query heads 0 and 1
    o, lse, (dq, dk, _) = _run(q, k, v, causal=True)
    for i in rows:
        for h in heads:
            assert np.isnan(o[0, i, h]).all(), (i, h)
            assert np.isnan(lse[0, i, h]), (i, h)  # not -inf: that would look fully masked
    assert np.isnan(dq[0, rows]).any()
    assert np.isnan(dk[0, j] if where == "k" else dk[0, : j + 1]).any()
    clean = np.ones(S, bool)
    clean[rows] = False
    np.testing.assert_array_equal(o[0, clean], o0[0, clean])
    np.testing.assert_array_equal(lse[0, clean], lse0[0, clean])


def test_fully_masked_rows_are_zero_with_zero_dq():
    Sq, Sk = 384, 256  # causal, bottom-right aligned: the first 128 rows see no key
    q, k, v = _qkv(1, 2, Sq, Sk, 4, 2)
    o, lse, (dq, dk, dv) = _run(q, k, v, causal=True)
    assert (o[:, :128] == 0).all() and np.isneginf(lse[:, :128]).all()
    assert (dq[:, :128] == 0).all()
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.xfail(strict=True, reason="Hopper kernels: a padding query holding NaN reaches dK/dV "
                   "through P = 0 in the dK GEMM (docs/decisions.md#nan-guarantee-cuda)")
def test_fully_masked_rows_holding_nan_do_not_reach_dk_dv():
    Sq, Sk = 384, 256
    q, k, v = _qkv(1, 2, Sq, Sk, 4, 2)
    _, _, g0 = _run(q, k, v, causal=True)
    o, lse, g = _run(q.at[:, :128].set(jnp.nan), k, v, causal=True)
    assert (o[:, :128] == 0).all() and np.isneginf(lse[:, :128]).all()
    for a, b in zip(g[1:], g0[1:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.xfail(strict=True, reason="Hopper kernels: keys masked for every row still enter "
                   "P @ V and dS @ K with P = 0, and 0 * NaN = NaN (docs/decisions.md#nan-guarantee-cuda)")
@pytest.mark.parametrize("causal", [True, False])
def test_masked_keys_holding_nan_inf_never_leak(causal):
    S, n_pad = 512, 77
    q, k, v = _qkv(2, 2, S, S, 4, 2)
    seg = np.concatenate([np.zeros(200, int), np.ones(S - n_pad - 200, int), -np.ones(n_pad, int)])
    mask = masks.from_segment_ids(seg, causal=causal)
    o0, lse0, g0 = _run(q, k, v, mask)
    o, lse, g = _run(q, k.at[:, S - n_pad:].set(jnp.nan), v.at[:, S - n_pad:].set(jnp.inf), mask)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(lse, lse0)
    np.testing.assert_array_equal(g[0], g0[0])
    for a in g[1:]:
        assert np.isfinite(a).all() and (a[:, S - n_pad:] == 0).all()


def test_second_derivative_names_the_library():
    q, k, v = _qkv(3, 1, 128, 128, 2, 1)
    f = lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation="cuda").astype(jnp.float32))  # noqa: E731
    with pytest.raises(NotImplementedError, match="jax_flashmask"):
        jax.hessian(f)(q[:, :2])
    with pytest.raises(NotImplementedError, match="jax_flashmask"):
        jax.grad(lambda q: jnp.sum(jax.grad(f)(q).astype(jnp.float32)))(q)
    with pytest.raises(TypeError, match="jax_flashmask"):
        jax.jvp(f, (q,), (q,))
