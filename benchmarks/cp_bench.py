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
                    help="ring-pruned only: differentiate the lse merge (piece_vjp=False, the old path)")
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


def cp_schedule(comm, P, m, plan, need):
    """The static schedule of a ``-pruned`` comm mode (None for the others)."""
    return cp.make_schedule(P, m, "ring", plan=plan, needed=need) if comm.endswith("-pruned") else None


def cp_programs(mesh, mk, comm, sched, impl, cp_kwargs, pruned_kwargs, attention_fn=None):
    """(forward, grad of sum(out * g)) of CP attention, jitted: args (q, k, v, ind, plan[, g])."""
    base = comm.replace("-pruned", "")
    # the comm-alone probe's stand-in attention goes through the autodiff merge
    extra = pruned_kwargs if sched is not None and attention_fn is None else {}

    def fwd(q, k, v, ind, pl):
        return cp.context_parallel_attention(
            q, k, v, ind, plan=pl, mesh=mesh, axis_name="cp", causal=mk.causal,
            comm=base, schedule=sched, implementation=impl, attention_fn=attention_fn,
            attention_kwargs=cp_kwargs, **extra)

    def loss(q, k, v, ind, pl, g):
        return jnp.sum(fwd(q, k, v, ind, pl).astype(jnp.float32) * g.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens-per-device", default="32768,65536")
    ap.add_argument("--masks", default="causal_document,document")
    ap.add_argument("--comms", default=",".join(COMMS))
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
    mesh = Mesh(devs, ("cp",))
    dev0 = devs[0]
    m = a.chunks_per_rank
    dt = jnp.dtype(a.dtype)
    H, K, D = a.heads, a.kv_heads, a.head_dim
    env = dict(devices=f"{P} x {dev0.device_kind}", jax=jax.__version__, H=H, K=K, d=D, dtype=a.dtype,
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

    shard = NamedSharding(mesh, PS(None, "cp"))
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
                for comm in a.comms.split(","):
                    sched = cp_schedule(comm, P, m, plan, need)
                    vol = cp.comm_volume(sched) if sched is not None else cp.allgather_volume(P, m)

                    def make(attention_fn=None, comm=comm, sched=sched):
                        return cp_programs(mesh, mk, comm, sched, impl, cp_kwargs, pruned_kwargs,
                                           attention_fn=attention_fn)

                    fwd, bwd = make()
                    row = dict(mask=mname, S=S, tokens_per_device=L, rho=rho, comm=comm, plan=pname,
                               max_load_tiles=float(loads.max()), mean_load_tiles=float(loads.mean()),
                               recv_MiB_per_rank=vol["max_received"] * chunk_bytes / 2**20)
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

    out = [f"# Context-parallel attention, {env['devices']}",
           "",
           f"B = 1, H = {env['H']}, K = {env['K']}, d = {env['d']}, {env['dtype']}, {env['chunks_per_rank']} chunks "
           f"per rank, sm_margin {env.get('sm_margin', 0)}, overlap margin {env.get('overlap_margin')}, "
           f"schedule hints {env.get('schedule_hints', False)}, piece VJP {env.get('piece_vjp', False)}, jax {env['jax']}, XLA_FLAGS='{env['xla_flags']}', "
           f"NCCL_NVLS_ENABLE={env['nccl_nvls']}. "
           "TFLOP/s per GPU (FlashMask convention, x3.5 for fwd+bwd). speedup = one-GPU time / this time. "
           "hidden = (t_comm + t_compute − t_total) / t_comm. err = max|Δ| / max|ref| against one GPU.",
           "",
           "| mask | S | comm | plan | recv MiB/rank | fwd ms | fwd TF/GPU | fwd speedup | fwd hidden | "
           "fwd+bwd ms | fwd+bwd TF/GPU | fwd+bwd speedup | fwd+bwd hidden | out err | grad err |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['mask']} | {r['S']} | {r['comm']} | {r['plan']} | failed: {r['error'][:80]} |"
                       + " |" * 10)
            continue
        out.append(" | ".join([
            f"| {r['mask']}", str(r["S"]), r["comm"], r["plan"], f(r, "recv_MiB_per_rank", "{:.0f}"),
            f(r, "fwd_ms", "{:.2f}"), f(r, "fwd_tflops_per_gpu"), f(r, "fwd_speedup", "{:.2f}×"),
            f(r, "fwd_hidden", "{:.0%}"), f(r, "fwdbwd_ms", "{:.2f}"), f(r, "fwdbwd_tflops_per_gpu"),
            f(r, "fwdbwd_speedup", "{:.2f}×"), f(r, "fwdbwd_hidden", "{:.0%}"),
            f(r, "out_rel_err", "{:.1e}"), f(r, "grad_rel_err", "{:.1e}") + " |"]))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
