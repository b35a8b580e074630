"""GPU tests of the sm_90a FlashMask forward kernel (jax_flashmask._cuda).

Skipped unless the compiled extension and a Hopper GPU are present. Every case compares against a
dense float64 NumPy reference built inline from the canonical bounds, on fresh random inputs (the
seed is printed in failure messages).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from _gpu_bounds import causal_bounds, random_bounds
from jax_flashmask import _cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _cuda.is_available(), reason=f"CUDA kernels unavailable: {_cuda.unavailable_reason()}"),
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


# Kernel variants exercised by every check (jax_flashmask._cuda.TESTED_VARIANTS): 2 = one CTA per
# tile, 3 = persistent grid with a dynamic tile counter and smem-staged bounds (the default),
# 4 = one CTA per tile with smem-staged bounds, 6 = 3 + tile-boundary overlap, 7 = 3 with the
# two-level key-block walk (groups of 32 blocks; its group level only from 3 groups on, i.e. Sk > 8K
# at d = 64/128: the small cases here run it with the level off; test_group_scan_bit_identical
# runs it on).
# Variants 10 / 11 (3 / 7 with the partial blocks' mask as bit words) are not in TESTED_VARIANTS:
# select them with JFM_TEST_VARIANTS="3,10,11"; test_mask_bits_bit_identical always runs them
# against 3 (and test_group_scan_bit_identical 11 with the group level on).
# JFM_TEST_VARIANTS="3,6" overrides the list (the device script runs new variants in a separate,
# time-limited pytest call).
_env_variants = os.environ.get("JFM_TEST_VARIANTS", "").strip()
VARIANTS = (tuple(int(x) for x in _env_variants.split(",") if x.strip()) if _env_variants
            else tuple(getattr(_cuda, "TESTED_VARIANTS", (2,))))


def _supported(var, dtype, d):
    f = getattr(_cuda, "variant_supported", None)
    return True if f is None else f(var, dtype, d)


def _check(q, k, v, bounds, *, scale=None, seed=None, variants=None, fn=None):
    d = q.shape[-1]
    scale = float(d ** -0.5) if scale is None else scale
    ro, rl = reference(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), bounds, scale)
    empty = ~np.isfinite(rl)
    atol, rtol = TOL[jnp.dtype(q.dtype).type]
    if variants is None:  # the tested variants compiled for this (dtype, d)
        variants = [var for var in VARIANTS if _supported(var, q.dtype, d)]
    runs = [("fn", fn)] if fn is not None else [(f"variant={var}", var) for var in variants]
    for label, what in runs:
        if fn is not None:
            out, lse = fn(q, k, v, jnp.asarray(bounds))
        else:
            out, lse = _cuda.forward(q, k, v, jnp.asarray(bounds), scale=scale, variant=what)
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
    for var in [var for var in VARIANTS if _supported(var, q.dtype, 128)]:
        out, lse = _cuda.forward(q, k, v, jnp.asarray(everything), scale=0.1, variant=var)
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
    f = jax.jit(lambda q, k, v, b: _cuda.forward(q, k, v, b, scale=128 ** -0.5))
    _check(q, k, v, b, seed=seed, fn=f)
    # vmap over a leading axis: each slice is its own [1, ...] problem
    vf = jax.jit(jax.vmap(lambda q, k, v, b: _cuda.forward(q[None], k[None], v[None], b[None],
                                                           scale=128 ** -0.5)))
    out, lse = vf(q, k, v, jnp.asarray(b))
    ro, rl = f(q, k, v, jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(out[:, 0].astype(jnp.float32)), np.asarray(ro.astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(lse[:, 0]), np.asarray(rl))


def _assert_bit_identical(ref, variants, q, k, v, bounds, scale, msg, margins=(0,)):
    """Output and LSE of every variant in `variants` (at every sm_margin in `margins`) equal to
    variant `ref`'s bit for bit; returns ref's (out as float32, lse) as numpy arrays."""
    bounds = jnp.asarray(bounds)
    ro, rl = _cuda.forward(q, k, v, bounds, scale=scale, variant=ref)
    ro, rl = np.asarray(ro.astype(jnp.float32)), np.asarray(rl)
    for var in variants:
        for margin in margins:
            o, l = _cuda.forward(q, k, v, bounds, scale=scale, variant=var, sm_margin=margin)
            m = f"{msg} dtype={q.dtype} variant={var} vs {ref} sm_margin={margin}"
            np.testing.assert_array_equal(np.asarray(o.astype(jnp.float32)), ro, err_msg=m)
            np.testing.assert_array_equal(np.asarray(l), rl, err_msg=m)
    return ro, rl


@pytest.mark.parametrize("d", [128, 256])
def test_sm_margin_identical(d):
    """sm_margin > 0 (fewer persistent CTAs, each walking more tiles) gives bit-identical outputs:
    every tile is computed by one CTA with the same instruction sequence whichever CTA it is."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S, N, K = 2, 1100, 8, 2
    q, k, v = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    for b in (causal_bounds(B, 1, S, S), random_bounds(rng, B, 2, S, S)):
        b = jnp.asarray(b)
        for var in sorted(v for v in (set(_cuda.PERSISTENT_VARIANTS) & set(VARIANTS)) | {3}
                         if _supported(v, q.dtype, d)):
            # 100000: clamped to one CTA
            _assert_bit_identical(var, [var], q, k, v, b, d ** -0.5, f"seed={seed} d={d}",
                                  margins=(1, 16, 100, 131, 100000))
    # the one-CTA-per-tile variants ignore it
    o2, _ = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=2, sm_margin=64)
    r2, _ = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=2)
    np.testing.assert_array_equal(np.asarray(o2.astype(jnp.float32)), np.asarray(r2.astype(jnp.float32)))
    with pytest.raises(ValueError):
        _cuda.forward(q, k, v, b, scale=0.1, sm_margin=-1)


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


def test_check_supported_errors():
    with pytest.raises(NotImplementedError):
        _cuda.check_supported((1, 8, 2, 96), jnp.bfloat16, 96)
    with pytest.raises(NotImplementedError):
        _cuda.check_supported((1, 8, 2, 128), jnp.float32, 128)
    _cuda.check_supported((1, 8, 2, 128), jnp.bfloat16, 128)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_group_scan_bit_identical(d):
    """Variant 7 (two-level key-block walk: groups of 32 key blocks classified first) visits the same
    key blocks in the same order as variant 3, so outputs and LSE are equal bit for bit. Run where
    its group level is on (>= 3 groups): the 12 mask families at S = 12800 (d = 256, 64-key blocks:
    6400), and a cross-attention case with more than 32 groups (two group ballots per query tile),
    kept windows separated by skipped groups in both chunks, a ragged last key block and a query
    tile that keeps no block at all."""
    v7 = getattr(_cuda, "GROUP_SCAN_VARIANT", None)
    if v7 is None or not _supported(v7, jnp.bfloat16, d):
        pytest.skip(f"forward variant 7 (group walk) not compiled for d={d}")
    seed = _seed()
    rng = np.random.default_rng(seed)
    S = 12800 if d < 256 else 6400
    q, k, v = _inputs(rng, 1, S, S, 4, 2, d, jnp.bfloat16)
    cases = [(f"{name} S={S}", bb, scale) for name, bb in _suite(S, seed).items()
             for scale in (d ** -0.5,)]
    cases.append(("random S=%d large logits" % S, random_bounds(rng, 1, 1, S, S), 40.0 / d ** 0.5))
    # variant 11 (7 with variant 10's bit-word mask) where compiled: the same comparisons
    others = [v7] + [v for v in (getattr(_cuda, "MASK_BITS_GS_VARIANT", None),)
                     if v is not None and _supported(v, jnp.bfloat16, d)]
    for label, bb, scale in cases:
        _assert_bit_identical(3, others, q, k, v, bb, scale, f"seed={seed} {label} d={d}")
    # more than 32 groups (1094 key blocks), both dtypes
    Sq = 384
    Sk = 140004 if d < 256 else 70004  # not a multiple of the key block: ragged last block
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 1] = Sq  # every column masked for every row ...
    for lo, hi in ((1000, 1300), (Sk // 2, Sk // 2 + 100), (Sk - 3000, Sk - 2500), (Sk - 50, Sk)):
        b[0, 0, 0, lo:hi] = rng.integers(0, 256, hi - lo)  # ... but rows [0, LTS) in four windows
    for dtype in (jnp.bfloat16, jnp.float16):
        q, k, v = _inputs(rng, 1, Sq, Sk, 2, 1, d, dtype)
        msg = f"seed={seed} Sq={Sq} Sk={Sk} d={d}"
        o3, l3 = _assert_bit_identical(3, others, q, k, v, b, d ** -0.5, msg)
        assert np.all(l3[0, 256:] == -np.inf) and np.all(o3[0, 256:] == 0.0), msg  # the empty tile
        assert np.all(np.isfinite(l3[0, :200])), msg


@pytest.mark.parametrize("S", [32768, 131072])
def test_group_scan_bit_identical_benchmark_masks(S):
    """Variant 7 against variant 3, bit for bit, on the masks kernel_timing.py times (benchmark_suite(S,
    seed 0), exactly as it builds them) at the lengths where the group level has 8 / 32 groups: the
    masks whose timing regressed in the first measurement (sliding_window: window of 16 key blocks =
    half a group at 32K; prefix_lm_document; random_eviction: 3/4 of the kept blocks partial) and
    those that gained (share_question, causal_document), plus full (every group a candidate).
    d = 128, two heads sharing one K/V head."""
    v7 = getattr(_cuda, "GROUP_SCAN_VARIANT", None)
    if v7 is None or not _supported(v7, jnp.bfloat16, 128):
        pytest.skip("forward variant 7 (group walk) not compiled for d=128")
    masks = pytest.importorskip("jax_flashmask.masks")
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, S, S, 2, 1, 128, jnp.bfloat16)
    names = ["sliding_window", "prefix_lm_document", "random_eviction", "share_question",
             "causal_document", "full"]
    suite = masks.benchmark_suite(S, 0, batch=1)
    for name in names:
        m = suite[name]
        bb = masks.canonical_bounds(m.startend_row_indices, causal=m.causal, q_len=S)
        _assert_bit_identical(3, [v7], q, k, v, bb, 128 ** -0.5, f"seed={seed} {name} S={S}")


def _extreme_bounds(rng, B, Hm, Sk):
    """Bounds anywhere in int32 (INT_MIN / INT_MAX, reversed and wrapping intervals), half of the
    columns, the rest small: the element test wraps modulo 2^32 and variant 10's bit words must
    reproduce it exactly."""
    big = rng.integers(-(2 ** 31), 2 ** 31, (B, Hm, 4, Sk))
    ends = rng.choice(np.array([-(2 ** 31), 2 ** 31 - 1, 0, -1]), (B, Hm, 4, Sk))
    small = rng.integers(-64, 700, (B, Hm, 4, Sk))
    sel = rng.integers(0, 3, (B, Hm, 4, Sk))
    return np.choose(sel, [big, ends, small]).astype(np.int32)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_mask_bits_bit_identical(d):
    """Variant 10 (variant 3 with the element mask of partial key blocks as bit words built by the
    producer's mask builders) selects -inf or the score for exactly the elements variant 3 does, so
    outputs and LSE are equal bit for bit: the 12 mask families (random_eviction: most blocks
    partial) at S = 1500 (ragged last query tile and key block), GQA 8 / 2 with a mask head per query
    head, Sq != Sk with Sk % 4 != 0 (variant 3 then reads the bounds from global memory) and
    Sk % 4 == 0 (smem-staged), fully masked rows / query tiles, large logits, bounds anywhere in
    int32, both dtypes, and a persistent grid that loops (many tiles per CTA, both K stages reused
    across tiles)."""
    news = [v for v in (getattr(_cuda, "MASK_BITS_VARIANT", None), getattr(_cuda, "MASK_BITS_GS_VARIANT", None))
            if v is not None and _supported(v, jnp.bfloat16, d)]
    if not news:
        pytest.skip(f"forward variants 10 / 11 (bit-word mask) not compiled for d={d}")
    seed = _seed()
    rng = np.random.default_rng(seed)

    def same(q, k, v, bb, scale, label):
        return _assert_bit_identical(3, news, q, k, v, bb, scale, f"seed={seed} {label} d={d}")

    S = 1500
    q, k, v = _inputs(rng, 1, S, S, 8, 2, d, jnp.bfloat16)
    for name, bb in _suite(S, seed).items():
        same(q, k, v, bb, d ** -0.5, f"{name} S={S}")
    # a mask head per query head (GQA 8 / 2), random bounds, large logits
    same(q, k, v, random_bounds(rng, 1, 8, S, S), 40.0 / d ** 0.5, "random Hm=8 large logits")
    same(q, k, v, _extreme_bounds(rng, 1, 2, S), d ** -0.5, "int32 extremes Hm=2")
    for dtype in (jnp.bfloat16, jnp.float16):
        for Sq, Sk in ((700, 1111), (333, 1108), (1025, 260), (130, 3)):
            q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
            bb = random_bounds(rng, 2, 2, Sq, Sk)
            bb[:, :, 0, : Sk // 2] = 0  # rows [0, Sq) of the first half of the columns masked ...
            bb[:, :, 1, : Sk // 2] = Sq
            bb[1, :, 0, Sk // 2:] = 0  # ... and of every column in batch 1: fully masked rows
            bb[1, :, 1, Sk // 2:] = Sq // 3
            o3, l3 = same(q, k, v, bb, d ** -0.5, f"Sq={Sq} Sk={Sk}")
            assert np.all(l3[1, : Sq // 3] == -np.inf) and np.all(o3[1, : Sq // 3] == 0.0)
            same(q, k, v, _extreme_bounds(rng, 2, 1, Sk), d ** -0.5, f"int32 extremes Sq={Sq} Sk={Sk}")
    # many tiles per CTA (B * N * ceil(Sq / 128) = 4 * 8 * 20 = 640 tiles on <= 132 CTAs)
    q, k, v = _inputs(rng, 4, 2500, 2500, 8, 8, d, jnp.bfloat16)
    same(q, k, v, _suite(2500, seed, 4)["random_eviction"], d ** -0.5, "random_eviction B=4 S=2500")


_SAME_ARITHMETIC = [(17, 12, 64), (18, 13, 256)]


@pytest.mark.parametrize("var,ref,d", _SAME_ARITHMETIC, ids=[f"{v}v{r}-d{d}" for v, r, d in _SAME_ARITHMETIC])
def test_same_arithmetic_bit_identical(var, ref, d):
    """Variants that change only how key blocks are found or how the mask is evaluated, not which
    blocks are visited, in which order, or the arithmetic, give outputs and LSE equal to their base
    bit for bit: 17 / 18 (12 / 13 with 11's two-level walk and bit-word mask) against 12 / 13. Cases:
    the 12 mask families with the group level off (S = 1500: ragged last tiles) and on (S = 12800,
    d = 256: 6400), GQA with a mask head per query head, query tiles that keep no block (LSE -inf)
    between tiles that do, one-block tiles, Sk % 4 != 0, both dtypes, > 32 groups with kept windows
    separated by skipped groups, many tiles per CTA (the job ring wraps across tiles), and sm_margin
    (fewer CTAs, longer tile chains; one CTA)."""
    if not (var in getattr(_cuda, "VARIANTS", ()) and ref in getattr(_cuda, "VARIANTS", ())
            and _supported(var, jnp.bfloat16, d)):
        pytest.skip(f"forward variant {var} not compiled for d={d}")
    seed = _seed()
    rng = np.random.default_rng(seed)

    def same(q, k, v, bb, scale, label, margins=(0,)):
        return _assert_bit_identical(ref, [var], q, k, v, bb, scale, f"seed={seed} {label} d={d}",
                                     margins)

    S = 1500
    q, k, v = _inputs(rng, 1, S, S, 8, 2, d, jnp.bfloat16)
    for name, bb in _suite(S, seed).items():
        same(q, k, v, bb, d ** -0.5, f"{name} S={S}")
    same(q, k, v, random_bounds(rng, 1, 8, S, S), 40.0 / d ** 0.5, "random Hm=8 large logits")
    S = 12800 if d < 256 else 6400  # group level on (>= 3 groups of 32 key blocks)
    q, k, v = _inputs(rng, 1, S, S, 2, 1, d, jnp.bfloat16)
    for name, bb in _suite(S, seed).items():
        same(q, k, v, bb, d ** -0.5, f"{name} S={S}")
    for dtype in (jnp.bfloat16, jnp.float16):
        for Sq, Sk in ((700, 1111), (1025, 260), (130, 3), (129, 1000)):
            q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
            bb = random_bounds(rng, 2, 2, Sq, Sk)
            bb[1, :, 0, :] = 0  # batch 1: rows [0, Sq // 3) masked in every column (empty tiles)
            bb[1, :, 1, :] = Sq // 3
            o11, l11 = same(q, k, v, bb, d ** -0.5, f"Sq={Sq} Sk={Sk}", margins=(0, 131))
            assert np.all(l11[1, : Sq // 3] == -np.inf) and np.all(o11[1, : Sq // 3] == 0.0)
    # more than 32 groups, windows separated by skipped groups, a query tile with no kept block
    Sq = 384
    Sk = 140004 if d < 256 else 70004
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 1] = Sq
    for lo, hi in ((1000, 1300), (Sk // 2, Sk // 2 + 100), (Sk - 3000, Sk - 2500), (Sk - 50, Sk)):
        b[0, 0, 0, lo:hi] = rng.integers(0, 256, hi - lo)
    q, k, v = _inputs(rng, 1, Sq, Sk, 2, 1, d, jnp.float16)
    o11, l11 = same(q, k, v, b, d ** -0.5, f"Sq={Sq} Sk={Sk}")
    assert np.all(l11[0, 256:] == -np.inf) and np.all(o11[0, 256:] == 0.0)
    # many tiles per CTA (4 * 8 * 20 = 640 tiles), fewer CTAs, one CTA
    q, k, v = _inputs(rng, 4, 2500, 2500, 8, 8, d, jnp.bfloat16)
    for name in ("sliding_window", "causal_document", "random_eviction"):
        same(q, k, v, _suite(2500, seed, 4)[name], d ** -0.5, f"{name} B=4 S=2500",
             margins=(0, 1, 16, 131, 100000))


# --------------------------------------------------------------------------- variants 12 to 18
# Single-head-dim kernels (not in TESTED_VARIANTS): 12 = three consumer warpgroups (192-row query
# tiles, GEMM issue in a round robin), d = 64 only; 13 = key blocks of 80, d = 256 only; 14 = tiles
# in pairs (the second walked from its last key block down; odd tile counts leave a pair with one
# tile), d = 256 only; 15 = 13 and 14 together; 17 / 18 = 12 / 13 with 11's two-level walk and
# bit-word mask. These
# tests run them whatever JFM_TEST_VARIANTS says (the other d = 64 / 256 tests above run them too
# when it lists them). Shapes are chosen around their tile sizes: Sq not a multiple of 192, Sk not
# a multiple of 80 (ragged last key block), Sk % 4 != 0 (bounds read from global memory instead of
# the smem copy), query tiles with one key block (no round robin at all) and two.

HD_VARIANTS = [(12, 64), (13, 256), (14, 256), (15, 256), (17, 64), (18, 256)]


def _hd_variant(var, d):
    if var not in getattr(_cuda, "VARIANTS", ()) or not _supported(var, jnp.bfloat16, d):
        pytest.skip(f"forward variant {var} not compiled for d={d}")


def _hd_variants_of(d):
    """The variants of HD_VARIANTS compiled for d (one float64 reference checks all of them)."""
    vs = [v for v, dd in HD_VARIANTS if dd == d and v in getattr(_cuda, "VARIANTS", ())
          and _supported(v, jnp.bfloat16, d)]
    if not vs:
        pytest.skip(f"no head-dim variant compiled for d={d}")
    return vs


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("S", [1000, 2048])
def test_hd_variant_mask_families(d, S):
    variants = _hd_variants_of(d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    B = 1 if S < 2048 else 2
    suite = _suite(S, seed, B)
    q, k, v = _inputs(rng, B, S, S, 8, 2, d, jnp.bfloat16)
    for name, b in suite.items():
        _check(q, k, v, b, seed=f"{seed} mask={name}", variants=variants)


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 81), (191, 79), (193, 160), (192, 1000), (1000, 129),
                                   (385, 241), (577, 64), (65, 1), (300, 333), (700, 402)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_hd_variant_ragged(d, Sq, Sk, dtype):
    variants = _hd_variants_of(d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 2, Sq, Sk, 4, 2, d, dtype)
    _check(q, k, v, random_bounds(rng, 2, 2, Sq, Sk), seed=seed, variants=variants)
    _check(q, k, v, causal_bounds(2, 1, Sq, Sk), seed=seed, variants=variants)


@pytest.mark.parametrize("var,d", HD_VARIANTS)
@pytest.mark.parametrize("Sq", [300, 650])
def test_hd_variant_odd_tile_count(var, d, Sq):
    """An odd number of query tiles (3 heads x 3 or 5 tiles of 128 rows): variant 14's last pair
    has one tile; with sm_margin leaving one CTA, that CTA walks every pair."""
    _hd_variant(var, d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, Sq, 333, 3, 1, d, jnp.bfloat16)
    for b in (random_bounds(rng, 1, 3, Sq, 333), causal_bounds(1, 1, Sq, 333)):
        _check(q, k, v, b, seed=seed, variants=[var])
        ro, rl = _cuda.forward(q, k, v, jnp.asarray(b), scale=d ** -0.5, variant=var)
        o, l = _cuda.forward(q, k, v, jnp.asarray(b), scale=d ** -0.5, variant=var, sm_margin=100000)
        np.testing.assert_array_equal(np.asarray(o.astype(jnp.float32)), np.asarray(ro.astype(jnp.float32)))
        np.testing.assert_array_equal(np.asarray(l), np.asarray(rl))


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("N,K,Hm", [(8, 8, 1), (8, 2, 2), (8, 1, 8), (6, 3, 3)])
def test_hd_variant_gqa(d, N, K, Hm):
    variants = _hd_variants_of(d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, 1, 400, 520, N, K, d, jnp.bfloat16)
    _check(q, k, v, random_bounds(rng, 1, Hm, 400, 520), seed=seed, variants=variants)


@pytest.mark.parametrize("var,d", HD_VARIANTS)
def test_hd_variant_fully_masked_rows(var, d):
    _hd_variant(var, d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    Sq, Sk = 500, 400
    q, k, v = _inputs(rng, 1, Sq, Sk, 2, 2, d, jnp.bfloat16)
    b = np.zeros((1, 1, 4, Sk), np.int32)
    b[:, :, 0], b[:, :, 1] = 10, 250  # rows 10..249 masked for every column (whole warpgroups)
    b[:, :, 2], b[:, :, 3] = 380, 500  # and rows 380..499 (the last, partial 192-row tile)
    _check(q, k, v, b, seed=seed, variants=[var])
    everything = np.zeros((1, 1, 4, Sk), np.int32)
    everything[:, :, 1] = Sq
    out, lse = _cuda.forward(q, k, v, jnp.asarray(everything), scale=0.1, variant=var)
    assert np.all(np.asarray(out.astype(jnp.float32)) == 0.0)
    assert np.all(np.asarray(lse) == -np.inf)


@pytest.mark.parametrize("var,d", HD_VARIANTS)
def test_hd_variant_many_tiles_and_sm_margin(var, d):
    """More query tiles than SMs (each persistent CTA walks several tiles, the round robin's barrier
    counts must balance across tile boundaries), and sm_margin gives bit-identical outputs."""
    _hd_variant(var, d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    B, S, N, K = 2, 1500, 12, 4
    q, k, v = _inputs(rng, B, S, S, N, K, d, jnp.bfloat16)
    for b in (causal_bounds(B, 1, S, S), random_bounds(rng, B, N, S, S)):
        _check(q, k, v, b, seed=seed, variants=[var])
        b = jnp.asarray(b)
        ro, rl = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=var)
        for margin in (1, 100, 100000):
            o, l = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=var, sm_margin=margin)
            msg = f"seed={seed} variant={var} sm_margin={margin}"
            np.testing.assert_array_equal(np.asarray(o.astype(jnp.float32)),
                                          np.asarray(ro.astype(jnp.float32)), err_msg=msg)
            np.testing.assert_array_equal(np.asarray(l), np.asarray(rl), err_msg=msg)


@pytest.mark.parametrize("var,d", HD_VARIANTS)
def test_hd_variant_close_to_variant3(var, d):
    """Same math as variant 3 with other tile sizes: only the accumulation order differs."""
    _hd_variant(var, d)
    seed = _seed()
    rng = np.random.default_rng(seed)
    S = 3000
    q, k, v = _inputs(rng, 1, S, S, 4, 2, d, jnp.bfloat16)
    for name, b in _suite(S, seed).items():
        b = jnp.asarray(b)
        o3, l3 = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=3)
        on, ln = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=var)
        msg = f"seed={seed} mask={name} variant={var}"
        l3, ln = np.asarray(l3), np.asarray(ln)
        np.testing.assert_array_equal(np.isfinite(l3), np.isfinite(ln), err_msg=msg)
        fin = np.isfinite(l3)
        np.testing.assert_allclose(ln[fin], l3[fin], atol=1e-3, rtol=1e-3, err_msg=msg)
        np.testing.assert_allclose(np.asarray(on.astype(jnp.float32)), np.asarray(o3.astype(jnp.float32)),
                                   atol=2e-2, rtol=2e-2, err_msg=msg)


def test_hd_variant_wrong_head_dim():
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, 1, 64, 64, 2, 2, 128, jnp.bfloat16)
    b = causal_bounds(1, 1, 64, 64)
    for var in (12, 13, 14, 15, 17, 18):
        if var not in getattr(_cuda, "VARIANTS", ()):
            continue
        with pytest.raises(ValueError, match="head dim"):
            _cuda.forward(q, k, v, jnp.asarray(b), scale=0.1, variant=var)


def test_default_variant_follows_mask_structure():
    """attention() without mask vectors runs the dense default of the head dim (d = 64: 17,
    d = 256 full: 13, causal: 15), with vectors the general one (_cuda.DEFAULT_VARIANTS), and the
    dense default agrees with the general kernel on the same (causal) mask."""
    import re
    import jax_flashmask
    from jax_flashmask import masks
    rng = np.random.default_rng(_seed())
    for d, S, want in ((64, 1000, {"full": 17, "causal": 17, "general": 17}),
                       (256, 700, {"full": 13, "causal": 15, "general": 11})):
        q, k, v = _inputs(rng, 1, S, S, 4, 2, d, jnp.bfloat16)
        calls = {"full": lambda q, k, v: jax_flashmask.attention(q, k, v, implementation="cuda"),
                 "causal": lambda q, k, v: jax_flashmask.attention(q, k, v, causal=True, implementation="cuda"),
                 "general": lambda q, k, v: jax_flashmask.attention(
                     q, k, v, masks.causal_document([S // 2, S - S // 2]), implementation="cuda")}
        for structure, f in calls.items():
            hlo = jax.jit(f).lower(q, k, v).as_text()
            assert re.search(rf"variant = {want[structure]}\b", hlo), (d, structure)
        dense = jax_flashmask.attention(q, k, v, causal=True, implementation="cuda")
        b = jnp.asarray(causal_bounds(1, 1, S, S))
        general, _ = _cuda.forward(q, k, v, b, scale=d ** -0.5, variant=want["general"])
        np.testing.assert_allclose(np.asarray(dense, np.float32), np.asarray(general, np.float32),
                                   atol=2e-2, rtol=2e-2, err_msg=f"d={d}")
