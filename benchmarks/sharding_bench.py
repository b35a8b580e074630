"""Sharded attention under jit + NamedSharding over all local devices: per-device time against one
device on its share, and what the compiled program communicates.

    python3 benchmarks/sharding_bench.py --batch 8 --seq 8192 --heads 32 --kv-heads 8 \
        --out-dir $OUT --out-prefix h100x2_DATE_sharding

For one problem (B, S, N query heads, K kv heads, d; bf16; a causal-document mask with different
documents per batch row) it times forward + backward of ``jax_flashmask.attention`` jitted with q/k/v
(and the mask) placed by each layout on a mesh of all P devices:

- ``batch``: ``P("x")`` — each device its B/P rows;
- ``heads``: ``P(None, None, "x")`` — each device N/P query and K/P kv heads (the mask's one head
  replicated);
- ``sequence``: ``P(None, "x")`` — each device S/P query rows of every row's sequence (K/V gathered by
  the sharding rule);
- ``context_parallel``: `context_parallel_attention` on the same problem (``--cp-comm``, balanced plan;
  inputs in the plan's layout, the permutation not timed).

Baselines, on device 0: for batch and heads the same jitted call on one device's share (B/P rows,
or N/P and K/P heads) — the ideal per-device time equals it; for the sequence layouts the whole
problem on one device — the ideal time is 1/P of it. Each row lists the collectives of the compiled
program with their largest operand (batch and heads should have none). Results: ``<prefix>.json`` and
``.md`` under ``--out-dir``. CPU dry run: ``XLA_FLAGS=--xla_force_host_platform_device_count=2
python benchmarks/sharding_bench.py --batch 2 --seq 256 --heads 4 --kv-heads 2 --head-dim 32
--implementation xla --iters 1``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS  # noqa: E402

from jax_flashmask import context_parallel as cp  # noqa: E402
from jax_flashmask import masks  # noqa: E402
# benchmarks/ is on the path when this runs as a script: cp_bench's timing and program builders
from cp_bench import cp_programs, one_gpu_programs, timeit  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from _hlo import collectives as _hlo_collectives  # noqa: E402  (the sharding tests' HLO parser)

LAYOUTS = ("batch", "heads", "sequence", "context_parallel")


def collectives(hlo: str) -> list[str]:
    """The collectives of a compiled program as 'op (N elements)', largest first."""
    return [f"{op} ({n} elements)" for op, n in sorted(_hlo_collectives(hlo), key=lambda c: -c[1])]


def doc_mask(b: int, s: int, docs: int, seed: int) -> masks.FlashMask:
    """Causal document masks, `docs` documents per row at random cuts (different per row)."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((b, s), np.int32)
    for i in range(b):
        cuts = np.sort(rng.choice(np.arange(1, s), size=docs - 1, replace=False))
        seg[i, cuts] = 1
    return masks.from_segment_ids(np.cumsum(seg, axis=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--docs", type=int, default=8, help="documents per row of the causal-document mask")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--implementation", default="cuda")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma list of {', '.join(LAYOUTS)}")
    ap.add_argument("--cp-comm", default="ring", help="context_parallel's comm (allgather or ring)")
    ap.add_argument("--chunks-per-rank", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--out-prefix", default=None)
    a = ap.parse_args(argv)
    layouts = a.layouts.split(",")
    for lay in layouts:
        if lay not in LAYOUTS:
            ap.error(f"--layouts: unknown layout {lay!r}; choose from {', '.join(LAYOUTS)}")
    devs = np.array(jax.devices())
    P = len(devs)
    B, S, N, K, D = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    need = {"batch": ("--batch", B), "heads": ("--heads and --kv-heads", min(N, K)),
            "sequence": ("--seq", S), "context_parallel": ("--seq", S // a.chunks_per_rank)}
    for lay in layouts:
        name, size = need[lay]
        if size % P:
            ap.error(f"layout {lay}: {name} must be divisible by the {P} devices")
    impl = None if a.implementation in ("", "default") else a.implementation
    dt = jnp.dtype(a.dtype)
    mesh = Mesh(devs, ("x",))
    dev0 = devs[0]
    rng = jax.random.split(jax.random.PRNGKey(a.seed), 4)
    q = jax.random.normal(rng[0], (B, S, N, D), dt)
    k = jax.random.normal(rng[1], (B, S, K, D), dt)
    v = jax.random.normal(rng[2], (B, S, K, D), dt)
    g = jax.random.normal(rng[3], (B, S, N, D), dt)
    mask = doc_mask(B, S, a.docs, a.seed)
    ind = mask.startend_row_indices
    env = dict(devices=f"{P} x {dev0.device_kind}", jax=jax.__version__, B=B, S=S, N=N, K=K, d=D,
               dtype=a.dtype, docs=a.docs, implementation=a.implementation, cp_comm=a.cp_comm,
               chunks_per_rank=a.chunks_per_rank, command="python3 benchmarks/sharding_bench.py " +
               " ".join(sys.argv[1:] if argv is None else argv))
    print("env:", env, flush=True)
    _, f = one_gpu_programs(mask, impl)  # grad of sum(out * g): args (q, k, v, ind, g)
    put = lambda xs, dev: [jax.device_put(x, dev) for x in xs]  # noqa: E731
    whole = put((q, k, v, ind, g), dev0)
    t_whole = timeit(f, *whole, iters=a.iters)
    rows = [dict(layout="one device, whole problem", ms=t_whole * 1e3)]
    print(rows[-1], flush=True)
    for lay in layouts:
        row = dict(layout=lay)
        share = None  # one device's share of a batch / head split
        try:
            if lay == "context_parallel":
                m = a.chunks_per_rank
                work = cp.chunk_workloads(mask, P * m)
                plan = jnp.asarray(np.asarray(cp.balanced_plan(work, P).plan, np.int32))
                shard = NamedSharding(mesh, PS(None, "x"))
                perm = lambda x: cp.permute_tokens(x, plan)  # noqa: E731
                args = [jax.device_put(perm(x), shard) for x in (q, k, v)]
                args += [jax.device_put(ind, NamedSharding(mesh, PS())), plan, jax.device_put(perm(g), shard)]
                _, fn = cp_programs(mesh, mask, a.cp_comm, None, impl, None, {}, axis_name="x")
            else:
                spec = {"batch": PS("x"), "heads": PS(None, None, "x"), "sequence": PS(None, "x")}[lay]
                sh = NamedSharding(mesh, spec)
                mask_sh = NamedSharding(mesh, PS("x") if lay == "batch" else PS())
                args = [jax.device_put(x, sh) for x in (q, k, v)] + [jax.device_put(ind, mask_sh),
                                                                     jax.device_put(g, sh)]
                fn = f
                if lay == "batch":
                    share = (q[: B // P], k[: B // P], v[: B // P], ind[: B // P], g[: B // P])
                elif lay == "heads":
                    share = (q[:, :, : N // P], k[:, :, : K // P], v[:, :, : K // P], ind, g[:, :, : N // P])
            t_share = timeit(f, *put(share, dev0), iters=a.iters) if share is not None else None
            ideal = t_share if share is not None else t_whole / P
            share_ms = None if t_share is None else t_share * 1e3
            t = timeit(fn, *args, iters=a.iters)
            row.update(ms=t * 1e3, share_ms=share_ms, ideal_ms=ideal * 1e3, ratio_to_ideal=t / ideal,
                       speedup_over_one=t_whole / t,
                       collectives=collectives(fn.lower(*args).compile().as_text()))
        except Exception as e:  # noqa: BLE001  (report and go on)
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(row, flush=True)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = a.out_prefix or f"sharding_{P}x_{time.strftime('%Y-%m-%d')}"
    (out_dir / f"{prefix}.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    (out_dir / f"{prefix}.md").write_text(render(env, rows))
    print((out_dir / f"{prefix}.md").read_text())
    return 0


def render(env, rows) -> str:
    out = [f"# Sharded attention under jit, {env['devices']}", "",
           f"B = {env['B']}, S = {env['S']}, N = {env['N']}, K = {env['K']}, d = {env['d']}, {env['dtype']}, "
           f"causal document mask ({env['docs']} documents a row), forward + backward, jax {env['jax']}. "
           "ideal = one device on its share (batch, heads) or 1/P of one device on the whole problem "
           "(sequence, context_parallel).", "", "```", env["command"], "```", "",
           "| layout | ms | one device on its share, ms | ideal ms | time / ideal | speedup over one device | "
           "collectives (largest first) |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['layout']} | failed: {r['error'][:100]} | | | | | |")
            continue
        f = lambda key, spec="{:.2f}": spec.format(r[key]) if r.get(key) is not None else "–"  # noqa: E731
        out.append(f"| {r['layout']} | {f('ms')} | {f('share_ms')} | {f('ideal_ms')} | {f('ratio_to_ideal', '{:.3f}')} | "
                   f"{f('speedup_over_one', '{:.2f}×')} | {(', '.join(r['collectives'][:4]) or 'none') if 'collectives' in r else '–'} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
