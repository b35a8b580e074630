"""Builders of the twelve benchmark masks of FlashMask's suite (SPEC §2), random masks, sparsity.

Every builder returns a `FlashMask` whose ``startend_row_indices`` is int32 ``[batch, 1, S, D]``
with the (causal, D) pair of SPEC §2 (the mask is the same for every batch entry: ``batch``
broadcasts it). Builders are host-side numpy code: O(S) memory, never an S×S array.

Notation: ``doc_start(j)`` / ``doc_end(j)`` bound the document that contains column ``j``.

===================== ========= ==============================================================
mask                  causal/D  vectors
===================== ========= ==============================================================
full                  F / 2     LTS = S, UTE = 0
causal                T / 1     LTS = S
sliding_window        T / 1     LTS[j] = min(j + w + 1, S)
causal_document       T / 1     LTS[j] = doc_end(j)
document              F / 2     LTS = doc_end(j), UTE = doc_start(j)
share_question        T / 1     question columns: LTS = end of the question+answers group;
                                answer columns: LTS = end of that answer
global_sliding_window F / 4     first g columns visible to all rows; other columns: rows outside
                                [j - w, j + w] masked except the global rows < g
causal_blockwise      T / 2     LTS = doc_end(j); LTE = start of the last document (S for the
                                last document's own columns)
prefix_lm_document    F / 2     LTS = doc_end(j); UTE = doc_start(j) on the prefix columns of a
                                document, = j on its suffix columns
prefix_lm_causal      F / 2     LTS = S; UTE = 0 for j < prefix, = j otherwise
qk_sparse             T / 2     dropped span [o, o + L): LTS[j] = j, LTE[j] = o + L; other
                                columns LTS = LTE = S
random_eviction       T / 1     evicted column: LTS = its eviction row (>= S/2, > j); others S
===================== ========= ==============================================================

Default parameters of `benchmark_suite` follow FlashMask's public kernel benchmark script (its
``generate_*_mask`` functions and the parameters its driver passes them):
sliding window ``w = S/16``; global sliding window ``g = 16`` global tokens and ``w = S/16`` on
both sides; prefix-LM causal prefix ``S/2``; documents split at random (`default_num_docs`);
share-question: every document is one question followed by 2–6 answers of random lengths;
prefix-LM document: a random prefix of every document; qk-sparse: FlashMask's two dropped spans
``(1024, 538)`` and ``(2358, 1700)`` at S = 8192, scaled with S; random eviction: from row
``ceil(S/2)`` on every row evicts one random still-cached key (``S/2`` evictions in all).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._core import ALLOWED_D, FlashMask, validate

__all__ = [
    "full",
    "causal",
    "sliding_window",
    "causal_document",
    "document",
    "share_question",
    "global_sliding_window",
    "causal_blockwise",
    "prefix_lm_document",
    "prefix_lm_causal",
    "qk_sparse",
    "random_eviction",
    "default_num_docs",
    "random_doc_lens",
    "random_qa_split",
    "benchmark_suite",
    "BENCHMARK_MASKS",
    "block_sparsity",
    "visible_fraction",
    "random_mask",
    "canonical_bounds_np",
    "from_segment_ids",
    "from_window",
    "from_seq_lengths",
    "band_bounds",
    "from_dense",
    "from_mask_fn",
]

# SPEC §2 order.
BENCHMARK_MASKS = (
    "full",
    "causal",
    "sliding_window",
    "causal_document",
    "document",
    "share_question",
    "global_sliding_window",
    "causal_blockwise",
    "prefix_lm_document",
    "prefix_lm_causal",
    "qk_sparse",
    "random_eviction",
)


# ----------------------------------------------------------------------------- helpers


def _rng(rng) -> np.random.Generator:
    """A numpy Generator from a Generator, a seed (int / SeedSequence) or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        return np.random.default_rng(rng)
    raise ValueError(f"rng must be a numpy Generator, an int seed or None, got {type(rng).__name__}")


def _int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def _seq_len(S) -> int:
    return _int("S (sequence length)", S, lo=1)


def _batch(batch) -> int:
    return _int("batch", batch, lo=1)


def _lens(name: str, lens, S: int | None = None, *, min_len: int = 1) -> np.ndarray:
    """Validated 1-D int64 array of lengths (each >= min_len), summing to S if S is given."""
    arr = np.asarray(lens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of ints, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold ints, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < min_len):
        raise ValueError(f"{name} must all be >= {min_len}, got {arr.tolist()}")
    if S is not None and int(arr.sum()) != S:
        raise ValueError(f"{name} must sum to the sequence length S={S}, got sum {int(arr.sum())}")
    return arr


def _doc_bounds(doc_lens: np.ndarray):
    """Per-column doc_start(j) and doc_end(j) (int64, length S)."""
    ends = np.cumsum(doc_lens)
    starts = ends - doc_lens
    return np.repeat(starts, doc_lens), np.repeat(ends, doc_lens)


def _to_device(ind: np.ndarray):
    # jax.device_put, not jnp.asarray: the latter compiles a conversion for every new shape.
    return jax.device_put(np.ascontiguousarray(ind, dtype=np.int32))


def _make(vectors, causal: bool, batch: int) -> FlashMask:
    """FlashMask ``[batch, 1, S, D]`` from D per-column vectors (validated against SPEC §1)."""
    ind = np.stack([np.asarray(v, np.int64) for v in vectors], axis=-1)  # [S, D]
    s = ind.shape[0]
    ind = np.broadcast_to(ind[None, None].astype(np.int32), (batch, 1) + ind.shape)
    validate(ind, causal=causal, q_len=s, kv_len=s)
    return FlashMask(_to_device(ind), causal=causal)


# ----------------------------------------------------------------------------- documents


def default_num_docs(S: int) -> tuple[int, int]:
    """FlashMask's document counts, an inclusive range: 3–7 up to 8K, 10–14 up to 32K, 11–15 beyond."""
    S = _seq_len(S)
    if S <= 8 * 1024:
        return (3, 7)
    if S <= 32 * 1024:
        return (10, 14)
    return (11, 15)


def random_doc_lens(S: int, n_docs=None, rng=None, *, min_len: int = 1) -> list[int]:
    """Split S tokens into random documents (a uniformly random composition).

    `n_docs`: an int, an inclusive ``(lo, hi)`` range to draw the count from, or None for
    `default_num_docs(S)`. Every document gets at least `min_len` tokens.
    """
    S = _seq_len(S)
    min_len = _int("min_len", min_len, lo=1)
    g = _rng(rng)
    if n_docs is None:
        n_docs = default_num_docs(S)
    if isinstance(n_docs, (tuple, list)):
        if len(n_docs) != 2:
            raise ValueError(f"n_docs range must be (lo, hi), got {n_docs!r}")
        lo = _int("n_docs lo", n_docs[0], lo=1)
        hi = _int("n_docs hi", n_docs[1], lo=lo)
        hi = min(hi, S // min_len)
        if lo > hi:
            raise ValueError(f"cannot split S={S} into at least {lo} documents of >= {min_len} tokens")
        n = int(g.integers(lo, hi + 1))
    else:
        n = _int("n_docs", n_docs, lo=1)
    if n * min_len > S:
        raise ValueError(f"cannot split S={S} into {n} documents of >= {min_len} tokens")
    extra = S - n * min_len
    # stars and bars: n-1 distinct cut positions among extra + n - 1 slots
    cuts = np.sort(g.choice(extra + n - 1, size=n - 1, replace=False)) if n > 1 else np.zeros(0, np.int64)
    edges = np.concatenate([[-1], cuts, [extra + n - 1]])
    lens = np.diff(edges) - 1 + min_len
    assert lens.sum() == S and lens.min() >= min_len
    return [int(x) for x in lens]


def random_qa_split(doc_len: int, num_answers=(2, 6), rng=None) -> list[int]:
    """Split one document into ``[question, answer_1, ..., answer_k]`` lengths (each >= 1).

    `num_answers`: an int or an inclusive ``(lo, hi)`` range (FlashMask: 2–6); capped at
    ``doc_len - 1``. Lengths are a uniformly random composition of `doc_len`.
    """
    doc_len = _int("doc_len", doc_len, lo=1)
    g = _rng(rng)
    if isinstance(num_answers, (tuple, list)):
        lo = _int("num_answers lo", num_answers[0], lo=0)
        hi = _int("num_answers hi", num_answers[1], lo=lo)
        k = int(g.integers(lo, hi + 1))
    else:
        k = _int("num_answers", num_answers, lo=0)
    k = min(k, doc_len - 1)
    return random_doc_lens(doc_len, k + 1, g)


# ----------------------------------------------------------------------------- the twelve masks


def full(S: int, *, batch: int = 1) -> FlashMask:
    """No mask (non-causal D=2: LTS = S, UTE = 0)."""
    S, batch = _seq_len(S), _batch(batch)
    return _make([np.full(S, S), np.zeros(S)], False, batch)


def causal(S: int, *, batch: int = 1) -> FlashMask:
    """Plain causal (causal D=1: LTS = S)."""
    S, batch = _seq_len(S), _batch(batch)
    return _make([np.full(S, S)], True, batch)


def sliding_window(S: int, window: int, *, batch: int = 1) -> FlashMask:
    """Causal sliding window: row i sees keys ``i - window <= j <= i`` (LTS[j] = min(j+w+1, S))."""
    S, batch = _seq_len(S), _batch(batch)
    w = _int("window", window, lo=0)
    j = np.arange(S, dtype=np.int64)
    return _make([np.minimum(j + w + 1, S)], True, batch)


def causal_document(doc_lens: Sequence[int], *, batch: int = 1) -> FlashMask:
    """Packed documents, causal inside each (causal D=1: LTS = doc_end(j))."""
    lens = _lens("doc_lens", doc_lens)
    _, end = _doc_bounds(lens)
    return _make([end], True, _batch(batch))


def document(doc_lens: Sequence[int], *, batch: int = 1) -> FlashMask:
    """Packed documents, bidirectional inside each (non-causal D=2: LTS = doc_end, UTE = doc_start)."""
    lens = _lens("doc_lens", doc_lens)
    start, end = _doc_bounds(lens)
    return _make([end, start], False, _batch(batch))


def share_question(
    S: int | None = None,
    *,
    groups: Sequence[Sequence[int]] | None = None,
    doc_lens: Sequence[int] | None = None,
    num_answers=(2, 6),
    rng=None,
    batch: int = 1,
) -> FlashMask:
    """Shared-question mask (causal D=1): documents each made of a question then several answers.

    Every answer sees the question (and itself, causally) but not the other answers.
    Describe the documents by one of

    * ``groups``: per document ``[question_len, answer_1_len, ...]`` (every part >= 1);
    * ``doc_lens``: document lengths, each split at random by `random_qa_split` (`num_answers`);
    * ``S`` alone: random documents (`random_doc_lens`), then split as above.

    `S`, when given with `groups` / `doc_lens`, must equal their total.
    Vectors: question columns LTS = end of the group; answer columns LTS = end of that answer.
    """
    if groups is not None and doc_lens is not None:
        raise ValueError("share_question: give groups or doc_lens, not both")
    if S is not None:
        S = _seq_len(S)
    if groups is None:
        g = _rng(rng)
        if doc_lens is None:
            if S is None:
                raise ValueError("share_question: give S, doc_lens or groups")
            doc_lens = random_doc_lens(S, None, g)
        lens = _lens("doc_lens", doc_lens, S)
        groups = [random_qa_split(int(n), num_answers, g) for n in lens]
    if isinstance(groups, (str, bytes)) or len(groups) == 0:
        raise ValueError("share_question: groups must be a non-empty list of [question, answers...]")
    parts = [_lens(f"groups[{k}]", grp) for k, grp in enumerate(groups)]
    total = int(sum(p.sum() for p in parts))
    if S is not None and total != S:
        raise ValueError(f"share_question: groups cover {total} tokens, but S={S}")
    lts = np.empty(total, np.int64)
    pos = 0
    for p in parts:
        group_end = pos + int(p.sum())
        lts[pos : pos + p[0]] = group_end  # the question: visible to its whole group
        pos += int(p[0])
        for a in p[1:]:
            lts[pos : pos + a] = pos + a  # an answer: visible to itself only
            pos += int(a)
    return _make([lts], True, _batch(batch))


def global_sliding_window(S: int, global_tokens: int, window: int, *, batch: int = 1) -> FlashMask:
    """Sliding window with global tokens (non-causal D=4).

    The first `global_tokens` (g) columns are visible to every row and the first g rows see every
    column; otherwise row i sees column j when ``|i - j| <= window``.
    Vectors: global columns have empty ranges (LTS = LTE = S, UTS = UTE = 0); column j >= g has
    LTS = min(j + w + 1, S), LTE = S and UTS = g, UTE = j - w when ``j - w > g`` (else empty).
    """
    S, batch = _seq_len(S), _batch(batch)
    g = _int("global_tokens", global_tokens, lo=0, hi=S)
    w = _int("window", window, lo=0)
    j = np.arange(S, dtype=np.int64)
    glob = j < g
    lts = np.where(glob, S, np.minimum(j + w + 1, S))
    lte = np.full(S, S)
    up = (j - w > g) & ~glob
    uts = np.where(up, g, 0)
    ute = np.where(up, j - w, 0)
    return _make([lts, lte, uts, ute], False, batch)


def causal_blockwise(doc_lens: Sequence[int], *, batch: int = 1) -> FlashMask:
    """Causal blockwise (causal D=2): documents are causal and isolated, except the last document,
    which sees everything before it. LTS = doc_end(j); LTE = start of the last document (S on the
    last document's own columns)."""
    lens = _lens("doc_lens", doc_lens)
    S = int(lens.sum())
    _, end = _doc_bounds(lens)
    last_start = S - int(lens[-1])
    lte = np.where(np.arange(S) >= last_start, S, last_start)
    return _make([end, lte], True, _batch(batch))


def prefix_lm_document(doc_lens: Sequence[int], prefix_lens: Sequence[int], *, batch: int = 1) -> FlashMask:
    """Packed prefix-LM documents (non-causal D=2): inside a document the first `prefix_lens[k]`
    tokens are bidirectional, the rest causal; documents do not see each other.
    LTS = doc_end(j); UTE = doc_start(j) on prefix columns, j on suffix columns."""
    lens = _lens("doc_lens", doc_lens)
    pre = _lens("prefix_lens", prefix_lens, min_len=0)
    if pre.shape != lens.shape:
        raise ValueError(
            f"prefix_lens must have one entry per document ({lens.size}), got {pre.size}"
        )
    if np.any(pre > lens):
        raise ValueError(f"every prefix must fit in its document: prefix_lens {pre.tolist()} > doc_lens {lens.tolist()}")
    start, end = _doc_bounds(lens)
    j = np.arange(int(lens.sum()), dtype=np.int64)
    in_prefix = j < start + np.repeat(pre, lens)
    return _make([end, np.where(in_prefix, start, j)], False, _batch(batch))


def prefix_lm_causal(S: int, prefix: int, *, batch: int = 1) -> FlashMask:
    """Prefix LM (non-causal D=2): the first `prefix` tokens are bidirectional, the rest causal.
    LTS = S; UTE = 0 for j < prefix, j otherwise."""
    S, batch = _seq_len(S), _batch(batch)
    p = _int("prefix", prefix, lo=0, hi=S)
    j = np.arange(S, dtype=np.int64)
    return _make([np.full(S, S), np.where(j < p, 0, j)], False, batch)


def qk_sparse(S: int, offset, length, *, batch: int = 1) -> FlashMask:
    """QK-sparse (causal D=2): the queries of a dropped span ``[o, o + L)`` do not attend to the
    keys of that span (they still see the keys before it); rows from ``o + L`` on see everything.

    `offset` and `length` are ints (one span) or equal-length sequences (several spans, sorted and
    non-overlapping). Span columns: LTS[j] = j, LTE[j] = o + L; other columns LTS = LTE = S.
    """
    S, batch = _seq_len(S), _batch(batch)
    offs = np.atleast_1d(np.asarray(offset))
    lens = np.atleast_1d(np.asarray(length))
    if offs.ndim != 1 or lens.shape != offs.shape:
        raise ValueError(f"qk_sparse: offset and length must be ints or equal-length sequences, got {offset!r}, {length!r}")
    lts = np.full(S, S, np.int64)
    lte = np.full(S, S, np.int64)
    prev_end = 0
    for k, (o, n) in enumerate(zip(offs.tolist(), lens.tolist())):
        o = _int(f"offset[{k}]", o, lo=0)
        n = _int(f"length[{k}]", n, lo=0)
        if o + n > S:
            raise ValueError(f"qk_sparse: span [{o}, {o + n}) does not fit in S={S}")
        if o < prev_end:
            raise ValueError(f"qk_sparse: spans must be sorted and non-overlapping (span {k} starts at {o} < {prev_end})")
        lts[o : o + n] = np.arange(o, o + n)
        lte[o : o + n] = o + n
        prev_end = o + n
    return _make([lts, lte], True, batch)


def random_eviction(
    S: int,
    rng=None,
    *,
    start_row: int | None = None,
    num_evictions: int | None = None,
    batch: int = 1,
) -> FlashMask:
    """Random KV eviction (causal D=1): an evicted key is invisible from its eviction row on.

    Evictions happen at `num_evictions` distinct random rows in ``[start_row, S)`` (default: every
    one of them, one eviction per row; `start_row` defaults to ``ceil(S/2)``, as FlashMask's
    ``S//2``). At each eviction row r a key chosen uniformly among the keys ``j < r`` not yet evicted
    gets LTS[j] = r; other columns LTS = S. (A cache of `start_row` keys that evicts one per step.)
    """
    S, batch = _seq_len(S), _batch(batch)
    g = _rng(rng)
    r0 = (S + 1) // 2 if start_row is None else _int("start_row", start_row, lo=1, hi=S)
    n = S - r0 if num_evictions is None else _int("num_evictions", num_evictions, lo=0, hi=S - r0)
    rows = np.arange(r0, S) if n == S - r0 else np.sort(g.choice(np.arange(r0, S), size=n, replace=False))
    u = g.random(n)
    lts = np.full(S, S, np.int64)
    pool = list(range(r0))  # keys j < current row that are still cached
    nxt = r0
    for k, r in enumerate(rows.tolist()):
        pool.extend(range(nxt, r))
        nxt = max(nxt, r)
        t = int(u[k] * len(pool))
        pool[t], pool[-1] = pool[-1], pool[t]
        lts[pool.pop()] = r
    return _make([lts], True, batch)


# ----------------------------------------------------------------------------- the suite


def benchmark_suite(S: int, seed=0, *, batch: int = 1) -> dict[str, FlashMask]:
    """All twelve masks of SPEC §2 at length S, in SPEC order, with FlashMask's default parameters.

    One random document split (`random_doc_lens` with `default_num_docs(S)`) is shared by the
    document masks. Parameters: sliding window w = S/16; global sliding window g = min(16, S),
    w = S/16; share-question 2–6 answers per document; prefix-LM document: prefix of every
    document uniform in [1, len - 1]; prefix-LM causal prefix = S/2; qk-sparse spans
    (1024, 538) and (2358, 1700) scaled by S/8192; random eviction from row ceil(S/2).
    Deterministic for a given `seed` (int, SeedSequence or Generator).
    """
    S, batch = _seq_len(S), _batch(batch)
    g = _rng(seed)
    lo, hi = default_num_docs(S)
    docs = random_doc_lens(S, (min(lo, S), min(hi, S)), g)
    w = S // 16
    prefixes = [int(g.integers(1, n)) if n > 1 else n for n in docs]
    qk_spans = [(1024, 538), (2358, 1700)]
    offs = [min(o * S // 8192, S) for o, _ in qk_spans]
    lens = [min((o + n) * S // 8192, S) - o2 for (o, n), o2 in zip(qk_spans, offs)]
    qa_groups = [random_qa_split(n, (2, 6), g) for n in docs]
    return {
        "full": full(S, batch=batch),
        "causal": causal(S, batch=batch),
        "sliding_window": sliding_window(S, w, batch=batch),
        "causal_document": causal_document(docs, batch=batch),
        "document": document(docs, batch=batch),
        "share_question": share_question(S, groups=qa_groups, batch=batch),
        "global_sliding_window": global_sliding_window(S, min(16, S), w, batch=batch),
        "causal_blockwise": causal_blockwise(docs, batch=batch),
        "prefix_lm_document": prefix_lm_document(docs, prefixes, batch=batch),
        "prefix_lm_causal": prefix_lm_causal(S, S // 2, batch=batch),
        "qk_sparse": qk_sparse(S, offs, lens, batch=batch),
        "random_eviction": random_eviction(S, g, batch=batch),
    }


# ----------------------------------------------------------------------------- sparsity


def canonical_bounds_np(startend_row_indices, *, causal: bool, q_len: int) -> np.ndarray:
    """Host (numpy) twin of `canonical_bounds`: int64 ``[B, Hm, 4, Sk]`` (LTS, LTE, UTS, UTE).

    For host-side tools (sparsity, pictures, planners) on long sequences: no XLA compilation.
    """
    x = np.asarray(startend_row_indices).astype(np.int64)
    b, hm, sk, d = x.shape
    full_ = np.full((b, hm, sk), q_len, np.int64)
    zero = np.zeros((b, hm, sk), np.int64)
    if causal and d in (1, 2):
        ute = np.broadcast_to(np.clip(np.arange(sk) - (sk - q_len), 0, q_len), (b, hm, sk))
        lts, lte, uts = x[..., 0], (x[..., 1] if d == 2 else full_), zero
    elif not causal and d == 2:
        lts, lte, uts, ute = x[..., 0], full_, zero, x[..., 1]
    elif not causal and d == 4:
        lts, lte, uts, ute = x[..., 0], x[..., 1], x[..., 2], x[..., 3]
    else:
        raise ValueError(f"invalid (causal={causal}, D={d}); see jax_flashmask.masks.validate")
    return np.stack([lts, lte, uts, ute], axis=2)


def _bounds_np(mask, q_len, causal):
    """(canonical bounds as int64 numpy [B, Hm, 4, Sk], Sq)."""
    if isinstance(mask, FlashMask):
        causal, ind = mask.causal, mask.startend_row_indices
    else:
        if causal is None:
            raise ValueError("pass a FlashMask, or the indices together with causal=")
        ind = mask
    sk = ind.shape[2]
    q_len = sk if q_len is None else _int("q_len", q_len, lo=1)
    validate(ind, causal=causal, q_len=q_len)
    return canonical_bounds_np(ind, causal=causal, q_len=q_len), q_len


def _block_minmax(v: np.ndarray, block: int):
    """Per key block min and max over the last axis (length Sk, last block may be short)."""
    sk = v.shape[-1]
    starts = np.arange(0, sk, block)
    return np.minimum.reduceat(v, starts, axis=-1), np.maximum.reduceat(v, starts, axis=-1)


def _fully_masked_tiles(bounds: np.ndarray, q_len: int, block_q: int, block_k: int) -> np.ndarray:
    """Boolean ``[B, Hm, Tq, Tk]``: True where SPEC §3's classification skips the tile."""
    (lts_min, lts_max), (lte_min, lte_max), (uts_min, uts_max), (ute_min, ute_max) = (
        _block_minmax(bounds[:, :, k, :], block_k) for k in range(4)
    )
    ms = np.arange(0, q_len, block_q)
    me = np.minimum(ms + block_q, q_len)
    ms, me = ms[:, None], me[:, None]
    ex = lambda a: a[:, :, None, :]  # noqa: E731  [B, Hm, 1, Tk]
    lt = (ms >= ex(lts_max)) & (me <= ex(lte_min))
    ut = (ms >= ex(uts_max)) & (me <= ex(ute_min))
    return lt | ut


def block_sparsity(mask, q_len: int | None = None, block: int = 128, *, causal: bool | None = None) -> float:
    """ρ: the fraction of ``block × block`` tiles that the kernel skips as fully masked.

    Uses SPEC §3's classification on per-key-block min/max of the canonical bounds (O(S) work,
    no S×S array). The test is sufficient, not necessary: a tile it keeps may still be fully masked
    by columns whose ranges differ. Edge tiles (S not a multiple of `block`) count by their area,
    so ρ is the fraction of cells that lie in skipped tiles; averaged over batch and mask heads.
    `mask` is a `FlashMask`, or raw indices with `causal=`.
    """
    block = _int("block", block, lo=1)
    bounds, q_len = _bounds_np(mask, q_len, causal)
    sk = bounds.shape[-1]
    skipped = _fully_masked_tiles(bounds, q_len, block, block)
    hq = np.diff(np.append(np.arange(0, q_len, block), q_len)).astype(np.float64)
    wk = np.diff(np.append(np.arange(0, sk, block), sk)).astype(np.float64)
    area = hq[:, None] * wk[None, :]
    return float((skipped * area).sum() / (area.sum() * skipped.shape[0] * skipped.shape[1]))


def visible_fraction(mask, q_len: int | None = None, *, causal: bool | None = None) -> float:
    """Exact fraction of unmasked cells, from the bounds in O(Sk) per head (union of the two row
    ranges of every column). Averaged over batch and mask heads."""
    b, q_len = _bounds_np(mask, q_len, causal)
    lts, lte, uts, ute = (np.clip(b[:, :, k, :], 0, q_len) for k in range(4))
    len_l = np.maximum(lte - lts, 0)
    len_u = np.maximum(ute - uts, 0)
    overlap = np.maximum(np.minimum(lte, ute) - np.maximum(lts, uts), 0)
    masked = len_l + len_u - overlap
    return float(1.0 - masked.sum() / (masked.size * q_len))


# ----------------------------------------------------------------------------- random masks


def _random_vector(g: np.random.Generator, sk: int, hi: int) -> np.ndarray:
    """Random boundary values in [0, hi] for sk columns, mixing several column styles."""
    style = int(g.integers(0, 4))
    if style == 0:  # independent uniform
        return g.integers(0, hi + 1, size=sk)
    if style == 1:  # piecewise constant runs (document-like, exercises block min/max)
        n = int(g.integers(1, min(sk, 6) + 1))
        lens = random_doc_lens(sk, n, g)
        return np.repeat(g.integers(0, hi + 1, size=n), lens)
    if style == 2:  # extremes and near-diagonal values
        j = np.arange(sk)
        cand = np.stack([np.zeros(sk, np.int64), np.full(sk, hi), j, j + 1, j - 1], axis=0)
        return np.clip(cand[g.integers(0, 5, size=sk), j], 0, hi)
    # monotone (sliding-window like)
    return np.sort(g.integers(0, hi + 1, size=sk))


def random_mask(
    rng,
    S: int,
    causal: bool,
    D: int,
    batch: int = 1,
    heads: int = 1,
    q_len: int | None = None,
) -> FlashMask:
    """A random valid mask ``[batch, heads, S, D]`` for property tests.

    `S` is the key length, `q_len` the query length (default S). Any allowed (causal, D) pair;
    values in ``[0, q_len]`` with every start <= its end. Columns mix several styles (uniform,
    runs of equal values, extremes 0 / Sq / near the diagonal, monotone) so empty, full and
    block-constant ranges all occur.
    """
    g = _rng(rng)
    S = _int("S", S, lo=1)
    batch = _int("batch", batch, lo=1)
    heads = _int("heads", heads, lo=1)
    sq = S if q_len is None else _int("q_len", q_len, lo=1)
    causal = bool(causal)
    D = _int("D", D)
    if D not in ALLOWED_D[causal]:
        raise ValueError(f"random_mask: D={D} is not allowed with causal={causal} (allowed: {sorted(ALLOWED_D[causal])})")
    names = ALLOWED_D[causal][D]
    out = np.empty((batch, heads, S, D), np.int64)
    for b in range(batch):
        for h in range(heads):
            vec = {n: _random_vector(g, S, sq) for n in names}
            for lo, hi in (("LTS", "LTE"), ("UTS", "UTE")):
                if lo in vec and hi in vec:
                    a, c = vec[lo], vec[hi]
                    vec[lo], vec[hi] = np.minimum(a, c), np.maximum(a, c)
            out[b, h] = np.stack([vec[n] for n in names], axis=-1)
    out = out.astype(np.int32)
    validate(out, causal=causal, q_len=sq, kv_len=S)
    return FlashMask(_to_device(out), causal=causal)


# ----------------------------------------------------------------------------- masks from data (jit-friendly)
#
# These builders take sequence data (segment ids, lengths, window sizes) that may be traced: they
# are jnp code, so a jitted training step can build its mask from the batch. Sq != Sk is aligned
# bottom-right, like `causal` (query row i sits at key position i + Sk - Sq).


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _int_ids(name: str, ids):
    """`ids` as an int array ``[B, S]`` (a ``[S]`` input gets B = 1), checked without reading values."""
    if isinstance(ids, (list, tuple)):
        ids = np.asarray(ids, dtype=np.int32 if len(ids) == 0 else None)
    if not hasattr(ids, "shape") or not hasattr(ids, "dtype"):
        raise TypeError(f"{name} must be an integer array [B, S] or [S], got {type(ids).__name__}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array [B, S] or [S], got dtype {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise ValueError(f"{name} must be an integer array [B, S] or [S], got shape {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty: it needs one id per token (shape [B, S] or [S] with S >= 1)")
    return ids


def _check_contiguous(name: str, ids) -> None:
    """ValueError when a concrete id array repeats an id after another one (-1 = padding exempt)."""
    if _is_traced(ids):
        return
    seg = np.asarray(ids)
    for r in range(seg.shape[0]):
        starts = np.concatenate([[0], np.flatnonzero(np.diff(seg[r])) + 1])
        run_ids = seg[r, starts]
        real = run_ids[run_ids != -1]
        if len(np.unique(real)) != len(real):
            raise ValueError(
                f"{name}: every document must be one contiguous run of equal ids "
                f"(row {r} repeats an id after another one)")


@functools.partial(jax.jit, static_argnames=("causal",))
def _self_segments(seg, causal):
    b, s = seg.shape
    pos = jnp.arange(s, dtype=jnp.int32)
    change = seg[:, 1:] != seg[:, :-1]
    true = jnp.ones((b, 1), bool)
    is_start = jnp.concatenate([true, change], axis=1)
    is_end = jnp.concatenate([change, true], axis=1)
    run_start = jax.lax.cummax(jnp.where(is_start, pos, 0), axis=1)
    run_end = jax.lax.cummin(jnp.where(is_end, pos + 1, s), axis=1, reverse=True)
    pad = seg == -1
    lts = jnp.where(pad, 0, run_end)  # padding columns: every row masked
    if causal:
        return lts[:, None, :, None].astype(jnp.int32)
    ute = jnp.where(pad, s, run_start)
    return jnp.stack([lts, ute], axis=-1)[:, None].astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("causal",))
def _cross_segments(q_seg, kv_seg, causal):
    b = max(q_seg.shape[0], kv_seg.shape[0])
    q_seg = jnp.broadcast_to(q_seg, (b, q_seg.shape[1]))
    kv_seg = jnp.broadcast_to(kv_seg, (b, kv_seg.shape[1]))
    sq, sk = q_seg.shape[1], kv_seg.shape[1]

    def one(q, kv):
        order = jnp.argsort(q, stable=True).astype(jnp.int32)  # equal ids keep their row order
        ids = q[order]
        lo = jnp.searchsorted(ids, kv, side="left")
        hi = jnp.searchsorted(ids, kv, side="right")
        present = (hi > lo) & (kv != -1)
        first = order[jnp.clip(lo, 0, sq - 1)]
        last = order[jnp.clip(hi - 1, 0, sq - 1)]
        return present, first, last + 1

    present, first, end = jax.vmap(one)(q_seg, kv_seg)
    ute = first
    if causal:
        j = jnp.arange(sk, dtype=jnp.int32)
        ute = jnp.maximum(ute, jnp.clip(j - (sk - sq), 0, sq))
    lts = jnp.where(present, end, 0)  # an id absent from the queries (or padding): every row masked
    ute = jnp.where(present, ute, 0)
    return jnp.stack([lts, ute], axis=-1)[:, None].astype(jnp.int32)


def from_segment_ids(q_segment_ids, kv_segment_ids=None, *, causal: bool = True) -> FlashMask:
    """Packed documents: query i sees key j when both carry the same id (and, if `causal`,
    ``j <= i + Sk - Sq``). Works under `jax.jit` with traced ids.

    `q_segment_ids`: int ``[B, Sq]`` or ``[Sq]``; `kv_segment_ids`: int ``[B, Sk]`` / ``[Sk]``, default
    the query ids (self-attention). Id ``-1`` marks padding, whose rows and columns are fully masked
    (output 0). A document is a contiguous run of one id; a concrete array that repeats an id after
    another one raises ``ValueError``. Traced ids cannot be checked: there, without
    `kv_segment_ids` every maximal run is its own document (an id that comes back starts a new
    one); with `kv_segment_ids` a key with id s sees the query rows from the first to the last row
    with id s.

    Returns a `FlashMask` ``[B, 1, Sk, D]``: without `kv_segment_ids` causal D=1 (`causal`) or
    non-causal D=2; with them non-causal D=2 (LTS, UTE), which expresses the bottom-right causal
    limit exactly whatever the ids are.
    """
    q_seg = _int_ids("q_segment_ids", q_segment_ids)
    causal = bool(causal)
    if kv_segment_ids is None:
        _check_contiguous("q_segment_ids", q_seg)
        return FlashMask(_self_segments(jnp.asarray(q_seg, jnp.int32), causal), causal=causal)
    kv_seg = _int_ids("kv_segment_ids", kv_segment_ids)
    if q_seg.shape[0] != kv_seg.shape[0] and 1 not in (q_seg.shape[0], kv_seg.shape[0]):
        raise ValueError(f"q_segment_ids batch {q_seg.shape[0]} and kv_segment_ids batch "
                         f"{kv_seg.shape[0]} differ (use equal batches, or 1 to share one)")
    _check_contiguous("q_segment_ids", q_seg)
    ind = _cross_segments(jnp.asarray(q_seg, jnp.int32), jnp.asarray(kv_seg, jnp.int32), causal)
    return FlashMask(ind, causal=False)


def _check_lengths(name: str, x, batch: int | None):
    x = jnp.asarray(x)
    if x.ndim != 1 or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an int array [B], got {x.dtype} {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name} has batch {x.shape[0]}, expected {batch}")
    return x.astype(jnp.int32)


def band_bounds(q_len: int, kv_len: int, *, lo_shift=None, hi_shift=None, q_lengths=None,
                kv_lengths=None):
    """(LTS, UTE) int32 ``[B, Sk]`` (B = 1 without lengths) of the mask in which key column j is
    visible to the query rows ``[j + lo_shift, j + hi_shift)`` (None: unbounded) that are below
    ``q_lengths[b]``, and to none when ``j >= kv_lengths[b]``. jnp code: shifts and lengths may be
    traced. The non-causal D=2 form: cell (i, j) is masked iff ``i >= LTS[j]`` or ``i < UTE[j]``."""
    j = jnp.arange(kv_len, dtype=jnp.int32)[None]
    lts = jnp.full((1, kv_len), q_len, jnp.int32) if hi_shift is None else jnp.clip(j + hi_shift, 0, q_len)
    ute = jnp.zeros((1, kv_len), jnp.int32) if lo_shift is None else jnp.clip(j + lo_shift, 0, q_len)
    if q_lengths is not None:
        lts = jnp.minimum(lts, jnp.clip(q_lengths, 0, q_len)[:, None])
    if kv_lengths is not None:
        lts = jnp.where(j < kv_lengths[:, None], lts, 0)
    b = max(lts.shape[0], ute.shape[0])
    return (jnp.broadcast_to(lts, (b, kv_len)).astype(jnp.int32),
            jnp.broadcast_to(ute, (b, kv_len)).astype(jnp.int32))


def _window_size(name: str, w):
    if w is None:
        return None
    if _is_traced(w):
        return jnp.asarray(w, jnp.int32)
    if isinstance(w, bool) or not isinstance(w, (int, np.integer)) and not (
            hasattr(w, "shape") and w.shape == () and jnp.issubdtype(w.dtype, jnp.integer)):
        raise ValueError(f"from_window: {name} must be an int >= 0 or None, got {w!r}")
    if int(w) < 0:
        raise ValueError(f"from_window: {name} must be >= 0 or None, got {int(w)}")
    return int(w)


def from_window(seq_len: int, left, right=0, *, batch: int = 1, q_len: int | None = None) -> FlashMask:
    """Sliding window: query i sees keys j with ``i' - left <= j <= i' + right`` (None = unbounded),
    where ``i' = i + seq_len - q_len`` aligns the queries bottom-right (``q_len`` defaults to
    `seq_len`, the key length).

    `left` / `right` may be traced ints. ``right=0`` (a Python int) is the causal sliding window
    (``causal=True``, D=1); anything else, a traced `right` included, is ``causal=False`` with
    (LTS, UTE).
    """
    sk = _seq_len(seq_len)
    sq = sk if q_len is None else _int("q_len", q_len, lo=1)
    batch = _batch(batch)
    left, right = _window_size("left", left), _window_size("right", right)
    delta = sk - sq
    hi = None if left is None else left + 1 - delta
    if isinstance(right, int) and right == 0:
        lts, _ = band_bounds(sq, sk, hi_shift=hi)
        ind = lts[:, None, :, None]
        causal_ = True
    else:
        lo = None if right is None else -right - delta
        lts, ute = band_bounds(sq, sk, lo_shift=lo, hi_shift=hi)
        ind = jnp.stack([lts, ute], axis=-1)[:, None]
        causal_ = False
    return FlashMask(jnp.broadcast_to(ind, (batch,) + ind.shape[1:]), causal=causal_)


def from_seq_lengths(q_seq_lengths=None, kv_seq_lengths=None, *, q_len: int, kv_len: int | None = None,
                     causal: bool = False) -> FlashMask:
    """Padding: in batch entry b, query rows ``>= q_seq_lengths[b]`` and key columns
    ``>= kv_seq_lengths[b]`` are fully masked (padded rows output 0). Lengths are int ``[B]``
    arrays, possibly traced. `causal` adds the bottom-right causal limit of the full (padded)
    lengths: causal D=1; otherwise non-causal D=2. Shape ``[B, 1, kv_len, D]``."""
    sq = _int("q_len", q_len, lo=1)
    sk = sq if kv_len is None else _int("kv_len", kv_len, lo=1)
    ql = None if q_seq_lengths is None else _check_lengths("q_seq_lengths", q_seq_lengths, None)
    kl = None if kv_seq_lengths is None else _check_lengths(
        "kv_seq_lengths", kv_seq_lengths, None if ql is None else ql.shape[0])
    lts, ute = band_bounds(sq, sk, q_lengths=ql, kv_lengths=kl)
    if causal:
        return FlashMask(lts[:, None, :, None], causal=True)
    return FlashMask(jnp.stack([lts, ute], axis=-1)[:, None], causal=False)


# ----------------------------------------------------------------------------- masks from a dense view
#
# Both converters read the masked rows of every key column as at most two runs [s1, e1), [s2, e2)
# (bit-packed, so a block of columns costs Sq/8 bytes each), then pick the smallest (causal, D)
# mode that represents every column.

_LEAD = np.array([8] + [7 - int(v).bit_length() + 1 for v in range(1, 256)], np.int64)  # zeros before the top set bit
_TRAIL = np.array([8] + [(v & -v).bit_length() - 1 for v in range(1, 256)], np.int64)
_POPCOUNT = np.array([bin(v).count("1") for v in range(256)], np.uint8)


def _pack_rows(rows, invert: bool = False):
    """Bit-packed bool rows ``[n, S]`` -> uint8 ``[n, S/8 + 1]`` (row r at bit 7 - r % 8 of byte
    r // 8), optionally inverted, with every bit from S on cleared (one spare zero byte at least)."""
    n, s = rows.shape
    p = np.packbits(rows, axis=1)
    if invert:
        np.invert(p, out=p)
        if s % 8:
            p[:, -1] &= np.uint8((0xFF << (8 - s % 8)) & 0xFF)
    return np.concatenate([p, np.zeros((n, 1), np.uint8)], axis=1)


def _popcount_rows(p):
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(p).sum(axis=1, dtype=np.int64)
    return _POPCOUNT[p].sum(axis=1, dtype=np.int64)


def _first_last_bits(p, nz):
    """Positions of the first and last set bit of each packed row (`nz` = ``p != 0``; rows
    without a set bit give garbage)."""
    rows = np.arange(p.shape[0])
    fb = nz.argmax(axis=1)
    lb = p.shape[1] - 1 - np.flip(nz, axis=1).argmax(axis=1)
    return fb * 8 + _LEAD[p[rows, fb]], lb * 8 + 7 - _TRAIL[p[rows, lb]]


def _column_runs(packed, q_len: int):
    """Masked rows of each key column as two runs: `packed` holds one column per row (masked = 1,
    from `_pack_rows`). Returns int64 ``[4, nc]`` (s1, e1, s2, e2) and the number of runs (3 stands
    for "more than 2").

    Runs are read from the transitions ``bit(r) != bit(r - 1)`` (bit(-1) = 0; the zero bits from
    Sq on close a run that reaches the last row): a column's 2k transitions are its k runs' starts
    and ends in order. Empty runs are (0, 0) and (Sq, Sq); a single run that ends at Sq but starts
    after row 0 is the second run, so that the non-causal D=2 form reads (UTE = e1, LTS = s2)
    directly."""
    nc = packed.shape[0]
    carry = np.zeros_like(packed)
    carry[:, 1:] = packed[:, :-1] << 7  # the previous byte's last bit
    t = packed ^ ((packed >> 1) | carry)
    count = _popcount_rows(t)
    runs = np.zeros((4, nc), np.int64)
    runs[2:] = q_len
    nruns = np.minimum(count // 2, 3)
    idx = np.flatnonzero(count)
    if idx.size == 0:
        return runs, nruns
    t = t[idx]
    nz = t != 0
    first, last = _first_last_bits(t, nz)
    one = count[idx] == 2
    i1, f1, l1 = idx[one], first[one], last[one]
    tail = (l1 == q_len) & (f1 > 0)
    runs[0, i1[~tail]], runs[1, i1[~tail]] = f1[~tail], l1[~tail]
    runs[2, i1[tail]], runs[3, i1[tail]] = f1[tail], q_len
    two = count[idx] == 4
    if two.any():
        i2, t2, nz2, f2, l2 = idx[two], t[two], nz[two], first[two], last[two]
        r = np.arange(t2.shape[0])
        for pos in (f2, l2):  # drop the outer transitions: the inner ones are e1 and s2
            t2[r, pos // 8] &= ~(np.uint8(0x80) >> (pos % 8).astype(np.uint8))
            nz2[r, pos // 8] = t2[r, pos // 8] != 0
        e1, s2 = _first_last_bits(t2, nz2)
        runs[:, i2] = np.stack([f2, e1, s2, l2])
    return runs, nruns


def _mode_from_runs(runs, nruns, q_len: int, what: str) -> FlashMask:
    """The smallest (causal, D) mode that represents every column of ``runs`` int64
    ``[B, Hm, 4, Sk]`` (causal D=1, causal D=2, non-causal D=2, non-causal D=4, in that order)."""
    bad = np.argwhere(nruns > 2)
    if bad.size:
        b, h, j = (int(x) for x in bad[0])
        raise ValueError(
            f"{what}: key column j={j} (batch {b}, mask head {h}) masks more than two separate runs "
            "of query rows; a FlashMask column holds at most two masked row ranges. Split the mask "
            "(e.g. per head) or change it so that each column's masked rows form <= 2 runs.")
    sq = q_len
    sk = runs.shape[-1]
    s1, e1, s2, e2 = (runs[:, :, k] for k in range(4))
    has1, has2 = e1 > s1, e2 > s2
    c = np.clip(np.arange(sk) - (sk - sq), 0, sq)  # rows above the bottom-right diagonal
    upper = (c == 0) | (has1 & (s1 == 0) & (e1 >= c))
    a0, b0 = np.maximum(s1, c), np.maximum(s2, c)
    a_on, b_on = has1 & (e1 > a0), has2 & (e2 > b0)
    start = np.where(a_on, a0, np.where(b_on, b0, sq))
    end = np.where(a_on, e1, np.where(b_on, e2, sq))
    causal2 = upper & ~(a_on & b_on)
    lts, ute = np.where(has2, s2, sq), np.where(has1, e1, 0)
    if np.all(causal2 & (end == sq)):
        return _device_mask([start], True)
    if np.all(causal2):
        return _device_mask([start, end], True)
    if np.all((~has1 | (s1 == 0)) & (~has2 | (e2 == sq))):
        return _device_mask([lts, ute], False)
    return _device_mask([lts, np.where(has2, e2, sq), np.where(has1, s1, 0), ute], False)


def _device_mask(vectors, causal: bool) -> FlashMask:
    return FlashMask(_to_device(np.stack(vectors, axis=-1)), causal=causal)


def from_dense(dense) -> FlashMask:
    """Exact conversion of a boolean ``[B, Hm, Sq, Sk]`` mask (True = masked; ``[Sq, Sk]`` is read
    as B = Hm = 1) into the smallest FlashMask mode that represents every column: causal D=1,
    causal D=2, non-causal D=2, else non-causal D=4 (bottom-right causal alignment).

    Raises ``ValueError`` naming the first key column whose masked rows form more than two runs
    (not representable). Host code: `dense` must be concrete (not traced), and is O(Sq·Sk);
    for long sequences describe the mask with `from_mask_fn` or a builder instead.
    """
    if _is_traced(dense):
        raise TypeError(
            "from_dense needs a concrete boolean array (it runs on the host); build the FlashMask "
            "outside jit and pass it in, or use the jit-friendly builders (from_segment_ids, "
            "from_window, from_seq_lengths)")
    m = np.asarray(dense)
    if m.dtype != np.bool_:
        raise ValueError(f"from_dense: dense must be a boolean array (True = masked), got dtype {m.dtype}")
    if m.ndim == 2:
        m = m[None, None]
    if m.ndim != 4 or 0 in m.shape:
        raise ValueError(f"from_dense: dense must have shape [B, Hm, Sq, Sk] (or [Sq, Sk]), got {m.shape}")
    b, hm, sq, sk = m.shape
    cols = np.swapaxes(m, 2, 3).reshape(b * hm * sk, sq)
    runs, nruns = _column_runs(_pack_rows(cols), sq)
    runs = np.moveaxis(runs.reshape(4, b, hm, sk), 0, 2)
    return _mode_from_runs(runs, nruns.reshape(b, hm, sk), sq, "from_dense")


def from_mask_fn(mask_mod, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
                 block: int | None = None) -> FlashMask:
    """A FlashMask from a FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx)`` -> True = attend.

    Evaluated on the host, one block of key columns at a time: `mask_mod` is called with numpy
    values, ``b`` and ``h`` int32 scalars, ``q_idx`` int32 ``[1, Sq]`` and ``kv_idx`` int32
    ``[nc, 1]``, and must return something that broadcasts to ``[nc, Sq]`` (write it with operators
    and numpy functions, e.g. ``(q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])``; Python ``and`` /
    ``if`` on the indices do not broadcast). Memory is O(block·Sq) plus O(Sk) for the result, never
    Sq·Sk; the time is batch·heads·Sq·Sk cell evaluations (give ``batch=heads=1`` when the mask does
    not depend on them: the result broadcasts). `block` = columns per call (default: about
    512K cells, which keeps a block in cache). The result is the smallest representable mode, as
    in `from_dense`, and a column whose masked rows form more than two runs raises ``ValueError``.
    """
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be a callable mask_mod(b, h, q_idx, kv_idx), got {type(mask_mod).__name__}")
    sq = _int("q_len", q_len, lo=1)
    sk = sq if kv_len is None else _int("kv_len", kv_len, lo=1)
    batch, heads = _batch(batch), _int("heads", heads, lo=1)
    # mask_mod runs on blocks small enough to stay in cache; the bit analysis on batches of
    # packed columns large enough that numpy's per-call cost does not dominate.
    nc = max(1, (1 << 19) // sq) if block is None else _int("block", block, lo=1)
    batch_cols = max(nc, (1 << 25) // sq)
    q_idx = np.arange(sq, dtype=np.int32)[None, :]  # int32, as FlexAttention's: half the bytes of int64
    runs = np.empty((batch, heads, 4, sk), np.int64)
    nruns = np.empty((batch, heads, sk), np.int64)
    for b in range(batch):
        for h in range(heads):
            for a0 in range(0, sk, batch_cols):
                a1 = min(a0 + batch_cols, sk)
                packed = np.empty((a1 - a0, -(-sq // 8) + 1), np.uint8)
                for c0 in range(a0, a1, nc):
                    kv_idx = np.arange(c0, min(c0 + nc, a1), dtype=np.int32)[:, None]
                    attend = np.asarray(mask_mod(np.int32(b), np.int32(h), q_idx, kv_idx))
                    if attend.dtype != np.bool_:
                        raise TypeError(
                            f"mask_mod must return booleans (True = attend), got dtype {attend.dtype}")
                    attend = np.broadcast_to(attend, (kv_idx.shape[0], sq))
                    packed[c0 - a0 : c0 - a0 + kv_idx.shape[0]] = _pack_rows(attend, invert=True)
                runs[b, h, :, a0:a1], nruns[b, h, a0:a1] = _column_runs(packed, sq)
    return _mode_from_runs(runs, nruns, sq, "from_mask_fn")
