"""CPU checks of the backward's deterministic launch order and wait / signal protocol (variants 5,
13, 14, 15, 17; benchmarks/bwd_det_protocol.py, benchmarks/NOTES_bwd_det.md "The variant 15 hang").

The simulation transcribes flashmask_bwd_pp_kernel's producer, consumer warpgroups (ping-pong
sections on named barriers), dQ writer and skip-marking warp, with the kernel's mbarrier parities,
and runs the launches of the GPU tests that hung on the H200 (bwd_timing.py --small's first case,
test_deterministic_bitwise[causal-15]) and the shapes of the deterministic / det_groups tests. The
variant 15 code that hung (pipelined writer, last section in one turn) deadlocks here; the fixed
kernel and variants 5 / 14 end in every mode, also with a single resident CTA."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bwd_det_protocol", ROOT / "benchmarks" / "bwd_det_protocol.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


proto = _load()
CASES = {name: (b, Sq, N, K) for name, b, Sq, N, K in proto.cases()}


def test_fixed_kernel_never_deadlocks():
    """Every case, variants 5 / 14 / 15, both dQ modes and deterministic: every CTA ends."""
    assert proto.protocol_check() == []


@pytest.mark.parametrize("name", ["small_d128", "det_bitwise_causal", "det_groups_doc_many_pairs",
                                  "det_groups_one_pair"])
def test_v15_as_committed_deadlocks_inside_a_cta(name):
    """The check that would have caught the hang: variant 15's pipelined writer frees tile k-1's dQ
    buffer only after tile k's dQ is stored, while consumer warpgroup 0 stores the last two tiles
    in one turn (waiting for tile t-2's buffer) and warpgroup 1 stores tile t-1 only after that
    turn: an intra-CTA cycle in every CTA with three or more kept tiles."""
    b, Sq, N, K = CASES[name]
    r = proto.simulate(b, Sq, N, K, "v15_hang", True, 1)
    assert not r["ok"] and r["kind"] == "intra-CTA", r
    assert any("put_dq" in line and "last section" in line and "dq_empty" in line for line in r["blocked"])
    assert any("bar.sync 2 (last section" in line for line in r["blocked"])
    # the default mode of the same kernel (variant 5's writer) is fine
    for mode in (1, 0):
        assert proto.simulate(b, Sq, N, K, "v15_hang", False, mode)["ok"]


def test_short_walks_do_not_deadlock_even_as_committed():
    """One or two kept tiles per CTA: the last section's second put_dq waits for a fresh buffer."""
    for name in ("one_tile", "two_tiles"):
        b, Sq, N, K = CASES[name]
        assert proto.simulate(b, Sq, N, K, "v15_hang", True, 1)["ok"]


@pytest.mark.parametrize("cfg", ["v5", "v14", "v15"])
def test_one_resident_cta_suffices(cfg):
    """Deterministic CTAs wait only for CTAs at lower grid positions: the launch completes with one
    CTA resident at a time (the H200 holds 132)."""
    for name in ("det_bitwise_causal", "det_groups_doc_many_pairs", "det_groups_random_gqa_ragged"):
        b, Sq, N, K = CASES[name]
        assert proto.simulate(b, Sq, N, K, cfg, True, 1, resident=1)["ok"], name


def test_ascending_order_is_a_residency_deadlock():
    """Mutation: key blocks launched ascending (the waits point to later CTAs) deadlocks once a chain
    is longer than the resident CTAs, and the simulation says so."""
    b, Sq, N, K = CASES["det_bitwise_causal"]
    P = proto.Problem(b, Sq, N, K)
    items = [(x, y, z) for z in range(P.B) for y in range(P.K) for x in range(P.nblk)]
    r = proto.Sim(P, "v5", True, 1, 4, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r
    assert proto.Sim(P, "v5", True, 1, 132, items=items).run()["ok"]


def test_grid_decoding_matches_the_kernel_grid():
    """Variants 14 / 15 deterministic: the 1-D order covers every (key block, kv head, batch) once,
    G = min(pairs, 8); variant 5: (nblk, K, B) with key block nblk - 1 - x."""
    b, Sq, N, K = CASES["det_groups_doc_many_pairs"]
    P = proto.Problem(b, Sq, N, K)
    for v in (5, 14, 15):
        items = proto.grid_items(P, v, True)
        assert sorted(items) == sorted((n, hk, bb) for n in range(P.nblk) for hk in range(P.K) for bb in range(P.B))
    assert proto.grid_items(P, 5, True)[0] == (P.nblk - 1, 0, 0)
    assert proto.grid_items(P, 14, True)[:2] == [(P.nblk - 1, 0, 0), (P.nblk - 1, 1, 0)]
    assert proto.grid_items(P, 14, False) == proto.grid_items(P, 5, False)


def test_kernel_source_has_the_split_last_section():
    """The fix the simulation's v15 models: in the kernel's last consumer section, variant 15 in
    deterministic mode stores tile t in a turn of its own when t >= 2."""
    src = (ROOT / "cc" / "sm90" / "bwd_kernel.cuh").read_text()
    m = re.search(r"if constexpr \(T::kDetPipe\) \{[^{}]*?if \(u == 0 && a\.deterministic && t >= 2\) \{\s*"
                  r"turn_end\(false\);\s*turn_begin\(\);", src)
    assert m, "variant 15's split last section not found in bwd_kernel.cuh"


# ------------------------------------------------------------------------------------ variant 17
# Variant 13's lock-step consumers (dQ of tile t stored in iteration t) + variant 15's pipelined
# writer + variant 14's launch groups with G chosen on the device (bwd_det_group_kernel; host twin
# Problem.auto_group / bwd_det_model.auto_group). benchmarks/NOTES_bwd_det.md "Variant 17".

_model = proto._det


@pytest.mark.parametrize("resident", [1, 2, 132])
def test_v17_never_deadlocks(resident):
    """Variant 17 (and the lock-step v13 with variant 5's writer) end on every case in
    deterministic mode with one, two or 132 resident CTAs: no intra-CTA cycle between the
    pipelined writer's late buffer release and the lock-step consumers, and every wait points to a
    lower grid position."""
    for name, (b, Sq, N, K) in CASES.items():
        for cfg in ("v17", "v13"):
            r = proto.simulate(b, Sq, N, K, cfg, True, 1, resident)
            assert r["ok"], (name, cfg, resident, r.get("blocked", [])[:3])


def test_v17_default_mode_is_variant13():
    """In the default mode variant 17 is variant 13: variant 5's (nblk, K, B) grid, both dQ modes end."""
    for name in ("det_bitwise_causal", "v17_small_docs_groups", "det_groups_random_gqa_ragged"):
        b, Sq, N, K = CASES[name]
        P = proto.Problem(b, Sq, N, K)
        assert proto.grid_items(P, 17, False) == proto.grid_items(P, 5, False)
        for mode in (1, 0):
            assert proto.simulate(b, Sq, N, K, "v17", False, mode)["ok"], name


def test_v17_group_rule():
    """bwd_det_group_kernel's rule (host twin): G = 1 unless most key blocks start their walk at the
    tile where the key block above starts (co-started chains: documents), then min(8, pairs,
    mblk / mean kept tiles). The 32K suite: full / causal / causal_document G = 1 (variant 5's
    launch order, one head's L2 working set), document G = 8; the protocol cases: many short
    documents with 9 pairs G = 8 (two launch groups), the causal / full / random cases G = 1."""
    assert [_model.suite_group(m) for m in ("full", "causal", "causal_document", "document")] == [1, 1, 1, 8]
    P = proto.Problem(*CASES["v17_small_docs_groups"])
    assert P.auto_group() == 8 and P.K * P.B == 9
    items = proto.grid_items(P, 17, True)
    assert sorted(items) == sorted((n, hk, bb) for n in range(P.nblk) for hk in range(P.K) for bb in range(P.B))
    assert items[:9] == [(P.nblk - 1, p % 3, p // 3) for p in range(8)] + [(P.nblk - 2, 0, 0)]
    for name in ("det_bitwise_causal", "det_bitwise_full", "det_groups_one_pair"):
        P = proto.Problem(*CASES[name])
        assert P.auto_group() == 1, name
        assert proto.grid_items(P, 17, True) == proto.grid_items(P, 5, True), name
    # twin of the kernel's arithmetic: no co-start -> 1; co-start with long walks -> 1; short -> cap
    assert _model.auto_group([4, 4, 4, 4], [0, 1, 2, 3], 4, 8, 16) == 1
    assert _model.auto_group([8, 8, 8, 8], [0, 0, 0, 0], 4, 8, 16) == 1
    assert _model.auto_group([1, 1, 1, 1], [2, 2, 2, 2], 4, 64, 16) == 8
    assert _model.auto_group([1, 1, 1, 1], [2, 2, 2, 2], 4, 64, 3) == 3
    assert _model.auto_group([0, 0, 0, 0], [9, 9, 9, 9], 4, 8, 16) == 1


def test_v17_ascending_order_is_a_residency_deadlock():
    """Mutation: variant 17's protocol with key blocks launched ascending deadlocks at 4 resident
    CTAs (the waits point to later CTAs), ends with all resident: the check sees the order."""
    b, Sq, N, K = CASES["v17_small_docs_groups"]
    P = proto.Problem(b, Sq, N, K)
    items = [(x, y, z) for z in range(P.B) for y in range(P.K) for x in range(P.nblk)]
    r = proto.Sim(P, "v17", True, 1, 4, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r
    assert proto.Sim(P, "v17", True, 1, len(items), items=items).run()["ok"]


def test_kernel_source_has_variant17():
    """The kernel as simulated: BwdDetAuto sets kDetGroups / kDetPipe on a lock-step, mask-in-
    registers base, and bwd_pp_item reads G from sched[1] when the launcher passes 0."""
    src = (ROOT / "cc" / "sm90" / "bwd_kernel.cuh").read_text()
    assert re.search(r"struct BwdDetAuto : Base \{\s*static constexpr bool kDetGroups = true;\s*"
                     r"static constexpr bool kDetPipe = true;\s*static constexpr bool kDetAuto = true;\s*"
                     r"static_assert\(Base::kLockstep && Base::kMaskRegs", src)
    assert re.search(r"if constexpr \(T::kDetAuto\) \{\s*if \(G <= 0\) G = __ldg\(a\.sched \+ 1\);", src)
    assert "BwdDetAuto<BwdLockstep<BwdMaskRegs<BwdTraits<Elem, D>>>>" in src
    aux = (ROOT / "cc" / "sm90" / "bwd_aux.cu").read_text()
    assert "sched[1] = (int)max(1ull, min(g, (unsigned long long)cap));" in aux


# ------------------------------------------------------------------------------------ variant 19
# Variant 16 (lock-step consumers, 80-row tiles, one dQ smem buffer, variant 5's serial writer)
# with variant 14's launch groups in deterministic mode, G chosen on the device by
# bwd_det_group80_kernel (host twins: bwd_det_protocol.Problem.auto_group19 and
# bwd_det_model.auto_group19). benchmarks/NOTES_detwalk.md.


def _blockwise(B, docs):
    """causal_blockwise bounds [B, 1, 4, S] (jax_flashmask.masks, canonical, causal)."""
    import numpy as np
    from jax_flashmask.masks import canonical_bounds_np, causal_blockwise

    m = causal_blockwise(docs, batch=B)
    S = int(sum(docs))
    return np.asarray(canonical_bounds_np(np.asarray(m.startend_row_indices, np.int32), causal=True,
                                          q_len=S), np.int32)


BLOCKWISE = (_blockwise(3, [700, 260, 900, 180, 1100, 460]), 3600, 3, 3)  # 9 pairs


@pytest.mark.parametrize("resident", [1, 2, 132])
def test_v19_never_deadlocks(resident):
    """Variants 19, 16 and 21 (one dQ buffer, 80-row tiles) end on every case in deterministic mode
    with one, two or 132 resident CTAs, and on a causal-blockwise launch whose rule picks G = 4
    (and which 21 reorders)."""
    for name, (b, Sq, N, K) in list(CASES.items()) + [("blockwise_groups", BLOCKWISE)]:
        for cfg in ("v19", "v16", "v21"):
            r = proto.simulate(b, Sq, N, K, cfg, True, 1, resident)
            assert r["ok"], (name, cfg, resident, r.get("blocked", [])[:3])


def test_v19_default_mode_is_variant16():
    """In the default mode variant 19 is variant 16: the (nblk, K, B) grid, both dQ modes end."""
    for name, (b, Sq, N, K) in (("det_bitwise_causal", CASES["det_bitwise_causal"]),
                                ("v17_small_docs_groups", CASES["v17_small_docs_groups"]),
                                ("blockwise_groups", BLOCKWISE)):
        P = proto.Problem(b, Sq, N, K, Bm=80)
        assert proto.grid_items(P, 19, False) == proto.grid_items(P, 16, False) == proto.grid_items(P, 5, False)
        for mode in (1, 0):
            assert proto.simulate(b, Sq, N, K, "v19", False, mode)["ok"], name


def test_v19_group_rule():
    """bwd_det_group80_kernel's rule (host twin) on the 32K suite at 80-row tiles: document 6,
    global_sliding_window 5 (co-started chains: variant 17's rule, 8 and 7, capped by the L2
    budget of 300 tiles over a mean walk of 50 / 54 tiles), causal_blockwise 4 (inverted tails:
    the top key block of a document ends on the last document's rows with a shorter walk than the
    key block above it), every other mask 1 (variant 16's launch order)."""
    got = {m: _model.suite_group19(m)[0] for m in _model.MEASURED16}
    want = {m: 1 for m in _model.MEASURED16}
    want.update(document=6, global_sliding_window=5, causal_blockwise=4)
    assert got == want
    # protocol twin == model twin on the blockwise case; the grouped grid is a bijection with every
    # key block above an item (all it can wait for) at a lower grid position
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    assert P.auto_group19() == 4 and P.K * P.B == 9
    items = proto.grid_items(P, 19, True)
    pos = {it: x for x, it in enumerate(items)}
    assert len(pos) == len(items) == P.nblk * P.K * P.B
    assert all(pos[(n + 1, hk, bb)] < x for (n, hk, bb), x in pos.items() if n + 1 < P.nblk)
    for name in ("det_bitwise_causal", "det_bitwise_full", "det_groups_one_pair"):
        P = proto.Problem(*CASES[name], Bm=80)
        assert P.auto_group19() == 1, name
        assert proto.grid_items(P, 19, True) == proto.grid_items(P, 16, True), name
    # the arithmetic: (kept, live, co-starting, inverted tiles, items, mblk, pairs)
    assert _model.auto_group19(100, 10, 4, 0, 10, 40, 16) == 1          # nothing
    assert _model.auto_group19(100, 10, 5, 0, 10, 40, 16) == 8          # co-start: the cap
    assert _model.auto_group19(100, 10, 5, 0, 10, 19, 16) == 1          # co-start over > half the tiles
    assert _model.auto_group19(100, 10, 0, 1, 10, 40, 16) == 4          # inverted >= kept / 128
    assert _model.auto_group19(1000, 4, 4, 0, 4, 1000, 16) == 1         # co-start 8, L2: 300 * 4 / 1000
    assert _model.auto_group19(1000, 10, 0, 8, 10, 200, 16) == 3        # inverted 4, L2: 300 * 10 / 1000
    assert _model.auto_group19(200, 10, 0, 1, 10, 40, 16) == 1          # inverted < kept / 128
    assert _model.auto_group19(100, 10, 5, 0, 10, 40, 3) == 3           # clamped to the pairs
    assert _model.auto_group19(0, 0, 0, 0, 10, 40, 16) == 1             # nothing kept


def test_v19_ascending_order_is_a_residency_deadlock():
    """Mutation: variant 19's protocol with key blocks launched ascending deadlocks at 4 resident
    CTAs, ends with all resident (the check sees the order)."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    items = [(x, y, z) for z in range(P.B) for y in range(P.K) for x in range(P.nblk)]
    r = proto.Sim(P, "v19", True, 1, 4, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r
    assert proto.Sim(P, "v19", True, 1, len(items), items=items).run()["ok"]


def test_kernel_source_has_variant19():
    """The kernel as simulated: BwdDetAuto80 sets kDetGroups / kDetAuto (not kDetPipe: variant 16's
    serial writer) on variant 16's base, the launcher runs bwd_det_group80_sm90 for 80-row tiles,
    variant 19 dispatches to it in the 80-row units, and the device rule has the model's threshold."""
    src = (ROOT / "cc" / "sm90" / "bwd_kernel.cuh").read_text()
    assert re.search(r"struct BwdDetAuto80 : Base \{\s*static constexpr bool kDetGroups = true;\s*"
                     r"static constexpr bool kDetAuto = true;[^\n]*\n\s*static_assert\(Base::kLockstep && "
                     r"Base::kMaskRegs && Base::Bm == 80 && !Base::kDetPipe", src)
    assert re.search(r"if constexpr \(T::Bm == 80\)[^\n]*\n\s*e = bwd_det_group80_sm90\(", src)
    assert ("if (p.variant == 19 || p.variant == 21) return "
            "launch_bwd_impl<BwdDetAuto80<BwdRows80<Elem, 128>>>") in src
    aux = (ROOT / "cc" / "sm90" / "bwd_aux.cu").read_text()
    assert "return t.live > 0ull && !det_costarts(t) && 128ull * t.inv >= t.kept;" in aux
    assert "constexpr int kDetGroupRows80 = 80;" in aux
    ffi = (ROOT / "cc" / "ffi" / "bwd_handler.cc").read_text()
    assert "variant == 19" in ffi


# ------------------------------------------------------------------------------------ variant 21
# Variant 19 whose pre-pass, in the inverted-tails branch of the rule, launches each pair's key
# blocks in ascending kept-tile count (ties: descending key block) and gives the key block at
# launch position i the ordering slot nblk - 1 - i (bwd_kernel.cuh BwdDetAuto80 / det_perm;
# host twins: bwd_det_protocol.Problem.order21, grid_slots; bwd_det_model.kept_rank_order_counts).


def test_v21_order():
    """The reordered grid: on the blockwise launch the order is a real permutation (not descending),
    ascending in kept tiles; every (pair, slot) occurs once and every higher slot of a pair (all a
    CTA can wait for) sits at a lower grid position. Masks without inverted tails keep variant
    19's grid (dQ bitwise 19's there)."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    order = P.order21()
    assert order is not None and set(order) == {(bb, 0) for bb in range(P.B)}
    counts = P._stats19()[4]
    for key, o in order.items():
        assert sorted(o) == list(range(P.nblk)) and o != list(range(P.nblk - 1, -1, -1))
        c = [counts[key][n] for n in o]
        assert c == sorted(c)
    slots = proto.grid_slots(P, 21, True)
    pos = {(s, hk, bb): x for x, (n, hk, bb, s) in enumerate(slots)}
    assert len(pos) == len(slots) == P.nblk * P.K * P.B
    assert len({it[:3] for it in slots}) == len(slots)
    assert all(pos[(s + 1, hk, bb)] < x for (s, hk, bb), x in pos.items() if s + 1 < P.nblk)
    for name, (b2, Sq2, N2, K2) in CASES.items():
        P2 = proto.Problem(b2, Sq2, N2, K2, Bm=80)
        assert P2.order21() is None, name
        assert proto.grid_slots(P2, 21, True) == proto.grid_slots(P2, 19, True), name
    assert _model.kept_rank_order_counts([3, 1, 3, 0, 1]) == [3, 4, 1, 2, 0]
    # windows of 3 key blocks, the highest first, each sorted: {3, 4, 5} then {0, 1, 2}
    assert _model.kept_rank_order_counts([1, 3, 0, 2, 5, 4], window=3) == [3, 5, 4, 2, 0, 1]
    assert _model.rule19_branch(100, 10, 0, 1) == "inverted"
    assert _model.rule19_branch(100, 10, 5, 1) == "costart"
    assert _model.rule19_branch(200, 10, 0, 1) == "none"


def test_v21_summing_in_key_block_order_is_a_residency_deadlock():
    """Mutation: variant 21's launch order with variant 19's summation order (slot = key block)
    deadlocks at one resident CTA on the blockwise launch (the check sees the slots)."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    items = proto.grid_items(P, 21, True)
    r = proto.Sim(P, "v21", True, 1, 1, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r


# ------------------------------------------------------------------------- variants 7 / 11 (d = 64)
# Since session 25 the (nblk, K, B) launch of variants 7 / 11 takes variant 21's order at 128-row
# tiles in deterministic mode where the tails are inverted (bwd_det_order_sm90; bwd_det_key_block):
# launch position x of a pair holds slot nblk - 1 - x.


@pytest.mark.parametrize("resident", [1, 2, 132])
def test_v11_order_never_deadlocks(resident):
    """Variant 11 (d = 64, 128-row tiles) in deterministic mode ends on every case with one, two or
    132 resident CTAs, and on the blockwise launch, which its order permutes (not descending), with
    every higher slot of a pair at a lower grid position."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=128)
    order = P.order21()
    assert order is not None
    assert all(sorted(o) == list(range(P.nblk)) and o != list(range(P.nblk - 1, -1, -1))
               for o in order.values())
    slots = proto.grid_slots(P, 11, True)
    pos = {(s, hk, bb): x for x, (n, hk, bb, s) in enumerate(slots)}
    assert len(pos) == len(slots) == P.nblk * P.K * P.B
    assert all(pos[(s + 1, hk, bb)] < x for (s, hk, bb), x in pos.items() if s + 1 < P.nblk)
    for name, (b2, Sq2, N2, K2) in list(CASES.items()) + [("blockwise", BLOCKWISE)]:
        r = proto.simulate(b2, Sq2, N2, K2, "v11", True, 1, resident)
        assert r["ok"], (name, resident, r.get("blocked", [])[:3])


def test_v11_summing_in_key_block_order_is_a_residency_deadlock():
    """Mutation: variant 11's reordered launch with the summation order of the key block (slot =
    n) deadlocks at one resident CTA on the blockwise launch."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=128)
    items = proto.grid_items(P, 11, True)
    r = proto.Sim(P, "v11", True, 1, 1, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r


def test_kernel_source_has_variant21():
    """The kernel as simulated: the launch position -> key block through the pre-pass's order only
    when det_perm and sched[2] are set, the writer and the skipped-tile marks on the slot, the
    pre-pass writes the order only in the inverted branch, and the FFI accepts 21."""
    src = (ROOT / "cc" / "sm90" / "bwd_kernel.cuh").read_text()
    assert "if (a.det_perm && __ldg(a.sched + 2))" in src
    assert "const int hk = pr % a.K, b = pr / a.K, slot = a.nblk - 1 - r / gs;" in src
    assert "bwd_sem_need(a, slot, w)" in src and "bwd_mark_skipped<Bm>(a, b, hk, n, slot, lane)" in src
    assert "const bool perm = T::Bm == 80 && p.variant == 21;" in src
    aux = (ROOT / "cc" / "sm90" / "bwd_aux.cu").read_text()
    assert "use_order = perm && inverted && nblk <= kDetPermMaxBlocks ? 1 : 0;" in aux
    assert "rank += (ku < k || (ku == k && u > n)) ? 1 : 0;" in aux
    assert "int rank = nblk - hi;  // the windows above come first" in aux
    ffi = (ROOT / "cc" / "ffi" / "bwd_handler.cc").read_text()
    assert "variant == 21" in ffi


def test_device_rule_constants_match_the_host_twins():
    """bwd_aux.cu's constants of the variant 19 / 21 pre-pass are the host twins' (the rule's
    tile budget, the inverted-tails G, variant 21's order window)."""
    aux = (ROOT / "cc" / "sm90" / "bwd_aux.cu").read_text()

    def const(name):
        m = re.search(r"constexpr (?:unsigned|int) %s = (\d+);" % name, aux)
        assert m, name
        return int(m.group(1))

    assert const("kDetGroupTileBudget") == _model.TILE_BUDGET19
    assert const("kDetGroupInverted") == _model.INVERTED_G19
    assert const("kDetOrderWindow") == _model.ORDER_WINDOW21
