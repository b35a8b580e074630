"""Context-parallel FlashMask attention on 8 (host) devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/context_parallel.py

(the script sets the flag itself when it is missing; it must be set before jax is imported).
On a GPU machine the same code runs on the real devices: drop the flag.

Steps, once per training step:
1. build the step's mask (a FlashMask in global token order);
2. plan on the host: per-chunk workloads from the block metadata -> `balanced_plan`
   (or the mask-independent `dual_chunk_plan`);
3. permute the token-level inputs into the balanced layout (`permute_tokens`), shard them on
   the sequence axis, run every layer in that layout with `context_parallel_attention`
   (mask stays global, plan is data: a new mask/plan each step does not recompile);
4. un-permute what leaves the layout (`unpermute_tokens`), or permute the labels instead.
"""

import os
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402

S, B, H, KV, D = 2048, 1, 4, 2, 32
NDEV = 8
CHUNKS = 4 * NDEV  # 4 chunks per rank: finer than dual-chunk, more room for the balancer
IMPL = os.environ.get("JFM_IMPL")  # None = best available ("xla" on CPU)


def main():
    devices = np.array(jax.devices()[:NDEV])
    mesh = Mesh(devices, ("cp",))
    rng = np.random.default_rng(0)

    # 1. the mask of this step (packed documents, causal)
    mask = jf.masks.causal_document(jf.masks.random_doc_lens(S, (4, 8), rng), batch=B)

    # 2. host-side plan: workload = non-skipped 64x64 tiles per query chunk
    work = cp.chunk_workloads(mask, CHUNKS, tile_q=64, tile_k=64)
    rep = cp.balanced_plan(work, NDEV)
    dual = cp.dual_chunk_plan(NDEV, CHUNKS)
    dual_max = cp.plan_loads(dual, work).max()
    print(f"max tiles per rank: balanced {rep.max_load:.0f}, dual-chunk {dual_max:.0f}, "
          f"lower bound {rep.lower_bound:.0f}")
    plan = jnp.asarray(rep.plan)

    # bytes each rank would receive, vs a plain all-gather of K/V (chunk slots)
    need = cp.needed_chunks(mask, rep.plan)
    sched = cp.make_schedule(NDEV, CHUNKS // NDEV, "ring", plan=rep.plan, needed=need)
    vol = cp.comm_volume(sched)
    base = cp.allgather_volume(NDEV, CHUNKS // NDEV)
    print(f"K/V chunk slots received per rank: pruned max {vol['max_received']:.0f} / "
          f"mean {vol['received'].mean():.1f}, all-gather {base['max_received']:.0f}")

    # 3. inputs in the balanced layout, sharded on the sequence axis
    q = jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    seq = NamedSharding(mesh, P(None, "cp"))
    qp, kp, vp = (jax.device_put(cp.permute_tokens(x, plan), seq) for x in (q, k, v))
    positions = cp.token_positions(plan, S)  # global positions of the permuted tokens (RoPE)
    assert positions.shape == (S,)

    @jax.jit
    def layer(qp, kp, vp, mask, plan):
        return cp.context_parallel_attention(qp, kp, vp, mask, plan=plan, mesh=mesh, axis_name="cp",
                                             comm="ring", implementation=IMPL)

    t = time.time()
    out_p = jax.block_until_ready(layer(qp, kp, vp, mask, plan))
    print(f"context-parallel attention: {time.time() - t:.1f}s (with compile), out {out_p.shape}, "
          f"sharding {out_p.sharding.spec}")

    # 4. back to global order, compare with one device
    out = cp.unpermute_tokens(out_p, plan)
    ref = jf.attention(q, k, v, mask, implementation=IMPL)
    err = float(jnp.max(jnp.abs(out - ref)))
    print(f"max |cp - single device| = {err:.2e}")
    assert err < 1e-4

    # a new mask and plan next step: same shapes, no recompile
    mask2 = jf.masks.causal_document(jf.masks.random_doc_lens(S, (4, 8), rng), batch=B)
    plan2 = jnp.asarray(cp.balanced_plan(cp.chunk_workloads(mask2, CHUNKS, tile_q=64, tile_k=64), NDEV).plan)
    t = time.time()
    jax.block_until_ready(layer(*(jax.device_put(cp.permute_tokens(x, plan2), seq) for x in (q, k, v)), mask2, plan2))
    print(f"next step, new mask and plan: {time.time() - t:.2f}s (no recompile)")

    # gradients flow through the collectives (ppermute / all_gather transposes)
    g = jax.jit(jax.grad(lambda q: jnp.sum(layer(q, kp, vp, mask, plan) ** 2)))(qp)
    print("grad ok:", g.shape, bool(jnp.all(jnp.isfinite(g))))


if __name__ == "__main__":
    main()
