"""CPU checks of benchmarks/bench_attention.py's pure parts: ρ, FLOPs, reference, tables, driver.

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
        return 2.0 if phase == "fwd" else 7.0


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


def test_bwd_walk_check():
    """benchmarks/bwd_mask_model.py --walk-check, smaller: the O(1) tile walk of bwd_find_kept (the
    only walk of every backward kernel) returns the old tile-by-tile scan's tile for every start
    tile of every key block, at (Bm, Bn) = (64, 128), (128, 128) and (64, 64); and the check
    catches a dropped third jump and off-by-one range ends."""
    spec = importlib.util.spec_from_file_location("bwd_mask_model", ROOT / "benchmarks" / "bwd_mask_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.walk_check(sizes=(2048,), rand_cases=90) == 0


def test_bwd_rot_walk_check():
    """benchmarks/bwd_mask_model.py --rot-walk-check: bwd_group_skips_none (which key blocks of
    variants 16 / 19 / 21 walk clocked) agrees with the tile classification on the benchmark masks
    and random three-head groups, the clocked walk visits every tile of every head once, tiles >= r
    then tiles < r; and the check catches a strict range test and a walk that never changes head."""
    spec = importlib.util.spec_from_file_location("bwd_mask_model", ROOT / "benchmarks" / "bwd_mask_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.rot_walk_check() == 0


def test_bwd_mask_bits_check():
    """benchmarks/bwd_mask_model.py --mask-check: variants 10 / 11's element-mask bits (the thread's
    query columns below each bound, bmsk.clamp) equal variant 5 / 7's per-element test, for
    Bm 64 / 128, every col_base, int32 extremes, empty / reversed ranges and folded key columns >= Sk;
    and the check catches a wrong count and a width without max(., 0)."""
    spec = importlib.util.spec_from_file_location("bwd_mask_model", ROOT / "benchmarks" / "bwd_mask_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.mask_check(cases=5000) == 0


def test_bwd_det_model():
    """benchmarks/bwd_det_model.py (NOTES_bwd_det.md): variant 14's grid decoding is a bijection
    with every key block above an item at a lower grid position (deadlock-free), and on a small
    run of the timeline model the interleaved launch groups cut the deterministic cost on the
    document mask, as the notes state."""
    spec = importlib.util.spec_from_file_location("bwd_det_model", ROOT / "benchmarks" / "bwd_det_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.order_check() == 0
    base = model.simulate("document", False, "x", 4)
    v5 = model.simulate("document", True, "x", 4)
    v14 = model.simulate("document", True, "g4", 4)
    assert v14 < v5 and base <= v14 * 1.05, (base, v5, v14)


def test_bwd_lockstep_model_runs():
    """benchmarks/bwd_lockstep_model.py (the timeline model of NOTES_bwd_full.md): both consumer
    schedules run to completion without a barrier deadlock, neither beats the tensor floor of
    2,560 cycles per tile, and at the default parameters the lock-step schedule (variant 12) is
    faster than the ping-pong (variant 5), as the notes state."""
    spec = importlib.util.spec_from_file_location("bwd_lockstep_model",
                                                  ROOT / "benchmarks" / "bwd_lockstep_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    kw = dict(ss_slow=1.2, rs_slow=1.0, start=40, done=150, ipc=0.27)
    c5, _ = model.per_tile(model.prog_v5, 8, **kw)
    c12, _ = model.per_tile(model.prog_v12, 8, **kw)
    assert 2560 < c12 < c5, (c5, c12)


def test_gscan_walk_check():
    """benchmarks/gscan_walk.py --check, smaller: forward variant 7's group walk (the kernel's, with
    the merged first step) yields variant 3's (block, partial) sequence and, per query tile, at most
    variant 3's dependent metadata steps before the first block, between blocks and after the last;
    with the group level off it is variant 3's walk step for step."""
    spec = importlib.util.spec_from_file_location("gscan_walk", ROOT / "benchmarks" / "gscan_walk.py")
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    assert walk.check(rand_cases=40, seqs=(4096,)) == 0


def test_dev_table(tmp_path):
    """benchmarks/dev_table.py: one row per (S, d, mask), one column per implementation, repeated
    samples of one implementation joined in order, '–' where an implementation has no row."""
    spec = importlib.util.spec_from_file_location("dev_table", ROOT / "benchmarks" / "dev_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [dict(impl="a", S=8, d=64, mask="full", tflops_fm=1.4), dict(impl="b", S=8, d=64, mask="full", tflops_fm=2.0),
            dict(impl="a", S=8, d=64, mask="full", tflops_fm=3.0), dict(impl="a", S=8, d=64, mask="causal", tflops_fm=5.0)]
    p = tmp_path / "x.json"
    p.write_text(json.dumps(dict(device="cpu", rows=rows)))
    lines = mod.table(p).splitlines()
    assert lines[2] == "| S | d | mask | a | b |"
    assert lines[4] == "| 8 | 64 | full | 1 / 3 | 2 |"
    assert lines[5] == "| 8 | 64 | causal | 5 | – |"


def test_bwd_breakdown_model():
    """benchmarks/bwd_breakdown.py (NOTES_bwd_short.md) on the CPU: the bytes of the backward's
    per-call passes, and the session-7 fit (K0 + per-tile) reproducing the protocol's backward
    times; the device part is not run here."""
    spec = importlib.util.spec_from_file_location("bwd_breakdown", ROOT / "benchmarks" / "bwd_breakdown.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pieces = {p["name"].split(":")[0].split(" ")[0]: p for p in mod.piece_bytes(8192)}
    # fp32 dQ accumulator [B, N, sq_pad, d], sq_pad = 8240 at 80-row tiles
    assert pieces["cudaMemsetAsync"]["write"] == 16 * 32 * 8240 * 128 * 4
    assert pieces["bwd_convert80"]["read"] == pieces["cudaMemsetAsync"]["write"]
    assert pieces["bwd_convert80"]["write"] == 131072 * 32 * 128 * 2
    assert 1.8 < mod.passes_ms(8192) < 2.0 and 1.8 < mod.passes_ms(32768) < 2.0
    r = mod.fit_protocol()
    assert abs(r["K0"] - mod.FIT["K0"]) < 5 and abs(r["t_tile"] - mod.FIT["t_tile"]) < 1e-3 and r["rms"] < 0.01
    m = mod.model(8192, "sliding_window")
    assert abs(m["total"] - 12.18) / 12.18 < 0.02 and abs(m["ctas_per_sm"] - 32768 / 132) < 1e-9


def test_gpu_timing_scripts_parse_their_arguments():
    """The GPU-only timing scripts (variant_ab.py imports power_probe.py's sampler) import and
    parse --help on a CPU machine; their timed parts need the H200."""
    import subprocess
    import sys

    for script in ("variant_ab.py", "power_probe.py", "kernel_timing.py"):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (script, proc.stderr[-2000:])


def test_module_ab_stages_and_runs_each_module_in_its_own_tree(tmp_path):
    """benchmarks/module_ab.sh: `stage` packs a revision's tree and an extension; `run` unpacks
    each module once and runs bwd_timing.py in that module's tree, with NAME@VAR=VALUE's variable
    set (here `--help`: the timed part needs the H200)."""
    import os
    import shutil
    import subprocess
    import sys
    import sysconfig

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    fake_so = tmp_path / "ext.so"
    fake_so.write_bytes(b"not an extension")
    stage, out = tmp_path / "stage", tmp_path / "out"
    script = str(ROOT / "benchmarks" / "module_ab.sh")
    subprocess.run(["bash", script, "stage", "M", "HEAD", str(fake_so), str(stage)], cwd=ROOT, check=True)
    assert (stage / "tree_M.tgz").stat().st_size > 1000 and (stage / "M.so.gz").exists()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               JFM_AB_ROOT=str(tmp_path / "mods"))
    proc = subprocess.run(["bash", script, "run", str(stage), str(out), "M", "M@JFM_PROBE=1", "--", "--help"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "M (#1) rc=0" in proc.stdout and "M@JFM_PROBE=1 (#2) rc=0" in proc.stdout, proc.stdout
    log = (out / "ab.log").read_text()
    assert log.count("usage: bwd_timing.py") == 2, log[-2000:]
    # unpacked once, the extension under the interpreter's suffix, next to the staged tree's code
    pkg = tmp_path / "mods" / "M" / "jax_flashmask"
    assert (pkg / "_cuda.py").exists() and [p.name for p in pkg.glob("_flashmask_cuda*")] == [
        "_flashmask_cuda" + sysconfig.get_config_var("EXT_SUFFIX")]


def _benchmark_script(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ on sys.path for its sibling imports)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_ab_renders_module_labels(tmp_path):
    """variant_ab.py --render: runs of two builds with the same variant number are told apart by
    module (stored in a gathered file, or --labels per file) and compared per variant; the
    session-18 O-epilogue table comes out of its JSON (main vs oepi, 32K full -2.9 %)."""
    import json

    vab = _benchmark_script("variant_ab")
    gathered = ROOT / "benchmarks" / "results" / "h200_2026-12-03s18_fwd_oepi_ab.json"
    text = vab.table_md(vab.load_runs([str(gathered)]))
    row = [ln for ln in text.splitlines() if "| 32768 | 128 | full | 11 | oepi" in ln]
    assert len(row) == 1 and "| 612.7 / 611.4 | -2.9% |" in row[0], text

    def run(tf):
        return {"S": 8192, "d": 128, "checks": {},
                "phases": [{"mask": "full", "variant": 11, "tflops": tf, "mhz": 1700.0}]}
    paths = []
    for i, tf in enumerate((500.0, 550.0, 510.0, 560.0)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(run(tf)))
    runs = vab.load_runs([str(p) for p in paths], ["a", "b", "a", "b"])
    text = vab.table_md(runs)
    a = [ln for ln in text.splitlines() if "| 11 | a |" in ln]
    b = [ln for ln in text.splitlines() if "| 11 | b |" in ln]
    assert len(a) == len(b) == 1
    assert "| 505.0 | 500.0 / 510.0 | +0.0% |" in a[0] and "| 555.0 | 550.0 / 560.0 | +9.9% |" in b[0]
    with pytest.raises(SystemExit):
        vab.load_runs([str(paths[0])], ["a", "b"])


def test_timing_suite_window():
    """kernel_timing.py / bwd_timing.py --window: the sliding window's width replaced, the other
    masks the benchmark suite's."""

    kt = _benchmark_script("kernel_timing")
    default, fixed = kt.timing_suite(4096, 1), kt.timing_suite(4096, 1, 1000)
    assert int(np.asarray(default["sliding_window"].startend_row_indices)[0, 0, 0, 0]) == 4096 // 16 + 1
    assert int(np.asarray(fixed["sliding_window"].startend_row_indices)[0, 0, 0, 0]) == 1001
    assert fixed.keys() == default.keys() and fixed["causal_document"] is not default["causal_document"]
    np.testing.assert_array_equal(np.asarray(fixed["document"].startend_row_indices),
                                  np.asarray(default["document"].startend_row_indices))


def test_fixed_cost_of_the_32k_protocol():
    """fixed_cost.py on session 18's 32K protocol file: the full mask has no fixed cost by
    construction, and the figures benchmarks/NOTES.md (session 19) quotes come out (forward
    sliding_window F = 4.66 us per query tile, backward 6.91 us per CTA, 6.0 % passes)."""
    import json

    fc = _benchmark_script("fixed_cost")
    doc = json.loads((ROOT / "benchmarks" / "results" / "h200_2026-12-03s18_fwdbwd_32k.json").read_text())
    rows = {(r["direction"], r["mask"]): r for r in fc.fixed_costs(doc, {"fwd": 0.35, "bwd": 0.17}, 1.4)}
    assert abs(rows[("fwd", "full")]["F_us"]) < 1e-9 and abs(rows[("bwd", "full")]["F_us"]) < 1e-9
    assert rows[("fwd", "full")]["kept_per_item"] == 256 and rows[("fwd", "full")]["partial_per_item"] == 0
    sw_f, sw_b = rows[("fwd", "sliding_window")], rows[("bwd", "sliding_window")]
    assert abs(sw_f["F_us"] - 4.66) < 0.01 and abs(sw_f["kept_per_item"] - 16.47) < 0.01
    assert abs(sw_b["F_us"] - 6.91) < 0.01 and abs(sw_b["passes_share"] - 0.060) < 0.001


def test_flex_ratios_without_the_passes():
    """fixed_cost.py --flex-ratios on session 20's 8K protocol: the backward ratios to Flex that
    benchmarks/NOTES.md (session 23) quotes, as measured and without the convert (0.785 ms) and
    prep (0.543 ms) passes."""
    import json

    fc = _benchmark_script("fixed_cost")
    doc = json.loads((ROOT / "benchmarks" / "results" / "h200_2026-12-03s20_fwdbwd_8k.json").read_text())
    rows = {r["mask"]: r for r in fc.flex_ratios(doc, 0.785, 0.543)}
    assert len(rows) == 12
    sw, pld = rows["sliding_window"], rows["prefix_lm_document"]
    assert (round(sw["ratio"], 3), round(sw["ratio_no_convert"], 3), round(sw["ratio_no_passes"], 3)) == (1.190, 1.289, 1.368)
    assert (round(pld["ratio"], 3), round(pld["ratio_no_convert"], 3)) == (1.394, 1.457)


def test_ncu_sass_split_of_the_32k_forward(tmp_path):
    """ncu_sass_split.py on session 20's ncu export of the 32K sliding_window forward: the
    mainloop's class (516 instructions run 1,013,760 times, 56.1 % of the samples) and the
    per-tile epilogue region come out as benchmarks/NOTES.md (session 20) quotes them; and a tiny
    hand-made export checks the grouping itself (a run ends where the count changes)."""
    ns = _benchmark_script("ncu_sass_split")
    s = ns.split(*ns.load(str(ROOT / "benchmarks" / "results" / "ncu_2026-12-03s20_fwd11_sw32k_sass.csv.gz")))
    assert s["total"] == 199242
    samples, n = s["classes"][1013760]
    assert n == 516 and abs(samples / s["total"] - 0.561) < 0.001
    epi = [r for r in s["runs"] if r["count"] == 65536 and r["ops"]["STG.E.128"] > 0]
    assert [(r["first"], r["last"], r["ops"]["SHFL.BFLY"]) for r in epi] == [(2758, 2985, 16), (2987, 3106, 16)]

    head = ["Address", "Source", ns.SAMPLES, ns.EXECUTED, "stall_wait", "stall_wait (Not Issued)"]
    rows = [["0x0", "  FADD R1, R2, R3", "3", "10", "2", "2"],
            ["0x10", "@P0 BRA 0x0", "1", "10", "1", "1"],
            ["0x20", "  EXIT", "4", "2", "0", "0"]]
    path = tmp_path / "k_sass.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [["Kernel Name", "k"], head, *rows]))
    t = ns.split(*ns.load(str(path)))
    assert t["total"] == 8 and t["classes"] == {10: [4, 2], 2: [4, 1]}
    assert [(r["first"], r["last"], r["samples"]) for r in t["runs"]] == [(0, 1, 4), (2, 2, 4)]
    assert t["runs"][0]["ops"] == {"FADD": 1, "BRA": 1} and t["runs"][0]["stalls"]["wait"] == 3
    assert "| 0-1 | 10 | 50.00 % |" in ns.report(t, 0.0, 5)


def test_bwd_ab_table_pairs_two_kernels_of_one_file(tmp_path, monkeypatch):
    """bwd_ab_table.py --impls: B_IMPL's rows are compared with A_IMPL's of the same (S, mask)."""
    tab = _benchmark_script("bwd_ab_table")
    rows = [dict(impl=i, S=8192, mask=m, ms=ms) for i, m, ms in
            [("v16", "full", 10.0), ("v23", "full", 8.0), ("v16", "causal", 5.0), ("v23", "causal", 5.0)]]
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "ab.json"
    monkeypatch.setattr("sys.argv", ["x", "--a", str(f), "--b", str(f), "--impls", "v16", "v23",
                                     "--json", str(out)])
    tab.main()
    got = {r["mask"]: r["gain_pct"] for r in json.loads(out.read_text())["rows"]}
    assert got == pytest.approx({"full": 25.0, "causal": 0.0})


def test_ncu_metrics_reads_session_22s_reports(tmp_path, monkeypatch):
    """ncu_metrics.py on session 22's two reports of the full-mask backward: the first kernel's
    metrics in fixed units (Tbyte -> GB, s -> ms), one row per run, and the markdown table."""
    nm = _benchmark_script("ncu_metrics")
    res = ROOT / "benchmarks" / "results"
    big = nm.read((res / "h200_2026-12-03s22_ncu_bwd_full_131072.txt").read_text())
    assert big["dram__bytes_read.sum"] == pytest.approx((1300.0, "GB"))
    assert big["gpu__time_duration.sum"] == pytest.approx((1360.0, "ms"))
    assert big["lts__t_sector_hit_rate.pct"] == pytest.approx((69.89, "%"))
    small = nm.read((res / "h200_2026-12-03s22_ncu_bwd_full_32768.txt").read_text())
    assert small["dram__bytes_write.sum"] == pytest.approx((11.35, "GB"))
    assert small["sm__cycles_elapsed.avg.per_second"] == pytest.approx((1.58, "GHz"))
    md = tmp_path / "t.md"
    monkeypatch.setattr("sys.argv", ["ncu_metrics.py", "--runs",
                                     f"128K (B=1)={res / 'h200_2026-12-03s22_ncu_bwd_full_131072.txt'}",
                                     f"32K={res / 'h200_2026-12-03s22_ncu_bwd_full_32768.txt'}",
                                     "--md", str(md), "--json", str(tmp_path / "t.json")])
    assert nm.main() == 0
    rows = md.read_text().splitlines()
    assert rows[-2].startswith("| 128K (B=1) | 1300 | 698.8 | 1360 |") and rows[-1].startswith("| 32K | 16.4 |")
