#!/usr/bin/env python3
"""Context-parallel attention on the local GPUs: correctness against one GPU, throughput, overlap.

    NCCL_NVLS_ENABLE=0 python benchmarks/cp_bench.py --tokens-per-device 32768,65536 \\
        --masks causal_document,document --out-prefix h200x2_2026-11-30_cp

For every mask and global length ``S = P x tokens-per-device`` (B = 1, bf16, H query heads, K kv
heads, d) it

1. runs single-device `jax_flashmask.attention` on the whole problem on device 0 (the baseline);
2. runs `context_parallel_attention` over all P devices, inputs in the plan's permuted layout
   (the permutation happens once per training step, so it is not timed), for each comm mode:

   - ``allgather``: all-gather K/V, then one local attention (no overlap; SPEC §4's baseline),
   - ``ring``: the relay ring, the next piece's transfer overlapping this piece's attention,
   - ``ring-pruned``: the mask-pruned static schedule (only chunks some local row needs);
   - with ``--nodes N`` (the devices split into N groups as if on N hosts, a (node, local) mesh):
     ``hierarchical`` (the relay over the node axis, an all-gather inside the node) and
     ``hierarchical-pruned``; every row then also counts the MiB each rank sends across nodes;

   checks the un-permuted output (and dq/dk/dv of ``sum(out * g)``) against the baseline, and
   times the forward and forward + backward;
3. times the same program twice more: with every collective replaced by a local stand-in of the
   same shape (*compute alone*; for ``allgather`` that is one rank's single attention call, the
   kernel's own share) and with the attention replaced by a cheap stand-in that still reads K/V
   (*communication alone*). Then

       hidden = (t_comm + t_compute - t_total) / t_comm     (fraction of communication hidden)
       overhead = t_total / t_compute - 1

Overlap needs XLA's latency-hiding scheduler: run with
``XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true`` and ``JAX_ENABLE_PGLE=true`` (the
scheduler gives a custom call no duration without profile data, so it does not move the
collective-permutes across the attention: docs/decisions.md#cp-pgle).

TFLOP/s per GPU use the FlashMask convention ``4·B·H·S²·d·(1−ρ)`` (x3.5 for forward + backward),
ρ = fully masked 128x128 tiles, divided by P. Results: ``<out-prefix>.json`` and ``.md`` under
``--out-dir``. CPU dry run: ``XLA_FLAGS=--xla_force_host_platform_device_count=2 python
benchmarks/cp_bench.py --tokens-per-device 512 --heads 2 --kv-heads 2 --implementation xla``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402

COMMS = ("allgather", "ring", "ring-pruned")
HIER_COMMS = ("hierarchical", "hierarchical-pruned")  # with --nodes > 1


WARMUP = 2  # calls before timing (--warmup; with JAX_ENABLE_PGLE the profiled runs + the recompile)


def timeit(f, *args, iters=10, warmup=None):
    warmup = WARMUP if warmup is None else warmup
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def rel_err(a, b):
    a = np.asarray(jnp.asarray(a, jnp.float32))
    b = np.asarray(jnp.asarray(b, jnp.float32))
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@contextlib.contextmanager
def collectives_off():
    """Trace-time stand-ins for the collectives CP attention uses: same shapes, no traffic.
    A relay ring then attends to its own K/V with the source chunk's mask bounds, i.e. the same
    tiles and kernels as the real run."""
    ppermute, all_gather = jax.lax.ppermute, jax.lax.all_gather

    def fake_ppermute(x, axis_name, perm, **kw):
        return x

    def fake_all_gather(x, axis_name, *, axis=0, tiled=False, **kw):
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        n = int(np.prod([jax.lax.axis_size(a) for a in names]))
        return jnp.concatenate([x] * n, axis=axis) if tiled else jnp.stack([x] * n, axis=axis)

    jax.lax.ppermute, jax.lax.all_gather = fake_ppermute, fake_all_gather
    try:
        yield
    finally:
        jax.lax.ppermute, jax.lax.all_gather = ppermute, all_gather


def attention_off(q, k, v, ind, *, causal=False, return_residual=True, **kw):
    """Stand-in attention for the communication-alone probe: reads all of K and V (so every
    transfer must land) and returns outputs of the right shapes; differentiable (dK/dV travel
    back in the backward probe)."""
    t = jnp.sum(k, axis=(1, 2, 3), dtype=jnp.float32) + jnp.sum(v, axis=(1, 2, 3), dtype=jnp.float32)
    o = jnp.broadcast_to(t[:, None, None, None], q.shape[:3] + (v.shape[-1],)).astype(q.dtype)
    lse = jnp.broadcast_to(t[:, None, None], q.shape[:3])
    return o, lse


# ---- program builders ------------------------------------------------------------------------------


def add_program_args(ap):
    """The options that define the programs (the benchmark and its probes build the same ones)."""
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--plans", default="balanced", help="comma list of balanced, dual")
    ap.add_argument("--chunks-per-rank", type=int, default=4)
    ap.add_argument("--implementation", default="cuda")
    ap.add_argument("--sm-margin", type=int, default=0,
                    help="SMs the Hopper kernels leave free on every rank (for NCCL's kernels)")
    ap.add_argument("--overlap-margin", default=None,
                    help="ring-pruned only: sm_margin of the pieces that overlap a transfer, FWD[,BWD] "
                         "(e.g. 8,0 = forward only); the last piece keeps --sm-margin")
    ap.add_argument("--schedule-hints", nargs="?", const="both", default=False,
                    choices=["both", "forward", "backward"],
                    help="ring-pruned only: XLA scheduling groups pin each transfer around the kernel it "
                         "should overlap (context_parallel_attention(schedule_hints=...)); no value = both")
    ap.add_argument("--no-skip-masked", action="store_true",
                    help="ring-pruned only: run fully masked remote pieces (no lax.cond around them)")
    ap.add_argument("--autodiff-merge", action="store_true",
                    help="ring-pruned only: differentiate the lse merge through autodiff (piece_vjp=False)")
    ap.add_argument("--seed", type=int, default=0)


def program_kwargs(a):
    """(implementation, attention_kwargs, ring-pruned kwargs) from add_program_args' options."""
    impl = None if a.implementation in ("", "none", "None") else a.implementation
    cp_kwargs = {"sm_margin": a.sm_margin} if a.sm_margin else None
    om = None
    if a.overlap_margin:
        om = tuple(int(x) for x in a.overlap_margin.split(","))
        om = om[0] if len(om) == 1 else om
    pruned_kwargs = dict(overlap_sm_margin=om, schedule_hints=a.schedule_hints,
                         piece_vjp=not a.autodiff_merge, skip_masked=not a.no_skip_masked)
    return impl, cp_kwargs, pruned_kwargs


def make_inputs(S, H, K, D, dt, seed, dev):
    """q, k, v (and the cotangent g) of one B = 1 problem of S tokens, on device dev."""
    kq, kk, kv, kg = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(kq, (1, S, H, D), dt, ).astype(dt)
    k = jax.random.normal(kk, (1, S, K, D), dt).astype(dt)
    v = jax.random.normal(kv, (1, S, K, D), dt).astype(dt)
    g = jax.random.normal(kg, (1, S, H, D), dt).astype(dt)
    return tuple(jax.device_put(x, dev) for x in (q, k, v, g))


def one_gpu_programs(mk, impl):
    """(forward, grad of sum(out * g)) of single-device attention, jitted: args (q, k, v, ind[, g])."""
    def one_fwd(q, k, v, ind):
        return jf.attention(q, k, v, ind, causal=mk.causal, implementation=impl)

    def one_loss(q, k, v, ind, g):
        return jnp.sum(one_fwd(q, k, v, ind).astype(jnp.float32) * g.astype(jnp.float32))

    return jax.jit(one_fwd), jax.jit(jax.grad(one_loss, argnums=(0, 1, 2)))


def cp_plan(mk, P, m, pname):
    """(plan, per-rank loads, chunks each rank needs) of plan `pname` for P ranks x m chunks."""
    work = cp.chunk_workloads(mk, P * m)
    plans = {"balanced": lambda: cp.balanced_plan(work, P).plan, "dual": lambda: cp.dual_chunk_plan(P, P * m)}
    plan = np.asarray(plans[pname](), np.int32)
    return plan, cp.plan_loads(plan, work), cp.needed_chunks(mk, plan)


def cp_mesh(devs, nodes):
    """The context-parallel mesh and its axis name: one axis "cp", or with ``nodes > 1`` the
    devices split into `nodes` groups as if on as many hosts, axes ("node", "local") (rank =
    row-major index, so every comm mode sees the same rank order)."""
    if nodes <= 1:
        return Mesh(devs, ("cp",)), "cp"
    if len(devs) % nodes:
        raise ValueError(f"--nodes {nodes} does not divide the {len(devs)} devices")
    return Mesh(devs.reshape(nodes, -1), ("node", "local")), ("node", "local")


def cp_schedule(comm, P, m, plan, need, nodes=1):
    """The static schedule of a ``-pruned`` comm mode (None for the others)."""
    if not comm.endswith("-pruned"):
        return None
    kind = comm.replace("-pruned", "")
    return cp.make_schedule(P, m, kind, nodes=nodes if kind == "hierarchical" else 1, plan=plan,
                            needed=need)


def relay_volume(comm, P, m, nodes):
    """Chunk slots per rank of the dense relay loops (no schedule), in `comm_volume`'s keys: every
    rank receives the other ranks' (P-1)*m slots. The ring forwards all of them to its successor,
    which sits on another node at each node boundary; the hierarchy relays over the node axis only
    the slots of its own local slot, (nodes-1)*m, and gathers the rest inside the node."""
    g = P // nodes
    per = float((P - 1) * m)
    if comm == "ring":
        cross = np.array([per if (s + 1) % P // g != s // g else 0.0 for s in range(P)])
    else:
        cross = np.full(P, float((nodes - 1) * m))
    return dict(sent=np.full(P, per), received=np.full(P, per), cross_node_sent=cross,
                total=per * P, max_sent=per, max_received=per)


def cp_programs(mesh, mk, comm, sched, impl, cp_kwargs, pruned_kwargs, attention_fn=None,
                axis_name="cp"):
    """(forward, grad of sum(out * g)) of CP attention, jitted: args (q, k, v, ind, plan[, g])."""
    base = comm.replace("-pruned", "")
    # the comm-alone probe's stand-in attention goes through the autodiff merge
    extra = pruned_kwargs if sched is not None and attention_fn is None else {}

    def fwd(q, k, v, ind, pl):
        return cp.context_parallel_attention(
            q, k, v, ind, plan=pl, mesh=mesh, axis_name=axis_name, causal=mk.causal,
            comm=base, schedule=sched, implementation=impl, attention_fn=attention_fn,
            attention_kwargs=cp_kwargs, **extra)

    def loss(q, k, v, ind, pl, g):
        return jnp.sum(fwd(q, k, v, ind, pl).astype(jnp.float32) * g.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens-per-device", default="32768,65536")
    ap.add_argument("--masks", default="causal_document,document")
    ap.add_argument("--comms", default=None,
                    help=f"comma list of {', '.join(COMMS + HIER_COMMS)} (default: {','.join(COMMS)}, "
                         "plus the hierarchical modes with --nodes > 1)")
    ap.add_argument("--nodes", type=int, default=1,
                    help="split the devices into this many groups as if on as many hosts: a two-level "
                         "mesh (node, local); the hierarchical modes need it, the others run over both axes")
    add_program_args(ap)
    ap.add_argument("--no-bwd", action="store_true", help="time the forward only")
    ap.add_argument("--no-probes", action="store_true", help="skip the compute-/comm-alone probes")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed calls per program (with JAX_ENABLE_PGLE=true: > JAX_PGLE_PROFILING_RUNS, "
                         "so the timed calls run the profile-guided recompile)")
    ap.add_argument("--time-limit-s", type=float, default=0, help="stop starting new cases after this")
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--out-prefix", default=None)
    a = ap.parse_args()
    global WARMUP
    WARMUP = a.warmup
    t_start = time.time()
    impl, cp_kwargs, pruned_kwargs = program_kwargs(a)

    devs = np.array(jax.devices())
    P = len(devs)
    mesh, axis = cp_mesh(devs, a.nodes)
    comms = (a.comms or ",".join(COMMS + (HIER_COMMS if a.nodes > 1 else ()))).split(",")
    for comm in comms:
        if comm not in COMMS + HIER_COMMS:
            ap.error(f"--comms: unknown mode {comm!r}; choose from {', '.join(COMMS + HIER_COMMS)}")
        if comm in HIER_COMMS and a.nodes < 2:
            ap.error(f"--comms {comm} needs --nodes >= 2 (the devices split into groups)")
    dev0 = devs[0]
    m = a.chunks_per_rank
    dt = jnp.dtype(a.dtype)
    H, K, D = a.heads, a.kv_heads, a.head_dim
    env = dict(devices=f"{P} x {dev0.device_kind}", nodes=a.nodes, jax=jax.__version__, H=H, K=K, d=D,
               dtype=a.dtype,
               chunks_per_rank=m, implementation=a.implementation, sm_margin=a.sm_margin,
               overlap_margin=a.overlap_margin, schedule_hints=a.schedule_hints,
               skip_masked=not a.no_skip_masked, piece_vjp=not a.autodiff_merge,
               xla_flags=os.environ.get("XLA_FLAGS", ""),
               pgle=os.environ.get("JAX_ENABLE_PGLE", ""), pgle_runs=os.environ.get("JAX_PGLE_PROFILING_RUNS", ""),
               warmup=a.warmup, nccl_nvls=os.environ.get("NCCL_NVLS_ENABLE"))
    print("env:", env, flush=True)
    rows = []
    prefix = a.out_prefix or f"cp_{P}x_{time.strftime('%Y-%m-%d')}"
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def save():
        (out_dir / f"{prefix}.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
        (out_dir / f"{prefix}.md").write_text(render(env, rows))

    shard = NamedSharding(mesh, PS(None, axis))
    for L in [int(x) for x in a.tokens_per_device.split(",")]:
        S = P * L
        q, k, v, g = make_inputs(S, H, K, D, dt, a.seed, dev0)
        suite = jf.masks.benchmark_suite(S, seed=a.seed)
        for mname in a.masks.split(","):
            if a.time_limit_s and time.time() - t_start > a.time_limit_s:
                print("time limit reached; stopping", flush=True)
                save()
                return
            mk = suite[mname]
            rho = jf.masks.block_sparsity(mk, block=128)
            fl_fwd = 4.0 * S * S * H * D * (1 - rho)
            mask_ind = jax.device_put(mk.startend_row_indices, dev0)

            # 1. one device, the whole problem
            f1, b1 = one_gpu_programs(mk, impl)
            o1 = f1(q, k, v, mask_ind)
            t1 = timeit(f1, q, k, v, mask_ind, iters=a.iters)
            row1 = dict(mask=mname, S=S, tokens_per_device=L, rho=rho, comm="one-gpu", plan="-",
                        fwd_ms=t1 * 1e3, fwd_tflops_per_gpu=fl_fwd / t1 / 1e12)
            if not a.no_bwd:
                d1 = b1(q, k, v, mask_ind, g)
                tb1 = timeit(b1, q, k, v, mask_ind, g, iters=a.iters)
                row1.update(fwdbwd_ms=tb1 * 1e3, fwdbwd_tflops_per_gpu=3.5 * fl_fwd / tb1 / 1e12)
            rows.append(row1)
            print(fmt(row1), flush=True)

            for pname in a.plans.split(","):
                plan, loads, need = cp_plan(mk, P, m, pname)
                plan_j = jnp.asarray(plan)
                perm = lambda x: cp.permute_tokens(x, plan_j)  # noqa: E731
                qp, kp, vp, gp = (jax.device_put(perm(x), shard) for x in (q, k, v, g))
                ind_r = jax.device_put(mask_ind, NamedSharding(mesh, PS()))
                chunk_bytes = 2 * (S // (P * m)) * K * D * dt.itemsize
                for comm in comms:
                    sched = cp_schedule(comm, P, m, plan, need, a.nodes)
                    # chunk slots per rank; cross-node ones counted on the --nodes split whatever the mode
                    if sched is not None:
                        vol = cp.comm_volume(sched, nodes=a.nodes)
                    elif comm == "allgather":
                        vol = cp.allgather_volume(P, m, nodes=a.nodes)
                    else:
                        vol = relay_volume(comm, P, m, a.nodes)

                    def make(attention_fn=None, comm=comm, sched=sched):
                        return cp_programs(mesh, mk, comm, sched, impl, cp_kwargs, pruned_kwargs,
                                           attention_fn=attention_fn, axis_name=axis)

                    fwd, bwd = make()
                    row = dict(mask=mname, S=S, tokens_per_device=L, rho=rho, comm=comm, plan=pname,
                               max_load_tiles=float(loads.max()), mean_load_tiles=float(loads.mean()),
                               recv_MiB_per_rank=vol["max_received"] * chunk_bytes / 2**20)
                    if a.nodes > 1:
                        row["cross_node_MiB_per_rank"] = float(np.max(vol["cross_node_sent"])) * chunk_bytes / 2**20
                    try:
                        o = fwd(qp, kp, vp, ind_r, plan_j)
                        row["out_rel_err"] = rel_err(cp.unpermute_tokens(o, plan_j), o1)
                        t = timeit(fwd, qp, kp, vp, ind_r, plan_j, iters=a.iters)
                        row.update(fwd_ms=t * 1e3, fwd_tflops_per_gpu=fl_fwd / t / 1e12 / P,
                                   fwd_speedup=t1 / t)
                        if not a.no_bwd:
                            dd = bwd(qp, kp, vp, ind_r, plan_j, gp)
                            row["grad_rel_err"] = max(rel_err(cp.unpermute_tokens(x, plan_j), y)
                                                      for x, y in zip(dd, d1))
                            tb = timeit(bwd, qp, kp, vp, ind_r, plan_j, gp, iters=a.iters)
                            row.update(fwdbwd_ms=tb * 1e3, fwdbwd_tflops_per_gpu=3.5 * fl_fwd / tb / 1e12 / P,
                                       fwdbwd_speedup=tb1 / tb)
                        if not a.no_probes:
                            with collectives_off():
                                fc, bc = make()
                                try:  # scheduling groups without their collectives may not legalize
                                    row["fwd_compute_ms"] = 1e3 * timeit(fc, qp, kp, vp, ind_r, plan_j,
                                                                         iters=a.iters)
                                    if not a.no_bwd:
                                        row["fwdbwd_compute_ms"] = 1e3 * timeit(bc, qp, kp, vp, ind_r, plan_j, gp,
                                                                                iters=a.iters)
                                except Exception as e:
                                    row["compute_probe_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                            fm, bm = make(attention_fn=attention_off)
                            row["fwd_comm_ms"] = 1e3 * timeit(fm, qp, kp, vp, ind_r, plan_j, iters=a.iters)
                            if not a.no_bwd:
                                row["fwdbwd_comm_ms"] = 1e3 * timeit(bm, qp, kp, vp, ind_r, plan_j, gp, iters=a.iters)
                            for ph in ("fwd", "fwdbwd"):
                                if f"{ph}_comm_ms" in row and f"{ph}_compute_ms" in row:
                                    tt, tc, tm = row[f"{ph}_ms"], row[f"{ph}_compute_ms"], row[f"{ph}_comm_ms"]
                                    row[f"{ph}_hidden"] = min(1.0, max(0.0, (tm + tc - tt) / tm)) if tm > 0 else 1.0
                                    row[f"{ph}_overhead"] = tt / tc - 1
                    except Exception as e:  # keep going: report the failure
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    print(fmt(row), flush=True)
                    save()
    save()


def fmt(r):
    keys = ("fwd_ms", "fwd_tflops_per_gpu", "fwd_speedup", "fwdbwd_ms", "fwdbwd_tflops_per_gpu",
            "fwdbwd_speedup", "fwd_hidden", "fwdbwd_hidden", "out_rel_err", "grad_rel_err", "recv_MiB_per_rank",
            "error")
    body = "  ".join(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys if k in r)
    return f"{r['mask']:16s} S={r['S']:7d} {r['comm']:12s} {r['plan']:8s} {body}"


def render(env, rows):
    def f(r, k, spec="{:.1f}"):
        return spec.format(r[k]) if k in r else "–"

    nodes = env.get("nodes", 1)
    split = f" split into {nodes} groups as if {nodes} hosts" if nodes > 1 else ""
    out = [f"# Context-parallel attention, {env['devices']}{split}",
           "",
           f"B = 1, H = {env['H']}, K = {env['K']}, d = {env['d']}, {env['dtype']}, {env['chunks_per_rank']} chunks "
           f"per rank, sm_margin {env.get('sm_margin', 0)}, overlap margin {env.get('overlap_margin')}, "
           f"schedule hints {env.get('schedule_hints', False)}, piece VJP {env.get('piece_vjp', False)}, jax {env['jax']}, XLA_FLAGS='{env['xla_flags']}', "
           f"NCCL_NVLS_ENABLE={env['nccl_nvls']}. "
           "TFLOP/s per GPU (FlashMask convention, x3.5 for fwd+bwd). speedup = one-GPU time / this time. "
           "hidden = (t_comm + t_compute − t_total) / t_comm. err = max|Δ| / max|ref| against one GPU.",
           "",
           "| mask | S | comm | plan | recv MiB/rank | cross-node MiB/rank | fwd ms | fwd TF/GPU | fwd speedup | "
           "fwd hidden | fwd+bwd ms | fwd+bwd TF/GPU | fwd+bwd speedup | fwd+bwd hidden | out err | grad err |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['mask']} | {r['S']} | {r['comm']} | {r['plan']} | failed: {r['error'][:80]} |"
                       + " |" * 11)
            continue
        out.append(" | ".join([
            f"| {r['mask']}", str(r["S"]), r["comm"], r["plan"], f(r, "recv_MiB_per_rank", "{:.0f}"),
            f(r, "cross_node_MiB_per_rank", "{:.0f}"),
            f(r, "fwd_ms", "{:.2f}"), f(r, "fwd_tflops_per_gpu"), f(r, "fwd_speedup", "{:.2f}×"),
            f(r, "fwd_hidden", "{:.0%}"), f(r, "fwdbwd_ms", "{:.2f}"), f(r, "fwdbwd_tflops_per_gpu"),
            f(r, "fwdbwd_speedup", "{:.2f}×"), f(r, "fwdbwd_hidden", "{:.0%}"),
            f(r, "out_rel_err", "{:.1e}"), f(r, "grad_rel_err", "{:.1e}") + " |"]))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
