"""How the attention kernels partition under ``jax.jit`` with sharded inputs.

XLA cannot look inside an FFI custom call (nor usefully inside the portable path's blocked loops),
so without a rule it gathers every operand and computes the whole problem on every device. Here
the forward and backward calls of every implementation are wrapped in
`jax.experimental.custom_partitioning` with a Shardy sharding rule (propagation) and a partition
callback (what each device runs):

* **batch** (dim 0 of everything) and **heads** (query heads ``N = K·g`` and kv heads ``K`` on one
  mesh axis, so each GQA group stays on one device; mask heads follow ``Hm``: 1 replicated, K or N
  sharded alike) are embarrassingly parallel: no communication at all.
* **sequence**: the queries keep their shards; each device all-gathers K/V on that axis, localizes
  the mask's row boundaries to its own query rows (``clip(r - r0, 0, Sq_local)``, the
  zero-communication rule of context parallelism for one contiguous chunk), and the backward
  reduce-scatters dK/dV back to the owners of K/V. Outputs keep q's sharding.
* anything else (head_dim, an axis that does not divide its dimension, kv heads that a head
  sharding would split unevenly) is gathered on that axis: slower, never wrong.

The same rule serves every implementation, so the CPU tests exercise what the GPU runs.
``custom_partitioning`` has no batching rule; `jax.custom_batching.custom_vmap` folds a vmapped
axis into the batch dimension instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _transforms

__all__ = ["forward", "backward", "Layout"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Head counts the rule needs (static): query heads, kv heads and mask heads."""

    num_heads: int
    num_kv_heads: int
    mask_heads: int

    @classmethod
    def of(cls, q, k, bounds):
        return cls(q.shape[2], k.shape[2], bounds.shape[1])


# -- the Shardy rule (propagation) ------------------------------------------------------------------

def _heads(layout: Layout) -> str:
    """Factor expression of the query-head dim: N = K·g, so that N and K share a sharding (a single
    kv head is its own size-1 factor: Shardy takes no size-1 factor in a compound)."""
    if layout.num_heads == layout.num_kv_heads:
        return "k"
    return "g" if layout.num_kv_heads == 1 else "(k g)"


def _mask_heads(layout: Layout) -> str:
    if layout.mask_heads == layout.num_heads and layout.mask_heads > 1:
        return _heads(layout)
    if layout.mask_heads == layout.num_kv_heads and layout.mask_heads > 1:
        return "k"
    return "h"


def _factor_sizes(layout: Layout) -> dict:
    if layout.num_heads == layout.num_kv_heads or layout.num_kv_heads == 1:
        return {}
    return {"g": layout.num_heads // layout.num_kv_heads}


def _forward_rule(opts, layout, mesh, value_types, result_types):
    del opts, mesh, value_types, result_types
    n, m = _heads(layout), _mask_heads(layout)
    rule = f"b s {n} d, b t k d, b t k d, b {m} f u -> b s {n} d, b s {n}"
    return rule, dict(need_replication_factors=("d", "f", "u"), **_factor_sizes(layout))


def _backward_rule(opts, layout, mesh, value_types, result_types):
    del opts, mesh, value_types, result_types
    n, m = _heads(layout), _mask_heads(layout)
    q, kv, lse = f"b s {n} d", "b t k d", f"b s {n}"
    rule = (f"{q}, {kv}, {kv}, b {m} f u, {q}, {lse}, {q}, {lse} -> {q}, {kv}, {kv}")
    return rule, dict(need_replication_factors=("d", "f", "u"), **_factor_sizes(layout))


# -- the partition callback (what each device runs) -------------------------------------------------

def _axes(entry) -> tuple:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes: tuple):
    return None if not axes else axes[0] if len(axes) == 1 else axes


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Mesh axes of each logical dimension for one call, after the divisibility checks."""

    batch: tuple
    seq: tuple
    heads: tuple       # query heads (and kv heads when `kv_heads_sharded`)
    kv_heads_sharded: bool
    mask_heads: tuple

    def q(self):
        return P(_entry(self.batch), _entry(self.seq), _entry(self.heads), None)

    def lse(self):
        return P(_entry(self.batch), _entry(self.seq), _entry(self.heads))

    def kv(self):
        heads = self.heads if self.kv_heads_sharded else ()
        return P(_entry(self.batch), _entry(self.seq), _entry(heads), None)

    def bounds(self):
        return P(_entry(self.batch), _entry(self.mask_heads), None, None)


def _size(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _plan(mesh, layout: Layout, q_shape, k_shape, q_sharding) -> _Plan:
    spec = tuple(getattr(q_sharding, "spec", ())) + (None,) * 4
    if not isinstance(q_sharding, NamedSharding):
        spec = (None,) * 4
    b, sq, n, _ = q_shape
    sk, kh = k_shape[1], k_shape[2]
    batch, seq, heads = _axes(spec[0]), _axes(spec[1]), _axes(spec[2])
    if b % _size(mesh, batch):
        batch = ()
    if sq % _size(mesh, seq) or sk % _size(mesh, seq):
        seq = ()
    hs = _size(mesh, heads)
    kv_sharded = True
    if n % hs:
        heads = ()
    elif kh % hs:
        # MQA-like: one kv head (or too few to split) serves every local query head only when
        # the mask does not need kv-head granularity.
        if kh == 1 and layout.mask_heads in (1, n):
            kv_sharded = False
        else:
            heads = ()
    hm = layout.mask_heads
    mask_heads = heads if (hm > 1 and (hm == n or (hm == kh and kv_sharded))) else ()
    return _Plan(batch, seq, heads, kv_sharded, mask_heads)


def _localize(bounds, seq, q_rows):
    """Row boundaries relative to this device's contiguous block of `q_rows` query rows."""
    if not seq:
        return bounds
    r0 = lax.axis_index(_entry(seq)) * q_rows
    return jnp.clip(bounds - r0, 0, q_rows).astype(jnp.int32)


def _gather_kv(x, seq):
    return lax.all_gather(x, _entry(seq), axis=1, tiled=True) if seq else x


def _forward_partition(opts, layout, mesh, arg_shapes, result_shape):
    q, k = arg_shapes[0], arg_shapes[1]
    plan = _plan(mesh, layout, q.shape, k.shape, q.sharding)
    named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    args = (named(plan.q()), named(plan.kv()), named(plan.kv()), named(plan.bounds()))
    results = (named(plan.q()), named(plan.lse()))

    def per_device(q, k, v, bounds):
        fwd, _ = opts.kernels()
        k, v = _gather_kv(k, plan.seq), _gather_kv(v, plan.seq)
        return fwd(q, k, v, _localize(bounds, plan.seq, q.shape[1]), scale=opts.scale)

    return mesh, per_device, results, args


def _backward_partition(opts, layout, mesh, arg_shapes, result_shape):
    q, k = arg_shapes[0], arg_shapes[1]
    plan = _plan(mesh, layout, q.shape, k.shape, q.sharding)
    named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    qs, kvs, ls = named(plan.q()), named(plan.kv()), named(plan.lse())
    args = (qs, kvs, kvs, named(plan.bounds()), qs, ls, qs, ls)
    results = (qs, kvs, kvs)
    # kv heads replicated while query heads are split: each device holds a partial dK/dV.
    head_sum = plan.heads if not plan.kv_heads_sharded else ()

    def per_device(q, k, v, bounds, out, lse, dout, dlse):
        _, bwd = opts.kernels(backward=True)
        kf, vf = _gather_kv(k, plan.seq), _gather_kv(v, plan.seq)
        dq, dk, dv = bwd(q, kf, vf, _localize(bounds, plan.seq, q.shape[1]), out, lse, dout, dlse,
                         scale=opts.scale, deterministic=opts.deterministic)
        if plan.seq or head_sum:
            # Partial sums travel in float32: the owners add P contributions, as one device adds
            # its key blocks' contributions in float32 before the final rounding.
            dk, dv = dk.astype(jnp.float32), dv.astype(jnp.float32)
            if head_sum:
                dk, dv = lax.psum(dk, _entry(head_sum)), lax.psum(dv, _entry(head_sum))
            if plan.seq:
                dk = lax.psum_scatter(dk, _entry(plan.seq), scatter_dimension=1, tiled=True)
                dv = lax.psum_scatter(dv, _entry(plan.seq), scatter_dimension=1, tiled=True)
            dk, dv = dk.astype(k.dtype), dv.astype(v.dtype)
        return dq, dk, dv

    return mesh, per_device, results, args


def _reference_call(direction):
    """The unpartitioned computation (what runs on one device, or when nothing is sharded).

    Traced inside `jax.jit`: custom_partitioning takes no closed-over constants, and the
    implementations hold small index tables; a nested jit keeps them inside its own jaxpr."""
    if direction == "forward":
        def call(opts, layout, q, k, v, bounds):
            fwd, _ = opts.kernels()
            return jax.jit(functools.partial(fwd, scale=opts.scale))(q, k, v, bounds)
    else:
        def call(opts, layout, q, k, v, bounds, out, lse, dout, dlse):
            _, bwd = opts.kernels(backward=True)
            bwd = functools.partial(bwd, scale=opts.scale, deterministic=opts.deterministic)
            return jax.jit(bwd)(q, k, v, bounds, out, lse, dout, dlse)
    return call


_UNPARTITIONED = {"forward": _reference_call("forward"), "backward": _reference_call("backward")}
_forward_cp = custom_partitioning(_UNPARTITIONED["forward"], static_argnums=(0, 1))
_forward_cp.def_partition(partition=_forward_partition, sharding_rule=_forward_rule)
_backward_cp = custom_partitioning(_UNPARTITIONED["backward"], static_argnums=(0, 1))
_backward_cp.def_partition(partition=_backward_partition, sharding_rule=_backward_rule)


# -- vmap: fold the mapped axis into the batch ------------------------------------------------------

def _fold(axis_size, in_batched, args):
    folded = []
    for x, batched in zip(args, in_batched):
        if not batched:
            x = jnp.broadcast_to(x, (axis_size,) + x.shape)
        folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
    return folded


def _unfold(axis_size, outs):
    return tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in outs)


@functools.lru_cache(maxsize=None)
def _batchable(direction, opts, layout):
    call = _forward_cp if direction == "forward" else _backward_cp

    @jax.custom_batching.custom_vmap
    def run(*args):
        return tuple(call(opts, layout, *args))

    @run.def_vmap
    def _rule(axis_size, in_batched, *args):
        outs = run(*_fold(axis_size, in_batched, args))
        return _unfold(axis_size, outs), tuple(True for _ in outs)

    # custom_partitioning has no differentiation rule either. Forward mode reaches these calls only
    # in forward-over-reverse (Hessian-vector products): its tangents come from the unpartitioned
    # implementation, which is as differentiable as the implementation itself.
    @jax.custom_jvp
    def differentiable(*args):
        return run(*args)

    @differentiable.defjvp
    def _jvp(primals, tangents):
        unpartitioned = lambda *a: tuple(_UNPARTITIONED[direction](opts, layout, *a))  # noqa: E731
        # JAX runs this rule while it processes an already traced program (jvp of the jitted
        # attention), outside the custom_vjp's own error translation: translate here too.
        with _transforms.explain_higher_order():
            return jax.jvp(unpartitioned, primals, tangents)

    return differentiable


def _explicit_mesh(*xs):
    """The mesh when an input's type carries Explicit mesh axes (sharding in types), else None."""
    for x in xs:
        sharding = getattr(jax.typeof(x), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and getattr(mesh, "explicit_axes", ()):
            return mesh
    return None


def _spec(x, ndim):
    spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
    return spec + (None,) * (ndim - len(spec))


def _call(direction, opts, args, out_like):
    run = _batchable(direction, opts, Layout.of(*args[:2], args[3]))
    mesh = _explicit_mesh(*args)
    if mesh is None:
        return run(*args)
    # Explicit sharding: the rule works on Auto axes; results get the sharding `out_like` asks for
    # (q's for out / dq, k's and v's for dk / dv, q's without head_dim for lse).
    out_sharding = tuple(NamedSharding(mesh, P(*_spec(x, ndim)[:ndim])) for x, ndim in out_like)
    return jax.sharding.auto_axes(run, out_sharding=out_sharding)(*args)


def forward(q, k, v, bounds, opts):
    """(out, lse) of `opts`'s implementation, partitioned by the rule above under jit."""
    return _call("forward", opts, (q, k, v, bounds), ((q, 4), (q, 3)))


def backward(q, k, v, bounds, out, lse, dout, dlse, opts):
    """(dq, dk, dv) of `opts`'s implementation, partitioned by the rule above under jit."""
    if dlse is None:
        dlse = jnp.zeros(lse.shape, jnp.float32)
    return _call("backward", opts, (q, k, v, bounds, out, lse, dout, dlse), ((q, 4), (k, 4), (v, 4)))
