"""`attention(implementation="cuda")` sharded over all local GPUs (SPEC §8), bf16.

Skipped with fewer than two GPUs or without the compiled CUDA extension. Run with
``pytest -m multi_gpu tests/gpu/test_multi_gpu.py -s``.

* The layouts of tests/_sharding_worker.py — batch, heads, batch x heads, sequence,
  sequence x heads — under jit + NamedSharding: out, lse, dq, dk, dv equal the same jitted call on
  one GPU (bf16 tolerances), the outputs keep q's sharding, and the compiled program holds no
  collective for batch / head layouts (bar scalars) and none as large as q for sequence layouts.
* `context_parallel_attention` over all GPUs (allgather and ring): equal to one GPU, no
  collective as large as q.
* A timing (printed, not asserted): forward + backward per GPU, data parallel over all GPUs
  against one GPU running one GPU's share of the batch (the ideal is equal times).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/_hlo.py

import jax_flashmask as jf  # noqa: E402
from _hlo import large_collectives  # noqa: E402
from jax_flashmask import backends, masks  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402



def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


GPUS = _gpus()
NGPU = len(GPUS)
_REASON = backends.cuda_unavailable_reason()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multi_gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"CUDA kernels unavailable: {_REASON}"),
    pytest.mark.skipif(NGPU < 2, reason=f"needs at least two GPUs, found {NGPU}"),
]

D = 128
RTOL = 2e-2  # bf16 in, float32 accumulation; relative to each result's largest entry


def mesh_of(shape, names):
    devices = np.array(GPUS[: int(np.prod(shape))]).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types=(AxisType.Auto,) * len(shape))


def qkv(b, s, n, kh, seed=0):
    rng = np.random.default_rng(seed)
    mk = lambda h: jnp.asarray(rng.standard_normal((b, s, h, D)), jnp.bfloat16)  # noqa: E731
    return mk(n), mk(kh), mk(kh)


def doc_mask(b, s, heads=1, seed=1, docs=4):
    rng = np.random.default_rng(seed)
    segments = np.zeros((b * heads, s), np.int32)
    for r in range(b * heads):
        cuts = np.sort(rng.choice(np.arange(1, s), size=docs - 1, replace=False))
        segments[r, cuts] = 1
    ind = np.asarray(masks.from_segment_ids(np.cumsum(segments, axis=1), causal=True).startend_row_indices)
    return masks.FlashMask(jnp.asarray(ind.reshape(b, heads, s, -1)), causal=True)


def loss_and_grads(mask, **kw):
    def loss(q, k, v):
        o, lse = jf.attention(q, k, v, mask, return_residual=True, implementation="cuda", **kw)
        return weighted_loss(o, lse), (o, lse)

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


def compare(name, got, want, rtol=RTOL):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.array_equal(np.isfinite(g), np.isfinite(w)), f"{name}: leaf {i}: non-finite entries differ"
        fin = np.isfinite(w)
        scale = max(1.0, float(np.max(np.abs(w[fin]), initial=0.0)))
        err = float(np.max(np.abs(g[fin] - w[fin]), initial=0.0)) / scale
        assert err <= rtol, f"{name}: leaf {i}: max relative error {err:.3g} > {rtol}"


def one_gpu(f, *args):
    return jax.block_until_ready(f(*jax.device_put(args, GPUS[0])))


def same_spec(a, b):
    strip = lambda s: tuple(s)[:max([i + 1 for i, e in enumerate(tuple(s)) if e is not None], default=0)]  # noqa: E731
    return strip(a) == strip(b)


def _layouts():
    n, half = NGPU, max(1, NGPU // 2)
    two = min(2, NGPU)
    # name, mesh shape, axis names, q spec, kv spec, (B, S, N, K), mask heads, allowed traffic
    return [
        ("batch", (n,), ("x",), P("x"), P("x"), (n, 1024, 4, 2), 1, "none"),
        ("heads", (n,), ("x",), P(None, None, "x"), P(None, None, "x"), (2, 1024, 2 * n, n), n, "none"),
        ("batch x heads", (half, two), ("a", "b"), P("a", None, "b"), P("a", None, "b"),
         (half, 1024, 4, 2), 4, "none"),
        ("sequence", (n,), ("x",), P(None, "x"), P(None, "x"), (2, 1024 * n, 4, 2), 1, "kv"),
        ("sequence x heads", (half, two), ("a", "b"), P(None, "a", "b"), P(None, "a", "b"),
         (2, 1024 * half, 4, 2), 2, "kv"),
    ]


@pytest.mark.parametrize("layout", _layouts() if NGPU >= 2 else [], ids=lambda c: c[0])
def test_layout_equals_one_gpu(layout):
    name, shape, names, spec_q, spec_kv, (b, s, n, kh), hm, comm = layout
    mesh = mesh_of(shape, names)
    q, k, v = qkv(b, s, n, kh)
    f = jax.jit(loss_and_grads(doc_mask(b, s, hm)))
    want = one_gpu(f, q, k, v)
    sq, skv = NamedSharding(mesh, spec_q), NamedSharding(mesh, spec_kv)
    args = (jax.device_put(q, sq), jax.device_put(k, skv), jax.device_put(v, skv))
    text = f.lower(*args).compile().as_text()
    got = jax.block_until_ready(f(*args))
    compare(name, got, want)
    (_, (out, _)), (dq, dk, _) = got
    assert same_spec(out.sharding.spec, spec_q) and same_spec(dq.sharding.spec, spec_q), (out.sharding, dq.sharding)
    assert same_spec(dk.sharding.spec, spec_kv), dk.sharding
    found = large_collectives(text)
    if comm == "none":
        assert not found, f"{name}: expected no collectives, found {found}"
    else:
        assert all(size < q.size for _, size in found), f"{name}: a collective as large as q: {found}"
    print(f"{name} on {NGPU} GPUs: equal to one GPU; collectives {sorted(set(found))}")


def weighted_loss(o, lse):
    w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32).reshape(o.shape) * 0.01)
    return jnp.sum(o.astype(jnp.float32) * w) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))


@pytest.mark.parametrize("comm", ["allgather", "ring"])
def test_context_parallel_equals_one_gpu(comm):
    """Inputs permuted into the plan's layout on the host (once per step in training), so the
    compiled step holds only the K/V exchange and its dK/dV return (at most all of K and V, a
    quarter of q's size with 8 query heads on 2 kv heads)."""
    mesh = mesh_of((NGPU,), ("cp",))
    plan = np.asarray(cp.dual_chunk_plan(NGPU), np.int32)
    b, s = 1, 2048 * NGPU
    q, k, v = qkv(b, s, 8, 2)
    mask = doc_mask(b, s)
    perm = lambda x: cp.permute_tokens(np.asarray(x), plan, xp=np)  # noqa: E731

    def one(q, k, v):  # one GPU, global order; the loss reads the output in the permuted layout
        o, lse = jf.attention(q, k, v, mask, return_residual=True, implementation="cuda")
        return weighted_loss(cp.permute_tokens(o, plan), cp.permute_tokens(lse, plan)), (o, lse)

    (total, (o, lse)), grads = one_gpu(jax.jit(jax.value_and_grad(one, argnums=(0, 1, 2), has_aux=True)), q, k, v)
    want = ((total, (perm(o), perm(lse))), tuple(perm(g) for g in grads))

    def sharded(qp, kp, vp, plan):
        op, lsep = cp.context_parallel_attention(qp, kp, vp, mask, plan=plan, mesh=mesh, axis_name="cp",
                                                 comm=comm, return_residual=True, implementation="cuda")
        return weighted_loss(op, lsep), (op, lsep)

    f = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1, 2), has_aux=True))
    seq = NamedSharding(mesh, P(None, "cp"))
    args = tuple(jax.device_put(perm(x), seq) for x in (q, k, v)) + (jnp.asarray(plan),)
    text = f.lower(*args).compile().as_text()
    got = jax.block_until_ready(f(*args))
    compare(f"context parallel {comm}", got, want)
    found = large_collectives(text)
    assert all(size < q.size for _, size in found), f"context parallel {comm}: a collective as large as q: {found}"
    print(f"context_parallel comm={comm} on {NGPU} GPUs: equal to one GPU; collectives {sorted(set(found))}")


def time_call(f, *args, reps=10):
    """Median seconds of `f(*args)` after two warm-up calls."""
    for _ in range(2):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def test_data_parallel_timing(capsys):
    """Forward + backward, batch over all GPUs vs one GPU on its share: printed, not asserted."""
    per_gpu, s, n, kh = 2, 8192, 16, 4
    b = per_gpu * NGPU
    q, k, v = qkv(b, s, n, kh)
    mask = doc_mask(b, s, docs=8)
    f = jax.jit(loss_and_grads(mask))
    mesh = mesh_of((NGPU,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    sharded = tuple(jax.device_put(x, rows) for x in (q, k, v))
    t_dp = time_call(f, *sharded)
    share = masks.FlashMask(mask.startend_row_indices[:per_gpu], causal=True)
    g = jax.jit(loss_and_grads(share))
    t_one = time_call(g, *jax.device_put(tuple(x[:per_gpu] for x in (q, k, v)), GPUS[0]))
    with capsys.disabled():
        print(f"\n[multi_gpu timing] B={b} S={s} N={n} K={kh} d={D} bf16 causal_document, fwd+bwd: "
              f"data parallel on {NGPU} GPUs {t_dp * 1e3:.2f} ms per step (per GPU: B={per_gpu}); "
              f"one GPU on B={per_gpu} {t_one * 1e3:.2f} ms; ratio {t_dp / t_one:.3f} (ideal 1)")
    assert np.isfinite([t_dp, t_one]).all()
