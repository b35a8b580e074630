"""GPU tests of the sm_90a FlashMask backward kernels (jax_flashmask.backends.cuda).

Skipped unless the compiled extension and a Hopper GPU are present. Every backward config compiled
for a head dim (configs.BACKWARD_CONFIGS) runs in the default and the deterministic mode; dq / dk /
dv (and the lse cotangent path) are compared against a dense float64 NumPy reference on the upcast
inputs, with fresh random inputs (the seed is printed on failure).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from _gpu_bounds import causal_bounds, random_bounds
from jax_flashmask.backends import cuda
from jax_flashmask.backends.cuda import configs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.is_available(), reason=f"CUDA kernels unavailable: {cuda.unavailable_reason()}"),
]


def bwd_configs(d, pred=lambda c: True):
    """The backward configs compiled for head dim d (a development build may lack some); the
    soft-cap configs have their own tests (test_cuda_softcap.py)."""
    got = [c for c in configs.BACKWARD_CONFIGS
           if c.head_dim == d and c.name in cuda.compiled_configs() and pred(c) and not c.soft_cap]
    if not got:
        pytest.skip(f"no backward config compiled for d={d}")
    return got


def _seed():
    return int(np.random.SeedSequence().entropy % (2**32))


def _bwd(cfg, *args, scale, deterministic=False, sm_margin=0):
    return cuda.run_backward(cfg, *args, scale=scale, deterministic=deterministic, sm_margin=sm_margin)


def reference_grads(q, k, v, bounds, dout, dlse, scale):
    """float64 (out, lse, dq, dk, dv); fully masked rows: out 0, lse -inf, zero gradients."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    dlse = np.asarray(dlse, np.float64)
    bounds = np.asarray(bounds)
    B, Sq, N, d = q.shape
    Sk, K, Hm = k.shape[1], k.shape[2], bounds.shape[1]
    G = N // K
    kk = np.repeat(k, G, axis=2).transpose(0, 2, 1, 3)  # [B,N,Sk,d]
    vv = np.repeat(v, G, axis=2).transpose(0, 2, 1, 3)
    qt = q.transpose(0, 2, 1, 3)
    dot = dout.transpose(0, 2, 1, 3)
    s = np.matmul(qt, kk.transpose(0, 1, 3, 2)) * scale
    i = np.arange(Sq)[None, None, :, None]
    lts, lte, uts, ute = (bounds[:, :, c, None, :] for c in range(4))
    masked = ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))
    masked = np.repeat(masked, N // Hm, axis=1)
    s = np.where(masked, -np.inf, s)
    m = s.max(-1, keepdims=True)
    empty = ~np.isfinite(m)
    p = np.where(masked, 0.0, np.exp(s - np.where(empty, 0.0, m)))
    l = p.sum(-1, keepdims=True)
    p = p / np.where(l > 0, l, 1.0)
    out = np.matmul(p, vv)
    lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)[..., 0]
    dl = dlse.transpose(0, 2, 1)[..., None]  # [B,N,Sq,1]
    dp = np.matmul(dot, vv.transpose(0, 1, 3, 2))
    delta = (dot * out).sum(-1, keepdims=True) - dl
    ds = p * (dp - delta)
    dq = np.matmul(ds, kk) * scale
    dk = np.matmul(ds.transpose(0, 1, 3, 2), qt) * scale
    dv = np.matmul(p.transpose(0, 1, 3, 2), dot)
    dk = dk.reshape(B, K, G, Sk, d).sum(2)
    dv = dv.reshape(B, K, G, Sk, d).sum(2)
    return (out.transpose(0, 2, 1, 3), lse.transpose(0, 2, 1), dq.transpose(0, 2, 1, 3),
            dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), empty[..., 0].transpose(0, 2, 1))


def _inputs(rng, B, Sq, Sk, N, K, d, dtype):
    f = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32), dtype)  # noqa: E731
    return f(B, Sq, N, d), f(B, Sk, K, d), f(B, Sk, K, d), f(B, Sq, N, d)


def _relerr(x, ref):
    x = np.asarray(x, np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)


def _check(q, k, v, dout, bounds, *, cfg=None, det=False, scale=None, seed=None, with_dlse=True,
           rng=None, fn=None):
    """Forward with the CUDA kernel, backward with `cfg` (or `fn`), vs float64."""
    d = q.shape[-1]
    scale = float(d ** -0.5) if scale is None else scale
    rng = rng or np.random.default_rng(0)
    B, Sq, N, _ = q.shape
    dlse = (jnp.asarray(rng.standard_normal((B, Sq, N), np.float32)) if with_dlse
            else jnp.zeros((B, Sq, N), jnp.float32))
    bj = jnp.asarray(bounds)
    out, lse = cuda.forward(q, k, v, bj, scale=scale)
    f32 = lambda x: np.asarray(x.astype(jnp.float32))  # noqa: E731
    ro, rl, rdq, rdk, rdv, empty = reference_grads(f32(q), f32(k), f32(v), bounds, f32(dout),
                                                   np.asarray(dlse), scale)
    call = fn or (lambda *a: _bwd(cfg, *a, scale=scale, deterministic=det))
    dq, dk, dv = call(q, k, v, bj, out, lse, dout, dlse if with_dlse else None)
    msg = (f"seed={seed} {getattr(cfg, 'name', 'fn')} det={det} q={q.shape} k={k.shape} "
           f"bounds={np.shape(bounds)} dtype={q.dtype}")
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape, msg
    assert dq.dtype == q.dtype and dk.dtype == k.dtype and dv.dtype == v.dtype, msg
    tol = 2e-2 if q.dtype == jnp.bfloat16 else 6e-3
    for name, x, r in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        x = f32(x)
        assert not np.isnan(x).any(), f"{name} NaN {msg}"
        err = _relerr(x, r)
        assert err < tol, f"{name} rel err {err:.3e} >= {tol} {msg}"
    # fully masked query rows: exact zero dq
    dqn = f32(dq)
    assert np.all(dqn[empty] == 0.0), f"dq not exactly 0 on fully masked rows {msg}"
    return dq, dk, dv


def _bits(xs):
    return [np.asarray(x).view(np.uint16) for x in xs]


def _assert_same_bits(a, b, msg):
    for name, x, y in zip(("dq", "dk", "dv"), _bits(a), _bits(b)):
        assert np.array_equal(x, y), f"{name} differs: {msg}"


def _assert_equal(x, y, msg):
    np.testing.assert_array_equal(np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32)),
                                  err_msg=msg)


ALL = [c.name for c in configs.BACKWARD_CONFIGS if not c.soft_cap]


def _cfg(name):
    c = configs.config_by_name(name)
    bwd_configs(c.head_dim, lambda x: x == c)
    return c


# --------------------------------------------------------------------------- the 12 families


def _suite(S, seed, batch=1):
    masks = pytest.importorskip("jax_flashmask.masks")
    suite = masks.benchmark_suite(S, seed, batch=batch)
    return {name: np.asarray(masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S))
            for name, m in suite.items()}


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_mask_families(name, det):
    cfg = _cfg(name)
    seed = _seed()
    rng = np.random.default_rng(seed)
    S = 1000 if cfg.head_dim < 256 else 400
    suite = _suite(S, seed, 1)
    assert len(suite) == 12
    q, k, v, do = _inputs(rng, 1, S, S, 4, 2, cfg.head_dim, jnp.bfloat16)
    for mask, b in suite.items():
        _check(q, k, v, do, b, cfg=cfg, det=det, seed=f"{seed} mask={mask}", rng=rng)


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_dtypes(name, dtype):
    cfg = _cfg(name)
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 300, 333
    q, k, v, do = _inputs(rng, 2, Sq, Sk, 4, 2, cfg.head_dim, dtype)
    _check(q, k, v, do, random_bounds(rng, 2, 2, Sq, Sk), cfg=cfg, seed=seed, rng=rng)
    _check(q, k, v, do, causal_bounds(2, 1, Sq, Sk), cfg=cfg, seed=seed, rng=rng, with_dlse=False)
    _check(q, k, v, do, causal_bounds(2, 1, Sq, Sk), cfg=cfg, det=True, seed=seed, rng=rng)


@pytest.mark.parametrize("N,K,Hm", [(8, 8, 1), (8, 2, 2), (8, 1, 8), (8, 2, 8), (8, 1, 1), (6, 3, 3)])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gqa_mqa_mask_heads(d, N, K, Hm):
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 200, 260
    b = random_bounds(rng, 1, Hm, Sq, Sk)
    q, k, v, do = _inputs(rng, 1, Sq, Sk, N, K, d, jnp.bfloat16)
    for cfg in bwd_configs(d):
        _check(q, k, v, do, b, cfg=cfg, seed=seed, rng=rng)


@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 129), (127, 127), (129, 1000), (1000, 129), (513, 64),
                                   (65, 1), (1, 65), (63, 64), (257, 63)])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_ragged_lengths(d, Sq, Sk):
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v, do = _inputs(rng, 1, Sq, Sk, 2, 1, d, jnp.bfloat16)
    for cfg in bwd_configs(d):
        det = (Sq + Sk) % 2 == 1
        _check(q, k, v, do, random_bounds(rng, 1, 1, Sq, Sk), cfg=cfg, det=det, seed=seed, rng=rng)
        _check(q, k, v, do, causal_bounds(1, 1, Sq, Sk), cfg=cfg, det=not det, seed=seed, rng=rng)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fully_masked_rows_and_columns(d):
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 300, 400
    q, k, v, do = _inputs(rng, 1, Sq, Sk, 2, 2, d, jnp.bfloat16)
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 0], b[:, :, 1] = 10, 150  # rows 10..149 masked for every column
    b[:, :, 2], b[:, :, 3] = 290, 300  # and rows 290..299
    b[:, :, 0, 128:256] = 0  # and key columns 128..255 masked for every row (whole key blocks)
    b[:, :, 1, 128:256] = Sq
    everything = np.zeros((1, 1, 4, Sk), np.int32)
    everything[:, :, 1] = Sq
    out, lse = cuda.forward(q, k, v, jnp.asarray(everything), scale=0.1)
    dlse = jnp.asarray(rng.standard_normal((1, Sq, 2), np.float32))
    for cfg in bwd_configs(d):
        for det in (False, True):
            dq, dk, dv = _check(q, k, v, do, b, cfg=cfg, det=det, seed=seed, rng=rng)
            for x in (dk, dv):
                assert np.all(np.asarray(x[:, 128:256].astype(jnp.float32)) == 0.0)
            dq, dk, dv = _bwd(cfg, q, k, v, jnp.asarray(everything), out, lse, do, dlse, scale=0.1,
                              deterministic=det)
            for x in (dq, dk, dv):
                assert np.all(np.asarray(x.astype(jnp.float32)) == 0.0)


def test_jit_and_vmap():
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v, do = _inputs(rng, 2, 160, 200, 4, 2, 128, jnp.bfloat16)
    b = random_bounds(rng, 2, 2, 160, 200)
    f = jax.jit(lambda *a: cuda.backward(*a, scale=128 ** -0.5))
    _check(q, k, v, do, b, seed=seed, rng=rng, fn=f)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_many_key_blocks_and_heads(d):
    """Several CTAs reduce into the same dQ tiles; dK / dV do not depend on the mode (the same
    walk and products): bitwise equal between the default and the deterministic mode."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S, N, K = 2, 700, 6, 2
    b = causal_bounds(B, 1, S, S)
    q, k, v, do = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    for cfg in bwd_configs(d):
        r1 = _check(q, k, v, do, b, cfg=cfg, seed=seed, rng=rng, with_dlse=False)
        r0 = _check(q, k, v, do, b, cfg=cfg, det=True, seed=seed, rng=rng, with_dlse=False)
        for x, y in zip(r1[1:], r0[1:]):
            _assert_equal(x, y, f"{cfg.name} dK / dV default vs deterministic")


@pytest.mark.parametrize("name", [c.name for c in configs.BACKWARD_CONFIGS
                                  if not c.persistent and not c.soft_cap])
@pytest.mark.parametrize("N,K", [(8, 8), (8, 2)])
def test_zero_ahead_on_a_dirty_workspace(N, K, name):
    """The one-CTA-per-item kernels zero each (kv head, batch) pair's dQ rows one pair ahead of
    their use (epilogue.cuh bwd_zero_unit; the prep kernel zeroes the first pair only). A backward
    of other inputs of the same shape first leaves its fp32 accumulator in the allocator's pool, so
    a pair left unzeroed would carry its sums into this one. 4 x 8 or 4 x 2 pairs of 8 key blocks:
    more CTAs than SMs, so pairs wait across waves. Both modes, against the reference."""
    cfg = _cfg(name)
    d = cfg.head_dim
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S = 4, 1000
    b = causal_bounds(B, 1, S, S)
    dirty = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    q, k, v, do = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    for det in (False, True):
        bj = jnp.asarray(b)
        out, lse = cuda.forward(dirty[0], dirty[1], dirty[2], bj, scale=0.1)
        jax.block_until_ready(_bwd(cfg, *dirty[:3], bj, out, lse, dirty[3], None, scale=0.1,
                                   deterministic=det))
        _check(q, k, v, do, b, cfg=cfg, det=det, scale=0.1, seed=f"{seed} det={det}", rng=rng)


@pytest.mark.parametrize("d", [128, 256])
def test_vmap_matches_batched(d):
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v, do = _inputs(rng, 3, 150, 190, 4, 2, d, jnp.bfloat16)
    b = jnp.asarray(random_bounds(rng, 3, 2, 150, 190))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    for det in (False, True):
        ref = cuda.backward(q, k, v, b, out, lse, do, None, scale=0.1, deterministic=det)
        vf = jax.jit(jax.vmap(lambda *a: cuda.backward(*(x[None] for x in a), None, scale=0.1,
                                                       deterministic=det)))
        got = vf(q, k, v, b, out, lse, do)
        for x, y in zip(got, ref):
            if det:
                _assert_equal(x[:, 0], y, f"vmap d={d} det={det}")
            else:  # dQ's reduce-adds land in any order (three key blocks at d = 256): rounding only
                np.testing.assert_allclose(np.asarray(x[:, 0], np.float32), np.asarray(y, np.float32),
                                           rtol=2e-2, atol=2e-2, err_msg=f"vmap d={d}")


@pytest.mark.parametrize("d", [64, 128, 256])
def test_backward_matches_portable(d):
    """`backward` (the kernel where compiled, else the portable fallback itself) agrees with the
    portable backward, in both modes."""
    from jax_flashmask.backends import portable
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v, do = _inputs(rng, 1, 200, 230, 6, 2, d, jnp.bfloat16)
    b = jnp.asarray(random_bounds(rng, 1, 6, 200, 230))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    dlse = jnp.asarray(rng.standard_normal((1, 200, 6), np.float32))
    for det in (False, True):
        got = cuda.backward(q, k, v, b, out, lse, do, dlse, scale=0.1, deterministic=det)
        ref = portable.backward(q, k, v, b, out, lse, do, dlse, scale=0.1, deterministic=det)
        for name, x, y in zip(("dq", "dk", "dv"), got, ref):
            y = np.asarray(y.astype(jnp.float32), np.float64)
            err = _relerr(np.asarray(x.astype(jnp.float32)), y)
            assert err < 2e-2, f"{name} rel err {err:.3e} seed={seed} d={d} det={det}"


def test_grad_through_attention_uses_the_cuda_backward():
    """jax.grad of `attention(implementation="cuda")` lowers to the backward custom call."""
    import jax_flashmask as jf
    from jax_flashmask import masks

    bwd_configs(128)
    rng = np.random.default_rng(_seed())
    S, N, K, d = 333, 4, 2, 128
    q = jnp.asarray(rng.standard_normal((1, S, N, d)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((1, S, K, d)), jnp.bfloat16) for _ in range(2))
    mask = masks.from_segment_ids(np.repeat([0, 1, 2], [100, 150, 83]))

    def loss(q, k, v, impl):
        return jnp.sum(jf.attention(q, k, v, mask, implementation=impl).astype(jnp.float32) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    hlo = grad.lower(q, k, v, "cuda").as_text()
    assert cuda.BWD_TARGET in hlo and cuda.FWD_TARGET in hlo
    up = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.grad(loss, argnums=(0, 1, 2))(*up, "reference")
    for g, w in zip(grad(q, k, v, "cuda"), want):
        g = np.asarray(g, np.float64)
        w = np.asarray(w, np.float64)
        assert np.isfinite(g).all()
        assert np.linalg.norm(g - w) / np.linalg.norm(w) < 2e-2


def test_deterministic_flag_and_config_reach_the_kernel():
    """attention(deterministic=True) lowers to the backward custom call with deterministic = 1, the
    table's deterministic config and the ordering-bit workspace at its query-tile rows."""
    import re
    import jax_flashmask as jf
    bwd_configs(128)
    rng = np.random.default_rng(0)
    q, k, v, do = _inputs(rng, 1, 300, 300, 4, 2, 128, jnp.bfloat16)

    def lowered(det):
        loss = lambda q, k, v: jnp.sum(jf.attention(  # noqa: E731
            q, k, v, causal=True, implementation="cuda", deterministic=det).astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()

    on, off = lowered(True), lowered(False)
    assert re.search(r"deterministic = 1", on) and re.search(r"deterministic = 0", off)
    det_cfg, cfg = configs.backward_config(128, True), configs.backward_config(128, False)
    assert f'config = "{det_cfg.name}"' in on and f'config = "{cfg.name}"' in off
    assert f"tensor<1x4x{-(-300 // det_cfg.block_m)}x1xi32>" in on


# --------------------------------------------------------------------------- deterministic mode


def _check_twice_bitwise(q, k, v, do, b, seed, case, *, scale, cfg, msg):
    """Deterministic gradients of `cfg` against the reference, twice with another backward in
    between: bitwise the same both times."""
    det = jax.jit(lambda *a: _bwd(cfg, *a, scale=scale, deterministic=True))
    first = _check(q, k, v, do, b, seed=f"{seed} {case}", rng=np.random.default_rng(seed), fn=det)
    _bwd(cfg, q, k, v, jnp.asarray(b), *cuda.forward(q, k, v, jnp.asarray(b), scale=0.1), do, None,
         scale=0.1)
    second = _check(q, k, v, do, b, seed=f"{seed} {case}", rng=np.random.default_rng(seed), fn=det)
    _assert_same_bits(first, second, msg)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("case", ["causal", "full", "document", "random_gqa", "random_hm_n",
                                  "sliding_window", "many_words"])
def test_deterministic_bitwise(case, name):
    """deterministic=True: two runs give bit-identical dq/dk/dv (several CTAs add into every dQ
    tile), and the gradients are as accurate as the default mode's."""
    cfg = _cfg(name)
    d = cfg.head_dim
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, Sq, Sk, N, K = 2, 900, 900, 4, 2
    if case == "causal":
        b = causal_bounds(B, 1, Sq, Sk)
    elif case == "full":
        b = np.zeros((B, 1, 4, Sk), np.int32); b[:, :, :2] = Sq
    elif case in ("document", "sliding_window"):
        b = np.broadcast_to(_suite(Sq, seed, B)[case], (B, 1, 4, Sk)).copy()
    elif case == "random_gqa":
        N, K = 8, 2
        b = random_bounds(rng, B, 2, Sq, Sk)
    elif case == "random_hm_n":
        b = random_bounds(rng, B, N, Sq, Sk)
    else:  # 36 key blocks: the ordering bits span two words per query tile
        B, Sq, Sk, N, K = 1, 200, 4500 if d < 256 else 2300, 2, 1
        b = random_bounds(rng, B, 1, Sq, Sk, p_unmasked=0.8)
    q, k, v, do = _inputs(rng, B, Sq, Sk, N, K, d, jnp.bfloat16)
    _check_twice_bitwise(q, k, v, do, b, seed, case, scale=d ** -0.5, cfg=cfg,
                         msg=f"seed={seed} case={case} {name}")


@pytest.mark.parametrize("name", ALL)
def test_deterministic_large_many_ctas(name):
    """Many concurrent CTAs per query tile (64 key blocks, chains longer than the waves): repeated
    runs bit-identical, and equal to the default mode up to fp32 summation order."""
    cfg = _cfg(name)
    rng = np.random.default_rng(1)
    B, S, N, K = (2, 8192, 8, 2) if cfg.head_dim < 256 else (2, 4096, 4, 2)
    q, k, v, do = _inputs(rng, B, S, S, N, K, cfg.head_dim, jnp.bfloat16)
    for b in (causal_bounds(B, 1, S, S), np.tile(np.array([S, S, 0, 0], np.int32)[None, None, :, None], (B, 1, 1, S))):
        bj = jnp.asarray(b)
        out, lse = cuda.forward(q, k, v, bj, scale=0.1)
        f = jax.jit(lambda *a, det: _bwd(cfg, *a, None, scale=0.1, deterministic=det),
                    static_argnames="det")
        runs = [f(q, k, v, bj, out, lse, do, det=True) for _ in range(3)]
        for r in runs[1:]:
            _assert_same_bits(runs[0], r, f"large case {name}")
        ref = f(q, k, v, bj, out, lse, do, det=False)
        for x, y in zip(runs[0], ref):
            x, y = np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32), np.float64)
            assert _relerr(x, y) < 1e-2


@pytest.mark.parametrize("d", [64, 128])
def test_configs_agree(d):
    """The configs of one head dim compute the same gradients up to fp32 summation order."""
    cfgs = bwd_configs(d)
    if len(cfgs) < 2:
        pytest.skip(f"one backward config compiled for d={d}")
    rng = np.random.default_rng(3)
    q, k, v, do = _inputs(rng, 2, 1500, 1500, 8, 2, d, jnp.bfloat16)
    b = jnp.asarray(random_bounds(rng, 2, 2, 1500, 1500))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    got = [_bwd(c, q, k, v, b, out, lse, do, None, scale=0.1, deterministic=True) for c in cfgs]
    for c, r in zip(cfgs[1:], got[1:]):
        for x, y in zip(got[0], r):
            x, y = np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32), np.float64)
            assert _relerr(x, y) < 1e-2, f"{c.name} vs {cfgs[0].name}"


# --------------------------------------------------------------------------- persistent grid


@pytest.mark.parametrize("d", [64, 128])
def test_sm_margin_identical_results(d):
    """sm_margin only changes how many persistent CTAs share the items: deterministic results are
    bitwise identical for every margin (1 CTA included: margin >= the SM count), dK / dV also in
    the default mode; the one-CTA-per-item configs ignore it."""
    cfgs = bwd_configs(d)
    rng = np.random.default_rng(12)
    B, S, N, K = 2, 2048, 8, 4
    q, k, v, do = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    b = jnp.asarray(random_bounds(rng, B, 2, S, S))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    for cfg in cfgs:
        for det in (True, False):
            runs = {m: _bwd(cfg, q, k, v, b, out, lse, do, None, scale=0.1, deterministic=det,
                            sm_margin=m) for m in ((0, 1, 8, 100, 131, 100000) if cfg.persistent else (0, 64))}
            for m, r in runs.items():
                for i, (x, y) in enumerate(zip(runs[0], r)):
                    if i == 0 and not det:
                        assert _relerr(np.asarray(y.astype(jnp.float32)),
                                       np.asarray(x.astype(jnp.float32), np.float64)) < 1e-3
                        continue
                    _assert_equal(x, y, f"{cfg.name} sm_margin={m} output {i} det={det}")


@pytest.mark.parametrize("margin", [0, 129])
@pytest.mark.parametrize("case", ["random_gqa", "causal_ragged", "empty_items"])
@pytest.mark.parametrize("d", [64, 128])
def test_persistent_against_reference(d, case, margin):
    """The persistent grid (items heaviest first within L2 sections; margin 129: 3 CTAs on an
    H200, many items per CTA, both item slots, K / V reloads, the tile counters wrapping across
    items) against the float64 reference, both modes."""
    cfg = _cfg(configs.backward_config(d, False, 1).name)
    rng = np.random.default_rng(11)
    if case == "random_gqa":      # GQA 8 / 2, two mask heads with random masks
        B, Sq, Sk, N, K = 2, 1100, 1300, 8, 2
        b = random_bounds(rng, B, 2, Sq, Sk)
    elif case == "causal_ragged":  # ragged Sk (last key block partial), heavy-first order matters
        B, Sq, Sk, N, K = 1, 2000, 1999, 4, 4
        b = causal_bounds(B, 1, Sq, Sk)
    else:                          # key blocks with no kept query tile (dK = dV = 0 items)
        B, Sq, Sk, N, K = 2, 700, 1500, 4, 2
        b = np.zeros((B, 1, 4, Sk), np.int32)
        b[:, :, 0] = 0; b[:, :, 1] = Sq  # fully masked columns ...
        b[:, :, :, 300:900] = np.array([Sq, Sq, 0, 0], np.int32)[None, None, :, None]  # ... but these
    q, k, v, do = _inputs(rng, B, Sq, Sk, N, K, d, jnp.bfloat16)
    for det in (False, True):
        _check(q, k, v, do, b, seed=f"persistent {case}", rng=rng, fn=lambda *a: _bwd(
            cfg, *a, scale=d ** -0.5, deterministic=det, sm_margin=margin))


def test_sm_margin_validation():
    rng = np.random.default_rng(0)
    q, k, v, do = _inputs(rng, 1, 128, 128, 2, 2, 128, jnp.bfloat16)
    b = jnp.asarray(causal_bounds(1, 1, 128, 128))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="sm_margin"):
            cuda.backward(q, k, v, b, out, lse, do, None, scale=0.1, sm_margin=bad)


# --------------------------------------------------------------------------- the O(1) tile walk


def _jump_bounds(rng, B, Hm, Sq, Sk):
    """Per key column: rows [200, 600) and [0, 300) masked, with a few rows of jitter, on top of
    columns with document-like windows: key blocks whose skipped query tiles are two overlapping
    ranges, the second ending inside the first (the third jump of bwd_find_kept, at Bm = 64 and
    128 and at 64 or 128 keys per block), plus gaps in the middle of a key block's tiles and
    ragged last tiles."""
    b = np.empty((B, Hm, 4, Sk), np.int64)
    j = rng.integers(0, 9, (B, Hm, Sk))
    b[:, :, 0], b[:, :, 1] = 200 + j, 600 - j
    b[:, :, 2], b[:, :, 3] = j, 300 + j
    doc = (np.arange(Sk) // 128) % 3 == 1  # every third key block: a window [lo, hi) visible
    lo = rng.integers(0, Sq, (B, Hm, 1)) + np.zeros((1, 1, Sk), np.int64)
    hi = np.minimum(lo + 150, Sq)
    b[:, :, 0] = np.where(doc, hi, b[:, :, 0])
    b[:, :, 1] = np.where(doc, Sq, b[:, :, 1])
    b[:, :, 2] = np.where(doc, 0, b[:, :, 2])
    b[:, :, 3] = np.where(doc, lo, b[:, :, 3])
    return np.clip(b, 0, Sq).astype(np.int32)


@pytest.mark.parametrize("name", ALL)
def test_walk_jumps(name):
    """Every kernel walks a key block's query tiles with the O(1) walk of bwd_find_kept: bounds
    whose key blocks need all three jumps, windows in the middle of a key block's tiles, ragged
    Sq, GQA 4 query heads per kv head with a mask head each (the walk restarts per head, on other
    bounds), against the float64 reference in the default and the deterministic mode (bitwise
    repeatable)."""
    cfg = _cfg(name)
    d = cfg.head_dim
    rng = np.random.default_rng(17)
    B, Sq, Sk, N, K = 2, 1000, 900, 8, 2
    b = _jump_bounds(rng, B, N, Sq, Sk)
    q, k, v, do = _inputs(rng, B, Sq, Sk, N, K, d, jnp.bfloat16)
    _check(q, k, v, do, b, cfg=cfg, seed="jumps", rng=rng)
    det = jax.jit(lambda *a: _bwd(cfg, *a, scale=d ** -0.5, deterministic=True))
    r1 = _check(q, k, v, do, b, seed="jumps det", rng=np.random.default_rng(1), fn=det)
    r2 = _check(q, k, v, do, b, seed="jumps det", rng=np.random.default_rng(1), fn=det)
    _assert_same_bits(r1, r2, f"jumps {name}")


@pytest.mark.parametrize("d,S", [(128, 8192), (256, 4096)])
def test_clocked_walk(d, S):
    """The default d = 128 (80-row) and d = 256 kernels walk the key blocks that skip no query tile
    of their kv group from a clocked start where a kv head's Q / dO / dQ stream exceeds the L2
    (bwd_group_skips_none): 8 query heads on one kv head (8 x S x d x 8 bytes = 64 MB), full and
    prefix-LM masks. The deterministic mode keeps the ascending walk: the two agree up to fp32
    summation order."""
    cfg = _cfg(configs.backward_config(d).name)
    masks = pytest.importorskip("jax_flashmask.masks")
    rng = np.random.default_rng(_seed())
    B, N, K = 1, 8, 1
    q, k, v, do = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    suite = masks.benchmark_suite(S, 0, batch=B)
    for name in ("full", "prefix_lm_causal"):
        m = suite[name]
        bj = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
        out, lse = cuda.forward(q, k, v, bj, scale=0.1)
        clocked = _bwd(cfg, q, k, v, bj, out, lse, do, None, scale=0.1)
        ascending = _bwd(cfg, q, k, v, bj, out, lse, do, None, scale=0.1, deterministic=True)
        for x, y in zip(clocked, ascending):
            x, y = np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32), np.float64)
            assert np.isfinite(x).all() and _relerr(x, y) < 1e-2, name


# --------------------------------------------------------------------------- head dim 256 kernel


def test_d256_workspaces_use_64_key_blocks():
    """The d=256 kernel's metadata and ordering bits are sized at 64 keys per block: Sk = 2100 is
    33 blocks of 64 (two ordering words per query tile; one word at 128)."""
    import re
    cfg = _cfg(configs.backward_config(256).name)
    rng = np.random.default_rng(0)
    q, k, v, do = _inputs(rng, 1, 100, 2100, 2, 1, 256, jnp.bfloat16)
    b = jnp.asarray(causal_bounds(1, 1, 100, 2100))
    out, lse = cuda.forward(q, k, v, b, scale=0.1)
    f = jax.jit(lambda *a: _bwd(cfg, *a, scale=256 ** -0.5, deterministic=True))
    hlo = f.lower(q, k, v, b, out, lse, do, None).as_text()
    assert "tensor<1x2x2x2xi32>" in hlo  # [B, N, query tiles, ceil(33 / 32)]
    # metadata at 64 keys, the scheduler area, the orders, the zeroing counters (K * B), the
    # unseen-column words (as the metadata), the empty-row flags [B, N, ceil(100 / 64)]
    assert re.search(r"tensor<%dxi32>" % (1 * 1 * 8 * 33 + 4 + 33 + 33 + 1 + 1 * 1 * 8 * 33 + 1 * 2 * 2), hlo)
    _check(q, k, v, do, np.asarray(b), seed=0, rng=rng, fn=f)


# ----------------------------------------------------- the deterministic key-block order


@functools.cache
def _protocol():
    """tests/det_sim/bwd_det_protocol.py: the host twins of the deterministic launch pre-passes."""
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "det_sim" / "bwd_det_protocol.py"
    spec = importlib.util.spec_from_file_location("bwd_det_protocol", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bwd_det_protocol", mod)
    spec.loader.exec_module(mod)
    return mod


def _host_group(b, Sq, N, K):
    """The 80-row kernel's launch group size for this launch (host twin of bwd_det_group80_kernel)."""
    return _protocol().Problem(np.asarray(b), Sq, N, K, Bm=80).auto_group19()


def _host_reorders(b, Sq, N, K, d=128):
    """Whether the deterministic pre-pass reorders the key blocks of this launch at head dim d
    (host twin: the inverted-tails branch of the launch-group rule) at the tiles of d's
    deterministic config: 80-row tiles / 128-key blocks at d = 128, 128 / 128 at d = 64, 64 / 64
    at d = 256."""
    Bm, Bn = {128: (80, 128), 64: (128, 128), 256: (64, 64)}[d]
    return _protocol().Problem(np.asarray(b), Sq, N, K, Bm=Bm, Bn=Bn).order21() is not None


def _small_documents(B, S, rng, lo=150, hi=420):
    docs, t = [], 0
    while t < S:
        L = int(min(rng.integers(lo, hi), S - t))
        docs.append(L)
        t += L
    starts = np.cumsum([0] + docs)
    b = np.zeros((B, 1, 4, S), np.int32)
    for d0, d1 in zip(starts[:-1], starts[1:]):
        b[:, :, 0, d0:d1] = d1
        b[:, :, 1, d0:d1] = S
        b[:, :, 2, d0:d1] = 0
        b[:, :, 3, d0:d1] = d0
    return b


def _blockwise_per_head(B, N, S, rng):
    """causal_blockwise bounds [B, N, 4, S] with other documents in every (batch, head)."""
    masks = pytest.importorskip("jax_flashmask.masks")
    out = np.zeros((B, N, 4, S), np.int32)
    for b in range(B):
        for h in range(N):
            docs, t = [], 0
            while t < S:
                docs.append(int(min(rng.integers(60, 500), S - t)))
                t += docs[-1]
            m = masks.causal_blockwise(docs)
            out[b, h] = np.asarray(masks.canonical_bounds(m.startend_row_indices, causal=True,
                                                          q_len=S))[0, 0]
    return out


def _per_mask_args(rng, dims, bs, d=128):
    """(q, k, v, dO) at dims = (B, Sq, Sk, N, K) and head dim d (bf16), and an iterator over the
    masks of bs giving the backward arguments (q, k, v, bounds, out, lse, dO, dLSE), out / lse
    from the forward at scale 0.1, dLSE random."""
    B, Sq, Sk, N, K = dims
    q, k, v, do = _inputs(rng, B, Sq, Sk, N, K, d, jnp.bfloat16)
    dlse = jnp.asarray(rng.standard_normal((B, Sq, N), np.float32))

    def per_mask():
        for b in bs:
            bj = jnp.asarray(b)
            out, lse = cuda.forward(q, k, v, bj, scale=0.1)
            yield (q, k, v, bj, out, lse, do, dlse)

    return (q, k, v, do), per_mask()


def _det_case(case, seed):
    """(rng, (B, Sq, Sk, N, K), masks) of the deterministic launch-order tests."""
    rng = np.random.default_rng(seed)
    if case == "groups":  # the rule's G > 1 on the first three (two or three launch groups)
        B, S, N, K = 3, 4096, 3, 3
        suite = _suite(S, 0, B)
        names = ("document", "global_sliding_window", "causal_blockwise", "full", "causal")
        bs = [np.broadcast_to(suite[m], (B, 1, 4, S)).copy() for m in names]
        assert [_host_group(b, S, N, K) for b in bs] == [8, 8, 4, 1, 1]
        return rng, (B, S, S, N, K), bs
    if case == "blockwise_heads":  # other documents per query head, GQA 4 / 2, ragged S
        B, S, N, K = 2, 2999, 4, 2
        return rng, (B, S, S, N, K), [_blockwise_per_head(B, N, S, rng)]
    if case == "blockwise_many":  # 40 pairs of a small blockwise mask (five launch groups)
        B, S, N, K = 5, 1600, 8, 8
        return rng, (B, S, S, N, K), [np.broadcast_to(_suite(S, 0, B)["causal_blockwise"], (B, 1, 4, S)).copy()]
    if case == "suite":
        B, Sq, Sk, N, K = 1, 1500, 1500, 4, 2
        return rng, (B, Sq, Sk, N, K), list(_suite(Sq, seed, B).values())
    if case == "small_docs":
        B, Sq, Sk, N, K = 3, 4096, 4096, 3, 3
        return rng, (B, Sq, Sk, N, K), [_small_documents(B, Sq, rng)]
    if case == "random_gqa_ragged":
        B, Sq, Sk, N, K = 2, 1100, 1301, 8, 2
        return rng, (B, Sq, Sk, N, K), [random_bounds(rng, B, N, Sq, Sk)]
    if case == "one_pair":
        B, Sq, Sk, N, K = 1, 2000, 2000, 1, 1
        return rng, (B, Sq, Sk, N, K), [causal_bounds(B, 1, Sq, Sk), _small_documents(B, Sq, rng)]
    if case == "empty_items":
        B, Sq, Sk, N, K = 2, 700, 1500, 4, 2
        b = np.zeros((B, 1, 4, Sk), np.int32)
        b[:, :, 0] = 0; b[:, :, 1] = Sq
        b[:, :, :, 300:900] = np.array([Sq, Sq, 0, 0], np.int32)[None, None, :, None]
        return rng, (B, Sq, Sk, N, K), [b]
    B, Sq, Sk, N, K = 1, 200, 4500, 2, 1  # many_words: two ordering-bit words per tile
    return rng, (B, Sq, Sk, N, K), [random_bounds(rng, B, 1, Sq, Sk, p_unmasked=0.8)]


@pytest.mark.parametrize("case", ["groups", "blockwise_heads", "blockwise_many", "suite", "small_docs",
                                  "random_gqa_ragged", "one_pair", "empty_items", "many_words"])
def test_det_launch_groups_against_the_plain_kernel(case):
    """The d = 128 deterministic config (launch groups and key-block order sized on the device)
    against the default config on the same masks: dK / dV bitwise equal in both modes (same walk,
    same products); dQ within 1e-3 (the same fp32 terms summed in another fixed order where the
    launch is reordered; bitwise where it is not, in deterministic mode); three deterministic runs
    bitwise equal. The blockwise cases must reorder."""
    det_cfg, cfg = _cfg(configs.backward_config(128, True).name), _cfg(configs.backward_config(128).name)
    rng, dims, bs = _det_case(case, 71)
    B, Sq, Sk, N, K = dims
    _, per_mask = _per_mask_args(rng, dims, bs, 128)
    det = jax.jit(lambda *a: _bwd(det_cfg, *a, scale=0.1, deterministic=True))
    reordered = [_host_reorders(b, Sq, N, K) for b in bs]
    if case.startswith("blockwise") or case == "groups":
        assert any(reordered), case
    for i, args in enumerate(per_mask):
        label = f"{det_cfg.name} case={case} mask {i} reordered={reordered[i]}"
        for det_mode in (False, True):
            r0 = _bwd(cfg, *args, scale=0.1, deterministic=det_mode)
            r = _bwd(det_cfg, *args, scale=0.1, deterministic=det_mode)
            _assert_equal(r0[1], r[1], f"dk {label} det={det_mode}")
            _assert_equal(r0[2], r[2], f"dv {label} det={det_mode}")
            if det_mode and not reordered[i]:
                _assert_equal(r0[0], r[0], f"dq {label} det={det_mode}")
            else:
                assert _relerr(np.asarray(r[0].astype(jnp.float32)),
                               np.asarray(r0[0].astype(jnp.float32), np.float64)) < 1e-3, label
        first = det(*args)
        for rep in range(1, 3):
            _assert_same_bits(first, det(*args), f"{label} (run {rep + 1})")


@pytest.mark.parametrize("mask", ["document", "global_sliding_window", "causal_blockwise", "full"])
def test_det_launch_groups_large_repeatable(mask):
    """Many-CTA launches (8K, B = 2, 8 query / 4 kv heads: 8 pairs, several waves on 132 SMs):
    three deterministic runs bitwise equal; dK / dV bitwise the plain kernel's."""
    det_cfg, cfg = _cfg(configs.backward_config(128, True).name), _cfg(configs.backward_config(128).name)
    B, S, N, K = 2, 8192, 8, 4
    b = np.broadcast_to(_suite(S, 0, B)[mask], (B, 1, 4, S)).copy()
    assert (_host_group(b, S, N, K) > 1) == (mask != "full")
    q, k, v, do = _inputs(np.random.default_rng(5), B, S, S, N, K, 128, jnp.bfloat16)
    bj = jnp.asarray(b)
    out, lse = cuda.forward(q, k, v, bj, scale=0.1)
    f = jax.jit(lambda *a, c: _bwd(c, *a, None, scale=0.1, deterministic=True), static_argnames="c")
    rs = [f(q, k, v, bj, out, lse, do, c=det_cfg) for _ in range(3)]
    for r in rs[1:]:
        _assert_same_bits(rs[0], r, f"large {mask}")
    r0 = f(q, k, v, bj, out, lse, do, c=cfg)
    _assert_equal(r0[1], rs[0][1], f"dk vs {cfg.name}")
    _assert_equal(r0[2], rs[0][2], f"dv vs {cfg.name}")


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("case", ["blockwise", "blockwise_heads", "document", "causal"])
def test_det_order_d64_d256(case, d):
    """At d = 64 and d = 256 the deterministic mode launches each pair's key blocks in the
    pre-pass's order where the tails are inverted (causal blockwise; blockwise_heads: other
    documents per query head, GQA 4 / 2, ragged S, the order from a pair's first head) and
    descending elsewhere (document, causal). Either way: dQ / dK / dV against the float64
    reference, three runs bitwise equal, dK / dV bitwise the default mode's (the same walk and
    products: only the dQ summation order moves). The blockwise cases must reorder, the others not."""
    cfg = _cfg(configs.backward_config(d, True).name)
    seed = _seed()
    rng = np.random.default_rng(seed)
    if case == "blockwise_heads":
        B, S, N, K = 2, 2999, 4, 2
        b = _blockwise_per_head(B, N, S, rng)
    else:
        B, S, N, K = 2, 3000, 4, 2
        name = "causal_blockwise" if case == "blockwise" else case
        b = np.broadcast_to(_suite(S, 0, B)[name], (B, 1, 4, S)).copy()
    assert _host_reorders(b, S, N, K, d) == case.startswith("blockwise"), case
    q, k, v, do = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    det = jax.jit(lambda *a: _bwd(cfg, *a, scale=d ** -0.5, deterministic=True))
    _check(q, k, v, do, b, seed=f"{seed} {case}", rng=np.random.default_rng(seed), fn=det)
    bj = jnp.asarray(b)
    out, lse = cuda.forward(q, k, v, bj, scale=d ** -0.5)
    runs = [det(q, k, v, bj, out, lse, do, None) for _ in range(3)]
    for r in runs[1:]:
        _assert_same_bits(runs[0], r, f"seed={seed} case={case} d={d}")
    default = _bwd(cfg, q, k, v, bj, out, lse, do, None, scale=d ** -0.5)
    _assert_equal(default[1], runs[0][1], f"dk det vs default, case={case} d={d}")
    _assert_equal(default[2], runs[0][2], f"dv det vs default, case={case} d={d}")
