"""One process of a multi-process (multi-host) run on localhost: 4 host CPU devices per process,
gloo collectives between processes (see test_multihost.py).

Run as ``python tests/_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT``. Every process builds
the same global problem from one seed, computes the single-device reference itself on its first
local device, then runs on the mesh over all processes' devices:

* batch-sharded `attention` under jit (the batch split over all 8 devices of both processes, each
  process handing over only its own rows): out, lse, dq, dk, dv;
* `context_parallel_attention(comm="hierarchical")` on the mesh (process, local) = (2, 4), the
  process the slow axis: out and dq, dk, dv.

Each process checks the shards it holds against its reference and prints ``ok: ...`` lines, then
``done``. Prints ``SKIP: <reason>`` and exits 0 when this jaxlib has no gloo CPU collectives.
"""

from __future__ import annotations

import os
import re
import sys

LOCAL_DEVICES = 4
_flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count={LOCAL_DEVICES}".strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

D = 16


def log(msg):
    print(f"ok: [process {jax.process_index()}] {msg}", flush=True)


def block(x):
    return jax.block_until_ready(x)


def start(process_id: int, num_processes: int, port: int):
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception as e:  # noqa: BLE001 - any refusal means: no gloo here
        print(f"SKIP: this jaxlib has no gloo CPU collectives ({type(e).__name__}: {e})", flush=True)
        sys.exit(0)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                               process_id=process_id, initialization_timeout=120)
    if jax.process_count() != num_processes or len(jax.local_devices()) != LOCAL_DEVICES:
        raise AssertionError(f"{jax.process_count()} processes, {len(jax.local_devices())} local devices")


def problem(b, s, n, kh, seed=0):
    """The same arrays in every process (numpy, one seed): q, k, v, a causal document mask and the
    loss weights."""
    from jax_flashmask import masks

    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, s, n, D)).astype(np.float32)
    k = rng.normal(size=(b, s, kh, D)).astype(np.float32)
    v = rng.normal(size=(b, s, kh, D)).astype(np.float32)
    segments = np.cumsum(rng.random((b, s)) < 0.1, axis=1).astype(np.int32)
    mask = np.asarray(masks.from_segment_ids(segments, causal=True).startend_row_indices)
    w = rng.normal(size=(b, s, n, D)).astype(np.float32)
    return q, k, v, mask, w


def global_array(x, mesh, spec):
    """A global jax.Array from the full host array every process holds (each process fills its
    own devices' shards)."""
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def check_shards(name, got, want, rtol=2e-5):
    """Every shard this process holds equals the same slice of the single-device result."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        w = np.asarray(w, np.float64)
        fin = np.isfinite(w)
        scale = max(1.0, float(np.max(np.abs(w[fin]), initial=0.0)))
        for shard in g.addressable_shards:
            gs, ws, fs = np.asarray(shard.data, np.float64), w[shard.index], fin[shard.index]
            if not np.array_equal(np.isfinite(gs), fs):
                raise AssertionError(f"{name}: non-finite entries differ in shard {shard.index}")
            err = float(np.max(np.abs(gs[fs] - ws[fs]), initial=0.0)) / scale
            if not err <= rtol:
                raise AssertionError(f"{name}: shard {shard.index}: max relative error {err:.3g} > {rtol}")


def reference(q, k, v, mask, w):
    """out, lse, dq, dk, dv of one device (this process's first) on the whole problem."""
    import jax_flashmask as jf
    from jax_flashmask.masks import FlashMask

    dev = jax.local_devices()[0]
    q, k, v, mask, w = (jax.device_put(x, dev) for x in (q, k, v, mask, w))

    def loss(q, k, v):
        o, lse = jf.attention(q, k, v, FlashMask(mask, causal=True), return_residual=True,
                              implementation="xla")
        return jnp.sum(o * w) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)

    (_, (o, lse)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return jax.tree.map(np.asarray, block((o, lse) + tuple(grads)))


def process_grid():
    """All devices as [process, local device]: the process is the slow (outer) axis."""
    by_process = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    grid = np.array(by_process).reshape(jax.process_count(), LOCAL_DEVICES)
    for p, row in enumerate(grid):
        if any(d.process_index != p for d in row):
            raise AssertionError("devices do not group by process")
    return grid


def batch_sharded():
    import jax_flashmask as jf
    from jax_flashmask.masks import FlashMask

    q, k, v, mask, w = problem(8, 48, 4, 2)
    want = reference(q, k, v, mask, w)
    mesh = Mesh(process_grid().reshape(-1), ("data",))
    rows = NamedSharding(mesh, P("data"))
    # as a data loader would: each process passes only its own rows (devices ordered by process)
    per = q.shape[0] // jax.process_count()
    mine = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    gq, gk, gv, gm, gw = (jax.make_array_from_process_local_data(rows, x[mine], x.shape)
                          for x in (q, k, v, mask, w))

    def loss(q, k, v, mask, w):
        o, lse = jf.attention(q, k, v, FlashMask(mask, causal=True), return_residual=True,
                              implementation="xla")
        return jnp.sum(o * w) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, (o, lse)), grads = block(step(gq, gk, gv, gm, gw))
    for x in (o, lse) + tuple(grads):
        if tuple(x.sharding.spec)[:1] != ("data",):
            raise AssertionError(f"batch sharded: a result came back as {x.sharding.spec}")
    check_shards("batch sharded", (o, lse) + tuple(grads), want)
    log("batch sharded over 2 processes x 4 devices: out, lse, dq, dk, dv equal one device")


def hierarchical_context_parallel():
    from jax_flashmask import context_parallel as cp
    from jax_flashmask.masks import FlashMask

    q, k, v, mask, w = problem(2, 64, 4, 2, seed=1)
    want = reference(q, k, v, mask, w)
    mesh = Mesh(process_grid(), ("process", "local"))
    axes = ("process", "local")
    plan = jnp.asarray(cp.dual_chunk_plan(mesh.size))  # 16 chunks of 4 tokens, 2 per device
    seq = NamedSharding(mesh, P(None, axes))
    gq, gk, gv, gw = (global_array(x, mesh, P(None, axes)) for x in (q, k, v, w))
    gm = global_array(mask, mesh, P())

    def loss(q, k, v, mask, w):
        qp, kp, vp = (jax.lax.with_sharding_constraint(cp.permute_tokens(x, plan), seq) for x in (q, k, v))
        op, lsep = cp.context_parallel_attention(
            qp, kp, vp, FlashMask(mask, causal=True), plan=plan, mesh=mesh, axis_name=axes,
            comm="hierarchical", return_residual=True, implementation="xla")
        o, lse = cp.unpermute_tokens(op, plan), cp.unpermute_tokens(lsep, plan)
        return jnp.sum(o * w) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, (o, lse)), grads = block(step(gq, gk, gv, gm, gw))
    check_shards("hierarchical context parallel", (o, lse) + tuple(grads), want)
    log("context parallel, comm='hierarchical' over (process 2, local 4): out, lse, dq, dk, dv "
        "equal one device")


if __name__ == "__main__":
    pid, nproc, port = (int(a) for a in sys.argv[1:4])
    start(pid, nproc, port)
    batch_sharded()
    hierarchical_context_parallel()
    # leave together: a process that exits while the other still runs a collective hangs it
    multihost_utils.sync_global_devices("jax_flashmask multihost test done")
    print("done", flush=True)
    jax.distributed.shutdown()
