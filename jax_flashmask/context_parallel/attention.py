"""Context-parallel FlashMask attention: shard_map + jax.lax collectives.

Layout: q, k, v are in the *permuted* layout of a plan (see `layout.permute_tokens`), sharded on the
sequence axis over the context-parallel mesh axis (or axes); the mask stays global (every rank
holds its O(S) vectors and localizes them itself, `localize`). The result equals single-device
`jax_flashmask.attention` on the un-permuted inputs, permuted the same way.

Communication paths (all differentiable by JAX autodiff; the backward of ``ppermute`` is the
reverse ``ppermute``, of ``all_gather`` a reduce-scatter, so dK/dV travel the forward's pairs):

=========================== ======================================================================
``comm``, ``schedule``      what runs / what recompiles
=========================== ======================================================================
"allgather", None           all-gather K/V (tiled, plan order), one local attention over all S
                            keys; masked tiles are skipped by the kernel's block metadata.
                            Depends only on shapes: new masks/plans are data.
"ring", None                relay ring in ``lax.scan``: P-1 steps, each forwards the held K/V to
                            the next rank (issued before the step's attention, so it overlaps)
                            and attends to it; partial results merged with the lse rule. A piece
                            fully masked for the rank's rows skips its attention (data-dependent
                            ``lax.cond``), but is still forwarded. Masks/plans are data; the
                            compiled body does not grow with P.
"hierarchical", None        axis_name=(slow, fast): relay ring over the slow axis (each chunk set
                            crosses it once per node, between equal local slots) + an all_gather
                            over the fast axis at every step, one attention per step.
"ring"/"hierarchical",      mask-pruned, unrolled direct sends of a host-built static
  schedule=make_schedule(   `comm.Schedule`: one ppermute per (round, chunk slot) with only the
  ..., plan, needed)        (source, target) pairs whose target needs that chunk; one attention per
                            piece, the next piece's transfers issued before the current compute.
"allgather", schedule       the same pruned transfers, then a single attention over everything
                            received (a pruned all-gather: fewer kernels, no overlap).
=========================== ======================================================================

A pruned schedule is a static, hashable argument built from the *concrete* mask and plan
(`comm.needed_chunks`): a mask/plan whose needed-pattern differs needs a new schedule and
recompiles; mask values with the same pattern do not. Un-received (pruned) slots arrive as zeros
and their columns are force-masked (never NaN), but a schedule built for a *different* mask
silently drops chunks that mask needs: always build it from the mask you pass.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .. import backends
from .._api import attention as _library_attention
from ..masks import FlashMask, canonical_bounds, unmasked_bounds, validate
from . import pieces as pieces_mod
from ._vma import axis_size as _axis_size, match_vma as _match_vma, shard_map
from .balance import check_plan
from .comm import Schedule, make_schedule
from .localize import (
    bounds_to_indices,
    chunk_token_index,
    columns_fully_masked,
    localize_rows,
    masked_bounds,
)

__all__ = ["context_parallel_attention", "local_context_parallel_attention", "shard_map"]

PartitionSpec = jax.sharding.PartitionSpec


def _axis_tuple(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _merge(acc, new):
    """Log-sum-exp merge of two partial results (o f32 [B,L,N,d], lse f32 [B,L,N]); -inf safe."""
    o1, l1 = acc
    o2, l2 = new
    mx = jnp.maximum(l1, l2)
    mx = lax.stop_gradient(jnp.where(jnp.isfinite(mx), mx, 0.0))
    w1 = jnp.exp(l1 - mx)
    w2 = jnp.exp(l2 - mx)
    den = w1 + w2
    ok = den > 0
    den_s = jnp.where(ok, den, 1.0)
    o = (w1[..., None] * o1 + w2[..., None] * o2) / den_s[..., None]
    lse = jnp.where(ok, mx + jnp.log(den_s), -jnp.inf)
    return o, lse


def _check_mask_dtype(mask):
    if mask is not None and not jnp.issubdtype(jnp.result_type(mask), jnp.integer):
        raise TypeError(f"mask must be a FlashMask or integer startend_row_indices [B, Hm, S, D] "
                        f"(int32), got dtype {jnp.result_type(mask)}: a float mask is never "
                        f"rounded silently; build it with jax_flashmask.masks")


def _piece_attention(attn, q, k, v, local_bounds, *, scale, implementation, skip_masked, extra):
    """Local attention of q against one K/V piece with localized D=4 bounds -> (o f32, lse f32)."""
    b, lq, n, d = q.shape
    ind = bounds_to_indices(local_bounds)
    kw = dict(extra)
    if scale is not None:
        kw["scale"] = scale
    if implementation is not None:
        kw["implementation"] = implementation

    def compute(q, k, v, ind):
        o, lse = attn(q, k, v, ind, causal=False, return_residual=True, **kw)
        return (_match_vma(o.astype(jnp.float32), q, k, v, ind),
                _match_vma(lse.astype(jnp.float32), q, k, v, ind))

    def skip(q, k, v, ind):
        z = jnp.zeros((b, lq, n, v.shape[-1]), jnp.float32)
        inf = jnp.full((b, lq, n), -jnp.inf, jnp.float32)
        return _match_vma(z, q, k, v, ind), _match_vma(inf, q, k, v, ind)

    if not skip_masked:
        return compute(q, k, v, ind)
    needed = jnp.logical_not(jnp.all(columns_fully_masked(local_bounds, lq)))
    return lax.cond(needed, compute, skip, q, k, v, ind)


def local_context_parallel_attention(
    query, key, value, mask=None, *, plan, axis_name, causal: bool = False, comm: str = "allgather",
    schedule: Schedule | None = None, nodes: int | None = None, scale=None,
    return_residual: bool = False, implementation=None, skip_masked: bool = True,
    attention_fn=None, attention_kwargs=None, scan_unroll: int | bool = 1,
    overlap_sm_margin=None, schedule_hints: bool | str = False, piece_vjp: bool = True,
):
    """Per-rank body: call inside ``shard_map`` (or use `context_parallel_attention` with `mesh`).

    `query`/`key`/`value`: this rank's shard ``[B, m*C, N|K, d]`` of the permuted layout.
    `mask`: None, a `FlashMask` or int32 ``[B, Hm, S, D]`` in *global* coordinates, replicated over
    `axis_name` (sharded like q on a batch axis, if any). `plan`: int32 ``[P, m]`` (data; its ids
    are validated only when it is concrete, e.g. built on the host inside the shard_map body: a
    traced plan is checked for dtype and rank alone, see `check_plan`).
    `axis_name`: the context-parallel mesh axis, or a tuple of axes (rank = row-major index; for
    ``comm="hierarchical"`` the tuple is ``(slow, fast)``).
    Returns out ``[B, m*C, N, d]`` (and lse f32 ``[B, m*C, N]`` with `return_residual`).
    """
    attn = attention_fn or _library_attention
    extra = dict(attention_kwargs or {})
    if isinstance(mask, FlashMask):
        causal, mask = mask.causal, mask.startend_row_indices
    _check_mask_dtype(mask)
    axes = _axis_tuple(axis_name)
    axis = axes if len(axes) > 1 else axes[0]
    check_plan(plan)  # values only when concrete (a plan built on the host inside shard_map)
    plan = jnp.sort(jnp.asarray(plan).astype(jnp.int32), axis=1)
    P, m = plan.shape
    sizes = [_axis_size(a) for a in axes]
    if math.prod(sizes) != P:
        raise ValueError(f"plan has P={P} ranks but the axes {axes} have sizes {sizes}")
    b, lq, n_heads, d = query.shape
    if lq % m:
        raise ValueError(f"local length {lq} is not divisible by m={m} chunks per rank")
    if key.shape[1] != lq:
        raise ValueError("context parallelism here is self-attention: q and k must have equal length")
    c = lq // m
    s = P * lq
    my = lax.axis_index(axis)
    my_chunks = plan[my]
    if mask is None:
        bounds = unmasked_bounds(b, s, causal=causal, q_len=s)
    else:
        ind = jnp.asarray(mask)
        if ind.shape[2] != s:
            raise ValueError(f"mask has {ind.shape[2]} columns, the global sequence is {s}")
        bounds = canonical_bounds(ind, causal=causal, q_len=s)
    loc = localize_rows(bounds, my_chunks, c)  # [B, Hm, 4, S]: rows localized, columns global
    kw = dict(scale=scale, implementation=implementation, skip_masked=skip_masked, extra=extra)
    hint_dirs = _hint_directions(schedule_hints)  # (forward, backward); validates early
    if (overlap_sm_margin is not None or schedule_hints) and (
            schedule is None or comm not in ("ring", "hierarchical")):
        raise ValueError("overlap_sm_margin / schedule_hints apply to comm='ring'|'hierarchical' "
                         "with a schedule (make_schedule)")
    fused = None
    if piece_vjp and attention_fn is None and set(extra) <= {"sm_margin", "deterministic"}:
        fused = dict(implementation=backends.choose(implementation, query), scale=scale,
                     head_dim=d, deterministic=bool(extra.get("deterministic", False)),
                     base_margin=int(extra.get("sm_margin", 0)), overlap_margin=overlap_sm_margin,
                     hints=hint_dirs)
    elif overlap_sm_margin is not None or schedule_hints:
        raise ValueError("overlap_sm_margin / schedule_hints need the library's own attention "
                         "(attention_fn=None, attention_kwargs within {sm_margin, deterministic}, "
                         "piece_vjp=True)")

    if comm == "allgather" and schedule is not None:
        if schedule.P != P or schedule.m != m:
            raise ValueError(f"schedule is for P={schedule.P}, m={schedule.m}; got P={P}, m={m}")
        o, lse = _scheduled(attn, query, key, value, loc, plan, my, c, axis, schedule, kw,
                            single_call=True)
    elif comm == "allgather":
        kv = jnp.stack([key, value])  # [2, B, L, K, d]
        kv = lax.all_gather(kv, axis, axis=2, tiled=True)
        cols = chunk_token_index(plan.reshape(-1), c)
        o, lse = _piece_attention(attn, query, kv[0], kv[1], jnp.take(loc, cols, axis=-1), **kw)
    elif comm in ("ring", "hierarchical"):
        if comm == "hierarchical" and nodes is None:
            if len(axes) != 2:
                raise ValueError("comm='hierarchical' needs axis_name=(slow, fast) or nodes=")
            nodes = sizes[0]
        if schedule is not None:
            if schedule.P != P or schedule.m != m:
                raise ValueError(f"schedule is for P={schedule.P}, m={schedule.m}; got P={P}, m={m}")
            o, lse = _scheduled(attn, query, key, value, loc, plan, my, c, axis, schedule, kw,
                                fused=fused)
        elif comm == "ring":
            o, lse = _ring_scan(attn, query, key, value, loc, plan, my, c, axis, P, kw, scan_unroll)
        else:
            if len(axes) != 2 or sizes[0] != nodes:
                raise ValueError("comm='hierarchical' without a schedule needs axis_name=(slow, fast)")
            o, lse = _hier_scan(attn, query, key, value, loc, plan, my, c, axes, nodes, kw, scan_unroll)
    else:
        raise ValueError(f"unknown comm={comm!r}; use 'allgather', 'ring' or 'hierarchical'")
    o = o.astype(query.dtype)
    return (o, lse) if return_residual else o


def _ring_scan(attn, q, k, v, loc, plan, my, c, axis, P, kw, unroll=1):
    """Dense relay ring: ``lax.scan`` over P-1 steps; each step forwards the held K/V to the next
    rank (issued before the step's compute, so the transfer overlaps it) and computes on it.
    One attention trace in the loop body + one for the last piece, whatever P."""
    kv = jnp.stack([k, v])  # [2, B, L, K, d]
    perm = [(s, (s + 1) % P) for s in range(P)]

    def piece(buf, t):
        src = (my - t) % P
        lb = jnp.take(loc, chunk_token_index(plan[src], c), axis=-1)
        return _piece_attention(attn, q, buf[0], buf[1], lb, **kw)

    return _relay(kv, _empty_acc(q, v, loc, plan), piece, axis, perm, P, unroll)


def _relay(kv, acc, piece, axis, perm, steps, unroll):
    """The relay loop both rings share: `steps` pieces; before computing on the held K/V, forward it
    along `perm` so the transfer overlaps the compute; merge every piece's partial result."""

    def step(carry, t):
        buf, acc = carry
        nxt = lax.ppermute(buf, axis, perm)
        return (nxt, _merge(acc, piece(buf, t))), None

    if steps > 1:
        (kv, acc), _ = lax.scan(step, (kv, acc), jnp.arange(steps - 1, dtype=jnp.int32), unroll=unroll)
    return _merge(acc, piece(kv, jnp.int32(steps - 1)))


def _hier_scan(attn, q, k, v, loc, plan, my, c, axes, nodes, kw, unroll=1):
    """Two-level: a relay ring over the slow axis (each chunk set crosses it once per node, always
    between equal local slots), and at every step an all_gather of the held chunk sets over the
    fast axis, then one attention call over the g gathered pieces."""
    slow, fast = axes
    P = plan.shape[0]
    g = P // nodes
    kv = jnp.stack([k, v])
    perm = [(s, ((s // g + 1) % nodes) * g + s % g) for s in range(P)]
    node = my // g

    def piece(buf, u):
        gathered = lax.all_gather(buf, fast, axis=2, tiled=True)  # [2, B, g*L, K, d]
        srcs = ((node - u) % nodes) * g + jnp.arange(g, dtype=jnp.int32)
        lb = jnp.take(loc, chunk_token_index(plan[srcs].reshape(-1), c), axis=-1)
        return _piece_attention(attn, q, gathered[0], gathered[1], lb, **kw)

    return _relay(kv, _empty_acc(q, v, loc, plan), piece, axes, perm, nodes, unroll)


def _empty_acc(q, v, *refs):
    b, lq, n, _ = q.shape
    return (_match_vma(jnp.zeros((b, lq, n, v.shape[-1]), jnp.float32), q, v, *refs),
            _match_vma(jnp.full((b, lq, n), -jnp.inf, jnp.float32), q, v, *refs))


def _hint_directions(schedule_hints):
    """``schedule_hints`` -> (forward, backward) flags: True / "both", "forward", "backward", False."""
    table = {False: (False, False), None: (False, False), True: (True, True), "both": (True, True),
             "forward": (True, False), "backward": (False, True)}
    if not isinstance(schedule_hints, (bool, str, type(None))) or schedule_hints not in table:
        raise ValueError(f"schedule_hints must be False, True, 'both', 'forward' or 'backward', "
                         f"got {schedule_hints!r}")
    return table[schedule_hints]


def _scheduled(attn, q, k, v, loc, plan, my, c, axis, sched: Schedule, kw, single_call=False,
               fused=None):
    """Unrolled direct sends of a static `Schedule` (one ppermute per chunk slot and round).

    ``single_call=False``: one attention call per piece (piece 0 = the rank's own K/V, then one per
    round of received chunks); the transfers of piece i+1 are issued before piece i's compute. With
    ``fused`` (the library's own kernels) the pieces and their merge form one custom VJP
    (`pieces.piece_attention`: every piece's backward runs on the final out/lse, no merge pass in
    the backward, per-piece SM margins and optional XLA scheduling groups); otherwise the pieces are
    merged with the autodiff lse rule. ``single_call=True``: the pieces are concatenated and
    attended in one call (a pruned all-gather: fewer, larger kernels, no overlap).
    """
    b, lq, _, _ = q.shape
    m = sched.m
    kv_local = jnp.stack([k, v])  # [2, B, m*C, K, d]
    kv = kv_local.reshape((2, b, m, c) + k.shape[2:])  # [2, B, m, C, K, d]
    slot = lambda i: kv[:, :, i]  # noqa: E731
    bufs = {}
    hint_dirs = fused["hints"] if fused and sched.kind == "ring" and not single_call else (False, False)
    hints = any(hint_dirs)
    consumer = {}  # transfer id -> index of the piece that consumes it (ring: exactly one)
    for pi, piece in enumerate(sched.pieces):
        for tid in piece.slots:
            if tid >= 0:
                consumer.setdefault(tid, pi)

    def group(pi):  # (fwd, bwd) scheduling-group ids of piece pi-1's overlap (None: no hint)
        return (str(2 * pi - 1) if hint_dirs[0] else None, str(2 * pi) if hint_dirs[1] else None)

    def get(tid):
        if tid not in bufs:
            t = sched.transfers[tid]
            payload = slot(t.slot) if t.via == -1 else get(t.via)
            if hints:
                fg, bg = group(consumer[tid])
                bufs[tid] = pieces_mod.hinted_ppermute(payload, axis, tuple(t.pairs), fg, bg)
            else:
                bufs[tid] = lax.ppermute(payload, axis, perm=list(t.pairs))
        return bufs[tid]

    def issue(piece):
        for tid in piece.slots:
            if tid >= 0:
                get(tid)

    pieces = sched.pieces
    zeros = jnp.zeros_like(slot(0))
    kvs, lbs = [], []
    for i, piece in enumerate(pieces):
        # issue the next piece's transfers before this piece's compute (overlap)
        issue(piece)
        if i + 1 < len(pieces):
            issue(pieces[i + 1])
        if all(tid == -1 for tid in piece.slots):
            kvp = kv_local  # the rank's own K/V: no copy
        else:
            parts = [slot(bi) if tid == -1 else (get(tid) if tid >= 0 else zeros)
                     for bi, tid in enumerate(piece.slots)]
            kvp = jnp.concatenate(parts, axis=2)  # [2, B, m*C, K, d]
        src = jnp.asarray(piece.source, jnp.int32)[my]
        cols = chunk_token_index(plan[src], c)
        lb = jnp.take(loc, cols, axis=-1)
        if not all(all(r) for r in piece.received):
            rec = jnp.asarray(piece.received, bool)[my]  # [m]
            lb = masked_bounds(lb, jnp.repeat(~rec, c), lq)
        kvs.append(kvp)
        lbs.append(lb)
    if single_call:
        kvp = jnp.concatenate(kvs, axis=2)
        lb = jnp.concatenate(lbs, axis=-1)
        return _piece_attention(attn, q, kvp[0], kvp[1], lb, **kw)
    if fused is not None:
        n = len(kvs)
        cfg = pieces_mod.make_config(
            n, implementation=fused["implementation"], scale=fused["scale"],
            head_dim=fused["head_dim"], deterministic=fused["deterministic"],
            base_margin=fused["base_margin"], overlap_margin=fused["overlap_margin"],
            # the local piece (own rows x own keys) is never fully masked in practice: no cond
            skip=[kw["skip_masked"] and i > 0 for i in range(n)],
            groups=[group(i + 1) for i in range(n - 1)] if hints else None)
        return pieces_mod.piece_attention(q, kvs, lbs, cfg)  # out already in q.dtype
    acc = None
    for kvp, lb in zip(kvs, lbs):
        new = _piece_attention(attn, q, kvp[0], kvp[1], lb, **kw)
        acc = new if acc is None else _merge(acc, new)
    return acc


def context_parallel_attention(
    query, key, value, mask=None, *, plan, mesh=None, axis_name="cp", causal: bool = False,
    comm: str = "allgather", schedule: Schedule | None = None, nodes: int | None = None,
    batch_axis=None, head_axis=None, scale=None, return_residual: bool = False, implementation=None,
    skip_masked: bool = True, attention_fn=None, attention_kwargs=None,
    scan_unroll: int | bool = 1, overlap_sm_margin=None, schedule_hints: bool | str = False,
    piece_vjp: bool = True,
):
    """Context-parallel `jax_flashmask.attention`.

    Two ways to call it:

    * ``mesh=`` given: `query`/`key`/`value` are *global* arrays ``[B, S, N|K, d]`` in the permuted
      layout (`permute_tokens`), ideally already sharded ``P(batch_axis, axis_name)``; the mask is
      global. Wraps `local_context_parallel_attention` in ``shard_map`` and returns global arrays
      in the permuted layout (`unpermute_tokens` restores global order).
    * ``mesh=None``: you are inside your own ``shard_map``; the arrays are this rank's shards. Same
      as `local_context_parallel_attention`.

    Args:
      mask: None (no mask beyond `causal`), a `FlashMask`, or int32 ``[B, Hm, S, D]`` in global
        token order (any (causal, D) mode of SPEC §1; ``Hm`` in {1, K, N}). Data: new values never
        recompile. Passing canonical non-causal D=4 indices makes every mask share one program.
      plan: int32 ``[P, m]`` chunk ids per rank (`dual_chunk_plan`, `balanced_plan(...).plan`);
        data, sorted internally. ``S`` must be divisible by ``P*m``. A concrete plan is validated
        (`check_plan`: integer dtype, shape ``[P, m]``, every chunk id exactly once) and so is a
        concrete mask (`jax_flashmask.masks.validate`); a plan or mask traced under the caller's
        ``jit`` is checked for dtype and shape only: its values are **not** checked.
      mesh, axis_name: the mesh and its context-parallel axis (or ``(slow, fast)`` axes).
      comm: ``"allgather" | "ring" | "hierarchical"`` (see the module docstring).
      schedule: a static `Schedule` from `make_schedule` (pruned when built with ``needed=``).
      nodes: slow-axis size for ``"hierarchical"`` (default: from the mesh / axis sizes).
      batch_axis: mesh axis the batch is sharded on (data parallel), or None.
      head_axis: mesh axis the heads are sharded on (tensor parallel: query and kv heads on one
        axis, so a GQA group stays on one device), or None. Mask heads ``Hm`` in {K, N} are split
        alike, ``Hm = 1`` is replicated. q/k/v ``P(batch_axis, axis_name, head_axis, None)`` keep
        their sharding and so does the output.
      skip_masked: skip the attention of pieces fully masked for this rank (``lax.cond``).
      attention_fn / attention_kwargs / implementation / scale: the local attention
        (default `jax_flashmask.attention`), called as ``fn(q, k, v, indices, causal=False,
        return_residual=True, ...)`` with localized non-causal D=4 indices.
      scan_unroll: ``unroll`` of the relay-ring scans (``True`` = straight-line code, which can help
        XLA's latency-hiding scheduler overlap the ppermutes with the attention).
      overlap_sm_margin: scheduled ring/hierarchical with the library's kernels only: the
        ``sm_margin`` of the pieces that run while a transfer is in flight (every piece but the
        last: at P = 2 the local piece), as an int (forward and backward) or ``(fwd, bwd)``; the
        last piece keeps ``attention_kwargs["sm_margin"]`` (default 0). ``(8, 0)``: forward only.
      schedule_hints: scheduled ring only: put XLA scheduling-group ids
        (``_scheduling_group_id``) on each piece's kernels and on the transfers that should
        overlap them (forward: the next piece's K/V; backward: the next piece's dK/dV), so the
        latency-hiding scheduler issues each transfer before that kernel and waits after it.
        True / "both", or "forward" / "backward" for one direction only.
      piece_vjp: scheduled ring/hierarchical with the library's kernels: merge the pieces inside
        one custom VJP whose backward runs every piece on the final out/lse (`pieces`); False
        differentiates the lse merge instead (autodiff of the merge; kept for comparisons).
    Returns:
      out ``[B, S, N, d]`` (permuted layout; local shard with ``mesh=None``) and, with
      `return_residual`, lse float32 ``[B, S, N]`` (-inf on fully masked rows).
    """
    local = functools.partial(
        local_context_parallel_attention, plan=None, axis_name=axis_name, causal=causal, comm=comm,
        schedule=schedule, nodes=nodes, scale=scale, return_residual=True,
        implementation=implementation, skip_masked=skip_masked, attention_fn=attention_fn,
        attention_kwargs=attention_kwargs, scan_unroll=scan_unroll,
        overlap_sm_margin=overlap_sm_margin, schedule_hints=schedule_hints, piece_vjp=piece_vjp,
    )
    if isinstance(mask, FlashMask):
        causal, mask = mask.causal, mask.startend_row_indices
        local = functools.partial(local, causal=causal)
    _check_mask_dtype(mask)
    if mesh is None:
        o, lse = local(query, key, value, mask, plan=plan)
        return (o, lse) if return_residual else o
    axes = _axis_tuple(axis_name)
    seq = axes if len(axes) > 1 else axes[0]
    qs = PartitionSpec(batch_axis, seq, head_axis, None)
    ls = PartitionSpec(batch_axis, seq, head_axis)
    mask_batch = None if mask is None or jnp.shape(mask)[0] == 1 else batch_axis
    mask_heads = None if mask is None or jnp.shape(mask)[1] == 1 else head_axis
    ms = PartitionSpec(mask_batch, mask_heads, None, None)
    if comm == "hierarchical" and nodes is None and schedule is None and len(axes) == 2:
        local = functools.partial(local, nodes=int(mesh.shape[axes[0]]))
    # Validated here, while still concrete (inside shard_map it is traced); a plan traced by the
    # caller's jit is checked for dtype and shape only.
    check_plan(plan, P=math.prod(int(mesh.shape[a]) for a in axes))
    if mask is not None and not isinstance(mask, jax.core.Tracer):
        validate(mask, causal=causal, q_len=query.shape[1], kv_len=query.shape[1],
                 batch=query.shape[0], num_heads=query.shape[2], num_kv_heads=key.shape[2])
    plan = jnp.asarray(plan, jnp.int32)

    if mask is None:
        def body(q, k, v, pl):
            return local(q, k, v, None, plan=pl)
        args, specs = (query, key, value, plan), (qs, qs, qs, PartitionSpec())
    else:
        def body(q, k, v, mk, pl):
            return local(q, k, v, mk, plan=pl)
        args, specs = (query, key, value, jnp.asarray(mask, jnp.int32), plan), (qs, qs, qs, ms, PartitionSpec())
    f = shard_map(body, mesh=mesh, in_specs=specs, out_specs=(qs, ls), check_vma=False)
    o, lse = f(*args)
    return (o, lse) if return_residual else o
