"""CPU: the Hopper kernels' unseen-column predicate (cc/sm90/block_meta.cu column_unseen, the words
cc/sm90/unseen.cuh zeroes K / V rows by) against the dense mask.

A key column is unseen when every one of the Sq query rows masks it; the kernels then zero its K / V
rows in shared memory so that NaN / Inf there reaches nothing (README "Guarantees",
docs/decisions.md#nan-guarantee-cuda). The numpy model below is the kernel's arithmetic on the
bounds the kernels receive (canonical, clipped to [0, Sq] as backends/cuda/ops.py passes them),
packed as block_meta_sm90 packs it (4 words per key block of bn <= 128 columns, laid out as the
block metadata); the sources are checked to hold the same expressions. Compared with
``to_dense(...).all(rows)`` over the twelve benchmark masks and random masks of every mode, lengths
that are not multiples of 128, Sq < Sk and Sq > Sk.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from jax_flashmask import masks
from jax_flashmask.masks._core import canonical_bounds, columns_fully_masked

SM90 = pathlib.Path(__file__).resolve().parents[1] / "cc" / "sm90"


def kernel_unseen(bounds, sq):
    """bool [B, Hm, Sk]: block_meta.cu's column_unseen on the kernels' (clipped) bounds."""
    b = np.clip(np.asarray(bounds).astype(np.int64), 0, sq)
    lts, lte, uts, ute = (b[:, :, k, :] for k in range(4))
    lo, up = lts < lte, uts < ute
    return ((sq <= 0) | (lo & (lts <= 0) & (lte >= sq)) | (up & (uts <= 0) & (ute >= sq))
            | (lo & up & (lts <= 0) & (lte >= uts) & (ute >= sq))
            | (lo & up & (uts <= 0) & (ute >= lts) & (lte >= sq)))


def kernel_words(unseen, bn):
    """uint32 [B, Hm, 8 * nblk]: block_meta_kernel's ballots, block n's 4 words at 4 * n."""
    B, Hm, Sk = unseen.shape
    nblk = -(-Sk // bn)
    out = np.zeros((B, Hm, 8 * nblk), np.uint64)
    for c in range(Sk):
        n, t = divmod(c, bn)
        out[:, :, 4 * n + t // 32] |= unseen[:, :, c].astype(np.uint64) << np.uint64(t % 32)
    return out.astype(np.uint32)


def words_to_columns(words, Sk, bn):
    """The zeroing's reading of the words (zero_tile_rows: bit r % 32 of word r / 32 = row r)."""
    B, Hm, _ = words.shape
    cols = np.zeros((B, Hm, Sk), bool)
    for c in range(Sk):
        n, r = divmod(c, bn)
        cols[:, :, c] = (words[:, :, 4 * n + r // 32] >> np.uint32(r % 32)) & 1
    return cols


def dense_unseen(mask_or_raw, sq, causal=None):
    dense = np.asarray(masks.to_dense(mask_or_raw, causal=causal, q_len=sq))  # [B, Hm, Sq, Sk]
    return dense.all(axis=2)


def check(raw, causal, sq, bn):
    bounds = np.asarray(canonical_bounds(raw, causal=causal, q_len=sq))
    want = dense_unseen(raw, sq, causal)
    got = kernel_unseen(bounds, sq)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(columns_fully_masked(bounds, sq)), want)
    sk = bounds.shape[-1]
    np.testing.assert_array_equal(words_to_columns(kernel_words(got, bn), sk, bn), want)
    return want


def test_source_holds_the_modelled_predicate():
    src = (SM90 / "block_meta.cu").read_text()
    for expr in ("const bool lo = lts < lte, up = uts < ute;",
                 "return Sq <= 0 || (lo && lts <= 0 && lte >= Sq) || (up && uts <= 0 && ute >= Sq) ||",
                 "(lo && up && lts <= 0 && lte >= uts && ute >= Sq) ||",
                 "(lo && up && uts <= 0 && ute >= lts && lte >= Sq);",
                 "if (lane == 0) unseen[((int64_t)b * Hm + hm) * 8 * nblk + 4 * n + warp] = bits;"):
        assert expr in src, expr
    unseen = (SM90 / "unseen.cuh").read_text()
    assert "const uint32_t* p = unseen + ((int64_t)b * Hm + hm0) * 8 * nblk + 4 * n;" in unseen
    assert "if ((__ldg(words + (r >> 5)) >> (r & 31)) & 1u) st_shared_zero16(" in unseen  # bit r: row r
    fwd = (SM90 / "fwd_kernel.cuh").read_text()
    assert "__ldg(fwd_block_meta(a, tile.b, hm) + a.unseen_off + 4 * nblk) != 0;" in fwd  # any
    assert "a.unseen_off + 4 * n)," in fwd  # the block's words
    bwd = (SM90 / "bwd_mainloop.cuh").read_text()
    assert "const uint32_t* w0 = a.unseen + ((int64_t)b * a.Hm + hm0) * 8 * a.nblk + 4 * n;" in bwd
    assert "z = (__ldg(w0 + (int64_t)(hm - hm0) * 8 * a.nblk + (r >> 5)) >> (r & 31)) & 1u;" in bwd


@pytest.mark.parametrize("S", [1000, 1283])
def test_benchmark_masks(S):
    """The twelve masks (no unseen column except where a mask really leaves one), plus each with
    trailing padding keys (segment -1 style: every row masks them)."""
    for name, fm in masks.benchmark_suite(S, 0).items():
        want = check(fm.startend_row_indices, fm.causal, S, 128)
        assert want.shape[-1] == S, name
    for bn in (64, 80, 128):
        seg = np.concatenate([np.zeros(S // 3, int), np.ones(S - S // 3 - 77, int), -np.ones(77, int)])
        for causal in (True, False):
            fm = masks.from_segment_ids(seg, causal=causal)
            want = check(fm.startend_row_indices, causal, S, bn)
            assert want[..., S - 77:].all() and not want[..., : S - 77].any(), (causal, bn)


def _random_raw(rng, B, Hm, Sk, sq, causal, D):
    # values biased to the ends 0 / Sq so that columns covering every row are common
    v = rng.choice([0, sq, *rng.integers(0, sq + 1, 6)], size=(B, Hm, Sk, D)).astype(np.int32)
    if causal and D == 2:
        v = np.sort(v, axis=-1)  # LTS <= LTE
    if not causal and D == 4:
        v[..., :2] = np.sort(v[..., :2], axis=-1)
        v[..., 2:] = np.sort(v[..., 2:], axis=-1)
    return v


@pytest.mark.parametrize("sq,sk", [(300, 300), (200, 333), (333, 200), (129, 1), (1, 257)])
@pytest.mark.parametrize("causal,D", [(True, 1), (True, 2), (False, 2), (False, 4)])
def test_random_masks_every_mode(sq, sk, causal, D):
    rng = np.random.default_rng(sq * 7 + sk + D)
    hits = 0
    for _ in range(4):
        raw = _random_raw(rng, 2, 3, sk, sq, causal, D)
        hits += int(check(raw, causal, sq, 80 if D == 2 else 128).sum())
    if not causal or sq <= sk:
        assert hits > 0  # the cases exercise unseen columns, not only seen ones


def test_kv_group_words_are_the_and_of_its_mask_heads():
    """bwd_mainloop.cuh bwd_load_kv_zeroed: a kv head's CTA zeroes a K / V row only where every
    mask head its query heads use leaves the column unseen (per-head masks, GQA)."""
    rng = np.random.default_rng(5)
    sq, sk, N, K, bn = 150, 260, 8, 2, 128
    raw = _random_raw(rng, 1, N, sk, sq, False, 4)
    unseen = kernel_unseen(np.asarray(canonical_bounds(raw, causal=False, q_len=sq)), sq)
    words = kernel_words(unseen, bn)
    hpk, hpm = N // K, 1
    dense = np.asarray(masks.to_dense(raw, causal=False, q_len=sq))
    for hk in range(K):
        hms = range(hk * hpk // hpm, (hk * hpk + hpk - 1) // hpm + 1)
        w = np.bitwise_and.reduce(words[:, list(hms)], axis=1)[:, None]
        cols = words_to_columns(w, sk, bn)[0, 0]
        want = dense[0, hk * hpk:(hk + 1) * hpk].all(axis=(0, 1))
        np.testing.assert_array_equal(cols, want)
