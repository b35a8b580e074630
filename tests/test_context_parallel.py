"""Context parallelism: every check runs in a fresh subprocess (tests/_cp_worker.py).

``--xla_force_host_platform_device_count=8`` only takes effect if it is set before jax is
imported, and other test modules import jax first; so each group runs in its own interpreter
with the flag in its environment. The worker calls ``block_until_ready`` after every distributed
call (SPEC §6). Set ``CP_TEST_IMPL`` to choose the local attention implementation (default
"reference").

Groups:
  host  localization vs a dense slice, needed-chunk tables, balancer vs brute force, layout,
        schedule delivery, bytes-sent figures for the twelve masks
  cp2 / cp4 / cp8
        outputs, lse and dq/dk/dv equal single-device attention for the twelve masks (batch 2,
        two per-kv-head mask heads, GQA) with dual-chunk and balanced plans, comm = allgather and
        ring (scan), plus mask-pruned static schedules (ring and allgather)
  hier  a 2x4 (node, local) mesh: hierarchical comm for the twelve masks, allgather over both
        axes, a pruned hierarchical schedule
  pieces the scheduled ring's custom-VJP piece merge: exact vs one device (reference and xla
        kernels, m = 2 and 4), the autodiff merge, per-piece SM margins, scheduling hints,
        inside a user shard_map
  api   a raw causal FlashMask, mask=None, and a call inside the user's own shard_map
        (check_vma=True)
"""

from __future__ import annotations

import json

import pytest

from _subprocess import run_worker


def _run(group: str, timeout: int = 600) -> str:
    return run_worker("_cp_worker.py", group, timeout=timeout)


def test_host_localization_balancer_bytes():
    out = _run("host")
    line = next(x for x in out.splitlines() if x.startswith("BYTES "))
    table = json.loads(line[len("BYTES "):])
    assert set(table) >= {"full", "causal", "sliding_window", "causal_document", "document",
                          "share_question", "global_sliding_window", "causal_blockwise",
                          "prefix_lm_document", "prefix_lm_causal", "qk_sparse", "random_eviction"}


@pytest.mark.parametrize("group", ["cp2", "cp4", "cp8"])
def test_matches_single_device(group):
    _run(group)


def test_hierarchical_2x4():
    _run("hier")


def test_api_modes():
    _run("api")


def test_scheduled_pieces_custom_vjp():
    _run("pieces")
