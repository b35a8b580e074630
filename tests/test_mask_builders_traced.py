"""Masks from data inside jit (segment ids, windows, lengths), from a dense mask and from a
FlexAttention-style mask function."""

import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flashmask import FlashMask, masks


def dense(m, q_len=None):
    return np.asarray(m.to_dense(q_len))


def predicate(sq, sk, f):
    i, j = np.meshgrid(np.arange(sq), np.arange(sk), indexing="ij")
    return ~np.asarray(f(i, j), bool)  # True = masked


def vectors(m):
    return np.asarray(m.startend_row_indices)


SEGMENTS = [
    np.repeat([0, 1, 2, -1], [20, 17, 21, 6]),
    np.repeat([-1, 7, -1, 3], [3, 30, 2, 29]),
    np.repeat(np.arange(6), [1, 2, 3, 4, 10, 44]),
]


@pytest.mark.parametrize("causal", [True, False])
def test_segment_ids_traced_equals_host(causal):
    ids = np.stack(SEGMENTS).astype(np.int32)
    host = masks.from_segment_ids(ids, causal=causal)
    traced = jax.jit(lambda s: masks.from_segment_ids(s, causal=causal))(ids)
    assert traced.causal is host.causal is causal
    np.testing.assert_array_equal(vectors(traced), vectors(host))
    for r, s in enumerate(SEGMENTS):
        ref = predicate(64, 64, lambda i, j: (s[i] == s[j]) & (s[i] != -1) & ((j <= i) | (not causal)))
        np.testing.assert_array_equal(dense(traced)[r, 0], ref)


def test_segment_ids_match_document_builders():
    lens = [5, 17, 9, 33]
    ids = np.repeat(np.arange(4), lens).astype(np.int32)
    f = jax.jit(masks.from_segment_ids, static_argnames="causal")
    np.testing.assert_array_equal(vectors(f(ids, causal=True)), vectors(masks.causal_document(lens)))
    np.testing.assert_array_equal(vectors(f(ids, causal=False)), vectors(masks.document(lens)))


def test_segment_ids_traced_noncontiguous_runs_are_documents():
    s = np.array([0, 0, 1, 1, 0, 0, 0], np.int32)
    with pytest.raises(ValueError, match="contiguous"):
        masks.from_segment_ids(s)  # concrete: checked
    m = jax.jit(masks.from_segment_ids)(s)  # traced: each maximal run is its own document
    run = np.array([0, 0, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(dense(m)[0, 0], predicate(7, 7, lambda i, j: (run[i] == run[j]) & (j <= i)))


@pytest.mark.parametrize("causal", [True, False])
def test_segment_ids_q_kv_bottom_right(causal):
    # kv: a cached prefix then the new tokens; q: the last Sq tokens (documents continue across)
    kv = np.repeat([0, 1, 2, -1], [10, 25, 20, 5]).astype(np.int32)
    q = kv[-24:]
    sq, sk = len(q), len(kv)
    m = jax.jit(lambda a, b: masks.from_segment_ids(a, b, causal=causal))(q, kv)
    assert m.causal is False and m.shape == (1, 1, sk, 2)
    d = sk - sq
    ref = predicate(sq, sk, lambda i, j: (q[i] == kv[j]) & (q[i] != -1) & ((j <= i + d) | (not causal)))
    np.testing.assert_array_equal(dense(m, sq)[0, 0], ref)
    # an id absent from the queries hides its columns; batch broadcasting of q ids
    qb = np.stack([q, np.full_like(q, 1)])
    m2 = masks.from_segment_ids(qb, kv, causal=causal)
    ref2 = predicate(sq, sk, lambda i, j: (qb[1][i] == kv[j]) & ((j <= i + d) | (not causal)))
    np.testing.assert_array_equal(dense(m2, sq)[1, 0], ref2)


def test_segment_ids_errors():
    with pytest.raises(ValueError, match="empty"):
        masks.from_segment_ids([])
    with pytest.raises(ValueError, match="empty"):
        masks.from_segment_ids(np.zeros((2, 0), np.int32))
    with pytest.raises(ValueError, match="integer"):
        masks.from_segment_ids(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="batch"):
        masks.from_segment_ids(np.zeros((2, 4), np.int32), np.zeros((3, 4), np.int32))


@pytest.mark.parametrize("sq", [40, 64, 23])
@pytest.mark.parametrize("left,right", [(5, 0), (None, 0), (3, 7), (6, None), (0, 2)])
def test_window_traced_equals_host(sq, left, right):
    sk = 64
    host = masks.from_window(sk, left, right, batch=2, q_len=sq)
    d = sk - sq
    lo = np.inf if left is None else left
    hi = np.inf if right is None else right
    ref = predicate(sq, sk, lambda i, j: (i + d - lo <= j) & (j <= i + d + hi))
    np.testing.assert_array_equal(dense(host, sq)[1, 0], ref)
    if sq == sk and right == 0 and left is not None:
        np.testing.assert_array_equal(vectors(host)[:1], vectors(masks.sliding_window(sk, left)))
    # left traced (right static keeps the mode), then both traced (non-causal D=2)
    if left is not None:
        f = jax.jit(lambda l: masks.from_window(sk, l, right, batch=2, q_len=sq))
        t = f(jnp.int32(left))
        assert t.causal is host.causal
        np.testing.assert_array_equal(vectors(t), vectors(host))
    if left is not None and right is not None:
        g = jax.jit(lambda l, r: masks.from_window(sk, l, r, q_len=sq))
        np.testing.assert_array_equal(dense(g(jnp.int32(left), jnp.int32(right)), sq)[0, 0], ref)


@pytest.mark.parametrize("causal", [True, False])
def test_seq_lengths_traced(causal):
    sq, sk = 24, 32
    ql, kl = np.array([24, 10, 0], np.int32), np.array([32, 5, 17], np.int32)
    f = jax.jit(lambda a, b: masks.from_seq_lengths(a, b, q_len=sq, kv_len=sk, causal=causal))
    m = f(ql, kl)
    assert m.causal is causal
    d = sk - sq
    for b in range(3):
        ref = predicate(sq, sk, lambda i, j: (i < ql[b]) & (j < kl[b]) & ((j <= i + d) | (not causal)))
        np.testing.assert_array_equal(dense(m, sq)[b, 0], ref)


# ----------------------------------------------------------------------------- from_dense


@pytest.mark.parametrize("name", masks.BENCHMARK_MASKS)
def test_from_dense_round_trips_benchmark_suite(name):
    S = 256
    m = masks.benchmark_suite(S, seed=3)[name]
    got = masks.from_dense(dense(m))
    np.testing.assert_array_equal(dense(got), dense(m))
    assert (got.causal, got.shape[-1]) == (m.causal, m.shape[-1]), "not the builder's (smallest) mode"


@pytest.mark.parametrize("causal,D", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("sq", [48, 64, 80])
def test_from_dense_random_masks(causal, D, sq):
    for seed in range(3):
        m = masks.random_mask(seed, 64, causal, D, batch=2, heads=3, q_len=sq)
        got = masks.from_dense(dense(m, sq))
        assert got.shape[:3] == (2, 3, 64)
        np.testing.assert_array_equal(dense(got, sq), dense(m, sq))
        assert got.shape[-1] <= 4 and (got.shape[-1], got.causal) != (4, True)


def test_from_dense_picks_smallest_mode():
    S = 16
    causal = predicate(S, S, lambda i, j: j <= i)
    m = masks.from_dense(causal)
    assert (m.causal, m.shape) == (True, (1, 1, S, 1))
    np.testing.assert_array_equal(vectors(m)[0, 0, :, 0], S)
    full = masks.from_dense(np.zeros((1, 1, S, S), bool))
    assert (full.causal, full.shape[-1]) == (False, 2)
    allm = masks.from_dense(np.ones((S, S), bool))
    assert dense(allm).all()


def test_from_dense_errors():
    d = np.zeros((1, 2, 10, 12), bool)
    d[0, 1, [1, 4, 7], 5] = True  # three separate runs in column 5 of mask head 1
    with pytest.raises(ValueError, match=r"j=5 \(batch 0, mask head 1\)"):
        masks.from_dense(d)
    with pytest.raises(ValueError, match="boolean"):
        masks.from_dense(np.zeros((1, 1, 4, 4), np.int32))
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(masks.from_dense)(jnp.zeros((1, 1, 4, 4), bool))


# ----------------------------------------------------------------------------- from_mask_fn


def test_from_mask_fn_sliding_window_and_document_exact():
    S, w = 300, 37
    got = masks.from_mask_fn(lambda b, h, q, k: (k <= q) & (q - k <= w), S, block=7)
    np.testing.assert_array_equal(vectors(got), vectors(masks.sliding_window(S, w)))
    assert got.causal
    lens = [50, 120, 1, 129]
    doc = np.repeat(np.arange(len(lens)), lens)
    got = masks.from_mask_fn(lambda b, h, q, k: doc[q] == doc[k], S, block=64)
    ref = masks.document(lens)
    assert got.causal is ref.causal
    np.testing.assert_array_equal(vectors(got), vectors(ref))


def test_from_mask_fn_batch_heads_and_sq_ne_sk():
    sq, sk = 40, 56

    def mod(b, h, q, k):  # per-head window, per-batch key padding; bottom-right causal
        return (k <= q + (sk - sq)) & (q + (sk - sq) - k <= 4 + 3 * h) & (k < sk - 5 * b)

    got = masks.from_mask_fn(mod, sq, sk, batch=2, heads=3)
    assert got.shape[:3] == (2, 3, sk)
    for b in range(2):
        for h in range(3):
            np.testing.assert_array_equal(dense(got, sq)[b, h], predicate(sq, sk, lambda i, j: mod(b, h, i, j)))


def test_from_mask_fn_errors():
    with pytest.raises(ValueError, match="more than two"):
        masks.from_mask_fn(lambda b, h, q, k: (q % 4) != 0, 16)
    with pytest.raises(TypeError, match="booleans"):
        masks.from_mask_fn(lambda b, h, q, k: q - k, 16)
    with pytest.raises(TypeError, match="callable"):
        masks.from_mask_fn(None, 16)


def test_from_mask_fn_128k_without_s2_array():
    S = 128 * 1024
    lens = [40000, 30000, 1, S - 70001]
    end = np.repeat(np.cumsum(lens), lens).astype(np.int32)
    tracemalloc.start()
    t0 = time.perf_counter()
    got = masks.from_mask_fn(lambda b, h, q, k: (k <= q) & (q < end[k]), S)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"from_mask_fn at S={S}: {elapsed:.1f} s, peak traced memory {peak / 2**20:.1f} MiB")
    assert peak < 256 * 2**20  # an S² bool array would be 16 GiB
    np.testing.assert_array_equal(vectors(got), vectors(masks.causal_document(lens)))
