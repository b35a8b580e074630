"""Host-side (numpy) planning: chunk workloads, the dual-chunk plan and the sparsity-aware balancer.

A *plan* is an int32 array ``[P, m]``: row ``p`` holds the sorted chunk ids owned by rank ``p``
(``N = P*m`` chunks of ``C = S/N`` tokens). It is passed to the distributed code as data, so a new
plan every step does not recompile.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

__all__ = [
    "tile_workload",
    "chunk_workloads",
    "dual_chunk_plan",
    "contiguous_plan",
    "balanced_plan",
    "plan_loads",
    "lower_bound",
    "PlanReport",
    "validate_plan",
    "check_plan",
]


def _canonical_np(mask, causal, q_len):
    from ..masks import FlashMask, canonical_bounds

    if isinstance(mask, FlashMask):
        causal, mask = mask.causal, mask.startend_row_indices
    if mask is None:
        raise ValueError("a mask (FlashMask or startend_row_indices) is needed")
    mask = np.asarray(mask)
    if q_len is None:
        q_len = mask.shape[2]
    return np.asarray(canonical_bounds(mask, causal=causal, q_len=q_len))


def tile_workload(mask, *, causal: bool = False, tile_q: int = 128, tile_k: int = 128,
                  q_len: int | None = None, partial_weight: float = 1.0) -> np.ndarray:
    """Non-skipped tiles per query tile ``[ceil(Sq/tile_q)]``, summed over batch and mask heads.

    Uses the block-metadata classification of SPEC §3 (per key block, min/max of the canonical
    vectors; a tile is skipped iff ``(ms >= LTSmax and me <= LTEmin) or (ms >= UTSmax and me <= UTEmin)``).
    Partially masked tiles count `partial_weight` (1.0 = the FlashMask workload convention).
    """
    b = _canonical_np(mask, causal, q_len)  # [B, Hm, 4, Sk]
    bsz, hm, _, sk = b.shape
    sq = sk if q_len is None else q_len
    nk = -(-sk // tile_k)
    pad = nk * tile_k - sk
    if pad:
        # padded key columns are fully masked
        fill = np.array([0, sq, 0, 0], b.dtype)[None, None, :, None]
        b = np.concatenate([b, np.broadcast_to(fill, (bsz, hm, 4, pad))], axis=-1)
    blk = b.reshape(bsz, hm, 4, nk, tile_k)
    mx, mn = blk.max(-1), blk.min(-1)  # [B, Hm, 4, nk]
    nq = -(-sq // tile_q)
    ms = (np.arange(nq) * tile_q)[:, None]
    me = np.minimum(ms + tile_q, sq)
    lts_max, lte_min, uts_max, ute_min = mx[:, :, 0, None], mn[:, :, 1, None], mx[:, :, 2, None], mn[:, :, 3, None]
    skip = ((ms >= lts_max) & (me <= lte_min)) | ((ms >= uts_max) & (me <= ute_min))  # [B,Hm,nq,nk]
    if partial_weight == 1.0:
        work = (~skip).sum(axis=(0, 1, 3)).astype(np.float64)
    else:
        lts_min, lte_max, uts_min, ute_max = mn[:, :, 0, None], mx[:, :, 1, None], mn[:, :, 2, None], mx[:, :, 3, None]
        partial = ((ms < lte_max) & (me > lts_min)) | ((ms < ute_max) & (me > uts_min))
        w = np.where(skip, 0.0, np.where(partial, partial_weight, 1.0))
        work = w.sum(axis=(0, 1, 3))
    return work


def chunk_workloads(mask, n_chunks: int, *, causal: bool = False, tile_q: int = 128,
                    tile_k: int = 128, partial_weight: float = 1.0) -> np.ndarray:
    """Workload of each of `n_chunks` query chunks: its non-skipped tiles (all batches and heads).

    The chunk size must be a multiple of `tile_q` (smaller tiles are used if it is not).
    """
    from ..masks import FlashMask

    ind = mask.startend_row_indices if isinstance(mask, FlashMask) else mask
    s = int(np.asarray(ind).shape[2])
    if s % n_chunks:
        raise ValueError(f"sequence length {s} is not divisible by n_chunks={n_chunks}")
    c = s // n_chunks
    tq = min(tile_q, c)
    while c % tq:
        tq -= 1
    w = tile_workload(mask, causal=causal, tile_q=tq, tile_k=tile_k, partial_weight=partial_weight)
    return w.reshape(n_chunks, c // tq).sum(-1)


_PLAN_FIX = ("build plans with dual_chunk_plan(P), contiguous_plan(P) or "
             "balanced_plan(workloads, P).plan")


def _is_traced(x) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def check_plan(plan, *, P: int | None = None, m: int | None = None, n_chunks: int | None = None,
               name: str = "plan") -> None:
    """Validate a plan where it enters a public function.

    Always (the array's type, also when traced): an integer dtype (``TypeError``), rank 2 and, when
    given, the shape ``[P, m]`` / ``P*m == n_chunks`` (``ValueError``). The ids themselves (every
    chunk id ``0 .. P*m-1`` exactly once) only when `plan` is concrete: a plan traced under ``jit``
    is data and is **not** checked (a duplicate id there silently gives wrong attention).
    """
    dtype = getattr(plan, "dtype", None)
    if dtype is None:
        dtype = np.asarray(plan).dtype
        shape = np.shape(plan)
    else:
        shape = tuple(plan.shape)
    if not np.issubdtype(dtype, np.integer):
        raise TypeError(f"{name} must be an integer array [P, m] of chunk ids, got dtype {dtype}; "
                        + _PLAN_FIX)
    if len(shape) != 2:
        raise ValueError(f"{name} must be an int array [P, m] (rank 2: P ranks x m chunks each), "
                         f"got shape {shape}; " + _PLAN_FIX)
    if P is not None and shape[0] != P:
        raise ValueError(f"{name} has P={shape[0]} rows but there are {P} ranks: a plan holds one "
                         f"row of chunk ids per rank; " + _PLAN_FIX)
    if m is not None and shape[1] != m:
        raise ValueError(f"{name} has m={shape[1]} chunks per rank, expected {m} (shape {shape})")
    if n_chunks is not None and shape[0] * shape[1] != n_chunks:
        raise ValueError(f"{name} of shape {shape} holds {shape[0] * shape[1]} chunk ids, "
                         f"expected {n_chunks} chunks")
    if _is_traced(plan):
        return
    ids = np.asarray(plan).ravel()
    n = ids.size
    problems = []
    if np.any(ids < 0):
        problems.append(f"negative ids {sorted(set(ids[ids < 0].tolist()))}")
    if np.any(ids >= n):
        problems.append(f"ids out of range (>= {n}) {sorted(set(ids[ids >= n].tolist()))}")
    values, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        problems.append(f"duplicate ids {values[counts > 1].tolist()}")
    if problems:
        raise ValueError(f"{name} must hold every chunk id 0..{n - 1} exactly once; found "
                         + ", ".join(problems) + f" in {np.asarray(plan).tolist()}; " + _PLAN_FIX)


def validate_plan(plan, n_chunks: int | None = None, *, P: int | None = None,
                  m: int | None = None, name: str = "plan") -> np.ndarray:
    """Check that `plan` ``[P, m]`` is a concrete permutation of ``range(P*m)``; return it sorted
    per rank (int32). ``TypeError`` for a non-integer or traced plan, ``ValueError`` for a wrong
    rank, shape or ids (duplicate, negative, out of range), naming `name`."""
    if _is_traced(plan):
        raise TypeError(f"{name} must be concrete here (numpy or a committed jax array, not a "
                        "value traced under jit): the result depends on its values")
    check_plan(plan, P=P, m=m, n_chunks=n_chunks, name=name)
    return np.sort(np.asarray(plan), axis=1).astype(np.int32)


def contiguous_plan(P: int, n_chunks: int | None = None) -> np.ndarray:
    """Rank p owns chunks p*m .. p*m+m-1 (the plain sequence split; unbalanced under causal masks)."""
    n = P if n_chunks is None else n_chunks
    if n % P:
        raise ValueError(f"n_chunks={n} is not a multiple of P={P}")
    return np.arange(n, dtype=np.int32).reshape(P, n // P)


def dual_chunk_plan(P: int, n_chunks: int | None = None) -> np.ndarray:
    """Zig-zag ("dual chunk") plan: in every group of 2P chunks rank p owns chunks p and 2P-1-p.

    `n_chunks` defaults to 2P and must be a multiple of 2P.
    """
    n = 2 * P if n_chunks is None else n_chunks
    if n % (2 * P):
        raise ValueError(f"dual_chunk_plan: n_chunks={n} must be a multiple of 2P={2 * P}")
    rows = []
    for p in range(P):
        ids = []
        for g in range(n // (2 * P)):
            ids += [g * 2 * P + p, g * 2 * P + 2 * P - 1 - p]
        rows.append(sorted(ids))
    return np.asarray(rows, np.int32)


def plan_loads(plan, workloads) -> np.ndarray:
    """Per-rank load ``[P]``: the sum of its chunks' workloads."""
    w = np.asarray(workloads, np.float64)
    plan = validate_plan(plan, n_chunks=w.size)
    return w[plan].sum(-1)


def lower_bound(workloads, P: int) -> float:
    """``max(ceil(sum(w)/P), max(w))`` (ceil only for integral workloads)."""
    w = np.asarray(workloads, np.float64)
    avg = w.sum() / P
    if np.allclose(w, np.round(w)):
        avg = float(np.ceil(avg - 1e-9))
    return float(max(avg, w.max(initial=0.0)))


@dataclasses.dataclass(frozen=True)
class PlanReport:
    plan: np.ndarray  # int32 [P, m], sorted per rank
    loads: np.ndarray  # [P]
    max_load: float
    lower_bound: float
    lpt_max_load: float  # after the greedy phase, before the exact re-partitions
    improvements: int

    @property
    def ratio(self) -> float:
        return self.max_load / self.lower_bound if self.lower_bound > 0 else 1.0


def _best_split(items, w, m):
    """Split `items` (2m chunk ids) into two sets of m minimizing the max of the two sums (exact).

    Brute force over C(2m, m) subsets for m <= 8, meet-in-the-middle above.
    Returns (max_sum, set_a, set_b).
    """
    items = list(items)
    vals = np.asarray([w[i] for i in items], np.float64)
    total = vals.sum()
    n = len(items)
    if m <= 8:
        best = None
        # fix items[0] in set A to halve the search (symmetry)
        for rest in itertools.combinations(range(1, n), m - 1):
            idx = (0,) + rest
            s = vals[list(idx)].sum()
            mx = max(s, total - s)
            if best is None or mx < best[0] - 1e-12:
                best = (mx, idx)
        a = set(best[1])
    else:
        half = n // 2
        left, right = list(range(half)), list(range(half, n))

        def enum(side):
            out = {}
            for mask in range(1 << len(side)):
                bits = [side[t] for t in range(len(side)) if mask >> t & 1]
                out.setdefault(len(bits), []).append((vals[bits].sum() if bits else 0.0, bits))
            for k in out:
                out[k].sort(key=lambda t: t[0])
            return out

        el, er = enum(left), enum(right)
        target = total / 2
        best = None
        for kl, lst in el.items():
            kr = m - kl
            if kr not in er:
                continue
            rs = er[kr]
            rsums = np.asarray([t[0] for t in rs])
            for sl, bl in lst:
                pos = np.searchsorted(rsums, target - sl)
                for q in (pos - 1, pos):
                    if 0 <= q < len(rs):
                        s = sl + rs[q][0]
                        mx = max(s, total - s)
                        if best is None or mx < best[0] - 1e-12:
                            best = (mx, bl + rs[q][1])
        a = set(best[1])
    set_a = [items[i] for i in range(n) if i in a]
    set_b = [items[i] for i in range(n) if i not in a]
    return best[0], set_a, set_b


def balanced_plan(workloads, P: int, *, max_rounds: int = 1000) -> PlanReport:
    """Assign ``N = len(workloads)`` chunks to `P` ranks, ``N/P`` each, minimizing the maximum load.

    1. Longest-processing-time greedy: heaviest chunk first, onto the least-loaded rank that still
       has room.
    2. Repeatedly take the heaviest rank and re-partition its chunks together with one partner's
       (lightest partner first) exactly (brute force / meet-in-the-middle); apply the first split
       that lowers the pair's maximum below the heaviest load. Stop when no partner helps.
    Every applied step lowers the sorted load vector lexicographically, so it terminates.
    """
    w = np.asarray(workloads, np.float64)
    n = w.size
    if n % P:
        raise ValueError(f"{n} chunks cannot be split evenly over P={P} ranks")
    m = n // P
    ranks = [[] for _ in range(P)]
    loads = np.zeros(P)
    for c in sorted(range(n), key=lambda i: (-w[i], i)):
        open_ = [r for r in range(P) if len(ranks[r]) < m]
        r = min(open_, key=lambda r: (loads[r], r))
        ranks[r].append(c)
        loads[r] += w[c]
    lpt = float(loads.max())
    improvements = 0
    for _ in range(max_rounds):
        h = int(np.argmax(loads))
        improved = False
        for r in sorted(range(P), key=lambda r: (loads[r], r)):
            if r == h:
                continue
            mx, a, b = _best_split(ranks[h] + ranks[r], w, m)
            if mx < loads[h] - 1e-9:
                ranks[h], ranks[r] = a, b
                loads[h], loads[r] = w[a].sum(), w[b].sum()
                improvements += 1
                improved = True
                break
        if not improved:
            break
    plan = np.sort(np.asarray(ranks, np.int64), axis=1).astype(np.int32)
    loads = plan_loads(plan, w)
    return PlanReport(plan=plan, loads=loads, max_load=float(loads.max()),
                      lower_bound=lower_bound(w, P), lpt_max_load=lpt, improvements=improvements)
