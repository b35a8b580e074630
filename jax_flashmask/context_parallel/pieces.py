"""Several K/V pieces of one rank's attention, merged, with one custom VJP (the scheduled path).

`piece_attention` computes the attention of a rank's queries against ``n`` K/V pieces (its own
chunks first, then what it received), merges the partial results with the log-sum-exp rule and
returns ``(out in q.dtype, lse f32)`` equal to one attention call over all the pieces' keys.

Why not autodiff through a merge of per-piece ``attention`` calls (what `attention._merge` does for
the relay rings): its backward first differentiates the merge - an elementwise pass over the f32
partial outputs ``[B, L, N, d]`` per piece producing a rescaled ``dO_i`` and ``dlse_i`` per piece -
and every piece's backward kernel then runs on its own ``(o_i, lse_i)``. Here every piece's backward
kernel gets the *final* ``(out, lse, dO, dlse)`` instead (the ring-attention identity: with the final
lse, ``exp(S_i - lse)`` are the final probabilities restricted to piece i's columns, and
``D = rowsum(dO * out) - dlse`` is shared), so the backward has no merge pass, no per-piece
cotangents, and each row's D is computed from the same rounded output single-device attention
uses. The per-piece dQ are added in f32.

It also fixes what runs where, per piece (static, `PieceConfig`):

* ``fwd_margin[i]`` / ``bwd_margin[i]``: ``sm_margin`` of piece i's forward / backward kernel. Only
  the pieces that run while a transfer is in flight need free SMs for NCCL (forward: every piece but
  the last; backward, computed last piece first: every piece but the last as well, while the later
  pieces' dK/dV travel back), so the margin is paid only there.
* ``skip[i]``: wrap piece i in a ``lax.cond`` that skips it when it is fully masked for this rank
  (the local piece never needs it; a GPU conditional costs a device-to-host sync). The cond carries
  the piece's share of the elementwise work so that a skipped piece costs no HBM pass: forward, the
  LSE merge into the running (out, lse) happens inside the compute branch and the skip branch
  returns the running result unchanged; backward, the piece's dQ leaves its cond in the kernel
  dtype and is added to the local piece's dQ inside a second cond on the same predicate (skipped:
  the local dQ passes through). ``stack_in_cond[i]``: the piece's stacked dK/dV (one ppermute's
  operand) comes straight out of the cond.
* ``groups[i]``: an XLA scheduling-group id (``_scheduling_group_id`` frontend attribute) put on
  piece i's forward and backward kernels; `hinted_ppermute` puts the same ids on the transfers that
  should overlap them, so XLA's latency-hiding scheduler issues those transfers before the kernel
  and waits for them after it (forward: the K/V of piece i+1 during piece i; backward: the dK/dV
  of piece i+1 during piece i's backward).

Only for the library's own kernels (`jax_flashmask.attention` with default ``attention_fn``); a
user ``attention_fn`` goes through the autodiff merge.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["PieceConfig", "piece_attention", "hinted_ppermute", "scheduling_group"]


@dataclasses.dataclass(frozen=True)
class PieceConfig:
    implementation: str
    scale: float
    deterministic: bool
    fwd_margin: tuple
    bwd_margin: tuple
    skip: tuple
    fwd_groups: tuple  # per piece: scheduling-group id (str) or None
    bwd_groups: tuple
    # per piece (empty: all False): a skippable stacked piece whose K/V is one ppermute's payload
    # returns its dK/dV stacked from the cond (the skip branch writes the stacked zeros directly,
    # which are the reverse ppermute's operand as they are); False: unstacked from the cond, stacked
    # outside it, where the slices of several transfers fuse with the stack
    stack_in_cond: tuple = ()


def scheduling_group(group):
    """Context manager putting ``_scheduling_group_id=group`` on the ops traced inside (no-op for
    None)."""
    if group is None:
        import contextlib

        return contextlib.nullcontext()
    from jax.experimental.xla_metadata import set_xla_metadata

    return set_xla_metadata(_scheduling_group_id=str(group))


def _match(x, *refs):
    from .attention import _match_vma  # the shared helper (vma across jax versions)

    return _match_vma(x, *jax.tree_util.tree_leaves(refs))


def _kernels(cfg: PieceConfig, margin: int):
    import importlib

    attention_mod = importlib.import_module("jax_flashmask.attention")
    fwd, bwd = attention_mod._kernels(cfg.implementation, int(margin))
    if cfg.implementation == "reference":
        # its backward re-derives its own statistics; the portable one takes the given (out, lse)
        from .. import _xla

        bwd = _xla.backward
    return fwd, bwd


def _fully_masked(lb, n_rows):
    from .localize import columns_fully_masked

    return jnp.all(columns_fully_masked(lb, n_rows))


def _bounds(lb, b):
    # localized bounds are already canonical non-causal D=4 (`canonical_bounds` is the identity there)
    return jnp.broadcast_to(lb.astype(jnp.int32), (b,) + lb.shape[1:])


def _kv_pair(kv):
    """(K, V) of a piece: a ``(k, v)`` pair (the local piece) or a stacked ``[2, ...]`` array."""
    return (kv[0], kv[1])


def _piece_kernel_fwd(cfg, i, q, kv, lb):
    b = q.shape[0]
    fwd, _ = _kernels(cfg, cfg.fwd_margin[i])
    k, v = _kv_pair(kv)
    with scheduling_group(cfg.fwd_groups[i]):
        o, lse = fwd(q, k, v, _bounds(lb, b), scale=cfg.scale)
    return o, lse.astype(jnp.float32)


def _merge_all(outs, dtype):
    """LSE merge of n partial results (o_i in the kernel dtype, lse_i f32) -> (o dtype, lse f32)."""
    if len(outs) == 1:
        return outs[0][0].astype(dtype), outs[0][1]
    lses = [l for _, l in outs]
    mx = functools.reduce(jnp.maximum, lses)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    ws = [jnp.exp(l - mx) for l in lses]
    den = functools.reduce(jnp.add, ws)
    ok = den > 0
    den_s = jnp.where(ok, den, 1.0)
    acc = functools.reduce(jnp.add, [w[..., None] * o.astype(jnp.float32) for w, (o, _) in zip(ws, outs)])
    o = (acc / den_s[..., None]).astype(dtype)
    lse = jnp.where(ok, mx + jnp.log(den_s), -jnp.inf)
    return o, lse


def _chained(cfg):
    """Merge the pieces one at a time, each skippable piece's merge inside its ``lax.cond`` (the
    skip branch passes the running result through: no zero partial result, no merge pass)."""
    return any(cfg.skip[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pieces(cfg, q, kvs, lbs):
    n = len(kvs)
    lq = q.shape[1]
    if not _chained(cfg):
        outs = []
        for i, (kv, lb) in enumerate(zip(kvs, lbs)):
            if cfg.skip[i]:  # (only the local piece can get here with skip: never from make_config)
                outs.append(_skippable_fwd(cfg, i, q, kv, lb))
            else:
                outs.append(_piece_kernel_fwd(cfg, i, q, kv, lb))
        return _merge_all(outs, q.dtype)
    # chained: piece 0 (local) first, then merge piece i into the running (o, lse); the running o
    # stays in the kernel dtype after piece 0 and f32 between merges, q.dtype after the last one.
    if cfg.skip[0]:
        acc = _skippable_fwd(cfg, 0, q, kvs[0], lbs[0])
    else:
        acc = _piece_kernel_fwd(cfg, 0, q, kvs[0], lbs[0])
    for i in range(1, n):
        odt = q.dtype if i == n - 1 else jnp.float32

        def compute(ao, al, q, kv, lb, i=i, odt=odt):
            o, l = _merge_all([(ao, al), _piece_kernel_fwd(cfg, i, q, kv, lb)], odt)
            refs = (ao, al, q, kv, lb)
            return _match(o, *refs), _match(l, *refs)

        def skip(ao, al, q, kv, lb, odt=odt):
            refs = (ao, al, q, kv, lb)
            return _match(ao.astype(odt), *refs), _match(al, *refs)

        args = (acc[0], acc[1], q, kvs[i], lbs[i])
        if cfg.skip[i]:
            acc = lax.cond(jnp.logical_not(_fully_masked(lbs[i], lq)), compute, skip, *args)
        else:
            acc = compute(*args)
    return acc[0].astype(q.dtype), acc[1]


def _skippable_fwd(cfg, i, q, kv, lb):
    """Piece i's (o, lse), or (zeros, -inf) where fully masked (``lax.cond``)."""
    b, lq, n, _ = q.shape

    def compute(q, kv, lb):
        o, lse = _piece_kernel_fwd(cfg, i, q, kv, lb)
        return _match(o, q, kv, lb), _match(lse, q, kv, lb)

    def skip(q, kv, lb):
        dv = _kv_pair(kv)[1].shape[-1]
        return (_match(jnp.zeros((b, lq, n, dv), q.dtype), q, kv, lb),
                _match(jnp.full((b, lq, n), -jnp.inf, jnp.float32), q, kv, lb))

    return lax.cond(jnp.logical_not(_fully_masked(lb, lq)), compute, skip, q, kv, lb)


def _pieces_fwd(cfg, q, kvs, lbs):
    o, lse = _pieces(cfg, q, kvs, lbs)
    return (o, lse), (q, kvs, lbs, o, lse)


def _pieces_bwd(cfg, res, cts):
    """Every piece's backward kernel on the final (out, lse, dO, dlse), last piece first (its dK/dV,
    a remote piece's, can travel back while the earlier pieces run). A skippable piece's cond
    returns its dQ in the kernel's dtype (no f32 copy) and dK / dV unstacked (stacked outside the
    cond, so the slices sent back fuse with the stack); the dQ are summed in f32 after the local
    piece, a skippable piece's addition inside a ``lax.cond`` on the same predicate (skipped: the
    running dQ passes through, no zero dQ is read)."""
    q, kvs, lbs, o, lse = res
    do, dlse = cts
    b, lq, _, _ = q.shape
    do = do.astype(q.dtype)
    dlse = dlse.astype(jnp.float32)
    n = len(kvs)
    dqs = [None] * n
    dkvs = [None] * n
    # last piece first: its dK/dV (a remote piece's) can travel back while the earlier pieces run
    for i in reversed(range(n)):
        kv, lb = kvs[i], lbs[i]
        _, bwd = _kernels(cfg, cfg.bwd_margin[i])

        def compute(q, kv, lb, o, lse, do, dlse, bwd=bwd, i=i):
            k, v = _kv_pair(kv)
            with scheduling_group(cfg.bwd_groups[i]):
                dqi, dki, dvi = bwd(q, k, v, _bounds(lb, b), o, lse, do, dlse,
                                    scale=cfg.scale, deterministic=cfg.deterministic)
            refs = (q, kv, lb, o, lse, do, dlse)
            return (_match(dqi, *refs), _match(dki.astype(k.dtype), *refs),
                    _match(dvi.astype(v.dtype), *refs))

        args = (q, kv, lb, o, lse, do, dlse)
        stacked_out = (cfg.skip[i] and not isinstance(kv, (tuple, list)) and bool(cfg.stack_in_cond)
                       and cfg.stack_in_cond[i])
        if stacked_out:
            def compute(*a, unstacked=compute):
                dqi, dki, dvi = unstacked(*a)
                return dqi, _match(jnp.stack([dki, dvi]), *a)

        if cfg.skip[i]:
            shapes = jax.eval_shape(compute, *args)

            def skip(*a, shapes=shapes):
                return tuple(_match(jnp.zeros(s.shape, s.dtype), *a) for s in shapes)

            outs = lax.cond(jnp.logical_not(_fully_masked(lb, lq)), compute, skip, *args)
        else:
            outs = compute(*args)
        dqs[i] = outs[0]
        if stacked_out:
            dkvs[i] = outs[1]
        else:
            dkvs[i] = outs[1:] if isinstance(kv, (tuple, list)) else jnp.stack(outs[1:])
    if not _chained(cfg):
        dq = functools.reduce(jnp.add, [d.astype(jnp.float32) for d in reversed(dqs)])
        return dq.astype(q.dtype), dkvs, [None] * len(lbs)
    dq = dqs[0]
    for i in range(1, n):
        odt = q.dtype if i == n - 1 else jnp.float32

        def add(a, d, odt=odt):
            return _match((a.astype(jnp.float32) + d.astype(jnp.float32)).astype(odt), a, d)

        def keep(a, d, odt=odt):
            return _match(a.astype(odt), a, d)

        if cfg.skip[i]:
            dq = lax.cond(jnp.logical_not(_fully_masked(lbs[i], lq)), add, keep, dq, dqs[i])
        else:
            dq = add(dq, dqs[i])
    return dq.astype(q.dtype), dkvs, [None] * len(lbs)


_pieces.defvjp(_pieces_fwd, _pieces_bwd)


def piece_attention(q, kvs, lbs, cfg: PieceConfig):
    """q ``[B, L, N, d]``; kvs: n pieces, each K and V stacked ``[2, B, Lk_i, K, d]`` (what travels
    in one ``ppermute``) or a pair ``(k, v)`` of ``[B, Lk_i, K, d]`` (the local piece: no stack
    copy, and its dK / dV come back unstacked); lbs: n localized bounds ``[B|1, Hm, 4, Lk_i]``.
    Returns (out ``[B, L, N, d]`` in q.dtype, lse f32 ``[B, L, N]``)."""
    n = len(kvs)
    for name in ("fwd_margin", "bwd_margin", "skip", "fwd_groups", "bwd_groups"):
        if len(getattr(cfg, name)) != n:
            raise ValueError(f"PieceConfig.{name} has {len(getattr(cfg, name))} entries for {n} pieces")
    return _pieces(cfg, q, [tuple(kv) if isinstance(kv, (tuple, list)) else kv for kv in kvs],
                   list(lbs))


def make_config(n, *, implementation, scale, head_dim, deterministic=False, base_margin=0,
                overlap_margin=None, skip=None, groups=None, stack_in_cond=None):
    """A `PieceConfig` for n pieces, of which every piece but the last overlaps a transfer.

    ``overlap_margin``: None (use ``base_margin`` everywhere), an int (forward and backward) or a
    pair ``(fwd, bwd)``: the ``sm_margin`` of the overlapping pieces; the last piece keeps
    ``base_margin``. ``groups``: None or n-1 pairs ``(fwd_id, bwd_id)`` for pieces 0..n-2.
    ``stack_in_cond``: None or n bools (`PieceConfig.stack_in_cond`).
    """
    if overlap_margin is None:
        om = (base_margin, base_margin)
    elif isinstance(overlap_margin, (tuple, list)):
        om = tuple(int(x) for x in overlap_margin)
        if len(om) != 2:
            raise ValueError(f"overlap_sm_margin must be an int or a pair (fwd, bwd), got {overlap_margin!r}")
    else:
        om = (int(overlap_margin), int(overlap_margin))
    if min(om) < 0 or base_margin < 0:
        raise ValueError(f"SM margins must be >= 0, got {om}, {base_margin}")
    fwd_m = tuple(om[0] if i < n - 1 else base_margin for i in range(n))
    bwd_m = tuple(om[1] if i < n - 1 else base_margin for i in range(n))
    skip = tuple(bool(s) for s in (skip if skip is not None else [i > 0 for i in range(n)]))
    fg = tuple((groups[i][0] if groups is not None and i < n - 1 else None) for i in range(n))
    bg = tuple((groups[i][1] if groups is not None and i < n - 1 else None) for i in range(n))
    sc = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    sic = () if stack_in_cond is None else tuple(bool(x) for x in stack_in_cond)
    if sic and len(sic) != n:
        raise ValueError(f"stack_in_cond has {len(sic)} entries for {n} pieces")
    return PieceConfig(implementation=implementation, scale=sc, deterministic=bool(deterministic),
                       fwd_margin=fwd_m, bwd_margin=bwd_m, skip=skip, fwd_groups=fg, bwd_groups=bg,
                       stack_in_cond=sic)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def hinted_ppermute(x, axis, perm, fwd_group, bwd_group):
    """``lax.ppermute`` whose forward carries scheduling group `fwd_group` and whose transpose (the
    reverse ppermute that returns the cotangent) carries `bwd_group`."""
    with scheduling_group(fwd_group):
        return lax.ppermute(x, axis, perm=list(perm))


def _hp_fwd(x, axis, perm, fwd_group, bwd_group):
    return hinted_ppermute(x, axis, perm, fwd_group, bwd_group), None


def _hp_bwd(axis, perm, fwd_group, bwd_group, _, ct):
    with scheduling_group(bwd_group):
        return (lax.ppermute(ct, axis, perm=[(t, s) for s, t in perm]),)


hinted_ppermute.defvjp(_hp_fwd, _hp_bwd)
