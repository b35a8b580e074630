"""Worker for tests/test_context_parallel.py: one group of checks per process.

Run as ``python tests/_cp_worker.py GROUP`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` in the environment (the flag has no effect
once jax is imported, so every group gets a fresh process). Exits non-zero on the first failure.
Every distributed call is followed by ``block_until_ready`` (SPEC §6: back-to-back collective
programs on a 2-core CPU host can otherwise hang).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
try:  # the installed package (CI: pip install .), else this checkout
    import jax_flashmask  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import context_parallel as cp  # noqa: E402
from jax_flashmask.masks import canonical_bounds, to_dense  # noqa: E402

S, B, N, K, D = 256, 2, 4, 2, 16
IMPL = os.environ.get("CP_TEST_IMPL", "reference")
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def canonical_indices(mask) -> np.ndarray:
    """FlashMask -> non-causal D=4 int32 [B, Hm, S, 4] (one compiled program for every mask)."""
    b = canonical_bounds(mask.startend_row_indices, causal=mask.causal, q_len=mask.shape[2])
    return np.asarray(b).swapaxes(-1, -2).astype(np.int32)


def suite_masks():
    """The twelve masks, batch 2 x 2 mask heads (per kv head): each (b, h) a different instance."""
    s0 = jf.masks.benchmark_suite(S, seed=0)
    s1 = jf.masks.benchmark_suite(S, seed=1)
    names = list(s0)
    out = {}
    for i, name in enumerate(names):
        other = names[(i + 5) % len(names)]
        heads = lambda s, a, b: np.concatenate([canonical_indices(s[a]), canonical_indices(s[b])], axis=1)  # noqa: E731
        out[name] = np.concatenate([heads(s0, name, other), heads(s1, name, other)], axis=0)
    return out


def single_mask(name, seed=0):
    """One suite mask repeated over batch and both mask heads (so pruning really prunes)."""
    one = canonical_indices(jf.masks.benchmark_suite(S, seed=seed)[name])
    return np.repeat(np.repeat(one, B, axis=0), 2, axis=1)


def inputs(seed=0):
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.standard_normal(s), jnp.float32)  # noqa: E731
    return f(B, S, N, D), f(B, S, K, D), f(B, S, K, D), f(B, S, N, D), f(B, S, N)


def loss_terms(o, lse, co, cl):
    return jnp.sum(o * co) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * cl, 0.0))


def reference_fn():
    def fwd(q, k, v, ind, co, cl):
        o, lse = jf.attention(q, k, v, ind, return_residual=True, implementation=IMPL)
        return loss_terms(o, lse, co, cl), (o, lse)

    return jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))


def cp_fn(mesh, axis, comm, schedule=None, causal=False):
    def fwd(q, k, v, ind, plan, co, cl):
        qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
        o, lse = cp.context_parallel_attention(
            qp, kp, vp, ind, causal=causal, plan=plan, mesh=mesh, axis_name=axis, comm=comm,
            schedule=schedule, return_residual=True, implementation=IMPL)
        o, lse = cp.unpermute_tokens(o, plan), cp.unpermute_tokens(lse, plan)
        return loss_terms(o, lse, co, cl), (o, lse)

    return jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))


def compare(tag, got, ref, atol=2e-4):
    (l1, (o1, s1)), g1 = got
    (l2, (o2, s2)), g2 = ref
    s1, s2 = np.asarray(s1), np.asarray(s2)
    assert np.array_equal(np.isfinite(s1), np.isfinite(s2)), f"{tag}: lse -inf pattern differs"
    assert not np.any(np.isnan(s1)), f"{tag}: NaN in lse"
    fin = np.isfinite(s2)
    errs = {
        "out": float(np.max(np.abs(np.asarray(o1) - np.asarray(o2)))),
        "lse": float(np.max(np.abs(np.where(fin, s1 - s2, 0.0)))),
    }
    for n, a, b in zip("qkv", g1, g2):
        a, b = np.asarray(a), np.asarray(b)
        assert not np.any(np.isnan(a)), f"{tag}: NaN in d{n}"
        errs["d" + n] = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
    bad = {k: v for k, v in errs.items() if not v <= atol}
    assert not bad, f"{tag}: mismatch {bad}"
    return max(errs.values())


def block(x):
    return jax.block_until_ready(x)


def plans_for(P, masks):
    """Per mask: the dual-chunk plan and the balanced plan (same shape [P, 2]: one program)."""
    out = {}
    for name, ind in masks.items():
        w = cp.chunk_workloads(ind, 2 * P, causal=False, tile_q=16, tile_k=16)
        out[name] = {"dual": cp.dual_chunk_plan(P), "balanced": cp.balanced_plan(w, P).plan}
    return out


# --------------------------------------------------------------------------- groups


def group_host():
    """Localization vs a dense slice, balancer vs brute force, layout, schedules, bytes."""
    rng = np.random.default_rng(0)
    masks = suite_masks()
    # 1) localization: r_loc formulas agree; local dense mask == rows/cols slice of the global one
    def dense_np(bounds, n_rows):
        i = np.arange(n_rows)[:, None]
        lts, lte, uts, ute = (bounds[:, :, k, None, :] for k in range(4))
        return ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))

    for mi, (name, ind) in enumerate(masks.items()):
        bounds = np.asarray(canonical_bounds(ind, causal=False, q_len=S))
        dense = np.asarray(to_dense(ind, causal=False))  # [B, Hm, S, S]
        for P, nch in ((2, 4), (4, 16), (8, 16)):
            plan = cp.validate_plan(rng.permutation(nch).reshape(P, nch // P))
            c = S // nch
            for p in range(P):
                rows = (plan[p][:, None] * c + np.arange(c)).reshape(-1)
                cols = rng.permutation(S)[: S // 2]
                r = cp.localize.localize_rows_sum(bounds, plan[p], c, xp=np)
                assert np.array_equal(cp.localize_rows(bounds, plan[p], c, xp=np), r), name
                lb = cp.localize_bounds(bounds, plan[p], c, columns=cols, xp=np)
                want = dense[:, :, rows][:, :, :, cols]
                assert np.array_equal(dense_np(lb, len(rows)), want), f"{name} P={P} rank {p}: localized mask differs"
                if p == 0 and P == 4:  # the traced (jnp) path, plan as a device array
                    a = np.asarray(jax.jit(cp.localize_rows, static_argnums=2)(bounds, jnp.asarray(plan[p]), c))
                    assert np.array_equal(a, r), f"{name}: jnp localize_rows differs"
        # needed_chunks == "some cell of (rank rows, chunk cols) is visible"
        plan = cp.dual_chunk_plan(4)
        need = cp.needed_chunks(ind, plan)
        c = S // 8
        for p in range(4):
            rows = (plan[p][:, None] * c + np.arange(c)).reshape(-1)
            vis = ~dense[:, :, rows]  # [B, Hm, R, S]
            want = vis.reshape(B, dense.shape[1], len(rows), 8, c).any(axis=(0, 1, 2, 4))
            assert np.array_equal(need[p], want), f"{name}: needed_chunks differs from the dense mask"
    log("localization ok")
    # 2) balancer vs brute force
    def brute(w, P):
        n = len(w)
        m = n // P
        best = [np.inf]

        def rec(rem, loads):
            if not rem:
                best[0] = min(best[0], max(loads))
                return
            first = rem[0]
            for combo in itertools.combinations(rem[1:], m - 1):
                grp = (first,) + combo
                rest = [x for x in rem if x not in grp]
                rec(rest, loads + [sum(w[i] for i in grp)])

        rec(list(range(n)), [])
        return best[0]

    exact = total = 0
    for trial in range(40):
        P = [2, 2, 3, 4][trial % 4]
        m = [2, 3, 4, 2][trial % 4] if P != 4 else 2
        w = rng.integers(1, 50, size=P * m).astype(float)
        if trial % 5 == 0:
            w[rng.integers(0, len(w))] *= 10  # a dominant chunk
        rep = cp.balanced_plan(w, P)
        assert np.array_equal(np.sort(rep.plan.ravel()), np.arange(P * m)), "balanced_plan: not a permutation"
        assert rep.plan.shape == (P, m)
        opt = brute(w, P)
        assert rep.max_load >= opt - 1e-9 and rep.max_load >= rep.lower_bound - 1e-9
        assert rep.max_load <= rep.lpt_max_load + 1e-9
        if P == 2:
            assert abs(rep.max_load - opt) < 1e-9, f"P=2 must be exact: {rep.max_load} vs {opt} ({w})"
        assert rep.max_load <= opt * 4 / 3 + 1e-9, f"balanced_plan too far from optimal: {rep.max_load} vs {opt}"
        exact += abs(rep.max_load - opt) < 1e-9
        total += 1
    # meet-in-the-middle path (m > 8) against brute force on two ranks
    for trial in range(3):
        w = rng.integers(1, 1000, size=20).astype(float)
        rep = cp.balanced_plan(w, 2)
        assert abs(rep.max_load - brute(w, 2)) < 1e-9, "meet-in-the-middle split not exact"
    log(f"balancer ok: optimal on {exact}/{total} small instances, exact for P=2 (incl. MITM)")
    # 3) layout round trip
    x = jnp.arange(2 * S * 3).reshape(2, S, 3)
    for plan in (cp.dual_chunk_plan(4), cp.dual_chunk_plan(8, 32), rng.permutation(16).reshape(4, 4)):
        y = cp.permute_tokens(x, plan)
        assert np.array_equal(np.asarray(cp.unpermute_tokens(y, plan)), np.asarray(x))
        pos = np.asarray(cp.token_positions(plan, S))
        assert np.array_equal(np.asarray(y[0, :, 0]) // 3, pos)
    # 4) schedules: pruned pairs == needed; hierarchical cross-node volume
    for name, ind in masks.items():
        plan = cp.dual_chunk_plan(8)
        need = cp.needed_chunks(ind, plan)
        for kind, nodes in (("ring", 1), ("hierarchical", 2)):
            sch = cp.make_schedule(8, 2, kind, nodes=nodes, plan=plan, needed=need)
            got = np.zeros_like(need)
            for pc in sch.pieces:
                for p in range(8):
                    for b in range(2):
                        if pc.received[p][b]:
                            got[p, plan[pc.source[p]][b]] = True
            assert np.array_equal(got, need), f"{name} {kind}: the schedule does not deliver exactly the needed chunks"
    log("schedules ok")
    table = bytes_table(jf.masks.benchmark_suite(2048, seed=0))
    for name, row in table.items():
        for pname in ("dual", "balanced"):
            r = row[pname]
            assert r["max_recv"] <= row["allgather"] and r["ratio_vs_allgather"] <= 1.0
            assert r["cross_node_sent_hier"] <= r["cross_node_sent_flat"]
    assert table["full"]["dual"]["ratio_vs_allgather"] == 1.0
    assert table["sliding_window"]["dual"]["ratio_vs_allgather"] < 0.2
    print("BYTES " + json.dumps(table))
    log("bytes ok")


def bytes_table(masks_raw, P=8, nodes=2, chunks_per_rank=2):
    """Per mask: K/V chunk slots received per rank (max / mean) and cross-node, vs all-gather."""
    rows = {}
    for name, mk in masks_raw.items():
        n = P * chunks_per_rank
        plan = cp.dual_chunk_plan(P, n) if chunks_per_rank % 2 == 0 else cp.contiguous_plan(P, n)
        w = cp.chunk_workloads(mk, n, tile_q=128, tile_k=128)
        bal = cp.balanced_plan(w, P).plan
        base = cp.allgather_volume(P, chunks_per_rank, nodes=nodes)
        row = {"allgather": base["max_received"]}
        for pname, pl in (("dual", plan), ("balanced", bal)):
            need = cp.needed_chunks(mk, pl)
            ring = cp.comm_volume(cp.make_schedule(P, chunks_per_rank, "ring", plan=pl, needed=need), nodes=nodes)
            hier = cp.comm_volume(cp.make_schedule(P, chunks_per_rank, "hierarchical", nodes=nodes, plan=pl, needed=need))
            row[pname] = {"max_recv": ring["max_received"], "mean_recv": float(ring["received"].mean()),
                          "max_sent": ring["max_sent"], "cross_node_sent_hier": float(hier["cross_node_sent"].max()),
                          "cross_node_sent_flat": float(ring["cross_node_sent"].max()),
                          "ratio_vs_allgather": ring["total"] / base["total"]}
        rows[name] = row
    return rows


def group_cp(P):
    masks = suite_masks()
    plans = plans_for(P, masks)
    mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
    q, k, v, co, cl = inputs()
    ref = reference_fn()
    refs = {name: block(ref(q, k, v, jnp.asarray(ind), co, cl)) for name, ind in masks.items()}
    log(f"P={P}: references done")
    for comm in ("allgather", "ring"):
        f = cp_fn(mesh, "cp", comm)
        worst = 0.0
        for name, ind in masks.items():
            for pname, plan in plans[name].items():
                got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
                worst = max(worst, compare(f"P={P} {comm} {pname} {name}", got, refs[name]))
        assert f._cache_size() == 1, f"{comm}: a new mask or plan recompiled ({f._cache_size()} programs)"
        log(f"P={P} {comm}: 12 masks x (dual, balanced) ok, one program, worst err {worst:.1e}")
    # mask-pruned static schedules: recompiles per needed-pattern, so a few masks only
    pruned = {2: [("ring", "causal_document")],
              4: [("ring", "causal_document"), ("allgather", "share_question")],
              8: [("ring", "sliding_window"), ("allgather", "prefix_lm_document")]}[P]
    for comm, name in pruned:
        ind = single_mask(name)
        r = block(ref(q, k, v, jnp.asarray(ind), co, cl))
        plan = cp.balanced_plan(cp.chunk_workloads(ind, 2 * P, tile_q=16, tile_k=16), P).plan
        need = cp.needed_chunks(ind, plan)
        sch = cp.make_schedule(P, 2, "ring", plan=plan, needed=need)
        f = cp_fn(mesh, "cp", comm, schedule=sch)
        got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
        compare(f"P={P} pruned {comm} {name}", got, r)
        vol = cp.comm_volume(sch)
        log(f"P={P} pruned {comm} {name}: ok ({need.sum()}/{need.size} chunk deliveries needed, "
            f"{len(sch.transfers)} ppermutes, {vol['total']:.0f}/{P * (P - 1) * 2} chunk slots sent)")


def group_hier():
    masks = suite_masks()
    P, nodes = 8, 2
    plans = plans_for(P, masks)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(nodes, 4), ("node", "local"))
    q, k, v, co, cl = inputs(1)
    ref = reference_fn()
    refs = {name: block(ref(q, k, v, jnp.asarray(ind), co, cl)) for name, ind in masks.items()}
    log("hier: references done")
    f = cp_fn(mesh, ("node", "local"), "hierarchical")
    for name, ind in masks.items():
        for pname, plan in plans[name].items():
            got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
            compare(f"2x4 hierarchical {pname} {name}", got, refs[name])
    log("2x4 hierarchical: 12 masks x (dual, balanced) ok")
    f = cp_fn(mesh, ("node", "local"), "allgather")
    for name in ("causal", "share_question"):
        got = block(f(q, k, v, jnp.asarray(masks[name]), jnp.asarray(plans[name]["dual"]), co, cl))
        compare(f"2x4 allgather {name}", got, refs[name])
    log("2x4 allgather over both axes ok")
    for name in ("causal_document",):
        ind = single_mask(name)
        r = block(ref(q, k, v, jnp.asarray(ind), co, cl))
        plan = cp.dual_chunk_plan(P)
        need = cp.needed_chunks(ind, plan)
        sch = cp.make_schedule(P, 2, "hierarchical", nodes=nodes, plan=plan, needed=need)
        f = cp_fn(mesh, ("node", "local"), "hierarchical", schedule=sch)
        got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
        compare(f"2x4 pruned hierarchical {name}", got, r)
        log(f"2x4 pruned hierarchical {name}: ok ({len(sch.transfers)} ppermutes)")


def group_api():
    """Raw FlashMask (causal folding), no mask, inside the user's own shard_map (check_vma on)."""
    P = 4
    mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
    q, k, v, co, cl = inputs(2)
    plan = cp.dual_chunk_plan(P)
    mk = jf.masks.benchmark_suite(S, seed=3, batch=B)["causal_document"]
    ref = jax.jit(lambda q, k, v: jf.attention(q, k, v, mk, return_residual=True, implementation=IMPL))
    ro, rl = block(ref(q, k, v))

    @jax.jit
    def global_call(q, k, v, mk, plan):
        qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
        o, l = cp.context_parallel_attention(qp, kp, vp, mk, plan=plan, mesh=mesh, axis_name="cp",
                                             comm="ring", return_residual=True, implementation=IMPL)
        return cp.unpermute_tokens(o, plan), cp.unpermute_tokens(l, plan)

    o, l = block(global_call(q, k, v, mk, jnp.asarray(plan)))
    np.testing.assert_allclose(np.asarray(o), np.asarray(ro), atol=2e-5)
    np.testing.assert_allclose(np.asarray(l), np.asarray(rl), atol=2e-5)
    log("FlashMask(causal=True) through the mesh API ok")

    # inside the user's own shard_map, inputs placed with NamedSharding, default check_vma
    qs = NamedSharding(mesh, PS(None, "cp"))
    qp, kp, vp = (jax.device_put(cp.permute_tokens(x, plan), qs) for x in (q, k, v))

    def body(q, k, v, ind, plan):
        return cp.context_parallel_attention(q, k, v, ind, causal=True, plan=plan, axis_name="cp",
                                             comm="ring", return_residual=True, implementation=IMPL)

    f = jax.jit(cp.shard_map(body, mesh=mesh, in_specs=(PS(None, "cp"),) * 3 + (PS(), PS()),
                             out_specs=(PS(None, "cp"), PS(None, "cp"))))
    o, l = block(f(qp, kp, vp, mk.startend_row_indices, jnp.asarray(plan)))
    np.testing.assert_allclose(np.asarray(cp.unpermute_tokens(o, plan)), np.asarray(ro), atol=2e-5)
    np.testing.assert_allclose(np.asarray(cp.unpermute_tokens(l, plan)), np.asarray(rl), atol=2e-5)
    log("inside a user shard_map (check_vma=True) ok")

    # no mask (causal only), allgather
    ref2 = jax.jit(lambda q, k, v: jf.attention(q, k, v, None, causal=True, implementation=IMPL))
    o2 = block(jax.jit(lambda q, k, v, pl: cp.unpermute_tokens(cp.context_parallel_attention(
        *(cp.permute_tokens(x, pl) for x in (q, k, v)), None, causal=True, plan=pl, mesh=mesh,
        axis_name="cp", comm="allgather", implementation=IMPL), pl))(q, k, v, jnp.asarray(plan)))
    np.testing.assert_allclose(np.asarray(o2), np.asarray(block(ref2(q, k, v))), atol=2e-5)
    log("mask=None, causal=True ok")

    # data parallel x context parallel: batch sharded on "dp", sequence on "cp"
    mesh2 = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "cp"))
    plan2 = cp.dual_chunk_plan(2)
    ind = jnp.asarray(canonical_indices(mk))
    f3 = jax.jit(lambda q, k, v, ind, pl: cp.unpermute_tokens(cp.context_parallel_attention(
        *(cp.permute_tokens(x, pl) for x in (q, k, v)), ind, plan=pl, mesh=mesh2, axis_name="cp",
        batch_axis="dp", comm="allgather", implementation=IMPL), pl))
    o3 = block(f3(q, k, v, ind, jnp.asarray(plan2)))
    np.testing.assert_allclose(np.asarray(o3), np.asarray(ro), atol=2e-5)
    log("batch_axis='dp' x cp ok")

    # the relay ring unrolled (straight-line code for the GPU scheduler), forward only
    f4 = jax.jit(lambda q, k, v, ind, pl: cp.unpermute_tokens(cp.context_parallel_attention(
        *(cp.permute_tokens(x, pl) for x in (q, k, v)), ind, plan=pl, mesh=mesh, axis_name="cp",
        comm="ring", scan_unroll=True, implementation=IMPL), pl))
    o4 = block(f4(q, k, v, ind, jnp.asarray(plan)))
    np.testing.assert_allclose(np.asarray(o4), np.asarray(ro), atol=2e-5)
    log("ring with scan_unroll=True ok")


def group_pieces():
    """The scheduled ring's custom-VJP piece merge (`context_parallel.pieces`): exact against one
    device (out, lse and grads through both), old autodiff merge, per-piece SM margins, scheduling
    hints (attributes present in the lowered program), P = 2 with m = 2 and 4, a user shard_map."""
    P = 2
    mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
    q, k, v, co, cl = inputs(4)
    for impl in ("reference", "xla"):
        def ref_fn(q, k, v, ind, co, cl, impl=impl):
            o, lse = jf.attention(q, k, v, ind, return_residual=True, implementation=impl)
            return loss_terms(o, lse, co, cl), (o, lse)

        ref = jax.jit(jax.value_and_grad(ref_fn, argnums=(0, 1, 2), has_aux=True))
        for name, m in (("causal_document", 2), ("causal_document", 4), ("document", 4), ("share_question", 4)):
            ind = single_mask(name)
            r = block(ref(q, k, v, jnp.asarray(ind), co, cl))
            w = cp.chunk_workloads(ind, P * m, tile_q=16, tile_k=16)
            plan = cp.balanced_plan(w, P).plan
            sch = cp.make_schedule(P, m, "ring", plan=plan, needed=cp.needed_chunks(ind, plan))
            for kw in (dict(), dict(piece_vjp=False), dict(overlap_sm_margin=(8, 0)),
                       dict(overlap_sm_margin=4, schedule_hints=True), dict(skip_masked=False)):
                def fwd(q, k, v, ind, plan, co, cl, kw=kw):
                    qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
                    o, lse = cp.context_parallel_attention(
                        qp, kp, vp, ind, plan=plan, mesh=mesh, axis_name="cp", comm="ring",
                        schedule=sch, return_residual=True, implementation=impl, **kw)
                    o, lse = cp.unpermute_tokens(o, plan), cp.unpermute_tokens(lse, plan)
                    return loss_terms(o, lse, co, cl), (o, lse)

                f = jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))
                args = (q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl)
                compare(f"pieces {impl} {name} m={m} {kw}", block(f(*args)), r)
                if kw.get("schedule_hints"):
                    txt = f.lower(*args).as_text()
                    cps = [x for x in txt.splitlines() if "collective_permute" in x]
                    assert cps and all("_scheduling_group_id" in x for x in cps), \
                        "schedule_hints: a collective_permute without a scheduling group"
                    ids = set()
                    for x in txt.splitlines():
                        if "_scheduling_group_id" in x:
                            ids.add(x.split('_scheduling_group_id = "')[1].split('"')[0])
                    assert ids == {"1", "2"}, f"schedule_hints: groups {ids} (want fwd 1, bwd 2)"
        log(f"pieces {impl}: 4 masks x 5 variants exact")
    # argument checks
    try:
        cp.context_parallel_attention(q, k, v, None, plan=cp.dual_chunk_plan(P), mesh=mesh,
                                      comm="ring", overlap_sm_margin=8, implementation="reference")
        raise AssertionError("overlap_sm_margin without a schedule must raise")
    except ValueError:
        pass
    # the scheduled path inside the user's own shard_map (check_vma=True), forward and grads
    ind = single_mask("causal_document")
    plan = cp.balanced_plan(cp.chunk_workloads(ind, 4, tile_q=16, tile_k=16), P).plan
    sch = cp.make_schedule(P, 2, "ring", plan=plan, needed=cp.needed_chunks(ind, plan))
    r = block(reference_fn()(q, k, v, jnp.asarray(ind), co, cl))

    def body(q, k, v, ind, plan):
        return cp.context_parallel_attention(q, k, v, ind, plan=plan, axis_name="cp", comm="ring",
                                             schedule=sch, return_residual=True, implementation=IMPL,
                                             overlap_sm_margin=(8, 0))

    sm = cp.shard_map(body, mesh=mesh, in_specs=(PS(None, "cp"),) * 3 + (PS(), PS()),
                      out_specs=(PS(None, "cp"), PS(None, "cp")))

    def fwd(q, k, v, ind, plan, co, cl):
        qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
        o, lse = sm(qp, kp, vp, ind, plan)
        o, lse = cp.unpermute_tokens(o, plan), cp.unpermute_tokens(lse, plan)
        return loss_terms(o, lse, co, cl), (o, lse)

    got = block(jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))(
        q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
    compare("pieces inside a user shard_map (check_vma=True)", got, r)
    log("pieces inside a user shard_map ok")


def group_compact():
    """Compact pieces of pruned schedules: a chunk slot nobody receives in a piece (slot id -2) is
    left out of that piece. Exact vs one device (out, lse, grads) for masks where such slots exist,
    P = 2 and 4 (fused pieces, autodiff merge, pruned all-gather), and the traced key widths of the
    pieces are the kept slots' only (< m*C for at least one piece)."""
    from jax_flashmask.context_parallel import pieces as pieces_mod

    widths = []
    orig = pieces_mod.piece_attention

    def recording(q, kvs, lbs, cfg):
        widths.append([(int(kv[0].shape[1] if isinstance(kv, (tuple, list)) else kv.shape[2]),
                        int(lb.shape[-1])) for kv, lb in zip(kvs, lbs)])
        return orig(q, kvs, lbs, cfg)

    pieces_mod.piece_attention = recording
    try:
        q, k, v, co, cl = inputs(5)
        ref = reference_fn()
        for P, m, name in ((2, 4, "causal_document"), (4, 2, "causal_document"), (4, 4, "share_question")):
            mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
            ind = single_mask(name)
            r = block(ref(q, k, v, jnp.asarray(ind), co, cl))
            plan = cp.balanced_plan(cp.chunk_workloads(ind, P * m, tile_q=16, tile_k=16), P).plan
            sch = cp.make_schedule(P, m, "ring", plan=plan, needed=cp.needed_chunks(ind, plan))
            dropped = [sum(t == -2 for t in pc.slots) for pc in sch.pieces]
            assert sum(dropped) > 0, f"{name} P={P} m={m}: no slot pruned for all ranks (test needs one)"
            c = S // (P * m)
            for comm, kw in (("ring", dict()), ("ring", dict(piece_vjp=False)), ("allgather", dict())):
                def fwd(q, k, v, ind, plan, co, cl, comm=comm, kw=kw):
                    qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
                    o, lse = cp.context_parallel_attention(
                        qp, kp, vp, ind, plan=plan, mesh=mesh, axis_name="cp", comm=comm,
                        schedule=sch, return_residual=True, implementation=IMPL, **kw)
                    o, lse = cp.unpermute_tokens(o, plan), cp.unpermute_tokens(lse, plan)
                    return loss_terms(o, lse, co, cl), (o, lse)

                widths.clear()
                f = jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))
                got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
                err = compare(f"compact P={P} m={m} {name} {comm} {kw}", got, r)
                if comm == "ring" and not kw:
                    assert widths, "the fused piece path was not traced"
                    want = [(m - d) * c for d in dropped]
                    got_w = [kw_ for kw_, _ in widths[0]]
                    assert got_w == want and all(lw == kw_ for kw_, lw in widths[0]), \
                        f"compact P={P} m={m} {name}: piece key widths {widths[0]}, want {want}"
                    assert min(got_w) < m * c
                log(f"compact P={P} m={m} {name} {comm} {kw}: ok (err {err:.1e}, dropped slots per "
                    f"piece {dropped})")
    finally:
        pieces_mod.piece_attention = orig


def group_passthrough():
    """The skip branches of the fused pieces pass results through (`pieces._pieces`: the LSE merge
    and the dQ sum of a skippable piece happen inside its ``lax.cond``; skipped, the running out /
    lse / dQ are returned as they are). Plans where one rank's remote piece is fully masked (skipped)
    and another rank's is not: out, lse, dq, dk, dv equal one device (reference and xla kernels,
    pruned and dense schedules, P = 2 and a P = 4 chain with f32 intermediates); in bf16 the P = 2
    program equals the same program without the skip (``skip_masked=False``: every piece computed,
    one n-way merge) bit for bit. A skip branch returning zeros instead would fail all of these."""
    q, k, v, co, cl = inputs(6)
    name = "causal_document"
    ind = single_mask(name)
    for P, m, plan in ((2, 2, np.array([[0, 1], [2, 3]])), (4, 1, np.arange(4)[:, None])):
        mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
        need = cp.needed_chunks(ind, plan)
        # rank 0 (the first chunks) needs nothing later (causal): every remote piece is skipped;
        # the last rank needs earlier chunks: at least one remote piece is computed
        assert not need[0][plan[1:].ravel()].any(), need
        assert need[P - 1][plan[:P - 1].ravel()].any(), need
        schedules = [("pruned", cp.make_schedule(P, m, "ring", plan=plan, needed=need)),
                     ("dense", cp.make_schedule(P, m, "ring"))]
        for impl in ("reference", "xla"):
            def ref_fn(q, k, v, ind, co, cl, impl=impl):
                o, lse = jf.attention(q, k, v, ind, return_residual=True, implementation=impl)
                return loss_terms(o, lse, co, cl), (o, lse)

            r = block(jax.jit(jax.value_and_grad(ref_fn, argnums=(0, 1, 2), has_aux=True))(
                q, k, v, jnp.asarray(ind), co, cl))
            for sname, sch in schedules:
                for kw in (dict(), dict(skip_masked=False)):
                    def fwd(q, k, v, ind, plan, co, cl, kw=kw, sch=sch, mesh=mesh, impl=impl):
                        qp, kp, vp = (cp.permute_tokens(x, plan) for x in (q, k, v))
                        o, lse = cp.context_parallel_attention(
                            qp, kp, vp, ind, plan=plan, mesh=mesh, axis_name="cp", comm="ring",
                            schedule=sch, return_residual=True, implementation=impl, **kw)
                        o, lse = cp.unpermute_tokens(o, plan), cp.unpermute_tokens(lse, plan)
                        return loss_terms(o, lse, co, cl), (o, lse)

                    f = jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))
                    got = block(f(q, k, v, jnp.asarray(ind), jnp.asarray(plan), co, cl))
                    err = compare(f"passthrough P={P} m={m} {impl} {sname} {kw}", got, r)
                    log(f"passthrough P={P} m={m} {impl} {sname} {kw}: ok (err {err:.1e})")
    # bf16, P = 2: skipping (pass-through) == computing the fully masked piece and merging it
    P, m, plan = 2, 2, np.array([[0, 1], [2, 3]])
    mesh = Mesh(np.array(jax.devices()[:P]), ("cp",))
    sch = cp.make_schedule(P, m, "ring", plan=plan, needed=cp.needed_chunks(ind, plan))
    qb, kb, vb, cob = (x.astype(jnp.bfloat16) for x in (q, k, v, co))
    outs = []
    for kw in (dict(), dict(skip_masked=False)):
        def fwd(q, k, v, ind, plan, co, cl, kw=kw):
            o, lse = cp.context_parallel_attention(
                q, k, v, ind, plan=plan, mesh=mesh, axis_name="cp", comm="ring", schedule=sch,
                return_residual=True, implementation="xla", **kw)
            return loss_terms(o.astype(jnp.float32), lse, co.astype(jnp.float32), cl), (o, lse)

        f = jax.jit(jax.value_and_grad(fwd, argnums=(0, 1, 2), has_aux=True))
        qp, kp, vp = (cp.permute_tokens(x, plan) for x in (qb, kb, vb))
        outs.append(block(f(qp, kp, vp, jnp.asarray(ind), jnp.asarray(plan), cob, cl)))
    (_, (o1, l1)), g1 = outs[0]
    (_, (o2, l2)), g2 = outs[1]
    assert o1.dtype == jnp.bfloat16 and g1[0].dtype == jnp.bfloat16
    for tag, a, b in (("out", o1, o2), ("lse", l1, l2), ("dq", g1[0], g2[0]), ("dk", g1[1], g2[1]),
                      ("dv", g1[2], g2[2])):
        assert np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)), \
            f"bf16 skip pass-through differs from the computed piece in {tag}"
    log("passthrough bf16 P=2: skip == computed fully masked piece, bit for bit")


GROUPS = {"pieces": group_pieces, "host": group_host, "cp2": lambda: group_cp(2), "cp4": lambda: group_cp(4),
          "cp8": lambda: group_cp(8), "hier": group_hier, "api": group_api,
          "compact": group_compact, "passthrough": group_passthrough}

if __name__ == "__main__":
    for g in sys.argv[1:]:
        GROUPS[g]()
    log("done", jax.__version__)
