"""Sharding checks on 8 host CPU devices, one group per interpreter (see test_sharding.py).

Run as ``python tests/_sharding_worker.py GROUP``; prints one ``ok: ...`` line per check and exits
non-zero on the first failure. Every distributed call is followed by ``block_until_ready``.
"""

from __future__ import annotations

import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402
from jax_flashmask import masks  # noqa: E402
from _hlo import large_collectives  # noqa: E402

D = 16


def log(msg):
    print("ok:", msg, flush=True)


def block(x):
    return jax.block_until_ready(x)


def mesh_of(shape, names, explicit=False):
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))


def qkv(b, sq, sk, n, kh, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, sq, n, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, sk, kh, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, sk, kh, D)), jnp.float32)
    return q, k, v


def doc_mask(b, sk, heads, seed=1):
    """Causal document masks with different document splits per batch row and mask head."""
    rng = np.random.default_rng(seed)
    ind = np.empty((b, heads, sk, 1), np.int32)
    for i in range(b):
        for h in range(heads):
            cuts = np.sort(rng.choice(np.arange(1, sk), size=3, replace=False))
            ends = np.append(cuts, sk)
            ind[i, h, :, 0] = ends[np.searchsorted(ends, np.arange(sk), side="right")]
    return masks.FlashMask(jnp.asarray(ind), causal=True)


def loss_and_grads(mask, impl, **kw):
    def loss(q, k, v):
        o, lse = jf.attention(q, k, v, mask, return_residual=True, implementation=impl, **kw)
        w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32).reshape(o.shape))
        return jnp.sum(o * w) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


def same_spec(a, b):
    strip = lambda s: tuple(s)[:max([i + 1 for i, e in enumerate(tuple(s)) if e is not None], default=0)]  # noqa: E731
    return strip(a) == strip(b)


def compare(name, got, want, rtol=2e-5):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if not np.array_equal(np.isfinite(g), np.isfinite(w)) or not np.array_equal(g[~np.isfinite(w)], w[~np.isfinite(w)]):
            raise AssertionError(f"{name}: non-finite entries differ")
        fin = np.isfinite(w)
        scale = max(1.0, float(np.max(np.abs(w[fin]), initial=0.0)))
        err = float(np.max(np.abs(g[fin] - w[fin]), initial=0.0)) / scale
        if not err <= rtol:
            raise AssertionError(f"{name}: max relative error {err:.3g} > {rtol}")


def check_layout(name, mesh, spec_q, spec_kv, shapes, mask, impl, *, comm="none", **kw):
    """out, lse, dq, dk, dv under `spec_*` equal the unsharded call; `comm` says which
    collectives the compiled program may hold: "none" (bar scalars), "kv" (none as large as q)."""
    q, k, v = qkv(*shapes)
    f = jax.jit(loss_and_grads(mask, impl, **kw))
    want = block(f(q, k, v))
    sq, skv = NamedSharding(mesh, spec_q), NamedSharding(mesh, spec_kv)
    args = (jax.device_put(q, sq), jax.device_put(k, skv), jax.device_put(v, skv))
    text = f.lower(*args).compile().as_text()
    got = block(f(*args))
    compare(name, got, want)
    (_, (out, lse)), (dq, dk, dv) = got
    if not (same_spec(out.sharding.spec, sq.spec) and same_spec(dq.sharding.spec, sq.spec)
            and same_spec(dk.sharding.spec, skv.spec)):
        raise AssertionError(f"{name}: shardings out {out.sharding.spec}, dq {dq.sharding.spec}, "
                             f"dk {dk.sharding.spec}; expected {sq.spec} / {skv.spec}")
    found = large_collectives(text)
    if comm == "none" and found:
        raise AssertionError(f"{name}: expected no collectives, found {found}")
    if comm == "kv" and any(size >= q.size for _, size in found):
        raise AssertionError(f"{name}: a collective as large as q ({q.size}): {found}")
    log(f"{name} [{impl}]: equal to one device; collectives {sorted(set(found))}")


def group_layouts(impl):
    m8 = mesh_of((8,), ("x",))
    m24 = mesh_of((2, 4), ("a", "b"))
    # batch: per-row masks sharded alike; then a mask batch of 1 (replicated)
    check_layout("batch 8", m8, P("x"), P("x"), (8, 40, 40, 4, 2), doc_mask(8, 40, 1), impl)
    check_layout("batch 8, mask batch 1", m8, P("x"), P("x"), (8, 40, 40, 4, 2), doc_mask(1, 40, 1), impl)
    # heads: N = 16, K = 8 on one axis, per-kv-head masks
    check_layout("heads 8", m8, P(None, None, "x"), P(None, None, "x"), (2, 40, 40, 16, 8),
                 doc_mask(2, 40, 8), impl)
    # batch x heads on 2 x 4, per-query-head masks
    check_layout("batch x heads 2x4", m24, P("a", None, "b"), P("a", None, "b"), (2, 40, 40, 8, 4),
                 doc_mask(2, 40, 8), impl)
    # sequence: queries stay split, K/V gathered, dK/dV reduce-scattered
    check_layout("sequence 8", m8, P(None, "x"), P(None, "x"), (2, 64, 64, 4, 2), doc_mask(2, 64, 1),
                 impl, comm="kv")
    check_layout("sequence 8, Sq != Sk, causal", m8, P(None, "x"), P(None, "x"), (2, 64, 48, 4, 2),
                 None, impl, comm="kv", causal=True)
    check_layout("sequence x heads 2x4", m24, P(None, "a", "b"), P(None, "a", "b"), (2, 64, 64, 8, 4),
                 doc_mask(2, 64, 4), impl, comm="kv")
    check_layout("batch x sequence 2x4", m24, P("a", "b"), P("a", "b"), (2, 64, 64, 4, 2),
                 doc_mask(2, 64, 1), impl, comm="kv")
    # unsupported (head_dim) or uneven (40 rows over 8 devices): gathered, never wrong
    q, k, v = qkv(2, 40, 40, 4, 2)
    grads = loss_and_grads(doc_mask(2, 40, 1), impl)
    want = block(jax.jit(grads)(q, k, v))
    for name, spec in (("head_dim 8", P(None, None, None, "x")), ("uneven sequence 40 / 8", P(None, "x"))):
        sh = NamedSharding(m8, spec)
        constrained = lambda q, k, v, sh=sh: grads(*(jax.lax.with_sharding_constraint(x, sh) for x in (q, k, v)))
        compare(name, block(jax.jit(constrained)(q, k, v)), want)
        log(f"{name} [{impl}]: gathered, equal to one device")
    # MQA: one kv head, query heads split: dK/dV summed over the head axis
    check_layout("MQA heads 8", m8, P(None, None, "x"), P(), (2, 40, 40, 8, 1), doc_mask(2, 40, 1),
                 impl, comm="any")


def group_explicit():
    """Explicit mesh axes (sharding in types): the result's type carries q's sharding."""
    mesh = mesh_of((2, 4), ("a", "b"), explicit=True)
    q, k, v = qkv(2, 40, 40, 8, 4)
    mask = doc_mask(2, 40, 1)
    f = jax.jit(loss_and_grads(mask, "xla"))
    want = block(f(q, k, v))
    with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(mesh):
        spec = P("a", None, "b", None)
        args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v)]
        got = block(f(*args))
        (_, (out, lse)), (dq, dk, dv) = got
        for name, x, s in (("out", out, spec), ("lse", lse, P("a", None, "b")), ("dq", dq, spec),
                           ("dk", dk, spec)):
            t = jax.typeof(x).sharding.spec
            if not same_spec(t, s):
                raise AssertionError(f"explicit: {name} type sharding {t}, expected {s}")
        fwd = jax.jit(lambda q, k, v: jf.attention(q, k, v, mask, implementation="xla"))
        typed = fwd.trace(*args).out_info
        if not same_spec(typed.sharding.spec, spec):
            raise AssertionError(f"explicit: traced output sharding {typed.sharding.spec}")
    compare("explicit", got, want)
    log("explicit axes: equal to one device, output sharding in the result's type")


def group_cuda_lowering():
    """implementation='cuda' lowered for the CUDA platform (no GPU needed): the FFI custom calls
    sit inside the partitioning rule's custom call (CustomSPMDPartitioning + sdy.sharding_rule)."""
    from jax_flashmask import _api, backends

    cuda = backends.cuda

    def fake_forward(q, k, v, bounds, *, scale, sm_margin=0, structure="general"):
        types = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:3], jnp.float32))
        return jax.ffi.ffi_call(cuda.FWD_TARGET, types)(q, k, v, bounds, scale=np.float32(scale))

    def fake_backward(q, k, v, bounds, out, lse, dout, dlse, *, scale, deterministic=False, sm_margin=0):
        types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
        return jax.ffi.ffi_call(cuda.BWD_TARGET, types)(q, k, v, bounds, out, lse, dout, dlse,
                                                         scale=np.float32(scale))

    cuda.forward, cuda.backward = fake_forward, fake_backward
    mesh = mesh_of((8,), ("x",))
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(8, 64, 64, 4, 2))
    bounds = masks.canonical_bounds(doc_mask(8, 64, 1).startend_row_indices, causal=True, q_len=64)
    opts = _api.CallOptions("cuda", 0.25, False, 0, "general")

    def loss(q, k, v):
        out, lse = _api._flash(q, k, v, bounds, opts)
        return jnp.sum(out.astype(jnp.float32))

    sh = NamedSharding(mesh, P("x"))
    args = [jax.device_put(x, sh) for x in (q, k, v)]
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    # The whole-problem module: the rule's custom calls (forward and backward), no bare FFI call.
    if text.count("CustomSPMDPartitioning") < 2 or "sdy.sharding_rule" not in text:
        raise AssertionError("cuda lowering: the partitioning rule is missing around the FFI calls")
    for target in (cuda.FWD_TARGET, cuda.BWD_TARGET):
        if target in text:
            raise AssertionError(f"cuda lowering: {target} called outside the partitioning rule")
    # What each device runs (the partition callbacks): the FFI calls on the per-device shapes.
    from jax_flashmask import _sharding

    layout = _sharding.Layout.of(q, k, bounds)
    specs = lambda xs: [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("x"))) for x in xs]  # noqa: E731
    out, lse = jax.eval_shape(lambda *a: fake_forward(*a, scale=0.25), q, k, v, bounds)
    fwd = _sharding._forward_partition(opts, layout, mesh, specs((q, k, v, bounds)), specs((out, lse)))
    local = [jax.ShapeDtypeStruct((1,) + x.shape[1:], x.dtype) for x in (q, k, v, bounds)]
    fwd_text = jax.jit(fwd[1]).trace(*local).lower(lowering_platforms=("cuda",)).as_text()
    if cuda.FWD_TARGET not in fwd_text or "1x64x4x" not in fwd_text:
        raise AssertionError("cuda lowering: the per-device forward is not the FFI call on one batch row")
    log("cuda lowering: FFI forward and backward inside the partitioning rule")


def group_context_parallel_heads():
    """context_parallel_attention with a batch and a heads axis: q/k/v P(batch, cp, heads, None)
    keep their sharding and so does the output; equal to one device."""
    mesh = mesh_of((2, 2, 2), ("dp", "cp", "tp"))
    plan = jnp.asarray(cp.dual_chunk_plan(2))
    q, k, v = qkv(2, 64, 64, 4, 2)
    for hm in (1, 2, 4):
        mask = doc_mask(2, 64, hm)
        ref = block(jax.jit(lambda q, k, v: jf.attention(q, k, v, mask, implementation="xla"))(q, k, v))
        spec = P("dp", "cp", "tp", None)

        @jax.jit
        def run(q, k, v, plan):
            qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
            qp, kp, vp = (jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec)) for x in (qp, kp, vp))
            o = cp.context_parallel_attention(qp, kp, vp, mask, plan=plan, mesh=mesh, axis_name="cp",
                                              batch_axis="dp", head_axis="tp", implementation="xla")
            return o, cp.unpermute_tokens(o, plan)

        o_perm, o = block(run(q, k, v, plan))
        if not same_spec(o_perm.sharding.spec, spec):
            raise AssertionError(f"cp x heads: output sharding {o_perm.sharding.spec}, expected {spec}")
        compare(f"cp x heads (Hm={hm})", o, ref)
        log(f"context_parallel x batch x heads, Hm = {hm}: equal to one device, output {spec}")


GROUPS = {
    "layouts_xla": lambda: group_layouts("xla"),
    "layouts_reference": lambda: group_layouts("reference"),
    "explicit": group_explicit,
    "cuda_lowering": group_cuda_lowering,
    "cp_heads": group_context_parallel_heads,
}

if __name__ == "__main__":
    GROUPS[sys.argv[1]]()
    print("done", flush=True)
