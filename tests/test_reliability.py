"""Reliability contract (README "Guarantees"): NaN/Inf semantics, masked positions, bad input,
context-parallel plan validation, vmap of the Equinox layer, unsupported transformations.

Every implementation that runs on this machine is checked ("xla" = the portable blocked path,
"reference" = dense); tests/gpu/test_cuda_nan.py holds the same checks for the Hopper kernels.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flashmask as jf
from jax_flashmask import backends, masks
from jax_flashmask import context_parallel as cp
from jax_flashmask.masks import canonical_bounds

IMPLS = ["xla", "reference"]


def _qkv(seed, B, Sq, Sk, N, K, d, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, Sq, N, d)), dtype)
    k = jnp.asarray(rng.standard_normal((B, Sk, K, d)), dtype)
    v = jnp.asarray(rng.standard_normal((B, Sk, K, d)), dtype)
    return q, k, v


@functools.partial(jax.jit, static_argnames=("impl", "causal"))
def _fwd_bwd(q, k, v, mask, co, *, impl, causal):
    def f(q, k, v):
        return jf.attention(q, k, v, mask, causal=causal, implementation=impl, return_residual=True)

    (o, lse), vjp = jax.vjp(f, q, k, v)
    return o, lse, vjp((co.astype(o.dtype), jnp.zeros_like(lse)))


def _run(impl, q, k, v, mask=None, causal=False):
    """(out, lse, (dq, dk, dv)) of one call, gradients of a fixed random projection of out."""
    co = jnp.asarray(np.random.default_rng(7).standard_normal(q.shape[:3] + (v.shape[-1],)), jnp.float32)
    o, lse, grads = _fwd_bwd(q, k, v, mask, co, impl=impl, causal=causal)
    return np.asarray(o, np.float32), np.asarray(lse), [np.asarray(g, np.float32) for g in grads]


# ---------------------------------------------------------------------------------------------
# 1. NaN/Inf in a row's visible inputs reaches that row's out, lse and gradients.


@pytest.mark.parametrize("impl", IMPLS)
def test_issue_example_nan_query_row_is_not_hidden(impl):
    q = jnp.ones((1, 4, 1, 8)).at[0, 2, 0, 0].set(jnp.nan)
    k = v = jnp.ones((1, 4, 1, 8))
    o, lse, (dq, _, _) = _run(impl, q, k, v, causal=True)
    assert np.isnan(o[0, 2, 0]).all() and np.isnan(lse[0, 2, 0])
    assert np.isnan(dq[0, 2, 0]).all()
    np.testing.assert_allclose(o[0, [0, 1, 3], 0, 0], 1.0)
    assert np.isfinite(lse[0, [0, 1, 3]]).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("where", ["q", "k", "v", "k_inf"])
def test_nonfinite_visible_input_reaches_the_rows_that_see_it(impl, where):
    # 160 rows: two query tiles and two key blocks on the portable path (blocks of 128).
    S, j = 160, 140
    q, k, v = _qkv(0, 1, S, S, 2, 1, 16)
    o0, lse0, _ = _run(impl, q, k, v, causal=True)
    bad = jnp.inf if where.endswith("inf") else jnp.nan
    if where == "q":
        q = q.at[0, j, 0, 3].set(bad)
        hit_rows, hit_heads = [j], [0]
    elif where.startswith("k"):
        # +inf in k with q's matching component > 0: every score of key j is +inf (a -inf score
        # is just a zero weight, finite on purpose)
        q = q.at[..., 3].set(jnp.abs(q[..., 3]) + 0.1)
        o0, lse0, _ = _run(impl, q, k, v, causal=True)
        k = k.at[0, j, 0, 3].set(bad)
        hit_rows, hit_heads = list(range(j, S)), [0, 1]  # causal: rows i >= j see key j
    else:
        v = v.at[0, j, 0, 3].set(bad)
        hit_rows, hit_heads = list(range(j, S)), [0, 1]
    o, lse, (dq, dk, dv) = _run(impl, q, k, v, causal=True)
    for i in hit_rows:
        for h in hit_heads:
            assert not np.isfinite(o[0, i, h]).all(), (i, h)
            if where != "v":  # NaN or +inf, never the -inf of a fully masked row
                assert np.isnan(lse[0, i, h]) or np.isposinf(lse[0, i, h]), (i, h)
    assert not np.isfinite(dq[0, hit_rows]).all()
    assert not np.isfinite(dk[0, : j + 1] if where == "q" else dk[0, j]).all()
    if where == "v":
        # lse does not depend on v. Rows that mask key j may still see v[j] through 0 * NaN in
        # P @ V (dense: every row; portable: rows of the key block's partial tiles): documented,
        # a key visible to some rows must hold finite values.
        np.testing.assert_allclose(lse, lse0, rtol=1e-5, atol=1e-6)
        return
    # q and k enter through the scores, where masking replaces them: rows that never see the
    # bad value are untouched.
    clean = np.ones(S, bool)
    clean[hit_rows] = False
    np.testing.assert_allclose(o[0, clean], o0[0, clean], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse[0, clean], lse0[0, clean], rtol=1e-5, atol=1e-6)


def test_portable_small_blocks_nan_row_with_skipped_and_partial_tiles():
    # Small blocks: the NaN row's tile has skipped, partial and fully visible key blocks.
    B, S, N, d = 1, 48, 2, 8
    q, k, v = _qkv(1, B, S, S, N, N, d)
    ind = masks.from_window(S, 10).startend_row_indices
    bounds = canonical_bounds(ind, causal=True, q_len=S)
    q = q.at[0, 30, 1, 0].set(jnp.nan)
    o, lse = backends.portable.forward(q, k, v, bounds, scale=0.3, block_q=8, block_k=8)
    assert np.isnan(np.asarray(o[0, 30, 1])).all() and np.isnan(lse[0, 30, 1])
    assert np.isfinite(np.asarray(o[0, :, 0])).all() and np.isfinite(np.asarray(o[0, :30])).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_are_zero_with_zero_gradients_even_holding_nan(impl):
    # Sq > Sk with causal (bottom-right aligned): the first Sq - Sk rows see no key at all.
    Sq, Sk = 40, 24
    q, k, v = _qkv(2, 2, Sq, Sk, 2, 1, 8)
    o0, lse0, g0 = _run(impl, q, k, v, causal=True)
    dead = Sq - Sk
    q = q.at[:, :dead].set(jnp.nan)  # padding queries holding garbage
    o, lse, g = _run(impl, q, k, v, causal=True)
    assert (o[:, :dead] == 0).all() and np.isneginf(lse[:, :dead]).all()
    assert (g[0][:, :dead] == 0).all()
    np.testing.assert_array_equal(o[:, dead:], o0[:, dead:])
    np.testing.assert_array_equal(lse[:, dead:], lse0[:, dead:])
    np.testing.assert_allclose(g[0][:, dead:], g0[0][:, dead:], rtol=1e-6, atol=1e-7)
    for a, b in zip(g[1:], g0[1:]):  # dK / dV: the NaN queries contribute nothing
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# 6. Keys masked for every row (padding, unused cache slots) never influence anything.


def _padding_mask(S, n_pad, causal):
    """Two documents, then `n_pad` padding tokens (id -1: their rows and columns fully masked)."""
    half = (S - n_pad) // 2
    seg = np.concatenate([np.zeros(half, int), np.ones(S - n_pad - half, int), -np.ones(n_pad, int)])
    return masks.from_segment_ids(seg, causal=causal)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
def test_masked_keys_holding_nan_inf_never_leak(impl, causal):
    S, n_pad = 200, 37
    q, k, v = _qkv(3, 2, S, S, 4, 2, 16)
    mask = _padding_mask(S, n_pad, causal)
    o0, lse0, g0 = _run(impl, q, k, v, mask)
    k = k.at[:, S - n_pad:].set(jnp.nan)
    v = v.at[:, S - n_pad:].set(jnp.inf).at[:, S - 3:].set(-jnp.inf)
    o, lse, g = _run(impl, q, k, v, mask)
    live = slice(0, S - n_pad)
    np.testing.assert_array_equal(o, o0)  # padding rows are 0 in both
    np.testing.assert_array_equal(lse, lse0)
    np.testing.assert_allclose(g[0], g0[0], rtol=1e-6, atol=1e-7)
    for a, b in zip(g[1:], g0[1:]):
        np.testing.assert_allclose(a[:, live], b[:, live], rtol=1e-6, atol=1e-7)
        assert (a[:, S - n_pad:] == 0).all()  # exactly zero gradient at masked positions


def test_portable_small_blocks_masked_cache_slots_in_partial_tiles():
    # Decode-like: 8 queries over a 64-slot cache whose last 21 slots are unused (masked for every
    # row); with 16-wide key blocks the boundary block is partial.
    Sq, Sk, n_used = 8, 64, 43
    q, k, v = _qkv(4, 1, Sq, Sk, 2, 1, 8)
    ind = np.full((1, 1, Sk, 2), [Sq, 0], np.int32)
    ind[0, 0, n_used:, 0] = 0  # LTS = 0: every row masked
    bounds = canonical_bounds(jnp.asarray(ind), causal=False, q_len=Sq)
    kw = dict(scale=0.35, block_q=8, block_k=16)
    o0, lse0 = backends.portable.forward(q, k, v, bounds, **kw)
    kb, vb = k.at[0, n_used:].set(jnp.nan), v.at[0, n_used:].set(jnp.inf)
    o, lse = backends.portable.forward(q, kb, vb, bounds, **kw)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o0))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse0))
    do = jnp.ones_like(o)
    g0 = backends.portable.backward(q, k, v, bounds, o0, lse0, do, None, **kw)
    g = backends.portable.backward(q, kb, vb, bounds, o, lse, do, None, **kw)
    np.testing.assert_array_equal(np.asarray(g[0]), np.asarray(g0[0]))
    for a, b in zip(g[1:], g0[1:]):
        np.testing.assert_array_equal(np.asarray(a[0, :n_used]), np.asarray(b[0, :n_used]))
        assert (np.asarray(a[0, n_used:]) == 0).all()


# ---------------------------------------------------------------------------------------------
# 4. Bad input: clear errors naming the argument.


@pytest.mark.parametrize("dims,name", [
    ((0, 8, 2, 1, 8), "batch B"), ((1, 8, 0, 1, 8), "query heads N"), ((1, 0, 2, 1, 8), "query length"),
    ((1, 8, 2, 0, 8), "kv heads K"), ((1, 8, 2, 1, 0), "head dim"),
])
def test_empty_dimensions_raise_value_error(dims, name):
    B, S, N, K, d = dims
    q = jnp.zeros((B, S, N, d))
    k = v = jnp.zeros((B, 8, K, d))
    with pytest.raises(ValueError, match=name):
        jf.attention(q, k, v, implementation="xla")


@pytest.mark.parametrize("arg", ["causal", "return_residual"])
@pytest.mark.parametrize("bad", ["no", 1, None])
def test_flags_must_be_bool(arg, bad):
    q, k, v = _qkv(0, 1, 8, 8, 1, 1, 8)
    with pytest.raises(TypeError, match=arg):
        jf.attention(q, k, v, implementation="xla", **{arg: bad})
    jf.attention(q, k, v, implementation="xla", **{arg: np.bool_(True)})  # numpy bools are fine


def test_validate_requires_q_len():
    ind = jnp.full((1, 1, 8, 1), 8, jnp.int32)
    with pytest.raises(TypeError, match="q_len"):
        masks.validate(ind, causal=True, q_len=None)
    with pytest.raises(ValueError, match="q_len"):
        masks.validate(ind, causal=True, q_len=0)
    masks.validate(ind, causal=True, q_len=8)


# ---------------------------------------------------------------------------------------------
# 5. The Equinox layer under jax.vmap with a FlashMask.


def test_equinox_layer_vmap_with_flashmask_matches_batched_call():
    eqx_mod = pytest.importorskip("jax_flashmask.nn.equinox")
    B, S, F = 3, 32, 16
    layer = eqx_mod.FlashMaskAttention(F, 4, num_kv_heads=2, implementation="xla",
                                       key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, S, F))
    seg = np.stack([np.repeat([0, 1], [10, 22]), np.repeat([0, 1, 2], [5, 20, 7]),
                    np.repeat([0, -1], [25, 7])])
    mask = masks.from_segment_ids(seg, causal=True)
    want = layer(x, mask)
    got = jax.vmap(layer)(x, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    got_jit = jax.jit(jax.vmap(lambda x, m: layer(x, m)))(x, mask)
    np.testing.assert_allclose(np.asarray(got_jit), np.asarray(want), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# 2. Context-parallel plans: validated wherever a concrete plan enters.

_BAD_PLANS = [
    ("duplicate", np.array([[0, 0], [1, 2]]), ValueError, "duplicate ids"),
    ("negative", np.array([[-1, 0], [1, 2]]), ValueError, "negative ids"),
    ("out of range", np.array([[0, 4], [1, 2]]), ValueError, "out of range"),
    ("rank 1", np.arange(4), ValueError, "rank 2"),
    ("rank 3", np.arange(4).reshape(2, 2, 1), ValueError, "rank 2"),
    ("float", np.array([[0.0, 3.0], [1.0, 2.0]]), TypeError, "integer"),
    ("bool", np.array([[True, False]]), TypeError, "integer"),
]


def _entries():
    x = jnp.zeros((1, 16, 1, 4))
    ind = masks.from_segment_ids(np.repeat([0, 1], 8), causal=True)
    yield "permute_tokens", lambda plan: cp.permute_tokens(x, plan)
    yield "unpermute_tokens", lambda plan: cp.unpermute_tokens(x, plan)
    yield "token_positions", lambda plan: cp.token_positions(plan, 16)
    yield "make_schedule", lambda plan: cp.make_schedule(2, 2, plan=plan, needed=np.ones((2, 4), bool))
    yield "needed_chunks", lambda plan: cp.needed_chunks(ind, plan)
    yield "pruned_volume", lambda plan: cp.pruned_volume(ind, plan)
    yield "plan_loads", lambda plan: cp.plan_loads(plan, np.ones(4))
    yield "validate_plan", lambda plan: cp.validate_plan(plan)
    yield "local_context_parallel_attention", lambda plan: cp.local_context_parallel_attention(
        x, x, x, ind, plan=plan, axis_name="cp")


@pytest.mark.parametrize("entry", list(_entries()), ids=lambda e: e[0])
@pytest.mark.parametrize("case", _BAD_PLANS, ids=lambda c: c[0])
def test_invalid_plans_are_rejected_at_every_entry(entry, case):
    _, call = entry
    _, plan, exc, message = case
    with pytest.raises(exc, match=message) as info:
        call(plan)
    assert "plan" in str(info.value)


def test_context_parallel_attention_validates_plan_and_mask():
    mesh = jax.make_mesh((1,), ("cp",))
    q = jnp.zeros((1, 16, 1, 4))
    ind = masks.from_segment_ids(np.repeat([0, 1], 8), causal=True)
    for plan, exc, message in [(np.array([[0, 0]]), ValueError, "duplicate"),
                               (np.array([[0, 2]]), ValueError, "out of range"),
                               (np.array([[0.0, 1.0]]), TypeError, "integer"),
                               (np.array([0, 1]), ValueError, "rank 2"),
                               (np.array([[0], [1]]), ValueError, "P=2 rows but there are 1 ranks")]:
        with pytest.raises(exc, match=message):
            cp.context_parallel_attention(q, q, q, ind, plan=plan, mesh=mesh)
    with pytest.raises(TypeError, match="mask"):
        cp.context_parallel_attention(q, q, q, ind.startend_row_indices.astype(jnp.float32),
                                      plan=np.array([[0, 1]]), mesh=mesh, causal=True)
    with pytest.raises(ValueError, match="Sq=16"):  # a concrete mask's values are checked too
        cp.context_parallel_attention(q, q, q, ind.startend_row_indices + 1,
                                      plan=np.array([[0, 1]]), mesh=mesh, causal=True)
    qs = jax.device_put(q, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "cp")))
    out = cp.context_parallel_attention(qs, qs, qs, ind, plan=np.array([[1, 0]]), mesh=mesh)
    assert out.shape == q.shape


def test_traced_plans_are_checked_for_dtype_and_rank_only():
    x = jnp.arange(16.0).reshape(1, 16, 1, 1)
    plan = cp.dual_chunk_plan(2)
    got = jax.jit(lambda p: cp.permute_tokens(x, p))(plan)
    np.testing.assert_array_equal(got, cp.permute_tokens(x, plan))
    # ids of a traced plan are data: not checked (documented)
    jax.jit(lambda p: cp.permute_tokens(x, p))(np.array([[0, 0], [1, 2]]))
    with pytest.raises(TypeError, match="integer"):
        jax.jit(lambda p: cp.permute_tokens(x, p))(plan.astype(np.float32))
    with pytest.raises(ValueError, match="rank 2"):
        jax.jit(lambda p: cp.permute_tokens(x, p))(plan.reshape(-1))


# ---------------------------------------------------------------------------------------------
# 7. Unsupported transformations: errors that name jax_flashmask.


@pytest.mark.parametrize("impl", IMPLS)
def test_forward_mode_error_names_the_library(impl):
    q, k, v = _qkv(0, 1, 16, 16, 2, 1, 8)
    f = lambda q: jf.attention(q, k, v, causal=True, implementation=impl)  # noqa: E731
    with pytest.raises(TypeError, match="jax_flashmask.*forward-mode.*jax.jacrev"):
        jax.jvp(f, (q,), (q,))
    with pytest.raises(TypeError, match="jax_flashmask"):
        jax.jacfwd(lambda q: f(q).sum())(q)
    # jvp of a function jitted beforehand re-traces without our code: JAX's own message
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(jax.jit(f), (q,), (q,))


def test_forward_over_reverse_works_and_matches_reference():
    q, k, v = _qkv(5, 1, 24, 24, 2, 1, 8)
    t = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), jnp.float32)

    def hvp(impl):
        g = jax.grad(lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation=impl) ** 2))
        return jax.jvp(g, (q,), (t,))[1]

    np.testing.assert_allclose(hvp("xla"), hvp("reference"), rtol=2e-4, atol=2e-5)


def test_grad_of_grad():
    q, k, v = _qkv(5, 1, 16, 16, 2, 1, 8)

    def gg(impl):
        f = lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation=impl) ** 2)  # noqa: E731
        return jax.grad(lambda q: jnp.sum(jax.grad(f)(q) ** 2))(q)

    assert np.isfinite(gg("reference")).all()  # the dense reference differentiates to any order
    # The portable backward's loops have data-dependent trip counts: JAX refuses to transpose them
    # (documented in README "Guarantees"; the error surfaces outside the library's code).
    with pytest.raises(ValueError, match="fori_loop"):
        gg("xla")


def test_higher_order_error_translation():
    from jax_flashmask import _transforms

    with pytest.raises(NotImplementedError, match="jax_flashmask.*implementation='xla'"):
        with _transforms.explain_higher_order():
            raise NotImplementedError("Differentiation rule for 'ffi_call' not implemented")
    # jax >= 0.11 words it so (seen on the device with jax 0.11.2)
    with pytest.raises(NotImplementedError, match="jax_flashmask.*implementation='xla'"):
        with _transforms.explain_higher_order():
            raise ValueError("The FFI call to `jax_flashmask_fwd_sm90` cannot be differentiated. "
                             "You can use `jax.custom_jvp` or `jax.custom_jvp` to add support.")
    with pytest.raises(ValueError, match="unrelated"):
        with _transforms.explain_higher_order():
            raise ValueError("unrelated")


def test_second_derivative_through_a_kernel_without_rules(monkeypatch):
    """jax.hessian of a jitted attention reaches the kernels in JAX's jvp of the traced program
    (the sharding rule's jvp), outside the custom_vjp: the library's error is raised there too.
    The kernel here is the portable forward behind a jvp rule that fails as an FFI call does."""
    from jax_flashmask import backends

    real = backends.kernels

    def kernels(*args, **kwargs):
        fwd, bwd = real(*args, **kwargs)

        def opaque_fwd(q, k, v, bounds, **kw):
            @jax.custom_jvp
            def call(q, k, v, bounds):
                return fwd(q, k, v, bounds, **kw)

            @call.defjvp
            def _no_rule(primals, tangents):
                raise ValueError("The FFI call to `opaque` cannot be differentiated. "
                                 "You can use `jax.custom_jvp` or `jax.custom_jvp` to add support.")

            return call(q, k, v, bounds)

        return opaque_fwd, bwd

    monkeypatch.setattr(backends, "kernels", kernels)
    q, k, v = _qkv(6, 1, 16, 16, 2, 1, 8)
    # a scale no other test uses: jit's cache must not hand back a program traced with the real kernels
    f = lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation="xla", scale=0.3125))  # noqa: E731
    assert np.isfinite(jax.grad(f)(q)).all()  # a first derivative never differentiates the kernels
    with pytest.raises(NotImplementedError, match="jax_flashmask"):
        jax.hessian(f)(q[:, :4])
