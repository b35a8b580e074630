"""Context-parallel attention throughput on the local GPUs (untested on hardware so far).

    python benchmarks/cp_bench.py --S 32768 --heads 32 --kv-heads 8 --head-dim 128 \
        --masks causal,causal_document,full --comms allgather,ring,ring-pruned,allgather-pruned \
        [--nodes 1] [--chunks-per-rank 2] [--iters 10] [--bwd] [--json out.json]

For every mask x plan (dual, balanced) x comm it times the forward (and with --bwd forward +
backward) of `context_parallel_attention` on all visible devices, and reports ms, TFLOP/s
(FlashMask convention: 4*B*H*S*S*d*(1-rho), x2.5 for backward; rho at 128x128 tiles) and the
pruned bytes per rank. Overlap: it also times the pieces alone -- the K/V collective with no
attention (``--comm-only``) and the local attention on already gathered K/V -- so that
``overlap = (t_comm + t_compute - t_total) / min(t_comm, t_compute)``.
On CPU (for a dry run): XLA_FLAGS=--xla_force_host_platform_device_count=8 ... --S 1024 --heads 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402


def timeit(f, *args, iters=10, warmup=2):
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--S", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--masks", default="causal,causal_document,document,share_question,full")
    ap.add_argument("--comms", default="allgather,ring,ring-pruned,allgather-pruned")
    ap.add_argument("--plans", default="dual,balanced")
    ap.add_argument("--nodes", type=int, default=1, help="> 1: (node, local) mesh; adds 'hierarchical'")
    ap.add_argument("--chunks-per-rank", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--implementation", default=None)
    ap.add_argument("--json")
    a = ap.parse_args()

    devs = np.array(jax.devices())
    P = len(devs)
    if a.nodes > 1:
        mesh = Mesh(devs.reshape(a.nodes, P // a.nodes), ("node", "local"))
        axis = ("node", "local")
    else:
        mesh = Mesh(devs, ("cp",))
        axis = "cp"
    m = a.chunks_per_rank
    n = P * m
    dt = jnp.dtype(a.dtype)
    B, S, H, K, D = a.batch, a.S, a.heads, a.kv_heads, a.head_dim
    shard = NamedSharding(mesh, PS(None, axis))
    key = jax.random.PRNGKey(0)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.device_put(jax.random.normal(kq, (B, S, H, D), dt), shard)
    k = jax.device_put(jax.random.normal(kk, (B, S, K, D), dt), shard)
    v = jax.device_put(jax.random.normal(kv, (B, S, K, D), dt), shard)
    suite = jf.masks.benchmark_suite(S, seed=0, batch=B)
    results = []
    print(f"devices: {P} x {devs[0].device_kind}; S={S} B={B} H={H} K={K} d={D} {a.dtype}")
    for mname in a.masks.split(","):
        mk = suite[mname]
        ind = jnp.asarray(np.asarray(jf.masks.canonical_bounds(mk.startend_row_indices, causal=mk.causal,
                                                               q_len=S)).swapaxes(-1, -2))
        rho = jf.masks.block_sparsity(mk, block=128)
        flops = 4 * B * H * S * S * D * (1 - rho) * (3.5 if a.bwd else 1.0)
        work = cp.chunk_workloads(mk, n)
        plans = {"dual": cp.dual_chunk_plan(P, n) if m % 2 == 0 else cp.contiguous_plan(P, n),
                 "balanced": cp.balanced_plan(work, P).plan}
        for pname in a.plans.split(","):
            plan = plans[pname]
            need = cp.needed_chunks(mk, plan)
            comms = a.comms.split(",") + (["hierarchical"] if a.nodes > 1 else [])
            for comm in comms:
                base = comm.replace("-pruned", "")
                sched = None
                if comm.endswith("-pruned"):
                    kind = "hierarchical" if (a.nodes > 1 and base != "allgather") else "ring"
                    sched = cp.make_schedule(P, m, kind, nodes=a.nodes if kind == "hierarchical" else 1,
                                             plan=plan, needed=need)
                    if base == "ring" and a.nodes > 1:
                        base = "hierarchical"

                def fwd(q, k, v, ind, plan, base=base, sched=sched):
                    return cp.context_parallel_attention(q, k, v, ind, plan=plan, mesh=mesh, axis_name=axis,
                                                         comm=base, schedule=sched, implementation=a.implementation)

                f = jax.jit(jax.grad(lambda *x: jnp.sum(fwd(*x).astype(jnp.float32)), argnums=(0, 1, 2))) if a.bwd else jax.jit(fwd)
                try:
                    t = timeit(f, q, k, v, ind, jnp.asarray(plan), iters=a.iters)
                except Exception as e:  # keep going: report the failure
                    print(f"{mname:22s} {pname:8s} {comm:18s} FAILED: {type(e).__name__}: {str(e)[:200]}")
                    continue
                vol = (cp.comm_volume(sched) if sched is not None else cp.allgather_volume(P, m, nodes=max(a.nodes, 1)))
                chunk_bytes = 2 * B * (S // n) * K * D * dt.itemsize
                row = dict(mask=mname, plan=pname, comm=comm, ms=t * 1e3, tflops=flops / t / 1e12 / P,
                           max_recv_MiB=vol["max_received"] * chunk_bytes / 2**20,
                           max_tiles=float(cp.plan_loads(plan, work).max()))
                results.append(row)
                print(f"{mname:22s} {pname:8s} {comm:18s} {row['ms']:8.2f} ms  {row['tflops']:6.1f} TFLOP/s/GPU  "
                      f"recv/rank {row['max_recv_MiB']:7.1f} MiB  max tiles {row['max_tiles']:.0f}", flush=True)
        # overlap probe: collective alone vs local attention alone (allgather shapes)
        def comm_only(k, v):
            def body(k, v):
                return jax.lax.all_gather(jnp.stack([k, v]), axis, axis=2, tiled=True)
            return cp.shard_map(body, mesh=mesh, in_specs=(PS(None, axis), PS(None, axis)),
                                out_specs=PS(None, None, axis), check_vma=False)(k, v)
        t_comm = timeit(jax.jit(comm_only), k, v, iters=a.iters)
        ql = q[:, : S // P]
        t_comp = timeit(jax.jit(lambda q, k, v: jf.attention(q, k, v, None, implementation=a.implementation)),
                        jax.device_put(ql, devs[0]), jax.device_put(k, devs[0]), jax.device_put(v, devs[0]),
                        iters=a.iters)
        print(f"{mname:22s} probe: all-gather alone {t_comm * 1e3:.2f} ms, one rank's full-mask local attention "
              f"alone {t_comp * 1e3:.2f} ms")
        results.append(dict(mask=mname, probe_comm_ms=t_comm * 1e3, probe_compute_ms=t_comp * 1e3))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
