"""`jax_flashmask.nn` layers against a plain-JAX composition of the same math.

The reference below is written independently of `jax_flashmask.nn._common`: projections as
matmuls, RoPE through complex rotation, GQA by repeating kv heads, dense softmax attention with the
dense mask from `masks.to_dense` (fully masked rows give 0).
"""

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flashmask
from jax_flashmask import masks

B, S, F, N, K = 2, 24, 32, 4, 2
D = F // N
TOL = dict(rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- reference math
def ref_rope(x, positions, base=10000.0):
    """x [B, S, H, d]; pair k with k + d/2 as one complex number, rotate by pos * base^(-2k/d)."""
    d = x.shape[-1]
    freq = base ** (-np.arange(0, d, 2) / d)
    pos = jnp.broadcast_to(jnp.asarray(positions, jnp.float32), x.shape[:2])
    rot = jnp.exp(1j * pos[..., None, None] * freq)  # [B, S, 1, d/2]
    z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * rot
    return jnp.concatenate([z.real, z.imag], axis=-1).astype(x.dtype)


def ref_dense_mask(mask, causal, sq, sk):
    """Boolean [b, Hm, Sq, Sk], True = masked."""
    if mask is None:
        m = np.zeros((1, 1, sq, sk), bool)
        if causal:
            m |= np.arange(sq)[:, None] < np.arange(sk)[None] - (sk - sq)
        return jnp.asarray(m)
    if isinstance(mask, masks.FlashMask):
        return mask.to_dense(q_len=sq)
    return masks.to_dense(mask, causal=causal, q_len=sq)


@functools.partial(jax.jit, static_argnames=("causal", "num_heads", "num_kv_heads", "rope", "scale"))
def ref_attention_layer(x, w, mask, *, causal, num_heads, num_kv_heads, rope, positions, scale=None):
    """w: dict of q/k/v/o -> (kernel [in, out], bias or None)."""
    def lin(name, t):
        kernel, bias = w[name]
        y = t @ kernel
        return y if bias is None else y + bias

    b, s, _ = x.shape
    q = lin("q", x).reshape(b, s, num_heads, -1)
    k = lin("k", x).reshape(b, s, num_kv_heads, -1)
    v = lin("v", x).reshape(b, s, num_kv_heads, -1)
    d = q.shape[-1]
    if rope:
        pos = jnp.arange(s) if positions is None else positions
        q, k = ref_rope(q, pos), ref_rope(k, pos)
    group = num_heads // num_kv_heads
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d ** -0.5 if scale is None else scale)
    dense = ref_dense_mask(mask, causal, s, s)
    dense = jnp.repeat(dense, num_heads // dense.shape[1], axis=1)
    scores = jnp.where(dense, -jnp.inf, scores)
    p = jax.nn.softmax(scores, axis=-1)
    p = jnp.where(dense.all(-1, keepdims=True), 0.0, p)  # fully masked rows -> 0
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, num_heads * d)
    return lin("o", out)


# --------------------------------------------------------------------------- masks to test
def doc_segments(causal):
    seg = np.array([[0] * 5 + [1] * 9 + [2] * 6 + [-1] * 4, [7] * 11 + [3] * 13])
    return masks.from_segment_ids(seg, causal=causal)


def per_kv_head_windows():
    """Raw causal D=1 indices with Hm = K: a different sliding window per kv head."""
    a = masks.from_window(S, 3, 0, batch=B).startend_row_indices
    c = masks.from_window(S, 9, 0, batch=B).startend_row_indices
    return jnp.concatenate([a, c], axis=1)  # [B, 2, S, 1]


CASES = {
    "causal_document+padding": lambda: (doc_segments(True), True),
    "document_noncausal": lambda: (doc_segments(False), False),
    "none_causal": lambda: (None, True),
    "none_full": lambda: (None, False),
    "raw_per_kv_head": lambda: (per_kv_head_windows(), True),
}


def make_x(seed=0):
    return jax.random.normal(jax.random.key(seed), (B, S, F), jnp.float32)


# --------------------------------------------------------------------------- Flax NNX
def flax_weights(layer):
    def get(lin):
        bias = None if lin.bias is None else lin.bias[...]
        return lin.kernel[...], bias
    return {n: get(getattr(layer, f"{n}_proj")) for n in "qkvo"}


FLAX_CASES = [(c, "xla") for c in ("causal_document+padding", "document_noncausal", "raw_per_kv_head")] + [
    ("none_full", "reference")]


@pytest.mark.parametrize("case,implementation", FLAX_CASES)
def test_flax_matches_reference(case, implementation):
    nnx = pytest.importorskip("flax.nnx")
    from jax_flashmask.nn.flax import FlashMaskAttention

    mask, causal = CASES[case]()
    rope = case != "document_noncausal"
    layer = FlashMaskAttention(F, N, num_kv_heads=K, causal=causal, rope=rope,
                               use_bias=not rope, implementation=implementation,
                               rngs=nnx.Rngs(1))
    x = make_x()
    got = jax.jit(lambda x, mask: layer(x, mask))(x, mask)
    want = ref_attention_layer(x, flax_weights(layer), mask, causal=causal, num_heads=N,
                               num_kv_heads=K, rope=rope, positions=None)
    np.testing.assert_allclose(got, want, **TOL)
    assert np.isfinite(np.asarray(got)).all()


def test_flax_gradients_and_jit():
    nnx = pytest.importorskip("flax.nnx")
    from jax_flashmask.nn.flax import FlashMaskAttention

    mask = doc_segments(True)
    layer = FlashMaskAttention(F, N, num_kv_heads=K, implementation="xla", rngs=nnx.Rngs(2))
    graphdef, params = nnx.split(layer, nnx.Param)
    x = make_x(1)
    positions = jnp.stack([jnp.arange(S), jnp.arange(S) + 5])  # [B, S] positions

    def loss_layer(params, x, mask):
        return jnp.sum(jnp.sin(nnx.merge(graphdef, params)(x, mask, positions=positions)))

    def loss_ref(w, x):
        out = ref_attention_layer(x, w, mask, causal=True, num_heads=N, num_kv_heads=K,
                                  rope=True, positions=positions)
        return jnp.sum(jnp.sin(out))

    w = flax_weights(layer)
    loss, (gp, gx) = jax.jit(jax.value_and_grad(loss_layer, argnums=(0, 1)))(params, x, mask)
    loss_want, (gw, gx_ref) = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1)))(w, x)
    np.testing.assert_allclose(loss, loss_want, rtol=1e-5)
    np.testing.assert_allclose(gx, gx_ref, **TOL)
    for n in "qkvo":
        np.testing.assert_allclose(getattr(gp, f"{n}_proj")["kernel"][...], gw[n][0], **TOL)


def test_flax_mqa_head_dim_and_out_features():
    nnx = pytest.importorskip("flax.nnx")
    from jax_flashmask.nn.flax import FlashMaskAttention

    layer = FlashMaskAttention(F, N, num_kv_heads=1, head_dim=16, out_features=12, causal=True,
                               rngs=nnx.Rngs(3))
    x = make_x(2)
    calls = []

    def spy(q, k, v, indices, **kw):  # the attention_fn hook (context parallelism uses it)
        calls.append((q.shape, k.shape, indices, kw))
        return jax_flashmask.attention(q, k, v, indices, **kw)

    got = jax.jit(lambda x: layer(x, attention_fn=spy))(x)
    assert calls == [((B, S, N, 16), (B, S, 1, 16), None,
                      dict(causal=True, scale=None, implementation=None))]
    assert got.shape == (B, S, 12)
    want = ref_attention_layer(x, flax_weights(layer), None, causal=True, num_heads=N,
                               num_kv_heads=1, rope=True, positions=None)
    np.testing.assert_allclose(got, want, **TOL)


# --------------------------------------------------------------------------- Equinox
def eqx_weights(layer):
    def get(lin):
        return lin.weight.T, lin.bias
    return {n: get(getattr(layer, f"{n}_proj")) for n in "qkvo"}


@pytest.mark.parametrize("case", ["document_noncausal"])
def test_equinox_matches_reference(case):
    eqx = pytest.importorskip("equinox")
    from jax_flashmask.nn.equinox import FlashMaskAttention

    mask, causal = CASES[case]()
    rope = case != "document_noncausal"
    layer = FlashMaskAttention(F, N, num_kv_heads=K, causal=causal, rope=rope,
                               use_bias=not rope, implementation="xla", key=jax.random.key(4))
    x = make_x(3)
    got = eqx.filter_jit(lambda layer, x, mask: layer(x, mask))(layer, x, mask)
    want = ref_attention_layer(x, eqx_weights(layer), mask, causal=causal, num_heads=N,
                               num_kv_heads=K, rope=rope, positions=None)
    np.testing.assert_allclose(got, want, **TOL)


def test_equinox_unbatched_vmap_and_grad():
    eqx = pytest.importorskip("equinox")
    from jax_flashmask.nn.equinox import FlashMaskAttention

    layer = FlashMaskAttention(F, N, num_kv_heads=K, causal=True, implementation="reference",
                               key=jax.random.key(5))
    x = make_x(4)
    seg = np.array([0] * 10 + [1] * 14)
    mask1 = masks.from_segment_ids(seg)  # [1, 1, S, 1]
    batched = masks.from_segment_ids(np.stack([seg, seg]))
    want = ref_attention_layer(x, eqx_weights(layer), batched, causal=True, num_heads=N,
                               num_kv_heads=K, rope=True, positions=None)
    # vmap of unbatched calls (equinox style): a FlashMask of batch 1, and raw [Hm, S, D] indices
    got = eqx.filter_jit(lambda layer, x, ind: (
        jax.vmap(lambda xi: layer(xi, mask1))(x),
        jax.vmap(lambda xi, ii: layer(xi, ii))(x, ind[:, 0:1, :, :]),
    ))(layer, x, batched.startend_row_indices)
    np.testing.assert_allclose(got[0], want, **TOL)
    np.testing.assert_allclose(got[1], want, **TOL)

    @eqx.filter_jit
    @eqx.filter_grad
    def grad(model, x):
        return jnp.sum(model(x, batched) ** 2)

    def loss_ref(w, x):
        return jnp.sum(ref_attention_layer(x, w, batched, causal=True, num_heads=N,
                                           num_kv_heads=K, rope=True, positions=None) ** 2)

    g = grad(layer, x)
    gw = jax.jit(jax.grad(loss_ref))(eqx_weights(layer), x)
    for n in "qkvo":
        np.testing.assert_allclose(getattr(g, f"{n}_proj").weight.T, gw[n][0], **TOL)


# --------------------------------------------------------------------------- shared pieces
def test_rope_matches_complex_rotation_and_is_relative():
    from jax_flashmask.nn import apply_rope

    x = jax.random.normal(jax.random.key(6), (B, S, N, D))
    np.testing.assert_allclose(jax.jit(apply_rope)(x), jax.jit(ref_rope)(x, jnp.arange(S)), **TOL)
    # q.k after RoPE depends only on the position difference
    q, k = x[:, :1], x[:, 1:2]

    @jax.jit
    def dot(off):
        return jnp.sum(apply_rope(q, jnp.array([3]) + off) * apply_rope(k, jnp.array([7]) + off))

    np.testing.assert_allclose(dot(0), dot(11), rtol=1e-4)


def test_head_config_errors():
    from jax_flashmask.nn import check_head_config, resolve_mask

    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        check_head_config(32, 4, 3, None)
    with pytest.raises(ValueError, match="pass head_dim"):
        check_head_config(30, 4, None, None)
    assert check_head_config(32, 4, None, None) == (4, 8)
    with pytest.raises(TypeError, match="FlashMask"):
        resolve_mask("causal", True)


def test_nn_imports_without_frameworks():
    """`jax_flashmask.nn` imports with flax/equinox absent; the layers name the extra to install."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["flax"] = None
        sys.modules["equinox"] = None
        import jax_flashmask.nn as nn
        assert callable(nn.apply_rope)
        for name, extra in (("flax", "jax_flashmask[flax]"), ("equinox", "jax_flashmask[equinox]")):
            try:
                getattr(nn, name)
            except ImportError as e:
                assert extra in str(e), str(e)
            else:
                raise AssertionError(name + " imported without its framework")
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
