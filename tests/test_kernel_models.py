"""CPU checks of the kernels' mask walk and element masks (cc/sm90/mask_walk.cuh) against their
host models: the forward's fwd_row_bits in numpy below; the backward's bwd_find_kept,
bwd_group_skips_none and bwd_col_mask in tests/det_sim/bwd_mask_model.py, compared with the
plain definitions."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

_path = Path(__file__).resolve().parent / "det_sim" / "bwd_mask_model.py"
_spec = importlib.util.spec_from_file_location("bwd_mask_model", _path)
model = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bwd_mask_model", model)
_spec.loader.exec_module(model)


def test_walk_check():
    """The O(1) tile walk of bwd_find_kept (every backward kernel's walk) returns the tile-by-tile
    scan's tile for every start tile of every key block, at (Bm, Bn) = (64, 128), (128, 128) and
    (64, 64); and the check catches a dropped third jump and off-by-one range ends."""
    assert model.walk_check(sizes=(2048,), rand_cases=90) == 0


def test_rot_walk_check():
    """bwd_group_skips_none (which key blocks of the 80-row kernel walk clocked) agrees with the
    tile classification on the benchmark masks and random three-head groups; the clocked walk
    visits every tile of every head once, tiles >= r then tiles < r; and the check catches a strict
    range test and a walk that never changes head."""
    assert model.rot_walk_check() == 0


def test_mask_bits_check():
    """The element-mask bits of the mask-in-registers kernels (the thread's query columns below
    each bound, bmsk.clamp) equal the per-element interval test for Bm 64 / 128, every col_base,
    int32 extremes, empty / reversed ranges and folded key columns >= Sk; and the check catches a
    wrong count and a width without max(., 0)."""
    assert model.mask_check(cases=5000) == 0


def _fwd_row_bits(lo, length, rb):
    """cc/sm90/mask_walk.cuh fwd_row_bits in numpy (uint32 arithmetic; bmsk.clamp with both
    operands already clamped to [0, 32]: bits [pos, min(pos + width, 32)))."""
    u = np.uint64
    M = u(0xFFFFFFFF)
    lo = lo.astype(np.int64).astype(u) & M
    rb = rb.astype(np.int64).astype(u) & M
    length = length.astype(u)
    d = (rb - lo) & M
    w0 = np.minimum(np.where(d < length, length - d, u(0)), u(32))
    s = np.minimum((u(0) - d) & M, u(32))
    w1 = np.minimum(length, u(32))

    def bmsk(pos, width):
        end = np.minimum(pos + width, u(32))
        return (((u(1) << end) - u(1)) ^ ((u(1) << pos) - u(1))) & M

    return bmsk(u(0), w0) | bmsk(s, w1)


def test_fwd_mask_bits_model():
    """The forward's mask bit words (one word per key column and 32 query rows, built by the
    producer's mask builders) equal the consumers' interval test for every int32 bound: (unsigned)(r - LTS) < max(LTE - LTS, 0) | (unsigned)(r - UTS) < max(UTE - UTS, 0)
    (wrapping 32-bit arithmetic), including intervals that wrap through 2^32, empty / reversed ones
    and INT_MIN / INT_MAX."""
    rng = np.random.default_rng(0)
    n = 20000
    pools = [rng.integers(-(2 ** 31), 2 ** 31, n), rng.integers(-40, 200, n),
             rng.choice(np.array([-(2 ** 31), 2 ** 31 - 1, 0, -1, 1, 2 ** 31 - 33, -(2 ** 31) + 5]), n)]
    def pick():
        return np.choose(rng.integers(0, 3, n), pools)
    lts, lte, uts, ute = pick(), pick(), pick(), pick()
    rb = np.where(rng.random(n) < 0.5, 32 * rng.integers(0, 8, n), 32 * rng.integers(0, 2 ** 26 - 1, n))
    def length(a, b):  # (unsigned)max(b - a, 0) with the wrapping int32 subtraction
        diff = ((b - a + 2 ** 31) % 2 ** 32) - 2 ** 31
        return np.maximum(diff, 0).astype(np.uint64)
    ll, ul = length(lts, lte), length(uts, ute)
    words = _fwd_row_bits(lts, ll, rb) | _fwd_row_bits(uts, ul, rb)
    for k in range(32):
        r = rb + k
        want = (((r - lts) % 2 ** 32).astype(np.uint64) < ll) | (((r - uts) % 2 ** 32).astype(np.uint64) < ul)
        got = ((words >> np.uint64(k)) & np.uint64(1)).astype(bool)
        assert np.array_equal(got, want), k
    # a column >= Sk: the interval [0, 2^31 - 1) masks every row
    w = _fwd_row_bits(np.zeros(4, np.int64), np.full(4, 2 ** 31 - 1, np.uint64), np.array([0, 32, 4096, 2 ** 30]))
    assert np.all(w == 0xFFFFFFFF)
