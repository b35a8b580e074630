"""jax_flashmask.dot_product_attention against jax.nn.dot_product_attention(implementation="xla")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flashmask as jf
from jax_flashmask import masks

B, N, K, H = 2, 4, 2, 16


def qkv(t, s, k_heads=K, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32)
                 for shape in [(B, t, N, H), (B, s, k_heads, H), (B, s, k_heads, H)])


CASES = {
    "causal": dict(is_causal=True),
    "causal_t_lt_s": dict(is_causal=True, _ts=(12, 20)),  # top-left, as jax.nn
    "causal_t_gt_s": dict(is_causal=True, _ts=(20, 12)),
    "key_padding": dict(key_value_seq_lengths=np.array([17, 5], np.int32)),
    "query_padding": dict(query_seq_lengths=np.array([9, 20], np.int32)),
    "causal_both_padding": dict(is_causal=True, query_seq_lengths=np.array([20, 11], np.int32),
                                key_value_seq_lengths=np.array([20, 11], np.int32)),
    "causal_local_window": dict(is_causal=True, local_window_size=(5, 0)),
    "local_window_symmetric": dict(local_window_size=3),
    "local_window_lr_t_ne_s": dict(local_window_size=(2, 6), _ts=(14, 20)),
    "mqa_causal": dict(is_causal=True, _k=1),
    "mha_window_padding": dict(local_window_size=(4, 1), key_value_seq_lengths=np.array([17, 20], np.int32), _k=N),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax_nn(name, jit):
    kw = dict(CASES[name])
    t, s = kw.pop("_ts", (20, 20))
    q, k, v = qkv(t, s, kw.pop("_k", K))
    arrays = {a: kw.pop(a) for a in ("query_seq_lengths", "key_value_seq_lengths") if a in kw}

    def ours(q, k, v, arrays):
        return jf.dot_product_attention(q, k, v, implementation="xla", **arrays, **kw)

    def theirs(q, k, v, arrays):
        return jax.nn.dot_product_attention(q, k, v, implementation="xla", **arrays, **kw)

    if jit:  # lengths are traced arguments
        ours, theirs = jax.jit(ours), jax.jit(theirs)
    got, want = ours(q, k, v, arrays), theirs(q, k, v, arrays)
    assert got.shape == want.shape == q.shape
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_gradients_match_on_valid_rows():
    q, k, v = qkv(20, 20)
    lens = dict(query_seq_lengths=jnp.array([13, 20], jnp.int32),
                key_value_seq_lengths=jnp.array([13, 20], jnp.int32))
    g = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v, is_causal=True, local_window_size=(6, 0), **lens) * g)

    got = jax.grad(loss(jf.dot_product_attention), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(lambda *a, **kw: jax.nn.dot_product_attention(*a, implementation="xla", **kw)),
                    argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=5e-5)


def test_boolean_mask_and_unbatched_and_residual():
    q, k, v = qkv(16, 24)
    rng = np.random.default_rng(2)
    # per head, per batch: a random prefix-LM-like mask (every column <= 2 masked runs)
    pre = rng.integers(0, 16, size=(B, N))
    i, j = np.arange(16)[:, None], np.arange(24)[None, :]
    mask = (j <= i + 8)[None, None] | (j[None, None] < pre[..., None, None])
    got = jf.dot_product_attention(q, k, v, mask=jnp.asarray(mask), implementation="reference")
    want = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask), implementation="xla")
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    # broadcast shapes [T, S] combined with lengths and causal
    m2 = np.broadcast_to(j >= 2, (16, 24))
    kw = dict(is_causal=True, key_value_seq_lengths=np.array([24, 10], np.int32))
    got = jf.dot_product_attention(q, k, v, mask=m2, implementation="xla", **kw)
    want = jax.nn.dot_product_attention(q, k, v, mask=m2, implementation="xla", **kw)
    for b, kv_len in enumerate((24, 10)):  # rows that see some key (jax.nn averages the others)
        valid = np.any((j < kv_len) & (j >= 2) & (j <= i), axis=1)
        np.testing.assert_allclose(got[b][valid], want[b][valid], atol=2e-5, rtol=2e-5)
    # rank-3 inputs and return_residual
    o, lse = jf.dot_product_attention(q[0], k[0], v[0], is_causal=True, return_residual=True)
    o2, lse2 = jax.nn.dot_product_attention(q[0], k[0], v[0], is_causal=True, return_residual=True)
    assert o.shape == o2.shape == q[0].shape and lse.shape == lse2.shape == (16, N) and lse.dtype == lse2.dtype
    np.testing.assert_allclose(o, o2, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, lse2, atol=2e-5, rtol=2e-5)


def test_padded_and_empty_rows():
    q, k, v = qkv(20, 20)
    ql, kl = jnp.array([7, 20], jnp.int32), jnp.array([20, 0], jnp.int32)
    out = jf.dot_product_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl)
    ref = jax.nn.dot_product_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl)
    np.testing.assert_allclose(out[0], ref[0], atol=2e-5, rtol=2e-5)  # padded rows 7.. are 0 in both
    assert not np.asarray(out[0, 7:]).any()
    assert not np.asarray(out[1]).any()  # no key at all: 0 here (jax.nn: the mean of the values)


def test_segment_ids_and_flash_mask_extensions():
    q, k, v = qkv(24, 24)
    seg = np.stack([np.repeat([0, 1, 2, -1], [6, 7, 8, 3]), np.repeat([5, 6], [10, 14])]).astype(np.int32)
    dense = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != -1)
    want = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(dense[:, None]), is_causal=True)
    f = jax.jit(lambda q, k, v, s: jf.dot_product_attention(q, k, v, is_causal=True, segment_ids=s))
    got = f(q, k, v, seg)
    rows = dense.any(-1)  # padding rows: 0 here, the mean of the values in jax.nn
    np.testing.assert_allclose(np.asarray(got)[rows], np.asarray(want)[rows], atol=2e-5, rtol=2e-5)
    fm = masks.from_segment_ids(seg, causal=True)
    got2 = jf.dot_product_attention(q, k, v, flash_mask=fm, key_value_seq_lengths=jnp.array([24, 24], jnp.int32))
    np.testing.assert_allclose(got2, got, atol=1e-6)
    # soft cap reaches attention
    capped = jf.dot_product_attention(q, k, v, flash_mask=fm, logits_soft_cap=0.5, implementation="reference")
    np.testing.assert_allclose(capped, jf.attention(q, k, v, fm, logits_soft_cap=0.5, implementation="reference"),
                               atol=1e-6)


def test_errors():
    q, k, v = qkv(8, 8)
    with pytest.raises(NotImplementedError, match="bias"):
        jf.dot_product_attention(q, k, v, bias=jnp.zeros((1, 1, 8, 8)))
    with pytest.raises(ValueError, match="cudnn"):
        jf.dot_product_attention(q, k, v, implementation="cudnn")
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda m: jf.dot_product_attention(q, k, v, mask=m))(jnp.ones((8, 8), bool))
    with pytest.raises(ValueError, match="more than two"):
        jf.dot_product_attention(q, k, v, mask=np.arange(8)[:, None] % 2 == np.zeros((1, 8), int))
    with pytest.raises(ValueError, match="query_seq_lengths"):
        jf.dot_product_attention(q, k, v, query_seq_lengths=jnp.array([3], jnp.int32))
    with pytest.raises(ValueError, match="local_window_size"):
        jf.dot_product_attention(q, k, v, local_window_size=(1, 2, 3))
    with pytest.raises(NotImplementedError, match="flash_mask"):
        jf.dot_product_attention(q, k, v, is_causal=True, flash_mask=masks.global_sliding_window(8, 1, 2))


# ----------------------------------------------------------------------------- the Flax hook

flax = pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402

from jax_flashmask.nn.flax import attention_fn  # noqa: E402

S, F = 24, 32


def _inputs():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((B, S, F)), jnp.float32)
    seg = np.stack([np.repeat([0, 1, 2], [7, 9, 8]), np.repeat([4, 5], [15, 9])]).astype(np.int32)
    fm = masks.from_segment_ids(seg, causal=True)
    return x, fm, ~np.asarray(fm.to_dense())  # True = attend, [B, 1, S, S]


def _nnx_pair(**kw):
    make = lambda fn: nnx.MultiHeadAttention(  # noqa: E731
        num_heads=N, in_features=F, decode=False, rngs=nnx.Rngs(0), attention_fn=fn, **kw)
    return make(attention_fn), make(nnx.dot_product_attention)


def test_nnx_multihead_attention_with_flash_mask():
    x, fm, dense = _inputs()
    ours, stock = _nnx_pair()
    np.testing.assert_allclose(ours(x, mask=fm), stock(x, mask=jnp.asarray(dense)), atol=2e-5, rtol=2e-5)
    # under nnx.jit the FlashMask is a traced pytree and passes through Flax untouched
    jitted = nnx.jit(lambda m, x, fm: m(x, mask=fm))(ours, x, fm)
    np.testing.assert_allclose(jitted, stock(x, mask=jnp.asarray(dense)), atol=2e-5, rtol=2e-5)
    # a concrete dense mask (Flax's float 0/1 masks too) and is_causal
    np.testing.assert_allclose(ours(x, mask=jnp.asarray(dense, jnp.float32)), stock(x, mask=jnp.asarray(dense)),
                               atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(ours(x, is_causal=True), stock(x, is_causal=True), atol=2e-5, rtol=2e-5)
    causal = nnx.make_causal_mask(jnp.ones((B, S)))
    np.testing.assert_allclose(ours(x, mask=causal), stock(x, mask=causal), atol=2e-5, rtol=2e-5)


def test_nnx_dropout_rules():
    x, fm, dense = _inputs()
    ours, stock = _nnx_pair(dropout_rate=0.1)
    np.testing.assert_allclose(ours(x, mask=fm, deterministic=True), stock(x, mask=jnp.asarray(dense),
                                                                           deterministic=True), atol=2e-5)
    with pytest.raises(NotImplementedError, match="dropout"):
        ours(x, mask=fm, deterministic=False)
    with pytest.raises(NotImplementedError, match="sow_weights"):
        _nnx_pair()[0](x, mask=fm, sow_weights=True)


def test_linen_multihead_attention_with_flash_mask():
    x, fm, dense = _inputs()
    ours = linen.MultiHeadDotProductAttention(num_heads=N, qkv_features=F, attention_fn=attention_fn)
    stock = linen.MultiHeadDotProductAttention(num_heads=N, qkv_features=F)
    params = stock.init(jax.random.key(0), x)
    want = stock.apply(params, x, mask=jnp.asarray(dense))
    np.testing.assert_allclose(ours.apply(params, x, mask=fm), want, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(jax.jit(lambda p, x, m: ours.apply(p, x, mask=m))(params, x, fm), want,
                               atol=2e-5, rtol=2e-5)
