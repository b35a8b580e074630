r"""Communication schedules for context-parallel attention (static, hashable, host-built).

Collectives need static source/target pairs, while which K/V chunks a rank needs depends on the
mask (data). A `Schedule` describes the *unrolled, direct-send* path of
`context_parallel_attention` (``comm="ring"|"hierarchical"`` with ``schedule=``); without a
schedule those modes run a ``lax.scan`` relay loop instead (dense traffic, one compiled body).
Two kinds of schedule live here:

* **dense** (``needed=None``): every chunk goes to every rank. The schedule depends only on ``P``,
  ``m`` (chunks per rank) and the mesh shape, so a new mask or plan never recompiles. Ranks still
  *skip the compute* of pieces that are fully masked for their rows (a data-dependent ``lax.cond``).
* **pruned** (``needed`` = a concrete ``[P, N]`` boolean table from `needed_chunks`): source/target
  pairs of chunks a receiver does not need are removed from the ``ppermute``\ s, so they are never
  sent (and, by autodiff's transpose of ``ppermute``, their dK/dV are never sent back). The
  schedule is a static argument: a mask whose *pattern* (which rank needs which chunk) differs
  recompiles; the mask values themselves stay traced data.

Topologies (``kind``):

* ``"ring"``: ``P-1`` rounds; in round ``t`` rank ``s`` sends its chunks to rank ``(s+t) % P``
  straight from its own buffer (no relay, so rounds are independent of each other's compute and
  can all be in flight while earlier pieces are computed).
* ``"hierarchical"`` on a ``nodes x local`` mesh (rank = node*local + l): a chunk crosses the slow
  (node) axis once, to the same local slot on every other node that needs it, then is relayed on the
  fast axis inside the node. Cross-node sends per rank drop from ``(P-local)*m`` chunk slots (a
  flat all-gather) to at most ``(nodes-1)*m``.

Every transfer moves one chunk slot (``C`` tokens of K and V) per source/target pair, so pruning has
chunk granularity.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .balance import validate_plan
from .localize import columns_fully_masked, localize_bounds

__all__ = [
    "Transfer",
    "Piece",
    "Schedule",
    "make_schedule",
    "needed_chunks",
    "comm_volume",
    "allgather_volume",
    "pruned_volume",
]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One ``ppermute`` of one chunk slot: `pairs` (source rank, target rank); the payload at the
    source is its own slot `slot` (``via=-1``) or what it received in transfer `via`."""

    pairs: tuple
    slot: int
    via: int = -1


@dataclasses.dataclass(frozen=True)
class Piece:
    """A K/V piece every rank computes on: the chunks of rank ``source[p]`` (for receiver ``p``).

    ``slots[b]``: the transfer delivering slot b (``-1`` = the rank's own K/V);
    ``received[p][b]``: whether rank p actually receives slot b (False: pruned, zeros arrive and
    the columns are force-masked).
    """

    source: tuple
    slots: tuple
    received: tuple


@dataclasses.dataclass(frozen=True)
class Schedule:
    kind: str
    P: int
    m: int
    nodes: int
    transfers: tuple
    pieces: tuple
    pruned: bool

    @property
    def local(self) -> int:
        return self.P // self.nodes

    def num_ppermutes(self) -> int:
        return len(self.transfers)


def _need(needed, p, chunk):
    return True if needed is None else bool(needed[p][chunk])


def _build(kind, P, m, nodes, plan, needed):
    transfers, pieces = [], []
    own = tuple(tuple(True for _ in range(m)) for _ in range(P))
    pieces.append(Piece(source=tuple(range(P)), slots=tuple([-1] * m), received=own))
    if kind == "ring":
        for t in range(1, P):
            src = tuple((p - t) % P for p in range(P))
            slots, rec = [], [[False] * m for _ in range(P)]
            for b in range(m):
                pairs = []
                for p in range(P):
                    s = src[p]
                    if _need(needed, p, None if plan is None else plan[s][b]):
                        pairs.append((s, p))
                        rec[p][b] = True
                if pairs:
                    transfers.append(Transfer(pairs=tuple(pairs), slot=b))
                    slots.append(len(transfers) - 1)
                else:
                    slots.append(-2)  # nobody receives this slot in this round
            if any(any(r) for r in rec):
                pieces.append(Piece(source=src, slots=tuple(slots), received=tuple(map(tuple, rec))))
    elif kind == "hierarchical":
        g = P // nodes
        # stage 1: cross-node, same local slot; kept when any rank of the receiving node needs it
        stage1 = {}  # (u, b) -> transfer id
        for u in range(1, nodes):
            for b in range(m):
                pairs = []
                for p in range(P):
                    n, l = divmod(p, g)
                    s = ((n - u) % nodes) * g + l
                    chunk = None if plan is None else plan[s][b]
                    if any(_need(needed, n * g + l2, chunk) for l2 in range(g)):
                        pairs.append((s, p))
                if pairs:
                    transfers.append(Transfer(pairs=tuple(pairs), slot=b))
                    stage1[(u, b)] = len(transfers) - 1
        # stage 2: relay inside the node (v = 0 is "no relay": the stage-1 receiver itself)
        for v in range(g):
            for u in range(nodes):
                if u == 0 and v == 0:
                    continue
                src = tuple(((p // g - u) % nodes) * g + (p % g - v) % g for p in range(P))
                slots, rec = [], [[False] * m for _ in range(P)]
                for b in range(m):
                    if v == 0:
                        tid = stage1.get((u, b), -2)
                        if tid >= 0:
                            for s, p in transfers[tid].pairs:
                                if _need(needed, p, None if plan is None else plan[src[p]][b]):
                                    rec[p][b] = True
                        slots.append(tid if any(rec[p][b] for p in range(P)) else -2)
                        continue
                    via = -1 if u == 0 else stage1.get((u, b), -2)
                    pairs = []
                    if via != -2:
                        for p in range(P):
                            n, l = divmod(p, g)
                            relay = n * g + (l - v) % g
                            if _need(needed, p, None if plan is None else plan[src[p]][b]):
                                pairs.append((relay, p))
                                rec[p][b] = True
                    if pairs:
                        transfers.append(Transfer(pairs=tuple(pairs), slot=b, via=via))
                        slots.append(len(transfers) - 1)
                    else:
                        slots.append(-2)
                if any(any(r) for r in rec):
                    pieces.append(Piece(source=src, slots=tuple(slots), received=tuple(map(tuple, rec))))
    else:
        raise ValueError(f"unknown schedule kind {kind!r} (use 'ring' or 'hierarchical')")
    return tuple(transfers), tuple(pieces)


@functools.lru_cache(maxsize=256)
def _make_schedule_cached(kind, P, m, nodes, plan, needed):
    transfers, pieces = _build(kind, P, m, nodes, plan, needed)
    return Schedule(kind=kind, P=P, m=m, nodes=nodes, transfers=transfers, pieces=pieces,
                    pruned=needed is not None)


def make_schedule(P: int, m: int, kind: str = "ring", *, nodes: int = 1, plan=None,
                  needed=None) -> Schedule:
    """Build a (hashable) schedule.

    `plan` (concrete ``[P, m]``, validated: every chunk id once) and `needed` (concrete bool
    ``[P, N]`` from `needed_chunks`) make it pruned; leave both ``None`` for the dense schedule,
    which depends only on ``P, m, nodes``.
    For ``kind="hierarchical"`` `nodes` is the size of the slow (outer) mesh axis.
    """
    if kind == "hierarchical" and (nodes < 1 or P % nodes):
        raise ValueError(f"hierarchical: P={P} must be a multiple of nodes={nodes}")
    if kind == "ring":
        nodes = 1 if nodes is None else nodes
    if (plan is None) != (needed is None):
        raise ValueError("a pruned schedule needs both `plan` and `needed`")
    if plan is not None:
        plan_t = tuple(tuple(int(c) for c in row) for row in validate_plan(plan, P=P, m=m))
        need = np.asarray(needed)
        if need.dtype != np.bool_ or need.shape != (P, P * m):
            raise ValueError(f"needed must be the bool [P, P*m] = [{P}, {P * m}] table of "
                             f"needed_chunks(mask, plan), got {need.dtype} {need.shape}")
        need_t = tuple(tuple(bool(x) for x in row) for row in need)
    else:
        plan_t = need_t = None
    return _make_schedule_cached(kind, P, m, nodes, plan_t, need_t)


def needed_chunks(mask, plan, *, causal: bool = False) -> np.ndarray:
    """Host-side ``[P, N]`` bool: does rank p (owning ``plan[p]``) need key chunk c?

    A chunk is not needed when every one of its columns is fully masked for every row the rank
    owns, in every batch element and mask head. `mask`: FlashMask or concrete indices.
    """
    from ..masks import FlashMask, canonical_bounds

    if isinstance(mask, FlashMask):
        causal, mask = mask.causal, mask.startend_row_indices
    ind = np.asarray(mask)
    if not np.issubdtype(ind.dtype, np.integer):
        raise TypeError(f"mask must be integer startend_row_indices [B, Hm, S, D] (int32), got "
                        f"dtype {ind.dtype}")
    s = ind.shape[2]
    plan = validate_plan(plan)
    P, m = plan.shape
    n = P * m
    c = s // n
    bounds = np.asarray(canonical_bounds(ind, causal=causal, q_len=s))
    out = np.zeros((P, n), bool)
    for p in range(P):
        loc = localize_bounds(bounds, plan[p], c, xp=np)
        full = columns_fully_masked(loc, m * c, xp=np)  # [B, Hm, S]
        out[p] = ~full.reshape(-1, n, c).all(axis=(0, 2))
    return out


def comm_volume(schedule: Schedule, *, chunk_bytes: float = 1.0, nodes: int | None = None) -> dict:
    """Bytes each rank sends/receives under `schedule` (forward K+V; backward dK+dV equal).

    Returns arrays ``sent``, ``received``, ``cross_node_sent`` (pairs whose ranks sit on different
    nodes; `nodes` defaults to the schedule's: pass it to account a flat ring on a two-level
    machine), and totals. `chunk_bytes`: bytes of one chunk slot of K and V
    (``2 * B * C * K * d * itemsize``).
    """
    P = schedule.P
    g = P // (schedule.nodes if nodes is None else nodes)
    sent = np.zeros(P)
    recv = np.zeros(P)
    cross = np.zeros(P)
    for t in schedule.transfers:
        for s, p in t.pairs:
            sent[s] += chunk_bytes
            recv[p] += chunk_bytes
            if s // g != p // g:
                cross[s] += chunk_bytes
    return dict(sent=sent, received=recv, cross_node_sent=cross, total=float(sent.sum()),
                max_sent=float(sent.max(initial=0)), max_received=float(recv.max(initial=0)))


def allgather_volume(P: int, m: int, *, nodes: int = 1, chunk_bytes: float = 1.0) -> dict:
    """The all-gather baseline: every rank receives (and, in a ring all-gather, sends) (P-1)*m slots.

    Cross-node: in a direct all-gather over ``nodes x local`` ranks a rank's slots go to the
    ``P-local`` ranks of other nodes (``(P-local)*m`` per rank).
    """
    g = P // nodes
    per = (P - 1) * m * chunk_bytes
    return dict(sent=np.full(P, per), received=np.full(P, per),
                cross_node_sent=np.full(P, (P - g) * m * chunk_bytes), total=per * P,
                max_sent=per, max_received=per)


def pruned_volume(mask, plan, *, kind: str = "ring", nodes: int = 1, causal: bool = False,
                  chunk_bytes: float = 1.0) -> dict:
    """Per-rank traffic of the mask-pruned schedule for `mask` and `plan`, next to the all-gather.

    Returns `comm_volume` of the pruned schedule plus ``allgather`` (`allgather_volume`) and
    ``needed`` (the `needed_chunks` table). ``chunk_bytes = 2 * B * C * K * d * itemsize`` turns
    chunk slots into bytes (K and V; the backward pass sends the same volume of dK/dV).
    """
    plan = validate_plan(plan)
    P, m = plan.shape
    need = needed_chunks(mask, plan, causal=causal)
    sched = make_schedule(P, m, kind, nodes=nodes, plan=plan, needed=need)
    vol = comm_volume(sched, chunk_bytes=chunk_bytes, nodes=nodes)
    vol["allgather"] = allgather_volume(P, m, nodes=nodes, chunk_bytes=chunk_bytes)
    vol["needed"] = need
    vol["schedule"] = sched
    return vol
