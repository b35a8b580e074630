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
  (the local piece never needs it; a GPU conditional costs a device-to-host sync).
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

from .. import backends
from ._vma import match_vma

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


def scheduling_group(group):
    """Context manager putting ``_scheduling_group_id=group`` on the ops traced inside (no-op for
    None)."""
    if group is None:
        import contextlib

        return contextlib.nullcontext()
    from jax.experimental.xla_metadata import set_xla_metadata

    return set_xla_metadata(_scheduling_group_id=str(group))


_match = match_vma


def _kernels(cfg: PieceConfig, margin: int):
    fwd, bwd = backends.kernels(cfg.implementation, int(margin))
    if cfg.implementation == "reference":
        # its backward re-derives its own statistics; the portable one takes the given (out, lse)
        bwd = backends.portable.backward
    return fwd, bwd


def _fully_masked(lb, n_rows):
    from .localize import columns_fully_masked

    return jnp.all(columns_fully_masked(lb, n_rows))


def _bounds(lb, b):
    # localized bounds are already canonical non-causal D=4 (`canonical_bounds` is the identity there)
    return jnp.broadcast_to(lb.astype(jnp.int32), (b,) + lb.shape[1:])


def _piece_fwd(cfg, i, q, kv, lb):
    b, lq, n, _ = q.shape
    fwd, _ = _kernels(cfg, cfg.fwd_margin[i])

    def compute(q, kv, lb):
        with scheduling_group(cfg.fwd_groups[i]):
            o, lse = fwd(q, kv[0], kv[1], _bounds(lb, b), scale=cfg.scale)
        return _match(o, q, kv, lb), _match(lse.astype(jnp.float32), q, kv, lb)

    def skip(q, kv, lb):
        return (_match(jnp.zeros((b, lq, n, kv.shape[-1]), q.dtype), q, kv, lb),
                _match(jnp.full((b, lq, n), -jnp.inf, jnp.float32), q, kv, lb))

    if not cfg.skip[i]:
        return compute(q, kv, lb)
    return lax.cond(jnp.logical_not(_fully_masked(lb, lq)), compute, skip, q, kv, lb)


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pieces(cfg, q, kvs, lbs):
    outs = [_piece_fwd(cfg, i, q, kv, lb) for i, (kv, lb) in enumerate(zip(kvs, lbs))]
    return _merge_all(outs, q.dtype)


def _pieces_fwd(cfg, q, kvs, lbs):
    o, lse = _pieces(cfg, q, kvs, lbs)
    return (o, lse), (q, kvs, lbs, o, lse)


def _pieces_bwd(cfg, res, cts):
    q, kvs, lbs, o, lse = res
    do, dlse = cts
    b, lq, _, _ = q.shape
    do = do.astype(q.dtype)
    dlse = dlse.astype(jnp.float32)
    dq = None
    dkvs = [None] * len(kvs)
    # last piece first: its dK/dV (a remote piece's) can travel back while the earlier pieces run
    for i in reversed(range(len(kvs))):
        kv, lb = kvs[i], lbs[i]
        _, bwd = _kernels(cfg, cfg.bwd_margin[i])

        def compute(q, kv, lb, o, lse, do, dlse, bwd=bwd, i=i):
            with scheduling_group(cfg.bwd_groups[i]):
                dqi, dki, dvi = bwd(q, kv[0], kv[1], _bounds(lb, b), o, lse, do, dlse,
                                    scale=cfg.scale, deterministic=cfg.deterministic)
            refs = (q, kv, lb, o, lse, do, dlse)
            return _match(dqi.astype(jnp.float32), *refs), _match(jnp.stack([dki, dvi]).astype(kv.dtype), *refs)

        def skip(q, kv, lb, o, lse, do, dlse):
            refs = (q, kv, lb, o, lse, do, dlse)
            return (_match(jnp.zeros(q.shape, jnp.float32), *refs), _match(jnp.zeros_like(kv), *refs))

        args = (q, kv, lb, o, lse, do, dlse)
        if cfg.skip[i]:
            dqi, dkvi = lax.cond(jnp.logical_not(_fully_masked(lb, lq)), compute, skip, *args)
        else:
            dqi, dkvi = compute(*args)
        dq = dqi if dq is None else dq + dqi
        dkvs[i] = dkvi
    return dq.astype(q.dtype), dkvs, [None] * len(lbs)


_pieces.defvjp(_pieces_fwd, _pieces_bwd)


def piece_attention(q, kvs, lbs, cfg: PieceConfig):
    """q ``[B, L, N, d]``; kvs: n arrays ``[2, B, Lk_i, K, d]`` (K and V stacked); lbs: n localized
    bounds ``[B|1, Hm, 4, Lk_i]``. Returns (out ``[B, L, N, d]`` in q.dtype, lse f32 ``[B, L, N]``)."""
    n = len(kvs)
    for name in ("fwd_margin", "bwd_margin", "skip", "fwd_groups", "bwd_groups"):
        if len(getattr(cfg, name)) != n:
            raise ValueError(f"PieceConfig.{name} has {len(getattr(cfg, name))} entries for {n} pieces")
    return _pieces(cfg, q, list(kvs), list(lbs))


def make_config(n, *, implementation, scale, head_dim, deterministic=False, base_margin=0,
                overlap_margin=None, skip=None, groups=None):
    """A `PieceConfig` for n pieces, of which every piece but the last overlaps a transfer.

    ``overlap_margin``: None (use ``base_margin`` everywhere), an int (forward and backward) or a
    pair ``(fwd, bwd)``: the ``sm_margin`` of the overlapping pieces; the last piece keeps
    ``base_margin``. ``groups``: None or n-1 pairs ``(fwd_id, bwd_id)`` for pieces 0..n-2.
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
    return PieceConfig(implementation=implementation, scale=sc, deterministic=bool(deterministic),
                       fwd_margin=fwd_m, bwd_margin=bwd_m, skip=skip, fwd_groups=fg, bwd_groups=bg)


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
