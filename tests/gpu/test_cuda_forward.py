"""GPU tests of the sm_90a FlashMask forward kernels (jax_flashmask.backends.cuda).

Skipped unless the compiled extension and a Hopper GPU are present. Every case runs every forward
config compiled for its head dim (configs.FORWARD_CONFIGS) against a dense float64 NumPy
reference built inline from the canonical bounds, on fresh random inputs (the seed is printed in
failure messages).
"""

from __future__ import annotations

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

TOL = {jnp.bfloat16: (2.5e-2, 2.5e-2), jnp.float16: (4e-3, 4e-3)}


def _seed():
    return int(np.random.SeedSequence().entropy % (2**32))


def reference(q, k, v, bounds, scale):
    """Dense reference: float64, (out [B,Sq,N,d], lse [B,Sq,N]); masked rows -> 0, -inf."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    bounds = np.asarray(bounds)
    B, Sq, N, d = q.shape
    K, Hm = k.shape[2], bounds.shape[1]
    kk = np.repeat(k, N // K, axis=2)
    vv = np.repeat(v, N // K, axis=2)
    s = np.matmul(q.transpose(0, 2, 1, 3), kk.transpose(0, 2, 3, 1)) * scale  # [B,N,Sq,Sk]
    i = np.arange(Sq)[None, None, :, None]
    lts, lte, uts, ute = (bounds[:, :, c, None, :] for c in range(4))
    masked = ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))  # [B,Hm,Sq,Sk]
    masked = np.repeat(masked, N // Hm, axis=1)
    s = np.where(masked, -np.inf, s)
    m = s.max(-1, keepdims=True)
    empty = ~np.isfinite(m)
    p = np.exp(s - np.where(empty, 0.0, m))
    l = p.sum(-1, keepdims=True)
    out = np.matmul(p / np.where(l > 0, l, 1.0), vv.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    lse = np.where(l[..., 0] > 0, (m + np.log(np.where(l > 0, l, 1.0)))[..., 0], -np.inf)
    return out, np.transpose(lse, (0, 2, 1))


def _inputs(rng, B, Sq, Sk, N, K, d, dtype):
    q = rng.standard_normal((B, Sq, N, d), np.float32)
    k = rng.standard_normal((B, Sk, K, d), np.float32)
    v = rng.standard_normal((B, Sk, K, d), np.float32)
    return (jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(v, dtype))


def fwd_configs(d, pred=lambda c: True):
    """The forward configs compiled for head dim d (a development build may lack some); the
    soft-cap configs have their own tests (test_cuda_softcap.py)."""
    got = [c for c in configs.FORWARD_CONFIGS
           if c.head_dim == d and c.name in cuda.compiled_configs() and pred(c) and not c.soft_cap]
    if not got:
        pytest.skip(f"no forward config compiled for d={d}")
    return got


def _check(q, k, v, bounds, *, scale=None, seed=None, cfgs=None, fn=None):
    d = q.shape[-1]
    scale = float(d ** -0.5) if scale is None else scale
    ro, rl = reference(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), bounds, scale)
    empty = ~np.isfinite(rl)
    atol, rtol = TOL[jnp.dtype(q.dtype).type]
    if cfgs is None:
        cfgs = fwd_configs(d)
    runs = [("fn", fn)] if fn is not None else [(c.name, c) for c in cfgs]
    for label, what in runs:
        if fn is not None:
            out, lse = fn(q, k, v, jnp.asarray(bounds))
        else:
            out, lse = cuda.run_forward(what, q, k, v, jnp.asarray(bounds), scale=scale)
        out = np.asarray(out.astype(jnp.float32))
        lse = np.asarray(lse)
        msg = f"seed={seed} {label} q={q.shape} k={k.shape} bounds={np.shape(bounds)} dtype={q.dtype}"
        assert out.shape == q.shape and out.dtype == np.float32
        assert lse.shape == q.shape[:3] and lse.dtype == np.float32
        assert not np.isnan(out).any(), msg
        assert not np.isnan(lse).any(), msg
        # fully masked rows: exactly 0 and -inf
        assert np.all(lse[empty] == -np.inf), msg
        assert np.all(out[empty] == 0.0), msg
        assert np.all(np.isfinite(lse[~empty])), msg
        np.testing.assert_allclose(out, ro, atol=atol, rtol=rtol, err_msg=msg)
        np.testing.assert_allclose(lse[~empty], rl[~empty], atol=2e-3, rtol=2e-3, err_msg=msg)


# --------------------------------------------------------------------------- the 12 families


def _suite(S, seed, batch=1):
    masks = pytest.importorskip("jax_flashmask.masks")
    suite = masks.benchmark_suite(S, seed, batch=batch)
    return {name: np.asarray(masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S))
            for name, m in suite.items()}


@pytest.mark.parametrize("S", [1000, 2048])
def test_mask_families(S):
    seed = _seed()
    rng = np.random.default_rng(seed)
    B = 1 if S < 2048 else 2  # 2 x 16 x 8 = 256 query tiles: the persistent grid loops
    suite = _suite(S, seed, B)
    assert len(suite) == 12
    q, k, v = _inputs(rng, B, S, S, 8, 2, 128, jnp.bfloat16)
    for name, b in suite.items():
        _check(q, k, v, b, seed=f"{seed} mask={name}")


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_head_dims_dtypes(d, dtype):
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 300, 333
    q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
    _check(q, k, v, random_bounds(rng, 2, 2, Sq, Sk), seed=seed)
    _check(q, k, v, causal_bounds(2, 1, Sq, Sk), seed=seed)


@pytest.mark.parametrize("N,K,Hm", [(8, 8, 1), (8, 2, 2), (8, 1, 8), (8, 2, 8), (8, 1, 1), (6, 3, 3)])
def test_gqa_mqa_mask_heads(N, K, Hm):
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 200, 260
    q, k, v = _inputs(rng, 1, Sq, Sk, N, K, 128, jnp.bfloat16)
    _check(q, k, v, random_bounds(rng, 1, Hm, Sq, Sk), seed=seed)


@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 129), (127, 127), (129, 1000), (1000, 129), (256, 512),
                                   (513, 64), (65, 1)])
@pytest.mark.parametrize("d", [64, 256])
def test_ragged_lengths(Sq, Sk, d):
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, Sq, Sk, 2, 1, d, jnp.float16)
    _check(q, k, v, random_bounds(rng, 1, 1, Sq, Sk), seed=seed)
    _check(q, k, v, causal_bounds(1, 1, Sq, Sk), seed=seed)


@pytest.mark.parametrize("d", [64, 256])
def test_persistent_many_tiles(d):
    """More query tiles than SMs, so each persistent CTA walks several tiles."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S, N, K = 2, 1500, 12, 4
    q, k, v = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    _check(q, k, v, causal_bounds(B, 1, S, S), seed=seed)
    _check(q, k, v, random_bounds(rng, B, N, S, S), seed=seed)


def test_fully_masked_rows():
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 300, 400
    q, k, v = _inputs(rng, 1, Sq, Sk, 2, 2, 128, jnp.bfloat16)
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 0], b[:, :, 1] = 10, 150  # rows 10..149 masked for every column
    b[:, :, 2], b[:, :, 3] = 290, 300  # and rows 290..299
    _check(q, k, v, b, seed=seed)
    everything = np.zeros((1, 1, 4, Sk), np.int32)
    everything[:, :, 1] = Sq
    for c in fwd_configs(128):
        out, lse = cuda.run_forward(c, q, k, v, jnp.asarray(everything), scale=0.1)
        assert np.all(np.asarray(out.astype(jnp.float32)) == 0.0)
        assert np.all(np.asarray(lse) == -np.inf)


def test_batch_and_scale():
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 3, 190, 250, 4, 4, 64, jnp.bfloat16)
    _check(q, k, v, random_bounds(rng, 3, 4, 190, 250), scale=0.3, seed=seed)


def test_jit_and_vmap():
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 2, 160, 200, 4, 2, 128, jnp.bfloat16)
    b = random_bounds(rng, 2, 2, 160, 200)
    f = jax.jit(lambda q, k, v, b: cuda.forward(q, k, v, b, scale=128 ** -0.5))
    _check(q, k, v, b, seed=seed, fn=f)
    # vmap over a leading axis: each slice is its own [1, ...] problem
    vf = jax.jit(jax.vmap(lambda q, k, v, b: cuda.forward(q[None], k[None], v[None], b[None],
                                                          scale=128 ** -0.5)))
    out, lse = vf(q, k, v, jnp.asarray(b))
    ro, rl = f(q, k, v, jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(out[:, 0].astype(jnp.float32)), np.asarray(ro.astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(lse[:, 0]), np.asarray(rl))


def _assert_margins_identical(cfg, q, k, v, bounds, scale, msg, margins):
    """Output and LSE at every sm_margin in `margins` equal to sm_margin 0's bit for bit (every
    tile is computed by one CTA with the same instruction sequence whichever CTA it is); returns
    (out as float32, lse) as numpy arrays."""
    bounds = jnp.asarray(bounds)
    ro, rl = cuda.run_forward(cfg, q, k, v, bounds, scale=scale)
    ro, rl = np.asarray(ro.astype(jnp.float32)), np.asarray(rl)
    for margin in margins:
        o, l = cuda.run_forward(cfg, q, k, v, bounds, scale=scale, sm_margin=margin)
        m = f"{msg} dtype={q.dtype} {cfg.name} sm_margin={margin}"
        np.testing.assert_array_equal(np.asarray(o.astype(jnp.float32)), ro, err_msg=m)
        np.testing.assert_array_equal(np.asarray(l), rl, err_msg=m)
    return ro, rl


@pytest.mark.parametrize("d", [64, 128, 256])
def test_sm_margin_identical(d):
    """sm_margin > 0 (fewer persistent CTAs, each walking more tiles; 100000: one CTA) gives
    bit-identical outputs."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S, N, K = 2, 1100, 8, 2
    q, k, v = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    for b in (causal_bounds(B, 1, S, S), random_bounds(rng, B, 2, S, S)):
        for c in fwd_configs(d):
            _assert_margins_identical(c, q, k, v, b, d ** -0.5, f"seed={seed} d={d}",
                                      margins=(1, 16, 100, 131, 100000))
    with pytest.raises(ValueError):
        cuda.forward(q, k, v, jnp.asarray(b), scale=0.1, sm_margin=-1)


def test_attention_sm_margin_same_values_and_grads():
    """`jax_flashmask.attention(..., sm_margin=)` reaches both Hopper kernels and changes nothing
    but the grid: output and gradients equal those with every SM (bitwise in deterministic mode)."""
    import jax_flashmask as jf

    rng = np.random.default_rng(_seed())
    q, k, v = _inputs(rng, 1, 700, 700, 4, 2, 128, jnp.bfloat16)
    mask = jf.masks.causal_document([300, 250, 150])

    def run(margin):
        f = lambda q, k, v: jnp.sum(jf.attention(q, k, v, mask, implementation="cuda",  # noqa: E731
                                                 deterministic=True, sm_margin=margin).astype(jnp.float32))
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)

    (l0, g0), (l8, g8) = run(0), run(120)
    np.testing.assert_array_equal(np.asarray(l0), np.asarray(l8))
    for a, b in zip(g0, g8):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


def _portable_close(cfg, q, k, v, bounds, scale, msg):
    """The kernel against the portable blocked forward (float32 inputs) where a float64 dense
    reference would not fit: the same -inf rows, values within the bf16 / fp16 tolerance."""
    from jax_flashmask.backends import portable

    b = jnp.asarray(bounds)
    o, l = cuda.run_forward(cfg, q, k, v, b, scale=scale)
    ro, rl = portable.forward(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                              b, scale=scale)
    o, l, ro, rl = (np.asarray(x.astype(jnp.float32)) for x in (o, l, ro, rl))
    atol, rtol = TOL[jnp.dtype(q.dtype).type]
    np.testing.assert_array_equal(np.isfinite(l), np.isfinite(rl), err_msg=msg)
    fin = np.isfinite(rl)
    np.testing.assert_allclose(l[fin], rl[fin], atol=2e-3, rtol=2e-3, err_msg=msg)
    assert np.all(o[~fin] == 0.0), msg
    np.testing.assert_allclose(o, ro, atol=atol, rtol=rtol, err_msg=msg)
    return o, l


@pytest.mark.parametrize("d", [64, 128, 256])
def test_group_walk_on(d):
    """The group walk's second metadata level is on from 3 groups of 32 key blocks: the 12 mask
    families at S = 12800 (d = 256, 64-key blocks: 6400), large logits, and a cross-attention case
    with more than 32 groups (two group ballots per query tile), kept windows separated by skipped
    groups, a ragged last key block and a query tile that keeps no block at all."""
    cfgs = fwd_configs(d, lambda c: c.group_walk)
    seed = _seed()
    rng = np.random.default_rng(seed)
    S = 12800 if d < 256 else 6400
    q, k, v = _inputs(rng, 1, S, S, 4, 2, d, jnp.bfloat16)
    cases = [(f"{name} S={S}", bb, d ** -0.5) for name, bb in _suite(S, seed).items()]
    cases.append((f"random S={S} large logits", random_bounds(rng, 1, 1, S, S), 40.0 / d ** 0.5))
    for c in cfgs:
        for label, bb, scale in cases:
            _portable_close(c, q, k, v, bb, scale, f"seed={seed} {label} {c.name}")
    Sq = 384
    Sk = 140004 if d < 256 else 70004  # not a multiple of the key block: ragged last block
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 1] = Sq  # every column masked for every row ...
    for lo, hi in ((1000, 1300), (Sk // 2, Sk // 2 + 100), (Sk - 3000, Sk - 2500), (Sk - 50, Sk)):
        b[0, 0, 0, lo:hi] = rng.integers(0, 256, hi - lo)  # ... but rows [0, LTS) in four windows
    for dtype in (jnp.bfloat16, jnp.float16):
        q, k, v = _inputs(rng, 1, Sq, Sk, 2, 1, d, dtype)
        for c in cfgs:
            msg = f"seed={seed} Sq={Sq} Sk={Sk} {c.name}"
            o, l = _assert_margins_identical(c, q, k, v, b, d ** -0.5, msg, margins=(131,))
            assert np.all(l[0, 256:] == -np.inf) and np.all(o[0, 256:] == 0.0), msg  # the empty tile
            assert np.all(np.isfinite(l[0, :200])), msg
            _portable_close(c, q, k, v, b, d ** -0.5, msg)


def _extreme_bounds(rng, B, Hm, Sk):
    """Bounds anywhere in int32 (INT_MIN / INT_MAX, reversed and wrapping intervals), half of the
    columns, the rest small: the element test wraps modulo 2^32 and the bit words must reproduce
    it exactly."""
    big = rng.integers(-(2 ** 31), 2 ** 31, (B, Hm, 4, Sk))
    ends = rng.choice(np.array([-(2 ** 31), 2 ** 31 - 1, 0, -1]), (B, Hm, 4, Sk))
    small = rng.integers(-64, 700, (B, Hm, 4, Sk))
    sel = rng.integers(0, 3, (B, Hm, 4, Sk))
    return np.choose(sel, [big, ends, small]).astype(np.int32)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_mask_bits(d):
    """The element mask of partial key blocks as bit words selects -inf or the score for exactly
    the elements of the interval test: the 12 mask families (random_eviction: most blocks partial)
    at S = 1500 (ragged last query tile and key block), GQA 8 / 2 with a mask head per query head,
    Sq != Sk with Sk % 4 != 0 and == 0, fully masked rows / query tiles, large logits, bounds
    anywhere in int32, both dtypes, and a persistent grid that loops (many tiles per CTA, the job
    ring wrapping across tiles; fewer CTAs, one CTA)."""
    cfgs = fwd_configs(d, lambda c: c.mask_bits)
    seed = _seed()
    rng = np.random.default_rng(seed)
    S = 1500
    q, k, v = _inputs(rng, 1, S, S, 8, 2, d, jnp.bfloat16)
    for name, bb in _suite(S, seed).items():
        _check(q, k, v, bb, seed=f"{seed} {name} S={S}", cfgs=cfgs)
    _check(q, k, v, random_bounds(rng, 1, 8, S, S), scale=40.0 / d ** 0.5, seed=f"{seed} Hm=8", cfgs=cfgs)
    _check(q, k, v, _extreme_bounds(rng, 1, 2, S), seed=f"{seed} int32 extremes", cfgs=cfgs)
    for dtype in (jnp.bfloat16, jnp.float16):
        for Sq, Sk in ((700, 1111), (333, 1108), (1025, 260), (130, 3)):
            q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
            bb = random_bounds(rng, 2, 2, Sq, Sk)
            bb[:, :, 0, : Sk // 2] = 0  # rows [0, Sq) of the first half of the columns masked ...
            bb[:, :, 1, : Sk // 2] = Sq
            bb[1, :, 0, Sk // 2:] = 0  # ... and of every column in batch 1: fully masked rows
            bb[1, :, 1, Sk // 2:] = Sq // 3
            _check(q, k, v, bb, seed=f"{seed} Sq={Sq} Sk={Sk}", cfgs=cfgs)
            _check(q, k, v, _extreme_bounds(rng, 2, 1, Sk), seed=f"{seed} extremes Sq={Sq}", cfgs=cfgs)
    q, k, v = _inputs(rng, 4, 2500, 2500, 8, 8, d, jnp.bfloat16)
    for name in ("sliding_window", "causal_document", "random_eviction"):
        bb = _suite(2500, seed, 4)[name]
        for c in cfgs:
            _assert_margins_identical(c, q, k, v, bb, d ** -0.5, f"seed={seed} {name} B=4 S=2500",
                                      margins=(1, 16, 131, 100000))


# --------------------------------------------------------------------------- tile-shape edges
# The configs' tile shapes: 192-row query tiles (three consumer warpgroups, d = 64), key blocks of
# 80 (d = 256), tiles in pairs (d = 256 causal; odd tile counts leave a pair with one tile). Sq not
# a multiple of 192, Sk not a multiple of 80 (ragged last key block), Sk % 4 != 0 (bounds read
# from global memory instead of the smem copy), query tiles with one key block and two.


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 81), (191, 79), (193, 160), (192, 1000), (1000, 129),
                                   (385, 241), (577, 64), (65, 1), (300, 333), (700, 402)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_tile_edges(d, Sq, Sk, dtype):
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
    _check(q, k, v, random_bounds(rng, 2, 2, Sq, Sk), seed=seed)
    _check(q, k, v, causal_bounds(2, 1, Sq, Sk), seed=seed)


@pytest.mark.parametrize("Sq", [300, 650])
def test_paired_odd_tile_count(Sq):
    """An odd number of query tiles (3 heads x 3 or 5 tiles of 128 rows): the last pair has one
    tile; with sm_margin leaving one CTA, that CTA walks every pair."""
    cfgs = fwd_configs(256, lambda c: c.paired_tiles)
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, Sq, 333, 3, 1, 256, jnp.bfloat16)
    for b in (random_bounds(rng, 1, 3, Sq, 333), causal_bounds(1, 1, Sq, 333)):
        _check(q, k, v, b, seed=seed, cfgs=cfgs)
        for c in cfgs:
            _assert_margins_identical(c, q, k, v, b, 256 ** -0.5, f"seed={seed}", margins=(100000,))


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("N,K,Hm", [(8, 8, 1), (8, 2, 2), (8, 1, 8), (6, 3, 3)])
def test_tile_edges_gqa(d, N, K, Hm):
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, 400, 520, N, K, d, jnp.bfloat16)
    _check(q, k, v, random_bounds(rng, 1, Hm, 400, 520), seed=seed)


@pytest.mark.parametrize("d", [64, 256])
def test_tile_edges_fully_masked_rows(d):
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 500, 400
    q, k, v = _inputs(rng, 1, Sq, Sk, 2, 2, d, jnp.bfloat16)
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 0], b[:, :, 1] = 10, 250  # rows 10..249 masked for every column (whole warpgroups)
    b[:, :, 2], b[:, :, 3] = 380, 500  # and rows 380..499 (the last, partial 192-row tile)
    _check(q, k, v, b, seed=seed)
    everything = np.zeros((1, 1, 4, Sk), np.int32)
    everything[:, :, 1] = Sq
    for c in fwd_configs(d):
        out, lse = cuda.run_forward(c, q, k, v, jnp.asarray(everything), scale=0.1)
        assert np.all(np.asarray(out.astype(jnp.float32)) == 0.0)
        assert np.all(np.asarray(lse) == -np.inf)


def test_config_for_another_head_dim_is_refused():
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, 1, 64, 64, 2, 2, 128, jnp.bfloat16)
    b = jnp.asarray(causal_bounds(1, 1, 64, 64))
    for c in configs.FORWARD_CONFIGS:
        if c.head_dim != 128:
            with pytest.raises(ValueError, match="head dim 128"):
                cuda.run_forward(c, q, k, v, b, scale=0.1)


def test_config_follows_mask_structure():
    """attention() without mask vectors runs the dense config of the head dim, with vectors the
    general one (configs.FORWARD_TABLE), and the dense config agrees with the general one on the
    same (causal) mask."""
    import re
    import jax_flashmask
    from jax_flashmask import masks
    rng = np.random.default_rng(_seed())
    for d, S in ((64, 1000), (256, 700)):
        fwd_configs(d)
        q, k, v = _inputs(rng, 1, S, S, 4, 2, d, jnp.bfloat16)
        calls = {"full": lambda q, k, v: jax_flashmask.attention(q, k, v, implementation="cuda"),
                 "causal": lambda q, k, v: jax_flashmask.attention(q, k, v, causal=True, implementation="cuda"),
                 "general": lambda q, k, v: jax_flashmask.attention(
                     q, k, v, masks.causal_document([S // 2, S - S // 2]), implementation="cuda")}
        for structure, f in calls.items():
            hlo = jax.jit(f).lower(q, k, v).as_text()
            want = configs.forward_config(d, structure).name
            assert re.search(rf'config = "{want}"', hlo), (d, structure)
        dense = jax_flashmask.attention(q, k, v, causal=True, implementation="cuda")
        b = jnp.asarray(causal_bounds(1, 1, S, S))
        general, _ = cuda.run_forward(configs.forward_config(d, "general"), q, k, v, b, scale=d ** -0.5)
        np.testing.assert_allclose(np.asarray(dense, np.float32), np.asarray(general, np.float32),
                                   atol=2e-2, rtol=2e-2, err_msg=f"d={d}")
