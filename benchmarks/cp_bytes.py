"""Bytes of K/V each context-parallel rank receives/sends, mask-pruned vs a plain all-gather.

    python benchmarks/cp_bytes.py [--S 8192] [--P 8] [--nodes 2] [--chunks-per-rank 2]
        [--heads-kv 8] [--head-dim 128] [--dtype-bytes 2] [--json out.json]

Host-only (numpy): for each of the twelve benchmark masks, the dual-chunk and the balanced plan,
it counts the chunk slots a pruned schedule (`make_schedule(..., needed=needed_chunks(...))`)
delivers, and converts to bytes with ``chunk_bytes = 2 * C * K * d * dtype_bytes`` (K and V, batch
1). Backward sends the same volume again (dK/dV on the reverse pairs). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402


def table(S=8192, P=8, nodes=2, chunks_per_rank=2, heads_kv=8, head_dim=128, dtype_bytes=2,
          seed=0, tile=128):
    n = P * chunks_per_rank
    c = S // n
    chunk_bytes = 2 * c * heads_kv * head_dim * dtype_bytes
    base = cp.allgather_volume(P, chunks_per_rank, nodes=nodes, chunk_bytes=chunk_bytes)
    rows = []
    for name, mk in jf.masks.benchmark_suite(S, seed=seed).items():
        work = cp.chunk_workloads(mk, n, tile_q=tile, tile_k=tile)
        rep = cp.balanced_plan(work, P)
        dual = cp.dual_chunk_plan(P, n) if chunks_per_rank % 2 == 0 else cp.contiguous_plan(P, n)
        row = dict(mask=name, allgather_per_rank=base["max_received"],
                   allgather_cross_node=float(base["cross_node_sent"].max()),
                   lb=rep.lower_bound, dual_load=float(cp.plan_loads(dual, work).max()),
                   balanced_load=rep.max_load)
        for pname, plan in (("dual", dual), ("balanced", rep.plan)):
            need = cp.needed_chunks(mk, plan)
            ring = cp.comm_volume(cp.make_schedule(P, chunks_per_rank, "ring", plan=plan, needed=need),
                                  chunk_bytes=chunk_bytes, nodes=nodes)
            hier = cp.comm_volume(cp.make_schedule(P, chunks_per_rank, "hierarchical", nodes=nodes,
                                                   plan=plan, needed=need), chunk_bytes=chunk_bytes)
            row[pname] = dict(max_recv=ring["max_received"], mean_recv=float(ring["received"].mean()),
                              max_sent=ring["max_sent"], total_ratio=ring["total"] / base["total"],
                              cross_node_flat=float(ring["cross_node_sent"].max()),
                              cross_node_hier=float(hier["cross_node_sent"].max()))
        rows.append(row)
    return dict(S=S, P=P, nodes=nodes, chunks_per_rank=chunks_per_rank, chunk_bytes=chunk_bytes,
                rows=rows)


def markdown(t):
    mb = lambda x: f"{x / 2**20:.1f}"  # noqa: E731
    out = [f"S={t['S']}, P={t['P']} ({t['nodes']} nodes x {t['P'] // t['nodes']}), "
           f"{t['chunks_per_rank']} chunks/rank, chunk slot = {mb(t['chunk_bytes'])} MiB (K+V). "
           "MiB per rank, forward (backward sends the same again).", "",
           "| mask | all-gather recv | dual: max recv | dual: mean recv | dual: total vs AG | "
           "balanced: max recv | balanced: mean recv | balanced: total vs AG | cross-node/rank: AG | flat pruned | hier pruned | "
           "max tiles: dual / balanced / LB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in t["rows"]:
        d, b = r["dual"], r["balanced"]
        out.append(f"| {r['mask']} | {mb(r['allgather_per_rank'])} | {mb(d['max_recv'])} | {mb(d['mean_recv'])} | "
                   f"{d['total_ratio']:.2f} | {mb(b['max_recv'])} | {mb(b['mean_recv'])} | {b['total_ratio']:.2f} | "
                   f"{mb(r['allgather_cross_node'])} | {mb(b['cross_node_flat'])} | {mb(b['cross_node_hier'])} | "
                   f"{r['dual_load']:.0f} / {r['balanced_load']:.0f} / {r['lb']:.0f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--S", type=int, default=8192)
    ap.add_argument("--P", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--chunks-per-rank", type=int, default=2)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    t = table(a.S, a.P, a.nodes, a.chunks_per_rank, a.heads_kv, a.head_dim, a.dtype_bytes, a.seed)
    print(markdown(t))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(t, f, indent=1, default=float)


if __name__ == "__main__":
    main()
