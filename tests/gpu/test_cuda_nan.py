"""GPU: the NaN / masked-position contract of README "Guarantees" for implementation="cuda".

Same checks as tests/test_reliability.py runs on the portable and reference paths. Skipped unless
the compiled extension and a Hopper GPU are present.

* NaN/Inf in a row's visible inputs reaches that row's out, lse (NaN, never the -inf of a fully
  masked row) and gradients; rows that do not see it are untouched.
* Fully masked rows: out 0, lse -inf, dq 0.
* Positions masked for every row hold NaN/Inf without effect: key columns no row of their mask
  head reads (padding keys, a column in mid-sequence; with GQA, unseen by every query head of the
  kv head) never reach out / lse / dq and get dK = dV = 0; fully masked query rows (lse = -inf)
  holding NaN in q and dO never reach dK / dV and get dq = 0. The kernels zero those rows in
  shared memory on the tiles that hold them (cc/sm90/unseen.cuh,
  docs/decisions.md#nan-guarantee-cuda). Head dims 64 / 128 / 256, the soft cap, deterministic mode.
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


def _qkv(seed, B, Sq, Sk, N, K, d=D):
    rng = np.random.default_rng(seed)
    mk = lambda *s: jnp.asarray(rng.standard_normal(s), DTYPE)  # noqa: E731
    return mk(B, Sq, N, d), mk(B, Sk, K, d), mk(B, Sk, K, d)


def _cotangent(q):
    return jnp.asarray(np.random.default_rng(7).standard_normal(q.shape), DTYPE)


def _run(q, k, v, mask=None, causal=False, co=None, **kw):
    if co is None:
        co = _cotangent(q)

    def f(q, k, v):
        return jf.attention(q, k, v, mask, causal=causal, implementation="cuda", return_residual=True,
                            **kw)

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


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fully_masked_rows_stay_zero_beside_non_finite_visible_keys(d):
    # Key 5 is seen by rows 133.. (causal, Sq - Sk = 128): Inf in its K and NaN in its V make
    # those rows' results non-finite, but rows 0..127 see no key: out 0, lse -inf, dq 0 (their dS is
    # 0, and the dQ conversion selects 0 rather than scaling 0 * Inf)
    Sq, Sk = 384, 256
    q, k, v = _qkv(11, 2, Sq, Sk, 4, 2, d)
    k, v = k.at[:, 5, :, 3].set(jnp.inf), v.at[:, 5, :, 7].set(jnp.nan)
    o, lse, (dq, _, _) = _run(q, k, v, causal=True)
    assert (o[:, :128] == 0).all() and np.isneginf(lse[:, :128]).all()
    assert (dq[:, :128] == 0).all()
    assert np.isnan(o[:, 133:]).any()  # the rows that see key 5


def _same_dq(a, b):
    """dq of two runs whose kernels saw the same shared-memory tiles: equal up to the order of the
    key blocks' fp32 reduce-adds (not fixed outside deterministic mode)."""
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("deterministic", [False, True])
def test_fully_masked_rows_holding_nan_do_not_reach_dk_dv(deterministic):
    Sq, Sk = 384, 256  # causal, bottom-right aligned: rows 0..127 see no key (inside 80-row tiles)
    q, k, v = _qkv(1, 2, Sq, Sk, 4, 2)
    co = _cotangent(q)
    _, _, g0 = _run(q, k, v, causal=True, co=co, deterministic=deterministic)
    o, lse, g = _run(q.at[:, :128].set(jnp.nan), k, v, causal=True, co=co.at[:, :128].set(jnp.nan),
                     deterministic=deterministic)
    assert (o[:, :128] == 0).all() and np.isneginf(lse[:, :128]).all()
    assert (g[0][:, :128] == 0).all()
    if deterministic:
        np.testing.assert_array_equal(g[0], g0[0])
    else:
        _same_dq(g[0], g0[0])
    for a, b in zip(g[1:], g0[1:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_masked_keys_holding_nan_inf_never_leak(causal, d):
    S, n_pad = 512, 77
    q, k, v = _qkv(2, 2, S, S, 4, 2, d)
    seg = np.concatenate([np.zeros(200, int), np.ones(S - n_pad - 200, int), -np.ones(n_pad, int)])
    mask = masks.from_segment_ids(seg, causal=causal)
    o0, lse0, g0 = _run(q, k, v, mask)
    o, lse, g = _run(q, k.at[:, S - n_pad:].set(jnp.nan), v.at[:, S - n_pad:].set(jnp.inf), mask)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(lse, lse0)
    _same_dq(g[0], g0[0])
    for a in g[1:]:
        assert np.isfinite(a).all() and (a[:, S - n_pad:] == 0).all()


def test_persistent_backward_masked_positions():
    """sm_margin > 0 takes the persistent 64-row backward (and the forward's margin): padding keys
    holding NaN / Inf and padding queries holding NaN in q and dO, in one call."""
    S, n_pad = 640, 100
    q, k, v = _qkv(6, 2, S, S, 4, 2)
    seg = np.concatenate([np.zeros(300, int), np.ones(S - n_pad - 300, int), -np.ones(n_pad, int)])
    mask = masks.from_segment_ids(seg, causal=True)
    co = _cotangent(q)
    o0, lse0, g0 = _run(q, k, v, mask, co=co, sm_margin=8)
    pad = slice(S - n_pad, S)
    o, lse, g = _run(q.at[:, pad].set(jnp.nan), k.at[:, pad].set(jnp.nan), v.at[:, pad].set(jnp.inf),
                     mask, co=co.at[:, pad].set(jnp.nan), sm_margin=8)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(lse, lse0)
    assert (o[:, pad] == 0).all() and np.isneginf(lse[:, pad]).all()
    assert (g[0][:, pad] == 0).all()
    _same_dq(g[0], g0[0])
    for a, b in zip(g[1:], g0[1:]):
        assert (a[:, pad] == 0).all()
        np.testing.assert_array_equal(a, b)


def _columns_masked_for(S, Hm, cols_per_head):
    """Raw D=4 bounds [1, Hm, S, 4] (causal=False): nothing masked except, under mask head h, the
    columns cols_per_head[h], masked for every row."""
    raw = np.zeros((1, Hm, S, 4), np.int32)
    raw[..., 0] = raw[..., 1] = S  # [LTS, LTE) = [S, S): empty; [UTS, UTE) = [0, 0): empty
    for h, cols in enumerate(cols_per_head):
        raw[0, h, list(cols), 0] = 0
    return jnp.asarray(raw)


@pytest.mark.parametrize("soft_cap", [None, 20.0])
def test_unseen_columns_mid_sequence(soft_cap):
    """Unseen key columns inside the sequence (not trailing padding), in two key blocks."""
    S, cols = 700, [130, 131, 300, 301, 302]
    q, k, v = _qkv(4, 1, S, S, 2, 1)
    mask = _columns_masked_for(S, 1, [cols])
    o0, lse0, g0 = _run(q, k, v, mask, logits_soft_cap=soft_cap)
    o, lse, g = _run(q, k.at[:, cols].set(jnp.nan), v.at[:, cols].set(-jnp.inf), mask,
                     logits_soft_cap=soft_cap)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(lse, lse0)
    _same_dq(g[0], g0[0])
    for a, b in zip(g[1:], g0[1:]):
        assert (a[:, cols] == 0).all()
        keep = np.ones(S, bool)
        keep[cols] = False
        np.testing.assert_array_equal(a[:, keep], b[:, keep])


def test_unseen_columns_gqa_per_head_masks():
    """Per-query-head masks with GQA (4 query heads on 2 kv heads): a column unseen by both query
    heads of kv head 0 is zeroed for kv head 0 only; kv head 1's heads keep reading it there."""
    S, j = 384, 200
    q, k, v = _qkv(5, 1, S, S, 4, 2)
    mask = _columns_masked_for(S, 4, [[j], [j], [], []])
    o0, lse0, g0 = _run(q, k, v, mask)
    o, lse, g = _run(q, k.at[:, j, 0].set(jnp.nan), v.at[:, j, 0].set(jnp.inf), mask)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(lse, lse0)
    _same_dq(g[0], g0[0])
    assert (g[1][:, j, 0] == 0).all() and (g[2][:, j, 0] == 0).all()
    np.testing.assert_array_equal(g[1][:, :, 1], g0[1][:, :, 1])
    np.testing.assert_array_equal(g[2][:, :, 1], g0[2][:, :, 1])


def test_second_derivative_names_the_library():
    q, k, v = _qkv(3, 1, 128, 128, 2, 1)
    f = lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation="cuda").astype(jnp.float32))  # noqa: E731
    with pytest.raises(NotImplementedError, match="jax_flashmask"):
        jax.hessian(f)(q[:, :2])
    with pytest.raises(NotImplementedError, match="jax_flashmask"):
        jax.grad(lambda q: jnp.sum(jax.grad(f)(q).astype(jnp.float32)))(q)
    with pytest.raises(TypeError, match="jax_flashmask"):
        jax.jvp(f, (q,), (q,))
