"""CPU checks of the backward's deterministic launch order and wait / signal protocol, for the
shipped configurations: the 80-row kernel with device-sized launch groups and key-block order
(configs.BWD_D128_DET; the simulator's "v21", and "v16" = the 80-row kernel without them), the
d = 64 kernel's reordered (nblk, K, B) launch ("v11"), and the pre-pass rules' host twins.

The simulator (tests/det_sim/bwd_det_protocol.py) transcribes flashmask_bwd_kernel's (single-tile scheduler) producer,
consumer warpgroups, dQ writer and skip-marking warp with the kernel's mbarrier parities, and runs
launches with one, two or 132 resident CTAs: a deadlock shows as a CTA that never ends."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = Path(__file__).resolve().parent / "det_sim"
SM90 = ROOT / "cc" / "sm90"


sys.path.insert(0, str(SIM))  # the simulator loads its sibling models itself
import bwd_det_protocol as proto  # noqa: E402
_model = proto._det
CASES = {name: (b, Sq, N, K) for name, b, Sq, N, K in proto.cases()}
# the backward kernels' sources (the parts and the kernels that compose them)
KERNEL_SRC = "\n".join(p.read_text() for p in sorted(SM90.glob("*.cuh")) + sorted(SM90.glob("*.h")))
AUX_SRC = (SM90 / "bwd_aux.cu").read_text()


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
def test_rows80_never_deadlocks(resident):
    """The 80-row kernel (one dQ buffer) with and without the launch groups ("v19": groups without
    reorder, "v21": the shipped deterministic config, "v16": the plain grid) ends on every case in
    deterministic mode with one, two or 132 resident CTAs, and on a causal-blockwise launch whose
    rule picks G = 4 (and which the pre-pass reorders)."""
    for name, (b, Sq, N, K) in list(CASES.items()) + [("blockwise_groups", BLOCKWISE)]:
        for cfg in ("v19", "v16", "v21"):
            r = proto.simulate(b, Sq, N, K, cfg, True, 1, resident)
            assert r["ok"], (name, cfg, resident, r.get("blocked", [])[:3])


def test_launch_groups_default_mode_is_the_plain_grid():
    """In the default mode the launch-group kernel launches the plain (nblk, K, B) grid; both dQ
    modes end."""
    for name, (b, Sq, N, K) in (("det_bitwise_causal", CASES["det_bitwise_causal"]),
                                ("v17_small_docs_groups", CASES["v17_small_docs_groups"]),
                                ("blockwise_groups", BLOCKWISE)):
        P = proto.Problem(b, Sq, N, K, Bm=80)
        assert proto.grid_items(P, 19, False) == proto.grid_items(P, 16, False) == proto.grid_items(P, 5, False)
        for mode in (1, 0):
            assert proto.simulate(b, Sq, N, K, "v19", False, mode)["ok"], name


def test_launch_group_rule():
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


def test_launch_groups_ascending_order_is_a_residency_deadlock():
    """Mutation: variant 19's protocol with key blocks launched ascending deadlocks at 4 resident
    CTAs, ends with all resident (the check sees the order)."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    items = [(x, y, z) for z in range(P.B) for y in range(P.K) for x in range(P.nblk)]
    r = proto.Sim(P, "v19", True, 1, 4, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r
    assert proto.Sim(P, "v19", True, 1, len(items), items=items).run()["ok"]


def test_kernel_source_has_the_launch_groups():
    """The kernel as simulated: BwdDetAuto80 sets kDetGroups on the 80-row lock-step base, the
    launcher runs bwd_det_group80_sm90 with the order, and the device rule has the model's
    threshold."""
    assert re.search(r"struct BwdDetAuto80 : Base \{\s*static constexpr bool kDetGroups = true;\s*"
                     r"static_assert\(Base::kLockstep && Base::kMaskRegs && Base::Bm == 80,", KERNEL_SRC)
    assert re.search(r"a\.det_group = 0;\s*a\.det_perm = 1;\s*a\.sched = p\.meta \+ ml\.sched;\s*"
                     r"e = bwd_det_group80_sm90\(p\.meta, a\.sched, p\.B, p\.Hm, nblk, mblk, p\.Sq, pairs,\s*"
                     r"kDetGroupPairs, true, stream\);", KERNEL_SRC)
    assert "return t.live > 0ull && !det_costarts(t) && 128ull * t.inv >= t.kept;" in AUX_SRC
    assert "constexpr int kDetGroupRows80 = 80;" in AUX_SRC


# --------------------------------------------------------------- the key-block order (80-row kernel)
# In the inverted-tails branch of the rule the pre-pass launches each pair's key blocks in
# ascending kept-tile count (ties: descending key block) and gives the key block at launch
# position i the ordering slot nblk - 1 - i (traits.h BwdDetAuto80, BwdArgs::det_perm; host
# twins: bwd_det_protocol.Problem.order21, grid_slots; bwd_det_model.kept_rank_order_counts).


def test_det_order_rows80():
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


def test_det_order_rows80_summing_in_key_block_order_is_a_residency_deadlock():
    """Mutation: variant 21's launch order with variant 19's summation order (slot = key block)
    deadlocks at one resident CTA on the blockwise launch (the check sees the slots)."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=80)
    items = proto.grid_items(P, 21, True)
    r = proto.Sim(P, "v21", True, 1, 1, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r


# ---------------------------------------------------------------- the key-block order (d = 64)
# The (nblk, K, B) launch of the d = 64 kernel ("v11") takes the same order at 128-row tiles in
# deterministic mode where the tails are inverted (bwd_det_order_sm90; bwd_det_key_block):
# launch position x of a pair holds slot nblk - 1 - x.


@pytest.mark.parametrize("resident", [1, 2, 132])
def test_det_order_d64_never_deadlocks(resident):
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


def test_det_order_d64_summing_in_key_block_order_is_a_residency_deadlock():
    """Mutation: variant 11's reordered launch with the summation order of the key block (slot =
    n) deadlocks at one resident CTA on the blockwise launch."""
    b, Sq, N, K = BLOCKWISE
    P = proto.Problem(b, Sq, N, K, Bm=128)
    items = proto.grid_items(P, 11, True)
    r = proto.Sim(P, "v11", True, 1, 1, items=items).run()
    assert not r["ok"] and r["kind"] == "residency", r


def test_kernel_source_has_the_order():
    """The kernel as simulated: the launch position -> key block through the pre-pass's order only
    when det_perm and sched[2] are set, the writer and the skipped-tile marks on the slot, and the
    pre-pass writes the order only in the inverted branch."""
    assert "if (a.det_perm && __ldg(a.sched + 2))" in KERNEL_SRC
    assert "const int hk = pr % a.K, b = pr / a.K, slot = a.nblk - 1 - r / gs;" in KERNEL_SRC
    assert "bwd_sem_need(a, slot, w)" in KERNEL_SRC
    assert "bwd_mark_skipped<Bm>(a, b, hk, n, slot, lane)" in KERNEL_SRC
    assert "use_order = perm && inverted && nblk <= kDetPermMaxBlocks ? 1 : 0;" in AUX_SRC
    assert "rank += (ku < k || (ku == k && u > n)) ? 1 : 0;" in AUX_SRC
    assert "int rank = nblk - hi;  // the windows above come first" in AUX_SRC


def test_device_rule_constants_match_the_host_twins():
    """bwd_aux.cu's constants of the variant 19 / 21 pre-pass are the host twins' (the rule's
    tile budget, the inverted-tails G, variant 21's order window)."""
    def const(name):
        m = re.search(r"constexpr (?:unsigned|int) %s = (\d+);" % name, AUX_SRC)
        assert m, name
        return int(m.group(1))

    assert const("kDetGroupTileBudget") == _model.TILE_BUDGET19
    assert const("kDetGroupInverted") == _model.INVERTED_G19
    assert const("kDetOrderWindow") == _model.ORDER_WINDOW21
