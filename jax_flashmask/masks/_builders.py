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

from collections.abc import Sequence

import jax
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
