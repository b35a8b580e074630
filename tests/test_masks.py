"""Masks: representation (SPEC §1), the twelve builders (SPEC §2), sparsity, random masks, plots.

Every reference here is an independent dense construction written from the SPEC's words
(predicates over (i, j)), never through `canonical_bounds`.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax_flashmask.masks as M
from jax_flashmask.masks import FlashMask

SIZES = (64, 100, 257)


# ----------------------------------------------------------------------------- references


def spec_dense(ind, causal, sq):
    """SPEC §1's table, mode by mode, as explicit (i, j) predicates. True = masked."""
    ind = np.asarray(ind).astype(np.int64)
    b, hm, sk, d = ind.shape
    delta = sk - sq
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    out = np.zeros((b, hm, sq, sk), bool)
    for x in range(b):
        for h in range(hm):
            v = ind[x, h]
            if causal and d == 1:
                m = (i < j - delta) | (i >= v[None, :, 0])
            elif causal and d == 2:
                m = (i < j - delta) | ((v[None, :, 0] <= i) & (i < v[None, :, 1]))
            elif not causal and d == 2:
                m = (i >= v[None, :, 0]) | (i < v[None, :, 1])
            elif not causal and d == 4:
                m = ((v[None, :, 0] <= i) & (i < v[None, :, 1])) | ((v[None, :, 2] <= i) & (i < v[None, :, 3]))
            else:
                raise AssertionError((causal, d))
            out[x, h] = m
    return out


def from_predicate(S, visible):
    """Dense masked[i, j] from a predicate visible(I, J) evaluated on the (i, j) grid."""
    i, j = np.meshgrid(np.arange(S), np.arange(S), indexing="ij")
    return ~np.broadcast_to(np.asarray(visible(i, j), bool), (S, S))


def doc_of(doc_lens):
    return np.repeat(np.arange(len(doc_lens)), doc_lens)


def dense(mask, q_len=None):
    return np.asarray(mask.to_dense(q_len))


def check_builder(mask, causal, D, ref, batch=1):
    S = ref.shape[0]
    assert mask.causal is causal
    assert mask.shape == (batch, 1, S, D)
    assert str(mask.startend_row_indices.dtype) == "int32"
    M.validate(mask.startend_row_indices, causal=causal, q_len=S, kv_len=S)
    ind = np.asarray(mask.startend_row_indices)
    for b in range(1, batch):
        np.testing.assert_array_equal(ind[b], ind[0])  # batch broadcasts one mask
    # the indices follow SPEC §1's table for their mode ...
    np.testing.assert_array_equal(spec_dense(ind[:1], causal, S)[0, 0], ref)
    # ... and so does the library's dense view (at S = 64 only: XLA compiles per shape)
    if S == 64:
        np.testing.assert_array_equal(dense(FlashMask(ind[:1], causal))[0, 0], ref)


def vec(mask, k):
    """Vector k of batch 0, head 0 (int64)."""
    return np.asarray(mask.startend_row_indices)[0, 0, :, k].astype(np.int64)


def doc_start_end(lens):
    ends = np.cumsum(lens)
    return np.repeat(ends - lens, lens), np.repeat(ends, lens)


def rand_docs(S, seed):
    return M.random_doc_lens(S, (1, 7), seed)


# ----------------------------------------------------------------------------- builders vs SPEC §2


@pytest.mark.parametrize("S", SIZES)
def test_full_and_causal(S):
    f, c = M.full(S, batch=2), M.causal(S)
    check_builder(f, False, 2, from_predicate(S, lambda i, j: i >= 0), batch=2)
    check_builder(c, True, 1, from_predicate(S, lambda i, j: j <= i))
    # SPEC §2's vectors: full LTS = S, UTE = 0; causal LTS = S
    assert np.all(vec(f, 0) == S) and np.all(vec(f, 1) == 0) and np.all(vec(c, 0) == S)


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("w", [0, 1, 7, 300])
def test_sliding_window(S, w):
    # row i sees keys i - w .. i
    ref = from_predicate(S, lambda i, j: (j <= i) & (i - j <= w))
    m = M.sliding_window(S, w)
    check_builder(m, True, 1, ref)
    np.testing.assert_array_equal(vec(m, 0), np.minimum(np.arange(S) + w + 1, S))


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("seed", [0, 1])
def test_document_masks(S, seed):
    lens = rand_docs(S, seed)
    doc = doc_of(lens)
    cd, dm, cb = M.causal_document(lens), M.document(lens, batch=3), M.causal_blockwise(lens)
    check_builder(cd, True, 1, from_predicate(S, lambda i, j: (j <= i) & (doc[i] == doc[j])))
    check_builder(dm, False, 2, from_predicate(S, lambda i, j: doc[i] == doc[j]), batch=3)
    last = len(lens) - 1
    check_builder(
        cb,
        True,
        2,
        # causal; documents isolated, except that the last document sees everything before it
        from_predicate(S, lambda i, j: (j <= i) & ((doc[i] == doc[j]) | (doc[i] == last))),
    )
    # SPEC §2's vectors
    start, end = doc_start_end(lens)
    np.testing.assert_array_equal(vec(cd, 0), end)
    np.testing.assert_array_equal(vec(dm, 0), end)
    np.testing.assert_array_equal(vec(dm, 1), start)
    np.testing.assert_array_equal(vec(cb, 0), end)
    np.testing.assert_array_equal(vec(cb, 1), np.where(doc == last, S, S - lens[-1]))


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_share_question(S, seed):
    rng = np.random.default_rng(seed)
    lens = rand_docs(S, seed)
    groups = [M.random_qa_split(n, (2, 6), rng) for n in lens]
    # group and part of every token; part 0 of a group is its question
    group = np.repeat(np.arange(len(groups)), [sum(g) for g in groups])
    part = np.concatenate([np.repeat(np.arange(len(g)), g) for g in groups])

    def visible(i, j):
        # causal, same group, and the key is the question or in the query's own answer
        return (j <= i) & (group[i] == group[j]) & ((part[j] == 0) | (part[i] == part[j]))

    m = M.share_question(S, groups=groups)
    check_builder(m, True, 1, from_predicate(S, visible))
    # SPEC §2's vectors: question columns LTS = end of the group; answer columns: end of the answer
    part_end = np.cumsum([n for g in groups for n in g])
    part_end = np.repeat(part_end, [n for g in groups for n in g])
    group_end = np.repeat(np.cumsum([sum(g) for g in groups]), [sum(g) for g in groups])
    np.testing.assert_array_equal(vec(m, 0), np.where(part == 0, group_end, part_end))
    # the random forms build a valid mask of the right size, reproducibly
    a = M.share_question(S, rng=seed)
    b = M.share_question(doc_lens=lens, rng=seed, batch=2)
    assert a.shape == (1, 1, S, 1) and b.shape == (2, 1, S, 1)
    np.testing.assert_array_equal(a.startend_row_indices, M.share_question(S, rng=seed).startend_row_indices)


def test_random_qa_split():
    for seed in range(5):
        g = M.random_qa_split(50, (2, 6), seed)
        assert sum(g) == 50 and 3 <= len(g) <= 7 and min(g) >= 1
    assert len(M.random_qa_split(50, 3, 0)) == 4
    assert M.random_qa_split(2, (2, 6), 0) == [1, 1]  # capped at doc_len - 1 answers


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("g,w", [(0, 3), (4, 0), (16, 5), (5, 1000), (3, 20)])
def test_global_sliding_window(S, g, w):
    ref = from_predicate(S, lambda i, j: (j < g) | (i < g) | (np.abs(i - j) <= w))
    m = M.global_sliding_window(S, g, w)
    check_builder(m, False, 4, ref)
    j = np.arange(S)
    # non-global columns: the lower range is rows > j + w (the documented vectors)
    np.testing.assert_array_equal(vec(m, 0)[g:], np.minimum(j + w + 1, S)[g:])
    assert np.all(vec(m, 1) == S)


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("seed", [0, 3])
def test_prefix_lm_document(S, seed):
    rng = np.random.default_rng(seed)
    lens = rand_docs(S, seed)
    pre = [int(rng.integers(0, n + 1)) for n in lens]
    pre[0] = lens[0]  # a document that is all prefix
    if len(pre) > 1:
        pre[1] = 0  # and one without a prefix
    doc = doc_of(lens)
    prefix_end = (np.cumsum([0] + lens[:-1]) + pre)[doc]  # per token: end of its doc's prefix

    def visible(i, j):
        # same document; the key is in the prefix, or causal
        return (doc[i] == doc[j]) & ((j < prefix_end[j]) | (j <= i))

    m = M.prefix_lm_document(lens, pre)
    check_builder(m, False, 2, from_predicate(S, visible))
    start, end = doc_start_end(lens)
    j = np.arange(S)
    np.testing.assert_array_equal(vec(m, 0), end)
    np.testing.assert_array_equal(vec(m, 1), np.where(j < prefix_end, start, j))


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("frac", [0.0, 0.3, 1.0])
def test_prefix_lm_causal(S, frac):
    p = int(S * frac)
    m = M.prefix_lm_causal(S, p)
    check_builder(m, False, 2, from_predicate(S, lambda i, j: (j < p) | (j <= i)))
    j = np.arange(S)
    assert np.all(vec(m, 0) == S)
    np.testing.assert_array_equal(vec(m, 1), np.where(j < p, 0, j))


@pytest.mark.parametrize("S", SIZES)
def test_qk_sparse(S):
    o, n = S // 5, S // 4

    def in_span(x, a=o, L=n):
        return (a <= x) & (x < a + L)

    # causal; the queries of the dropped span do not see the span's keys
    ref = from_predicate(S, lambda i, j: (j <= i) & ~(in_span(i) & in_span(j)))
    m = M.qk_sparse(S, o, n)
    check_builder(m, True, 2, ref)
    # SPEC §2's vectors: span columns LTS = j, LTE = o + L; others LTS = LTE = S
    j = np.arange(S)
    np.testing.assert_array_equal(vec(m, 0), np.where(in_span(j), j, S))
    np.testing.assert_array_equal(vec(m, 1), np.where(in_span(j), o + n, S))
    spans = [(0, 3), (10, 7), (S - 5, 5)]

    def vis2(i, j):
        v = j <= i
        for a, L in spans:
            v &= ~(in_span(i, a, L) & in_span(j, a, L))
        return v

    check_builder(M.qk_sparse(S, [a for a, _ in spans], [L for _, L in spans]), True, 2, from_predicate(S, vis2))


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_eviction(S, seed):
    m = M.random_eviction(S, seed)
    lts = np.asarray(m.startend_row_indices)[0, 0, :, 0]
    ref = from_predicate(S, lambda i, j: (j <= i) & (i < lts[j]))
    check_builder(m, True, 1, ref)
    ev = lts < S
    j = np.arange(S)
    # evicted columns: the eviction row is >= S/2 and > j; the others LTS = S
    assert np.all(lts[ev] >= S / 2) and np.all(lts[ev] > j[ev])
    r0 = math.ceil(S / 2)
    assert sorted(lts[ev].tolist()) == list(range(r0, S))  # one eviction per row from S/2 on
    # a cache of r0 keys: every row from r0 on sees exactly r0 keys
    vis = (~ref).sum(1)
    np.testing.assert_array_equal(vis[:r0], np.arange(1, r0 + 1))
    assert np.all(vis[r0:] == r0)
    # reproducible from a seed or a Generator; different seeds differ
    same = M.random_eviction(S, np.random.default_rng(seed)).startend_row_indices
    other = M.random_eviction(S, seed + 10).startend_row_indices
    np.testing.assert_array_equal(lts, np.asarray(same)[0, 0, :, 0])
    assert not np.array_equal(lts, np.asarray(other)[0, 0, :, 0])


def test_random_eviction_options():
    S = 100
    m = M.random_eviction(S, 0, start_row=70, num_evictions=10, batch=2)
    lts = np.asarray(m.startend_row_indices)
    assert lts.shape == (2, 1, S, 1)
    np.testing.assert_array_equal(lts[0], lts[1])
    v = lts[0, 0, :, 0]
    ev = v < S
    assert ev.sum() == 10 and len(set(v[ev].tolist())) == 10
    assert np.all(v[ev] >= 70) and np.all(v[ev] > np.arange(S)[ev])


# ----------------------------------------------------------------------------- docs and suite


def test_default_num_docs():
    assert M.default_num_docs(8192) == (3, 7)
    assert M.default_num_docs(32768) == (10, 14)
    assert M.default_num_docs(131072) == (11, 15)


@pytest.mark.parametrize("S", [64, 257, 8192, 32768, 131072])
def test_random_doc_lens(S):
    lo, hi = M.default_num_docs(S)
    seen = set()
    for seed in range(60):
        lens = M.random_doc_lens(S, rng=seed)
        assert sum(lens) == S and min(lens) >= 1 and lo <= len(lens) <= hi
        seen.add(len(lens))
    assert seen == set(range(lo, hi + 1))  # the count is random over the whole inclusive range
    assert len(M.random_doc_lens(S, 5, 0)) == 5
    lens = M.random_doc_lens(S, 4, 0, min_len=S // 8)
    assert sum(lens) == S and min(lens) >= S // 8
    assert M.random_doc_lens(S, None, 7) == M.random_doc_lens(S, None, np.random.default_rng(7))


def test_benchmark_suite():
    table = {  # SPEC §2: (causal, D)
        "full": (False, 2), "causal": (True, 1), "sliding_window": (True, 1),
        "causal_document": (True, 1), "document": (False, 2), "share_question": (True, 1),
        "global_sliding_window": (False, 4), "causal_blockwise": (True, 2),
        "prefix_lm_document": (False, 2), "prefix_lm_causal": (False, 2),
        "qk_sparse": (True, 2), "random_eviction": (True, 1),
    }  # fmt: skip
    for S in (100, 8192):
        suite = M.benchmark_suite(S, seed=3, batch=2)
        assert list(suite) == list(table) == list(M.BENCHMARK_MASKS)
        for name, m in suite.items():
            assert (m.causal, m.shape) == (table[name][0], (2, 1, S, table[name][1])), name
            M.validate(m.startend_row_indices, causal=m.causal, q_len=S, kv_len=S)
        again = M.benchmark_suite(S, seed=3, batch=2)
        for name in table:
            np.testing.assert_array_equal(suite[name].startend_row_indices, again[name].startend_row_indices)
    # 8K: 3-7 documents (distinct document ends), sliding window S/16, prefix S/2
    s8 = M.benchmark_suite(8192, seed=1)
    ind = {k: np.asarray(v.startend_row_indices)[0, 0] for k, v in s8.items()}
    assert 3 <= len(np.unique(ind["document"][:, 0])) <= 7
    assert ind["sliding_window"][0, 0] == 8192 // 16 + 1
    assert (ind["prefix_lm_causal"][:, 1] == 0).sum() == 4096
    assert (ind["qk_sparse"][:, 0] < 8192).sum() == 538 + 1700
    s2 = M.benchmark_suite(8192, seed=2)
    assert not np.array_equal(s2["document"].startend_row_indices, s8["document"].startend_row_indices)


# ----------------------------------------------------------------------------- builder argument errors


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.causal_document([10, 20, -1]),
        lambda: M.causal_document([10, 0, 5]),
        lambda: M.causal_document([]),
        lambda: M.document([[1, 2]]),
        lambda: M.document([1.5, 2.5]),
        lambda: M.sliding_window(64, -1),
        lambda: M.sliding_window(0, 3),
        lambda: M.sliding_window(64, 2.5),
        lambda: M.global_sliding_window(64, 65, 3),
        lambda: M.global_sliding_window(64, 4, -2),
        lambda: M.prefix_lm_causal(64, 65),
        lambda: M.prefix_lm_causal(64, -1),
        lambda: M.prefix_lm_document([10, 20], [11, 0]),
        lambda: M.prefix_lm_document([10, 20], [1]),
        lambda: M.qk_sparse(64, 60, 10),
        lambda: M.qk_sparse(64, [0, 5], [10, 3]),
        lambda: M.qk_sparse(64, [0, 5], [3]),
        lambda: M.qk_sparse(64, -1, 3),
        lambda: M.share_question(64, groups=[[10, 20], [30]]),
        lambda: M.share_question(64, groups=[[10, 0, 54]]),
        lambda: M.share_question(64, doc_lens=[10, 20]),
        lambda: M.share_question(64, groups=[[64]], doc_lens=[64]),
        lambda: M.share_question(),
        lambda: M.random_eviction(64, 0, start_row=0),
        lambda: M.random_eviction(64, 0, start_row=60, num_evictions=5),
        lambda: M.random_eviction(64, "seed"),
        lambda: M.random_doc_lens(10, 11),
        lambda: M.random_doc_lens(10, (12, 15)),
        lambda: M.random_doc_lens(10, (3,)),
        lambda: M.full(64, batch=0),
        lambda: M.random_mask(0, 16, True, 4),
        lambda: M.random_mask(0, 16, False, 1),
    ],
)
def test_builder_errors(call):
    with pytest.raises(ValueError):
        call()


def test_doc_lens_must_sum_to_S():
    with pytest.raises(ValueError, match="sum"):
        M.share_question(64, doc_lens=[10, 20])


# ----------------------------------------------------------------------------- representation (_core)
# XLA compiles eagerly per shape, so to_dense is exercised on Sk = 64 (sharing compilations).


@pytest.mark.parametrize("causal,D", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("sq", [64, 37, 100])
def test_to_dense_matches_spec_table(causal, D, sq):
    sk = 64
    for seed in range(3):
        m = M.random_mask(seed, sk, causal, D, q_len=sq)
        got = dense(m, sq)
        assert got.shape == (1, 1, sq, sk)
        np.testing.assert_array_equal(got, spec_dense(m.startend_row_indices, causal, sq))


def test_to_dense_heads_and_batch():
    m = M.random_mask(0, 64, False, 4, batch=2, heads=3)
    got = dense(m)
    assert got.shape == (2, 3, 64, 64)
    np.testing.assert_array_equal(got, spec_dense(m.startend_row_indices, False, 64))
    assert not np.array_equal(got[0, 0], got[1, 2])


def test_causal_alignment_bottom_right():
    # no mask beyond causal, Sq < Sk: the last query row sees every key (FlashAttention >= 2.1)
    sk, sq = 64, 37
    d = dense(FlashMask(np.full((1, 1, sk, 1), sq, np.int32), True), sq)[0, 0]
    ref = np.array([[j > i + (sk - sq) for j in range(sk)] for i in range(sq)])
    np.testing.assert_array_equal(d, ref)
    assert not d[-1].any() and d[0].sum() == sq - 1
    # Sq > Sk: the first Sq - Sk rows see no key, the last row sees all
    sq = 100
    d2 = dense(FlashMask(np.full((1, 1, sk, 1), sq, np.int32), True), sq)[0, 0]
    assert d2[: sq - sk].all() and not d2[sq - sk].all() and not d2[-1].any()
    assert d2[sq - sk, 0] == 0 and d2[sq - sk, 1:].all()


SEGMENTS = [
    np.repeat([0, 1, 2, -1], [20, 17, 21, 6]),  # trailing padding
    np.repeat([-1, 7, -1, 3], [3, 30, 2, 29]),  # leading and inner padding
    np.repeat(np.arange(6), [1, 2, 3, 4, 10, 44]),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("k", range(len(SEGMENTS)))
def test_from_segment_ids(causal, k):
    s = SEGMENTS[k]
    S = len(s)
    m = M.from_segment_ids(s, causal=causal)
    assert m.causal is causal and m.shape == (1, 1, S, 1 if causal else 2)
    got = dense(m)[0, 0]
    ref = from_predicate(S, lambda i, j: (s[i] == s[j]) & (s[i] != -1) & ((j <= i) | (not causal)))
    np.testing.assert_array_equal(got, ref)
    pad = s == -1
    assert got[pad].all() and got[:, pad].all()  # padding rows and columns fully masked
    # [B, S] input: one mask per row
    two = M.from_segment_ids(np.stack([s, SEGMENTS[2]]), causal=causal)
    assert two.shape == (2, 1, S, 1 if causal else 2)
    np.testing.assert_array_equal(spec_dense(two.startend_row_indices[:1], causal, S)[0, 0], ref)


def test_from_segment_ids_errors():
    with pytest.raises(ValueError):
        M.from_segment_ids(np.array([0, 0, 1, 1, 0]))  # document 0 is not contiguous
    with pytest.raises(ValueError):
        M.from_segment_ids(np.array([0.0, 1.0]))
    with pytest.raises(ValueError):
        M.from_segment_ids(np.zeros((1, 2, 3), np.int32))


@pytest.mark.parametrize("left,right", [(None, 0), (5, 0), (0, 0), (3, 7), (None, 4), (6, None), (None, None)])
def test_from_window(left, right):
    S = 64
    m = M.from_window(S, left, right, batch=2)
    assert m.causal is (right == 0) and m.shape == (2, 1, S, 1 if right == 0 else 2)
    lo = math.inf if left is None else left
    hi = math.inf if right is None else right
    # query i sees keys j with i - left <= j <= i + right
    ref = from_predicate(S, lambda i, j: (i - lo <= j) & (j <= i + hi))
    ind = np.asarray(m.startend_row_indices)
    np.testing.assert_array_equal(ind[0], ind[1])
    np.testing.assert_array_equal(dense(FlashMask(ind[:1], m.causal))[0, 0], ref)
    with pytest.raises(ValueError):
        M.from_window(S, -1)
    with pytest.raises(ValueError):
        M.from_window(S, 3, -2)


def _ok(**kw):
    base = dict(causal=True, q_len=8, kv_len=8)
    base.update(kw)
    return base


def _lt(lts, lte, extra=()):
    cols = [np.full(8, lts), np.full(8, lte)] + [np.full(8, e) for e in extra]
    return np.stack(cols, -1)[None, None].astype(np.int32)


@pytest.mark.parametrize(
    "arr,kw,match",
    [
        (np.zeros((1, 8, 1), np.int32), _ok(), "rank 4"),
        (np.zeros((1, 1, 1, 8, 1), np.int32), _ok(), "rank 4"),
        (np.zeros((1, 1, 8, 1), np.float32), _ok(), "dtype"),
        (np.zeros((1, 1, 8, 1), bool), _ok(), "dtype"),
        (np.zeros((1, 1, 8, 4), np.int32), _ok(), "D=4"),
        (np.zeros((1, 1, 8, 3), np.int32), _ok(), "D=3"),
        (np.zeros((1, 1, 8, 3), np.int32), _ok(causal=False), "D=3"),
        (np.zeros((1, 1, 8, 1), np.int32), _ok(causal=False), "D=1"),
        (np.zeros((1, 1, 8, 1), np.int32), _ok(kv_len=9), "Sk=8"),
        (np.zeros((1, 3, 8, 1), np.int32), _ok(num_heads=8, num_kv_heads=2), "Hm=3"),
        (np.zeros((1, 4, 8, 1), np.int32), _ok(num_heads=8, num_kv_heads=2), "Hm=4"),
        (np.zeros((2, 1, 8, 1), np.int32), _ok(batch=3), "batch"),
        (np.full((1, 1, 8, 1), 9, np.int32), _ok(), r"\[0, Sq=8\]"),
        (np.full((1, 1, 8, 1), -1, np.int32), _ok(), r"\[0, Sq=8\]"),
        (np.full((1, 1, 8, 2), 9, np.int32), _ok(causal=False), r"\[0, Sq=8\]"),
        (_lt(5, 4), _ok(), "LTS must be <= LTE"),
        (_lt(0, 0, extra=(5, 4)), _ok(causal=False), "UTS must be <= UTE"),
        (_lt(3, 2, extra=(0, 0)), _ok(causal=False), "LTS must be <= LTE"),
        ([[[[1]]]], _ok(), "array"),
    ],
)
def test_validate_errors(arr, kw, match):
    with pytest.raises(ValueError, match=match):
        M.validate(arr, **kw)


def test_validate_accepts():
    M.validate(np.zeros((1, 1, 8, 1), np.int32), causal=True, q_len=8, kv_len=8)
    for hm in (1, 2, 8):
        M.validate(np.zeros((2, hm, 8, 2), np.int32), causal=False, q_len=8, num_heads=8, num_kv_heads=2, batch=2)
    # non-causal D=2 has no order between LTS and UTE
    M.validate(np.stack([np.zeros(8), np.full(8, 8)], -1)[None, None].astype(np.int32), causal=False, q_len=8)
    M.validate(np.full((1, 1, 8, 1), 3, np.int64), causal=True, q_len=3)


# ----------------------------------------------------------------------------- sparsity


def spec_canonical(ind, causal, sq):
    """SPEC §1's reduction of every mode to D=4 (LTS, LTE, UTS, UTE), per column: [B, Hm, 4, Sk]."""
    ind = np.asarray(ind).astype(np.int64)
    b, hm, sk, d = ind.shape
    j = np.broadcast_to(np.arange(sk), (b, hm, sk))
    zeros, sqs = np.zeros((b, hm, sk), np.int64), np.full((b, hm, sk), sq)
    if causal:  # causal D=1: LTE=Sq, UTS=0, UTE=j-δ clipped; causal D=2: UTS=0, UTE=j-δ
        ute = np.clip(j - (sk - sq), 0, sq)
        vec = [ind[..., 0], ind[..., 1] if d == 2 else sqs, zeros, ute]
    elif d == 2:  # non-causal D=2: LTE=Sq, UTS=0
        vec = [ind[..., 0], sqs, zeros, ind[..., 1]]
    else:
        vec = [ind[..., k] for k in range(4)]
    return np.stack(vec, axis=2)


def dense_tile_stats(d, block):
    """(fraction of cells in fully-masked tiles, exact visible fraction) from a dense mask."""
    sq, sk = d.shape[-2:]
    skipped = 0
    for r in range(0, sq, block):
        for c in range(0, sk, block):
            t = d[..., r : r + block, c : c + block]
            skipped += t.all(axis=(-1, -2)).sum() * t.shape[-1] * t.shape[-2]
    return skipped / d.size, 1.0 - d.mean()


def brute_classification(bounds, sq, block):
    """SPEC §3's skip test tile by tile, with loops over the per-column canonical bounds."""
    b, hm, _, sk = bounds.shape
    skipped = total = 0
    for x in range(b):
        for h in range(hm):
            for ms in range(0, sq, block):
                me = min(ms + block, sq)
                for ns in range(0, sk, block):
                    cols = bounds[x, h, :, ns : ns + block]
                    lts_max, lte_min = cols[0].max(), cols[1].min()
                    uts_max, ute_min = cols[2].max(), cols[3].min()
                    area = (me - ms) * cols.shape[1]
                    total += area
                    if (ms >= lts_max and me <= lte_min) or (ms >= uts_max and me <= ute_min):
                        skipped += area
    return skipped / total


@pytest.mark.parametrize("S,block", [(256, 32), (257, 16), (100, 128)])
def test_block_sparsity_and_visible_fraction_suite(S, block):
    # masks whose skip test is exact (every fully-masked tile is found) at these sizes
    exact = {"full", "causal", "sliding_window", "causal_document", "document", "prefix_lm_causal", "causal_blockwise"}
    for name, m in M.benchmark_suite(S, seed=5).items():
        d = spec_dense(m.startend_row_indices, m.causal, S)
        rho_dense, vis_dense = dense_tile_stats(d, block)
        rho = M.block_sparsity(m, block=block)
        bounds = spec_canonical(m.startend_row_indices, m.causal, S)
        assert rho == pytest.approx(brute_classification(bounds, S, block), abs=1e-12), name
        assert rho <= rho_dense + 1e-12, name  # a sufficient test: never skips a visible cell
        if name in exact:
            assert rho == pytest.approx(rho_dense, abs=1e-12), name
        assert M.visible_fraction(m) == pytest.approx(vis_dense, abs=1e-12), name


def test_block_sparsity_known_values():
    S = 1024
    assert M.block_sparsity(M.full(S)) == 0.0
    assert M.block_sparsity(M.causal(S)) == pytest.approx(8 * 7 / 2 / 64)
    assert M.block_sparsity(M.document([512, 512])) == pytest.approx(0.5)
    assert M.visible_fraction(M.causal(S)) == pytest.approx((S + 1) / (2 * S))
    assert M.visible_fraction(M.full(S)) == 1.0
    # raw indices with causal=
    ind = M.causal(S).startend_row_indices
    assert M.block_sparsity(ind, causal=True) == M.block_sparsity(M.causal(S))
    with pytest.raises(ValueError):
        M.block_sparsity(ind)


@pytest.mark.parametrize("causal,D", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("sk,sq", [(96, 70), (70, 96)])
def test_sparsity_random_masks(causal, D, sk, sq):
    for seed in range(4):
        m = M.random_mask(seed, sk, causal, D, batch=2, heads=3, q_len=sq)
        d = spec_dense(m.startend_row_indices, causal, sq)
        rho_dense, vis_dense = dense_tile_stats(d, 16)
        bounds = spec_canonical(m.startend_row_indices, causal, sq)
        rho = M.block_sparsity(m, q_len=sq, block=16)
        assert rho == pytest.approx(brute_classification(bounds, sq, 16), abs=1e-12)
        assert rho <= rho_dense + 1e-12
        assert M.visible_fraction(m, q_len=sq) == pytest.approx(vis_dense, abs=1e-12)


# ----------------------------------------------------------------------------- property tests

MODES = [(True, 1), (True, 2), (False, 2), (False, 4)]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(MODES),
    sk=st.integers(1, 48),
    sq=st.one_of(st.none(), st.integers(1, 48)),
    batch=st.integers(1, 2),
    heads=st.sampled_from([1, 2]),
)
def test_random_mask_valid(seed, mode, sk, sq, batch, heads):
    """random_mask always validates, and its canonical form (host twin) matches SPEC §1."""
    causal, D = mode
    m = M.random_mask(np.random.default_rng(seed), sk, causal, D, batch=batch, heads=heads, q_len=sq)
    q = sk if sq is None else sq
    ind = np.asarray(m.startend_row_indices)
    assert ind.shape == (batch, heads, sk, D) and ind.dtype == np.int32 and m.causal is causal
    assert ind.min() >= 0 and ind.max() <= q
    M.validate(ind, causal=causal, q_len=q, kv_len=sk)
    b = M.canonical_bounds_np(ind, causal=causal, q_len=q)
    np.testing.assert_array_equal(b, spec_canonical(ind, causal, q))
    i = np.arange(q)[:, None]
    lts, lte, uts, ute = (b[:, :, k, None, :] for k in range(4))
    d4 = ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))
    np.testing.assert_array_equal(d4, spec_dense(ind, causal, q))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(MODES), sq=st.sampled_from([37, 64, 100]))
def test_canonical_bounds_dense_property(seed, mode, sq):
    """The library's canonical_bounds ∘ dense_from_bounds agrees with SPEC §1's per-mode formula
    (Sk = 64: the shapes of the to_dense tests, so XLA compiles each once)."""
    causal, D = mode
    m = M.random_mask(seed, 64, causal, D, q_len=sq)
    bounds = M.canonical_bounds(m.startend_row_indices, causal=causal, q_len=sq)
    np.testing.assert_array_equal(np.asarray(bounds), spec_canonical(m.startend_row_indices, causal, sq))
    got = np.asarray(M.dense_from_bounds(bounds, sq))
    np.testing.assert_array_equal(got, spec_dense(m.startend_row_indices, causal, sq))


def test_random_mask_covers_edge_cases():
    """Across seeds the generator produces empty, full and partial columns in every mode."""
    for causal, D in MODES:
        seen = set()
        for seed in range(40):
            d = spec_dense(M.random_mask(seed, 32, causal, D).startend_row_indices, causal, 32)[0, 0]
            col = d.sum(0)
            lo = np.arange(32) if causal else np.zeros(32)  # causal: column j always hides rows < j
            seen |= {"empty" if c == l else "full" if c == 32 else "partial" for c, l in zip(col, lo)}
        assert seen == {"empty", "full", "partial"}, (causal, D)


# ----------------------------------------------------------------------------- plots


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "one.png"
    M.plot(M.causal_document([30, 34]), path=p, title="doc")
    assert p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    suite = M.benchmark_suite(100, seed=0)
    q = tmp_path / "suite.png"
    M.plot_suite({k: suite[k] for k in ("causal", "share_question", "global_sliding_window")}, q)
    assert q.stat().st_size > 3000 and q.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib(monkeypatch, tmp_path):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install matplotlib"):
        M.plot(M.causal(8), path=tmp_path / "x.png")
    with pytest.raises(ImportError, match="pip install matplotlib"):
        M.plot_suite({"c": M.causal(8)}, tmp_path / "y.png")


def test_sampled_dense_is_small_and_exact():
    m = M.benchmark_suite(5000, seed=0)["share_question"]
    d, rows, cols = M.sampled_dense(m)
    assert d.shape == (1024, 1024) and rows.max() < 5000 and cols.max() < 5000
    # exact at the sampled cells
    lts = np.asarray(m.startend_row_indices)[0, 0, :, 0]
    ref = (cols[None, :] > rows[:, None]) | (rows[:, None] >= lts[cols][None, :])
    np.testing.assert_array_equal(d, ref)
    small, _, _ = M.sampled_dense(M.causal(50))
    assert small.shape == (50, 50)
    np.testing.assert_array_equal(small, np.triu(np.ones((50, 50), bool), 1))
