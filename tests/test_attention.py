"""`jax_flashmask.attention` against the dense reference: masks, shapes, dtypes, transforms, errors."""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_flashmask as jf
from jax_flashmask import backends, masks
from jax_flashmask._api import RESIDUAL_NAMES
from jax_flashmask.backends import portable as _xla

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}  # relative, measured ~4e-7 / 2.5e-3 / 3e-4


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert not np.isnan(a).any(), "NaN in result"
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def make_qkv(rng, b, sq, sk, n, k, d, dtype=jnp.float32):
    draw = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32).astype(dtype)  # noqa: E731
    return draw(b, sq, n, d), draw(b, sk, k, d), draw(b, sk, k, d)


def random_indices(rng, b, hm, sq, sk, causal, d):
    """Random valid indices for any (causal, D): each (start, end) pair sorted."""
    x = rng.integers(0, sq + 1, (b, hm, sk, d))
    if d >= 2 and causal:  # (LTS, LTE)
        x = np.sort(x, axis=-1)
    elif d == 4:  # (LTS, LTE, UTS, UTE)
        x = np.concatenate([np.sort(x[..., :2], -1), np.sort(x[..., 2:], -1)], -1)
    return jnp.asarray(x, jnp.int32)


@functools.partial(jax.jit, static_argnames=("causal", "impl"))
def fwd_and_grads(q, k, v, ind, do, dl, *, causal, impl):
    """Outputs, lse and (dq, dk, dv) for the cotangents (do, dl) of (out, lse)."""
    f = lambda q, k, v: jf.attention(q, k, v, ind, causal=causal, return_residual=True,  # noqa: E731
                                     implementation=impl)
    (out, lse), vjp = jax.vjp(f, q, k, v)
    dl = jnp.where(jnp.isfinite(lse), dl, 0.0)
    return out, lse, vjp((do, dl))


def check_against_reference(rng, q, k, v, ind, causal, tol):
    b, sq, n, _ = q.shape
    do = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    dl = jnp.asarray(rng.standard_normal((b, sq, n)), jnp.float32)
    got = fwd_and_grads(q, k, v, ind, do, dl, causal=causal, impl="xla")
    up = lambda x: x.astype(jnp.float32)  # noqa: E731  float32 reference on upcast inputs
    want = fwd_and_grads(up(q), up(k), up(v), ind, up(do), dl, causal=causal, impl="reference")
    (out, lse, grads), (out_r, lse_r, grads_r) = got, want
    assert out.dtype == q.dtype and lse.dtype == jnp.float32 and lse.shape == (b, sq, n)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_r))
    assert rel_err(out, out_r) < tol
    finite = np.isfinite(np.asarray(lse_r))
    assert rel_err(np.where(finite, lse, 0), np.where(finite, lse_r, 0)) < tol
    for g, g_r in zip(grads, grads_r):
        assert g.dtype == q.dtype
        assert rel_err(g, g_r) < tol * 2


@pytest.mark.parametrize("name", masks.benchmark_suite(64).keys() if hasattr(masks, "benchmark_suite") else [])
def test_benchmark_masks(name):
    rng = np.random.default_rng()
    s = 301
    mask = masks.benchmark_suite(s, seed=int(rng.integers(1 << 30)))[name]
    q, k, v = make_qkv(rng, 1, s, s, 4, 2, 32)
    check_against_reference(rng, q, k, v, mask.startend_row_indices, mask.causal, TOL[jnp.float32])


@settings(max_examples=10, deadline=None)
@given(
    st.data(),
    st.sampled_from([(True, 1), (True, 2), (False, 2), (False, 4)]),
    st.sampled_from([(4, 4), (4, 2), (4, 1)]),  # (N, K): MHA, GQA, MQA
    st.sampled_from(["one", "kv", "q"]),
)
def test_random_masks(data, mode, heads, mask_heads):
    causal, dim = mode
    n, kh = heads
    hm = {"one": 1, "kv": kh, "q": n}[mask_heads]
    b = data.draw(st.integers(1, 2))
    sq = data.draw(st.sampled_from([1, 7, 33, 100]))
    sk = data.draw(st.sampled_from([1, 9, 64, 97]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    q, k, v = make_qkv(rng, b, sq, sk, n, kh, 16)
    ind = random_indices(rng, b, hm, sq, sk, causal, dim)
    check_against_reference(rng, q, k, v, ind, causal, TOL[jnp.float32])


@pytest.mark.parametrize("length", [1, 127, 129, 1000])
def test_ragged_lengths(length):
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 1, length, length, 2, 1, 16)
    doc = masks.from_segment_ids(np.repeat(np.arange(4), -(-length // 4))[:length])
    check_against_reference(rng, q, k, v, doc.startend_row_indices, True, TOL[jnp.float32])


@pytest.mark.parametrize("sq,sk", [(100, 300), (300, 100), (1, 129)])
def test_cross_lengths_causal_bottom_right(sq, sk):
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 2, sq, sk, 4, 2, 16)
    check_against_reference(rng, q, k, v, None, True, TOL[jnp.float32])
    ind = random_indices(rng, 2, 2, sq, sk, True, 2)
    check_against_reference(rng, q, k, v, ind, True, TOL[jnp.float32])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dtypes(dtype):
    rng = np.random.default_rng()
    s = 200
    q, k, v = make_qkv(rng, 2, s, s, 4, 2, 32, dtype)
    mask = masks.from_segment_ids(np.repeat([0, 1, 2], [50, 90, 60]), causal=False)
    check_against_reference(rng, q, k, v, mask.startend_row_indices, False, TOL[dtype])


def test_head_dims():
    rng = np.random.default_rng()
    for d in (8, 64, 128, 256):
        q, k, v = make_qkv(rng, 1, 70, 70, 2, 2, d)
        check_against_reference(rng, q, k, v, None, True, TOL[jnp.float32])


def test_fully_masked_rows_are_zero_with_zero_gradients():
    rng = np.random.default_rng()
    s = 160
    seg = np.repeat([0, -1, 1, -1], [40, 30, 60, 30])  # padding inside and at the end
    mask = masks.from_segment_ids(seg)
    q, k, v = make_qkv(rng, 1, s, s, 2, 2, 16)
    for impl in ("xla", "reference"):
        out, lse = jf.attention(q, k, v, mask, return_residual=True, implementation=impl)
        pad = seg == -1
        assert np.all(np.asarray(out)[0, pad] == 0)
        assert np.all(np.isneginf(np.asarray(lse)[0, pad]))
        assert np.all(np.isfinite(np.asarray(lse)[0, ~pad]))
        dq, dk, dv = jax.grad(lambda q, k, v: jnp.sum(jf.attention(q, k, v, mask, implementation=impl) ** 2),
                              argnums=(0, 1, 2))(q, k, v)
        assert np.all(np.asarray(dq)[0, pad] == 0), impl
        assert np.all(np.asarray(dk)[0, pad] == 0) and np.all(np.asarray(dv)[0, pad] == 0), impl
        assert not any(np.isnan(np.asarray(g)).any() for g in (dq, dk, dv))


def test_skipped_tiles_are_never_read():
    """Keys in fully-masked blocks hold NaN: only an implementation that skips them stays finite."""
    rng = np.random.default_rng()
    s, blk = 256, 64
    seg = np.repeat([0, -1, 1], [64, 64, 128])  # columns 64..127 masked for every row
    mask = masks.from_segment_ids(seg)
    q, k, v = make_qkv(rng, 1, s, s, 2, 1, 16)
    k = k.at[:, 64:128].set(jnp.nan)
    v = v.at[:, 64:128].set(jnp.nan)
    bounds = masks.canonical_bounds(mask.startend_row_indices, causal=True, q_len=s)
    out, lse = _xla.forward(q, k, v, bounds, scale=0.25, block_q=blk, block_k=blk)
    assert np.isfinite(np.asarray(out)).all()
    dq, dk, dv = _xla.backward(q, k, v, bounds, out, lse, jnp.ones_like(out), None, scale=0.25,
                               block_q=blk, block_k=blk)
    assert np.isfinite(np.asarray(dq)).all()
    assert np.isfinite(np.asarray(dv)[:, :64]).all() and np.isfinite(np.asarray(dv)[:, 128:]).all()


def test_block_classification_matches_dense():
    from jax_flashmask import _blocks

    rng = np.random.default_rng()
    for causal, dim in [(True, 1), (True, 2), (False, 2), (False, 4)]:
        sq, sk, bq, bk = 100, 96, 16, 32
        ind = random_indices(rng, 1, 1, sq, sk, causal, dim)
        bounds = masks.canonical_bounds(ind, causal=causal, q_len=sq)
        cls = np.asarray(_blocks.classify(*_blocks.block_metadata(bounds, bk), sq, bq, -(-sq // bq)))[0, 0]
        dense = np.asarray(masks.dense_from_bounds(bounds, sq))[0, 0]
        for i in range(cls.shape[0]):
            for j in range(cls.shape[1]):
                tile = dense[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
                if cls[i, j] == _blocks.SKIP:
                    assert tile.all()
                if cls[i, j] == _blocks.VISIBLE:
                    assert not tile.any()


def test_jit_grad_vmap():
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 2, 50, 50, 2, 1, 8)
    mask = masks.from_window(50, left=10, right=3)
    qs, ks, vs = (jnp.stack([x, 2 * x, -x]) for x in (q, k, v))  # an extra leading batch axis

    def loss(q, k, v, impl):
        return jnp.sum(jnp.tanh(jf.attention(q, k, v, mask, implementation=impl)))

    got = jax.jit(jax.vmap(jax.grad(functools.partial(loss, impl="xla"), argnums=(0, 1, 2))))(qs, ks, vs)
    want = jax.vmap(jax.grad(functools.partial(loss, impl="reference"), argnums=(0, 1, 2)))(qs, ks, vs)
    for g, g_r in zip(got, want):
        assert rel_err(g, g_r) < 1e-4


def test_inside_shard_map():
    from jax.sharding import Mesh, PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 2, 40, 40, 2, 2, 8)
    mesh = Mesh(np.array(jax.devices()[:1]), ("b",))
    f = shard_map(lambda q, k, v: jf.attention(q, k, v, causal=True, implementation="xla"),
                  mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b"))
    out = jax.jit(f)(q, k, v)
    assert rel_err(out, jf.attention(q, k, v, causal=True, implementation="reference")) < 1e-5


def test_default_scale_and_explicit_scale():
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 16)
    a = jf.attention(q, k, v, implementation="xla")
    b = jf.attention(q, k, v, scale=0.25, implementation="xla")  # 1/sqrt(16)
    c = jf.attention(q, k, v, scale=1.0, implementation="xla")
    assert rel_err(a, b) < 1e-6 and rel_err(a, c) > 1e-3


def test_residuals_are_named_for_remat():
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 1, 16, 16, 1, 1, 8)
    f = lambda q: jf.attention(q, k, v, causal=True, implementation="xla")  # noqa: E731
    jaxpr = str(jax.make_jaxpr(lambda q: jax.vjp(f, q)[1](q))(q))
    for name in RESIDUAL_NAMES:
        assert name in jaxpr
    # A policy that saves nothing must still give the same gradient (recomputed forward).
    policy = jax.checkpoint_policies.save_only_these_names("flashmask_out")
    g = jax.grad(lambda q: jnp.sum(jax.checkpoint(f, policy=policy)(q)))(q)
    assert rel_err(g, jax.grad(lambda q: jnp.sum(f(q)))(q)) < 1e-6


def test_cuda_request_without_gpu_is_clear():
    if backends.cuda_unavailable_reason() is None:
        pytest.skip("the CUDA path is available here")
    q, k, v = make_qkv(np.random.default_rng(), 1, 8, 8, 1, 1, 8, jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="implementation='cuda' is not available"):
        jf.attention(q, k, v, implementation="cuda")


# ---------------------------------------------------------------------------------------------
# Bad input: every case raises ValueError from Python, naming what to change.

def _bad_calls():
    rng = np.random.default_rng(0)
    q, k, v = make_qkv(rng, 2, 16, 16, 4, 2, 8)
    ok1 = jnp.full((2, 1, 16, 1), 16, jnp.int32)
    yield "rank", lambda: jf.attention(q[0], k, v), "rank-4"
    yield "dtype", lambda: jf.attention(q.astype(jnp.int32), k, v), "float32, bfloat16 or float16"
    yield "mixed dtype", lambda: jf.attention(q.astype(jnp.bfloat16), k, v), "share one dtype"
    yield "kv shape", lambda: jf.attention(q, k, v[:, :8]), "same shape"
    yield "batch", lambda: jf.attention(q, k[:1], v[:1]), "batch"
    yield "head dim", lambda: jf.attention(q, k[..., :4], v[..., :4]), "head dim"
    yield "gqa", lambda: jf.attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)), "multiple"
    yield "impl", lambda: jf.attention(q, k, v, implementation="fast"), "implementation"
    yield "scale", lambda: jf.attention(q, k, v, scale=jnp.float32(1)), "scale"
    yield "mask rank", lambda: jf.attention(q, k, v, ok1[0], causal=True), "rank 4"
    yield "mask dtype", lambda: jf.attention(q, k, v, ok1.astype(jnp.float32), causal=True), "int32"
    yield "causal D", lambda: jf.attention(q, k, v, jnp.zeros((2, 1, 16, 4), jnp.int32), causal=True), "D=4"
    yield "noncausal D", lambda: jf.attention(q, k, v, ok1), "D=1"
    yield "mask Sk", lambda: jf.attention(q, k, v, ok1[:, :, :8], causal=True), "Sk=8"
    yield "mask Hm", lambda: jf.attention(q, k, v, jnp.full((2, 3, 16, 1), 16, jnp.int32), causal=True), "Hm=3"
    yield "mask batch", lambda: jf.attention(q, k, v, jnp.full((3, 1, 16, 1), 16, jnp.int32), causal=True), "batch"
    yield "too large", lambda: jf.attention(q, k, v, ok1 + 1, causal=True), r"\[0, Sq=16\]"
    yield "negative", lambda: jf.attention(q, k, v, ok1 * 0 - 1, causal=True), r"\[0, Sq=16\]"
    bad_order = jnp.concatenate([ok1, ok1 * 0], axis=-1)  # LTS=16 > LTE=0
    yield "start>end", lambda: jf.attention(q, k, v, bad_order, causal=True), "LTS must be <= LTE"
    yield "flashmask causal", lambda: jf.attention(q, k, v, jf.FlashMask(jnp.zeros((2, 1, 16, 2), jnp.int32)),
                                                   causal=True), "conflicts"


@pytest.mark.parametrize("case", list(_bad_calls()), ids=lambda c: c[0])
def test_bad_input_raises_value_error(case):
    _, call, message = case
    with pytest.raises(ValueError, match=message):
        call()


def test_traced_indices_skip_value_checks_but_work():
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, 1, 32, 32, 1, 1, 8)
    ind = random_indices(rng, 1, 1, 32, 32, False, 4)
    got = jax.jit(lambda ind: jf.attention(q, k, v, ind, implementation="xla"))(ind)
    assert rel_err(got, jf.attention(q, k, v, ind, implementation="reference")) < 1e-5


# ---------------------------------------------------------------------------------------------
# deterministic=True: validated, passed to the backward, reproducible on every implementation.


def test_deterministic_must_be_bool():
    q, k, v = make_qkv(np.random.default_rng(), 1, 8, 8, 1, 1, 8)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="deterministic"):
            jf.attention(q, k, v, implementation="xla", deterministic=bad)


def test_sm_margin_must_be_a_nonnegative_int():
    q, k, v = make_qkv(np.random.default_rng(), 1, 8, 8, 1, 1, 8)
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="sm_margin"):
            jf.attention(q, k, v, implementation="xla", sm_margin=bad)
    ref = jf.attention(q, k, v, implementation="xla")
    np.testing.assert_array_equal(jf.attention(q, k, v, implementation="xla", sm_margin=np.int32(8)), ref)


def test_sm_margin_reaches_the_hopper_kernels(monkeypatch):
    """No GPU needed: stand-ins for the two Hopper kernels record what attention passes them."""
    att = sys.modules["jax_flashmask._api"]
    seen = []

    def fwd(q, k, v, bounds, *, scale, sm_margin=0, structure="general"):
        seen.append(("fwd", sm_margin, structure))
        return _xla.forward(q, k, v, bounds, scale=scale)

    def bwd(*a, sm_margin=0, **kw):
        seen.append(("bwd", sm_margin))
        return _xla.backward(*a, **kw)

    monkeypatch.setattr(backends.cuda, "forward", fwd)
    monkeypatch.setattr(backends.cuda, "backward", bwd)
    q, k, v = make_qkv(np.random.default_rng(), 1, 16, 16, 2, 1, 8)
    jax.grad(lambda q: jnp.sum(att._flash(q, k, v, att.unmasked_bounds(1, 16, causal=True, q_len=16),
                                          att.CallOptions("cuda", 0.3, False, 8, "causal"))[0]))(q)
    assert seen == [("fwd", 8, "causal"), ("bwd", 8)]


def test_deterministic_reaches_the_backward(monkeypatch):
    xla = _xla
    seen = []
    real = xla.backward

    def spy(*a, **kw):
        seen.append(kw.get("deterministic"))
        return real(*a, **kw)

    monkeypatch.setattr(xla, "backward", spy)
    jax.clear_caches()  # attention's compiled programs: the spy must be traced into them
    q, k, v = make_qkv(np.random.default_rng(), 1, 16, 16, 2, 1, 8)
    for det in (True, False):
        jax.grad(lambda q: jnp.sum(jf.attention(q, k, v, causal=True, implementation="xla",
                                                deterministic=det)))(q)
    assert seen == [True, False]


@pytest.mark.parametrize("impl", ["xla", "reference"])
@pytest.mark.parametrize("heads,kv_heads,mask_heads", [(4, 2, 1), (6, 2, 6), (8, 1, 8)])
def test_deterministic_gradients_reproducible(impl, heads, kv_heads, mask_heads):
    """Two runs bit-identical; same values as the default mode (to rounding). (6, 2, 6) and (8, 1, 8)
    have 3 and 8 mask heads per kv head: the portable backward's scatter-add path is replaced."""
    rng = np.random.default_rng(0)
    q, k, v = make_qkv(rng, 2, 70, 90, heads, kv_heads, 16)
    ind = random_indices(rng, 2, mask_heads, 70, 90, False, 4)

    def grads(det):
        f = lambda q, k, v: jnp.sum(jnp.tanh(jf.attention(  # noqa: E731
            q, k, v, ind, implementation=impl, deterministic=det)))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    a, b, ref = grads(True), grads(True), grads(False)
    for x, y, r in zip(a, b, ref):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert rel_err(x, r) < 1e-5


def test_eager_calls_hit_the_compile_cache(monkeypatch):
    """Outside jit, a repeated call with the same shapes and options runs the compiled program
    instead of tracing the implementation again (each trace compiles the blocked loops anew)."""
    traced = []
    real = _xla.forward

    def counting(*a, **kw):
        traced.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(_xla, "forward", counting)
    jax.clear_caches()
    q, k, v = make_qkv(np.random.default_rng(0), 1, 24, 24, 2, 1, 8)
    first = jf.attention(q, k, v, causal=True, implementation="xla")
    assert traced, "the first call traces the implementation"
    n = len(traced)
    again = jf.attention(q, k, v, causal=True, implementation="xla")
    assert len(traced) == n, "an identical eager call traced again"
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    jf.attention(q, k, v, causal=False, implementation="xla")  # new static options: a new program
    assert len(traced) > n
