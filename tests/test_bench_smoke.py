"""CPU checks of the two benchmarks: bench_attention.py's pure parts (ρ, FLOPs, reference, tables,
driver) and cp_bench.py end to end on two host devices.

No GPU and no torch needed: the GPU implementations must come back as 'skipped', never crash.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flashmask import masks as M

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "benchmarks" / "bench_attention.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

ANCHORS = ROOT.parent / "shared" / "anchors" / "h200-2026-11-29.json"


def _dense_masked(sri, causal, S):
    return np.asarray(M.to_dense(jnp.asarray(sri), causal=causal, q_len=S))[0, 0]


def test_mask_names_match_package():
    assert tuple(bench.MASK_NAMES) == tuple(M.BENCHMARK_MASKS)


@pytest.mark.parametrize("S", [512, 640, 700])
def test_tile_sparsity_matches_dense(S):
    """Exact ρ from the vectors equals the brute-force count on the dense mask (S×S, small S)."""
    suite = bench.mask_suite(S, seed=3)
    for name, (sri, causal) in suite.items():
        dense = _dense_masked(sri, causal, S)
        t = bench.TILE
        n = -(-S // t)
        full = 0
        for a in range(n):
            for b in range(n):
                full += bool(dense[a * t : (a + 1) * t, b * t : (b + 1) * t].all())
        bounds = M.canonical_bounds_np(sri, causal=causal, q_len=S)
        assert bench.fully_masked_tiles(bounds, S) == (full, n * n), name
        stats = bench.mask_stats(sri, causal, S)
        assert stats["rho"] == pytest.approx(full / (n * n)), name
        # the kernel's block test is sufficient only: it never skips more than the exact count
        if S % t == 0:
            assert stats["rho_skip"] <= stats["rho"] + 1e-12, name
        assert stats["visible_cells_per_bh"] == pytest.approx(float((~dense).sum())), name


def test_causal_rho_and_anchor_tflops():
    """FLOP convention reproduces the anchors file's FlexAttention figures from its times."""
    S, H, d, B = 8192, 32, 128, 131072 // 8192
    sri, causal = bench.mask_suite(S, seed=0)["causal"]
    st = bench.mask_stats(sri, causal, S)
    assert st["rho"] == pytest.approx(2016 / 4096)
    f = bench.attention_flops(B, H, S, S, d, st["rho"], st["visible_cells_per_bh"])
    assert f["fwd_flops"] == pytest.approx(4 * B * H * S * S * d * (1 - 2016 / 4096))
    assert f["fwd_flops_exact"] == pytest.approx(4 * B * H * d * S * (S + 1) / 2)
    # anchors (flex, causal, 8K): fwd 21.826 ms -> 409.312, fwd+bwd 83.486 ms -> bwd 362.206, total 374.521
    t = bench.tflops_from_times(f["fwd_flops"], 21.826, 83.486)
    assert t["fwd"] == pytest.approx(409.312, rel=2e-3)
    assert t["bwd"] == pytest.approx(362.206, rel=2e-3)
    assert t["total"] == pytest.approx(374.521, rel=2e-3)
    full = bench.attention_flops(B, H, S, S, d, 0.0, S * S)
    t = bench.tflops_from_times(full["fwd_flops"], 40.99, 155.598)
    assert (t["fwd"], t["bwd"], t["total"]) == pytest.approx((429.181, 383.747, 395.716), rel=1e-3)
    assert bench.tflops_from_times(1e12, None, None) == {"fwd": None, "bwd": None, "total": None, "bwd_ms": None}
    assert bench.tflops_from_times(1e12, 5.0, 4.0)["bwd"] is None  # fwd+bwd faster than fwd: no bwd


@pytest.mark.skipif(not ANCHORS.exists(), reason="anchors file not beside the checkout")
def test_anchor_rho_for_deterministic_masks():
    raw = json.loads(ANCHORS.read_text())["flexattention_torch_2_11"]
    for S in (8192, 32768):
        suite = bench.mask_suite(S, seed=0)
        for name in ("full", "causal", "sliding_window", "random_eviction"):
            sri, causal = suite[name]
            assert bench.mask_stats(sri, causal, S)["rho"] == pytest.approx(raw[str(S)][name]["rho"], abs=1e-3)


def test_reference_rows_match_jax():
    """The float32 row reference (output and dQ) equals dense XLA attention and its gradient."""
    S, hc, d = 256, 2, 32
    sri, causal = bench.mask_suite(S, seed=1)["causal_document"]
    bounds = M.canonical_bounds_np(sri, causal=causal, q_len=S)[0, 0]
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((S, hc, d), dtype=np.float32) for _ in range(4))
    rows = bench.check_rows(S, 40, rng)
    out, dq = bench.reference_rows(q, k, v, do, bounds, rows, 1 / math.sqrt(d))
    allowed = ~_dense_masked(sri, causal, S)

    def attn(q_):
        return jax.nn.dot_product_attention(q_[None], k[None], v[None], mask=allowed[None, None])[0]

    ref_out, vjp = jax.vjp(attn, jnp.asarray(q))
    (ref_dq,) = vjp(jnp.asarray(do))
    np.testing.assert_allclose(out, np.asarray(ref_out)[rows], atol=2e-5)
    np.testing.assert_allclose(dq, np.asarray(ref_dq)[rows], atol=2e-5)


def test_reference_rows_fully_masked_row_is_zero():
    S, d = 128, 16
    bounds = np.stack([np.full(S, S), np.full(S, S), np.full(S, 5), np.full(S, 6)])  # row 5: all masked
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((S, 1, d), dtype=np.float32) for _ in range(4))
    out, dq = bench.reference_rows(q, k, v, do, bounds, np.array([4, 5, 6]), 0.25)
    assert np.all(out[1] == 0) and np.all(dq[1] == 0)
    assert np.all(np.isfinite(out)) and np.abs(out[0]).sum() > 0


def test_compare_flags_nan():
    ref = np.ones((3, 2), np.float32)
    assert bench.compare(ref + 1e-3, ref)["finite"]
    bad = ref.copy()
    bad[0, 0] = np.nan
    c = bench.compare(bad, ref)
    assert not c["finite"] and math.isnan(c["rel"])


def test_plan_and_quick_args():
    a = bench.parse_args([])
    assert bench.plan_cases(a) == [(8192, 128), (8192, 64), (8192, 256), (32768, 128), (32768, 64),
                                   (32768, 256), (131072, 128)]
    q = bench.parse_args(["--quick", "--masks", "full,causal"])
    assert q.seqlens == [8192] and q.masks == ["full", "causal"] and bench.plan_cases(q) == [(8192, 128)]
    assert bench.parse_args(["--masks", "all"]).masks == list(bench.MASK_NAMES)
    with pytest.raises(SystemExit):
        bench.parse_args(["--impls", "ours,magic"])


def test_driver_on_cpu_skips_gpu_impls(tmp_path):
    """End to end on CPU: every GPU implementation is recorded as skipped; files are written."""
    argv = ["--seqlens", "512", "--extra-head-dims", "", "--heads", "2", "--total-tokens", "1024",
            "--masks", "causal,document", "--impls", "cudnn,flex", "--out-dir", str(tmp_path),
            "--out-prefix", "cpu"]
    doc = bench.run(bench.parse_args(argv))
    assert {(r["mask"], r["impl"]) for r in doc["results"]} == {
        ("causal", "cudnn"), ("causal", "flex"), ("document", "cudnn"), ("document", "flex")}
    assert all(r["status"] == "skipped" and r["reason"] for r in doc["results"])
    saved = json.loads((tmp_path / "cpu.json").read_text())
    assert saved["results"][0]["rho"] == pytest.approx(doc["results"][0]["rho"])
    assert "| causal |" in (tmp_path / "cpu.md").read_text()


def test_render_with_results(tmp_path):
    """Markdown and PNG from a results document with timed rows (as the GPU run writes them)."""
    row = dict(mask="causal", S=8192, d=128, B=16, H=32, impl="flex", causal=True, D=1, rho=0.4921875,
               rho_skip=0.4921875, visible_frac=0.5, visible_cells_per_bh=8192 * 8193 / 2,
               fwd_flops=8.93e12, fwd_flops_exact=8.8e12, status="ok", fwd_ms=21.8, fwdbwd_ms=83.5,
               fwd_tflops=409.0, bwd_tflops=362.0, total_tflops=374.0, fwd_tflops_exact=404.0,
               err_out=3e-3, err_dq=5e-3, check="pass")
    doc = {"meta": {"date": "2026-11-29", "env": {"device": "NVIDIA H200"}}, "results": [
        row, {**row, "impl": "ours", "status": "skipped", "reason": "not built | yet"}]}
    anchors = bench.load_anchors(ANCHORS) if ANCHORS.exists() else {}
    md = bench.render_markdown(doc, anchors)
    assert "| causal | 0.492 | flex | 21.80 |" in md and "not built / yet" in md
    if anchors:
        assert "409.3 / 362.2" in md
    pytest.importorskip("matplotlib")
    assert bench.render_png(doc, tmp_path / "x.png") and (tmp_path / "x.png").stat().st_size > 0


class _FakeImpl:
    """Stands in for a GPU implementation: returns the reference itself, fixed times."""

    name = framework = "fake"

    def __init__(self, fail_phase=None, exc=NotImplementedError, wrong=False):
        self.fail_phase, self.exc, self.wrong = fail_phase, exc, wrong

    def inputs(self, S, d, B, H, seed):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal((S, H, d), dtype=np.float32) for _ in range(4)]

    def host_slice(self, inputs, hc):
        return [x[:, :hc] for x in inputs]

    def check(self, case, inputs, ref, phase):
        if phase == self.fail_phase:
            raise self.exc("no " + phase)
        want = ref["out"] if phase == "fwd" else ref["dq"]
        return bench.compare(want + (1.0 if self.wrong else 0.0), want)

    def time(self, case, inputs, phase):
        return [2.5, 2.0, 1.5] if phase == "fwd" else [7.0]


@pytest.mark.parametrize(
    "impl, status, bwd_status",
    [
        (_FakeImpl(), "ok", None),
        (_FakeImpl(wrong=True), "wrong", None),
        (_FakeImpl(fail_phase="bwd"), "ok", "skipped"),
        (_FakeImpl(fail_phase="bwd", exc=RuntimeError), "ok", "error"),
        (_FakeImpl(fail_phase="fwd"), "skipped", None),
        (_FakeImpl(fail_phase="fwd", exc=RuntimeError), "error", None),
    ],
)
def test_run_one_phases(impl, status, bwd_status):
    S, d = 256, 16
    sri, causal = bench.mask_suite(S, seed=0)["causal"]
    case = bench.Case("causal", S, d, 2, 2, sri, causal)
    ctx = {"inputs": {}, "hosts": {}, "refs": {}, "rows": bench.check_rows(S, 16, np.random.default_rng(0))}
    res = bench.run_one(impl, case, ctx, bench.parse_args([]))
    assert res["status"] == status and res.get("bwd_status") == bwd_status, res
    if status in ("ok", "wrong"):
        assert res["fwd_ms"] == 2.0 and res["fwd_tflops"] == pytest.approx(case.flops["fwd_flops"] / 2e-3 / 1e12)
        assert res["fwd_samples_ms"] == [2.5, 2.0, 1.5]  # the median is the figure, the samples are kept
        assert res["check"] == ("FAIL" if impl.wrong else "pass")
        if bwd_status is None:
            assert res["fwdbwd_ms"] == 7.0 and res["bwd_ms"] == 5.0 and res["err_dq"] is not None
        else:
            assert res["fwdbwd_ms"] is None and res["bwd_tflops"] is None and "no bwd" in res["bwd_reason"]
    else:
        assert "no fwd" in res["reason"]


def test_render_merges_runs(tmp_path):
    base = dict(S=8192, d=128, B=16, H=32, causal=True, D=1, rho=0.5, status="skipped", reason="x")
    a = {"meta": {"date": "d"}, "results": [dict(base, mask="causal", impl="flex"), dict(base, mask="full", impl="flex")]}
    b = {"meta": {"date": "d"}, "results": [dict(base, mask="causal", impl="flex", reason="newer"),
                                            dict(base, S=32768, mask="causal", impl="flex")]}
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    assert bench.main(["--render", str(fa), str(fb), "--out-dir", str(tmp_path), "--out-prefix", "m", "--no-plot"]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert [(r["S"], r["mask"], r["reason"]) for r in merged["results"]] == [
        (8192, "causal", "newer"), (8192, "full", "x"), (32768, "causal", "x")]
    assert "## S = 32768" in (tmp_path / "m.md").read_text()


def test_cp_bench_dry_run_on_two_host_devices(tmp_path):
    """benchmarks/cp_bench.py end to end on 2 CPU devices: every comm mode agrees with one device
    (outputs and dq/dk/dv), the probes run, and the JSON/markdown come out."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cp_bench.py"), "--tokens-per-device", "256",
           "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--masks", "causal_document",
           "--chunks-per-rank", "2", "--iters", "1", "--implementation", "xla",
           "--out-dir", str(tmp_path), "--out-prefix", "cp"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "cp.json").read_text())["rows"]
    cp_rows = [r for r in rows if r["comm"] != "one-gpu"]
    assert {r["comm"] for r in cp_rows} == {"allgather", "ring", "ring-pruned"}
    for r in cp_rows:
        assert "error" not in r, r
        assert r["out_rel_err"] < 2e-2 and r["grad_rel_err"] < 3e-2, r
        assert 0.0 <= r["fwdbwd_hidden"] <= 1.0 and r["fwd_compute_ms"] > 0, r
    assert "| causal_document |" in (tmp_path / "cp.md").read_text()


def test_cp_bench_two_level_on_four_host_devices(tmp_path):
    """--nodes 2 splits 4 CPU devices into two groups: the hierarchical modes agree with one device,
    and the cross-node traffic per rank falls from the relay ring's (P-1)*m chunk slots to the
    hierarchy's (nodes-1)*m, and further when pruned. Without --nodes they are refused."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cp_bench.py"), "--tokens-per-device", "128",
           "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--masks", "causal_document",
           "--chunks-per-rank", "2", "--iters", "1", "--implementation", "xla", "--no-probes",
           "--out-dir", str(tmp_path), "--out-prefix", "cp"]
    bad = subprocess.run(cmd + ["--comms", "hierarchical"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "needs --nodes" in bad.stderr
    proc = subprocess.run(cmd + ["--nodes", "2", "--comms", "ring,hierarchical,hierarchical-pruned"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["comm"]: r for r in json.loads((tmp_path / "cp.json").read_text())["rows"]}
    slot_mib = 2 * (4 * 128 // 8) * 1 * 32 * 2 / 2**20  # one chunk slot of K and V, bf16
    for comm in ("ring", "hierarchical", "hierarchical-pruned"):
        r = rows[comm]
        assert "error" not in r, r
        assert r["out_rel_err"] < 2e-2 and r["grad_rel_err"] < 3e-2, r
    assert rows["ring"]["cross_node_MiB_per_rank"] == pytest.approx(3 * 2 * slot_mib)
    assert rows["hierarchical"]["cross_node_MiB_per_rank"] == pytest.approx(1 * 2 * slot_mib)
    assert rows["hierarchical-pruned"]["cross_node_MiB_per_rank"] <= rows["hierarchical"]["cross_node_MiB_per_rank"]
    assert rows["hierarchical-pruned"]["recv_MiB_per_rank"] < rows["hierarchical"]["recv_MiB_per_rank"]
    assert "split into 2 groups" in (tmp_path / "cp.md").read_text()


def test_render_names_the_commands(tmp_path):
    """The markdown carries the command of each run it merged, from the arguments in the JSON."""
    base = dict(S=1024, d=128, B=128, H=32, causal=True, D=1, rho=0.5, status="skipped", reason="x",
                mask="causal", impl="ours")
    docs = []
    for i, S in enumerate((1024, 2048)):
        args = vars(bench.parse_args(["--seqlens", str(S), "--masks", "all", "--impls", "ours,flex"]))
        docs.append({"meta": {"date": "d", "args": args}, "results": [dict(base, S=S)]})
        (tmp_path / f"r{i}.json").write_text(json.dumps(docs[-1]))
    assert bench.main(["--render", str(tmp_path / "r0.json"), str(tmp_path / "r1.json"),
                       "--out-dir", str(tmp_path), "--out-prefix", "m", "--no-plot"]) == 0
    md = (tmp_path / "m.md").read_text()
    for S in (1024, 2048):
        assert f"bench_attention.py --impls=ours,flex --masks all --seqlens={S} " in md
    again = bench.parse_args(md.split("bench_attention.py ")[1].split("\n")[0].split())
    assert again.seqlens == [1024] and list(again.masks) == list(bench.MASK_NAMES)


def test_render_prints_the_meta_note():
    """A results document's note (what its commands don't say) follows the commands; none, no line."""
    row = dict(S=1024, d=128, B=128, H=32, causal=True, D=1, rho=0.5, status="skipped", reason="x",
               mask="causal", impl="ours")
    doc = {"meta": {"date": "d", "note": "The second run ended at its timeout."}, "results": [row]}
    md = bench.render_markdown(doc)
    assert md.index("```\n\nThe second run ended at its timeout.\n") < md.index("## S = 1024")
    del doc["meta"]["note"]
    assert "timeout" not in bench.render_markdown(doc)


def test_fitted_block_size_meets_fa4_tile_refusals():
    fit = bench.fitted_block_size
    multiple = "Block sparsity requires sparse_block_size[{}] to be a multiple of tile_n={}."
    match = "Block sparsity requires sparse_block_size[{}]={} to match tile_n={}."
    assert fit((128, 128), multiple.format(1, 80)) == (128, 80)
    assert fit((128, 160), match.format(1, 160, 80)) == (128, 80)
    assert fit((128, 128), multiple.format(0, 192)) == (192, 128)
    assert fit((128, 160), multiple.format(1, 80)) is None  # already a multiple: the error is real
    assert fit((128, 80), match.format(1, 80, 80)) is None
    assert fit((128, 128), "some other ValueError") is None
