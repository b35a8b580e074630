"""CPU checks of the backward's deterministic launch order and wait / signal protocol (variants 5,
14, 15; benchmarks/bwd_det_protocol.py, benchmarks/NOTES_bwd_det.md "The variant 15 hang").

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
