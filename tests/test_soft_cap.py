"""logits_soft_cap (Gemma 2's ``cap·tanh(s/cap)``) on the reference and portable paths: outputs and
gradients against an independent dense implementation written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flashmask as jf
from jax_flashmask import masks


def dense_soft_capped(q, k, v, masked, scale, cap):
    """Plain softmax attention in float64-free float32 numpy-style jnp: masked is [B, Hm, Sq, Sk]."""
    n, kh = q.shape[2], k.shape[2]
    kx = jnp.repeat(k, n // kh, axis=2)
    vx = jnp.repeat(v, n // kh, axis=2)
    logits = jnp.einsum("bqnd,bknd->bnqk", q, kx) * scale
    logits = cap * jnp.tanh(logits / cap)
    masked = jnp.repeat(masked, n // masked.shape[1], axis=1)
    logits = jnp.where(masked, -1e30, logits)
    w = jax.nn.softmax(logits, axis=-1)
    w = jnp.where(masked.all(-1, keepdims=True), 0.0, w)
    return jnp.einsum("bnqk,bknd->bqnd", w, vx)


CASES = [
    ("causal_document", lambda S: masks.causal_document([S // 3, S - S // 3])),
    ("global_sliding_window", lambda S: masks.global_sliding_window(S, 4, S // 8)),
    ("none_causal", lambda S: None),
]


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_soft_cap_forward_and_grad(impl, name, make):
    B, S, N, K, d, cap = 2, 96, 4, 2, 16, 0.7
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.standard_normal(s), jnp.float32) * 2
                  for s in [(B, S, N, d), (B, S, K, d), (B, S, K, d), (B, S, N, d)])
    mask = make(S)
    if mask is None:
        masked = jnp.triu(jnp.ones((S, S), bool), 1)[None, None]
        call = lambda q, k, v: jf.attention(q, k, v, causal=True, implementation=impl,  # noqa: E731
                                            logits_soft_cap=cap)
    else:
        masked = mask.to_dense()
        call = lambda q, k, v: jf.attention(q, k, v, mask, implementation=impl,  # noqa: E731
                                            logits_soft_cap=cap)
    scale = d ** -0.5
    ref = lambda q, k, v: dense_soft_capped(q, k, v, masked, scale, cap)  # noqa: E731
    np.testing.assert_allclose(call(q, k, v), ref(q, k, v), atol=2e-5, rtol=2e-5)
    # the cap changes the answer (it is not silently ignored)
    assert not np.allclose(jf.attention(q, k, v, mask, causal=mask is None, implementation=impl), ref(q, k, v),
                           atol=1e-3)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * g)  # noqa: E731
    got = jax.grad(loss(call), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=5e-5)


def test_soft_cap_bad_values_and_kernel_configs():
    """Bad caps raise on every path; each soft-cap kernel config is picked only with a cap and
    the kernel calls refuse a config that does not match (before anything is lowered)."""
    from jax_flashmask.backends.cuda import configs, ops

    for d in configs.HEAD_DIMS:
        for structure in configs.STRUCTURES:
            assert configs.forward_config(d, structure, True).soft_cap
            assert not configs.forward_config(d, structure, False).soft_cap
        for det in (False, True):
            for margin in (0, 8):
                assert configs.backward_config(d, det, margin, True).soft_cap
                assert not configs.backward_config(d, det, margin, False).soft_cap
    x = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    bounds = jnp.zeros((1, 1, 4, 128), jnp.int32)
    with pytest.raises(ValueError, match="soft cap"):
        ops.run_forward(configs.FWD_D64, x, x, x, bounds, scale=1.0, logits_soft_cap=30.0)
    with pytest.raises(ValueError, match="soft cap"):
        ops.run_forward(configs.FWD_D64_SOFTCAP, x, x, x, bounds, scale=1.0)
    q = jnp.zeros((1, 8, 2, 8))
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="logits_soft_cap"):
            jf.attention(q, q, q, implementation="xla", logits_soft_cap=bad)
