"""The Hopper backend's config table, extension loading and argument checks (no GPU needed)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jax_flashmask as jf
from jax_flashmask.backends import cuda
from jax_flashmask.backends.cuda import _extension, configs

ROOT = Path(__file__).resolve().parents[1]


def test_registration_failure_is_reported(monkeypatch):
    """_extension.load starts the backends before registering the FFI targets, so that a
    registration the platform rejects (handlers built against another XLA FFI API) raises there
    and is reported by unavailable_reason, instead of being queued, logged at plugin start and
    failing every call later. Checked with a stand-in extension module and a rejecting register."""
    calls = []
    fake = types.ModuleType("jax_flashmask._flashmask_cuda")
    fake.registrations = lambda: {"jfm_target": object()}

    def reject(name, capsule, platform):
        calls.append(("register", name, platform))
        raise RuntimeError("handler's API version (0.5) is incompatible")

    real_devices = jax.devices
    monkeypatch.setitem(sys.modules, "jax_flashmask._flashmask_cuda", fake)
    monkeypatch.setattr(jf, "_flashmask_cuda", fake, raising=False)  # an extension imported before
    monkeypatch.setattr(jax, "devices", lambda *a: calls.append(("devices",)) or real_devices(*a))
    monkeypatch.setattr(jax.ffi, "register_ffi_target", reject)
    monkeypatch.setattr(_extension, "_state", {})
    assert not cuda.is_available()
    assert "registering the FFI targets failed" in cuda.unavailable_reason()
    assert "API version" in cuda.unavailable_reason()
    assert calls[:2] == [("devices",), ("register", "jfm_target", "CUDA")]
    assert cuda.compiled_configs() == frozenset()


def test_unsupported_options_are_named():
    """The kernels' limits are checked in Python (no GPU needed), before anything is lowered."""
    with pytest.raises(NotImplementedError, match="head dims"):
        cuda.check_supported((1, 8, 2, 96), jnp.bfloat16, 96)
    with pytest.raises(NotImplementedError, match="bfloat16 or float16"):
        cuda.check_supported((1, 8, 2, 128), jnp.float32, 128)
    cuda.check_supported((1, 8, 2, 128), jnp.bfloat16, 128)  # supported: no error
    with pytest.raises(ValueError, match="structure must be one of"):
        configs.forward_config(128, "dense")
    with pytest.raises(NotImplementedError, match="head dims"):
        configs.backward_config(96)
    q = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    b = jnp.zeros((1, 1, 4, 8), jnp.int32)
    for kw, match in ((dict(sm_margin=-1), "sm_margin must be >= 0"),
                      (dict(sm_margin=1.5), "sm_margin must be an int"),
                      (dict(scale=0.0), "scale must be a finite number > 0")):
        with pytest.raises(ValueError, match=match):
            cuda.forward(q, q, q, b, **{"scale": 0.1, **kw})
    with pytest.raises(ValueError, match="deterministic must be a bool"):
        cuda.backward(q, q, q, b, q, jnp.zeros((1, 8, 2)), q, scale=0.1, deterministic=1)
    with pytest.raises(ValueError, match="ForwardConfig for head dim 64"):
        cuda.run_forward(configs.FWD_D128, q, q, q, b, scale=0.1)


def test_config_table():
    """Which kernel each call gets: the shipped configurations, one table row per key."""
    fwd = {(d, s): configs.forward_config(d, s) for d in (64, 128, 256) for s in configs.STRUCTURES}
    capped = {configs.forward_config(d, s, soft_cap=True) for d in (64, 128, 256)
              for s in configs.STRUCTURES}
    assert set(fwd.values()) | capped == set(configs.FORWARD_CONFIGS)
    # the soft cap: the general kernel of the head dim with the cap, for every structure (at d = 64
    # on two consumer warpgroups: the three-warpgroup tile spills with the tanh)
    assert capped == {dataclasses.replace(fwd[d, "general"], soft_cap=True) for d in (128, 256)} | {
        dataclasses.replace(fwd[64, "general"], consumer_warpgroups=2, soft_cap=True)}
    assert all(fwd[64, s] == configs.ForwardConfig(64, 128, 3, group_walk=True, mask_bits=True)
               for s in configs.STRUCTURES)
    assert all(fwd[128, s] == configs.ForwardConfig(128, 128, 2, group_walk=True, mask_bits=True)
               for s in configs.STRUCTURES)
    assert fwd[256, "full"] == configs.ForwardConfig(256, 80)
    assert fwd[256, "causal"] == configs.ForwardConfig(256, 80, paired_tiles=True)
    assert fwd[256, "general"] == configs.ForwardConfig(256, 64, group_walk=True, mask_bits=True)
    bwd = {(d, det, m): configs.backward_config(d, det, m)
           for d in (64, 128, 256) for det in (False, True) for m in (0, 8)}
    capped = {(d, det, m): configs.backward_config(d, det, m, soft_cap=True)
              for d in (64, 128, 256) for det in (False, True) for m in (0, 8)}
    assert set(bwd.values()) | set(capped.values()) == set(configs.BACKWARD_CONFIGS)
    # the soft cap: the default (non-deterministic, no margin) kernel with the cap, for every mode
    assert all(c == dataclasses.replace(bwd[k[0], False, 0], soft_cap=True) for k, c in capped.items())
    assert bwd[64, False, 0] == bwd[64, True, 0] == configs.BackwardConfig(64, 128, 128, mask_regs=True)
    assert bwd[128, False, 0] == configs.BackwardConfig(128, 80, 128, mask_regs=True, lockstep=True)
    assert bwd[128, True, 0] == configs.BackwardConfig(128, 80, 128, mask_regs=True, lockstep=True,
                                                       det_launch_groups=True)
    for d in (64, 128):  # a margin needs the persistent kernel
        for det in (False, True):
            assert bwd[d, det, 8] == configs.BackwardConfig(d, 64, 128, persistent=True)
    assert {bwd[256, det, m] for det in (False, True) for m in (0, 8)} == {
        configs.BackwardConfig(256, 64, 64)}
    # every row gives a reason that points into docs/decisions.md
    for key, (cfg, reason) in {**configs.FORWARD_TABLE, **configs.BACKWARD_TABLE}.items():
        assert re.search(r"docs/decisions\.md#[a-z0-9-]+$", reason), key
    names = [c.name for c in configs.FORWARD_CONFIGS + configs.BACKWARD_CONFIGS]
    assert len(set(names)) == len(names)
    assert all(configs.config_by_name(n).name == n for n in names)
    with pytest.raises(ValueError, match="unknown kernel config"):
        configs.config_by_name("fwd_d128_bn176_wg2")


def test_workspace_sizes():
    """The forward's workspace (metadata, tile counter, group metadata, unseen-column words) and
    the backward's metadata words at each config's key-block size (the last two terms: the
    unseen-column words and the query tiles' empty-row flags, N = 8 heads of Sq = 200 rows)."""
    assert configs.FWD_D256_BN80.workspace_words(2, 3, 1000) == 2 * 3 * 8 * 13 + 32 + 2 * 3 * 8 * 13
    assert configs.FWD_D128.workspace_words(2, 3, 1000) == 2 * (2 * 3 * 8 * 8 + 32) + 2 * 3 * 8 * 8
    assert configs.BWD_D256.meta_words(1, 2, 4, 130, 8, 200) == (
        2 * 8 * 3 + 4 + 3 + 2 * 3 + 4 + 2 * 8 * 3 + 8 * 4)  # 64-row tiles: 4
    assert configs.BWD_D128.meta_words(1, 2, 4, 130, 8, 200) == (
        2 * 8 * 2 + 4 + 2 + 2 * 2 + 4 + 2 * 8 * 2 + 8 * 3)  # 80-row tiles: 3


def test_backward_workspace_shapes():
    """The backward's workspaces as the FFI call allocates them: Sq padded to the config's query
    tile, ordering bits only in deterministic mode."""
    ws = configs.BWD_D128_DET.workspace_shapes(1, 200, 300, 4, 2, 1, deterministic=True)
    assert ws == {"dq_accum": (1, 4, 240, 128), "rowstats": (2, 1, 4, 240),
                  "meta": (configs.BWD_D128_DET.meta_words(1, 1, 2, 300, 4, 200),), "dq_sem": (1, 4, 3, 1)}
    assert configs.BWD_D64.workspace_shapes(2, 130, 130, 2, 1, 1, deterministic=False)["dq_sem"] == (1,)
    assert configs.BWD_D256.workspace_shapes(1, 64, 64 * 33, 1, 1, 1, True)["dq_sem"] == (1, 1, 1, 2)


def test_backward_calls_cover_the_table():
    """Every backward configuration is reached by some call of the table, and a margin is only
    passed on to the persistent grid (the compute-sanitizer driver runs exactly these calls)."""
    calls = [c for d in configs.HEAD_DIMS for cap in (False, True) for c in configs.backward_calls(d, cap)]
    assert {cfg for cfg, _, _ in calls} == set(configs.BACKWARD_CONFIGS)
    assert all(cfg.persistent for cfg, _, margin in calls if margin)
    assert configs.backward_calls(128) == [
        (configs.BWD_D128, False, False), (configs.BWD_D128_DET, True, False),
        (configs.BWD_D128_PERSISTENT, False, True), (configs.BWD_D128_PERSISTENT, True, True)]
    assert configs.backward_calls(256, soft_cap=True) == [
        (configs.BWD_D256_SOFTCAP, False, False), (configs.BWD_D256_SOFTCAP, True, False)]
    assert len(calls) == len(set(calls))


def test_generated_files_are_current():
    """cc/sm90/instantiations/ is what cc/generate_kernels.py writes from the config list."""
    r = subprocess.run([sys.executable, str(ROOT / "cc" / "generate_kernels.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    units = sorted(p.name for p in (ROOT / "cc" / "sm90" / "instantiations").glob("*.cu"))
    # a soft-cap config shares the unit of its twin without the cap
    plain = [c for c in configs.FORWARD_CONFIGS + configs.BACKWARD_CONFIGS if not c.soft_cap]
    assert len(units) == 2 * len(plain)


def test_library_code_has_no_switches_or_variant_numbers():
    """No environment switches and no numbered kernel variants in the kernels or the backend."""
    files = [p for p in (ROOT / "cc").rglob("*") if p.suffix in (".cu", ".cuh", ".h", ".cc")]
    files += list((ROOT / "jax_flashmask" / "backends" / "cuda").glob("*.py"))
    for p in files:
        text = p.read_text()
        assert "getenv" not in text and "os.environ" not in text, p
        assert not re.search(r"\bvariants? \d", text, re.IGNORECASE), p


def test_backward_falls_back_where_no_kernel_is_compiled(monkeypatch):
    """A configuration missing from the build (or no extension) runs the portable backward."""
    portable = pytest.importorskip("jax_flashmask.backends.portable")
    seen = []
    monkeypatch.setattr(portable, "backward", lambda *a, **kw: seen.append(kw) or "portable")
    q = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    b = jnp.zeros((1, 1, 4, 8), jnp.int32)
    monkeypatch.setattr(_extension, "compiled_configs", lambda: frozenset())
    assert cuda.backward(q, q, q, b, q, jnp.zeros((1, 8, 2)), q, scale=0.1,
                         deterministic=True) == "portable"
    assert seen == [{"scale": 0.1, "deterministic": True, "logits_soft_cap": None}]


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan"), float("inf")])
def test_scale_must_be_positive(scale):
    # checked before the extension loads, so this runs without a GPU too
    q = jnp.zeros((1, 16, 2, 64), jnp.bfloat16)
    bounds = jnp.zeros((1, 1, 4, 16), jnp.int32)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        cuda.forward(q, q, q, bounds, scale=scale)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        cuda.run_backward(configs.BWD_D64, q, q, q, bounds, q, jnp.zeros((1, 16, 2)), q, scale=scale)


def test_ffi_calls_carry_the_config(monkeypatch):
    """Lowered (no GPU, a stand-in extension): the custom calls name the table's config as a
    string attribute and size the workspaces from it."""
    monkeypatch.setattr(_extension, "load", lambda: (types.SimpleNamespace(), ""))
    monkeypatch.setattr(_extension, "compiled_configs",
                        lambda: frozenset(c.name for c in configs.FORWARD_CONFIGS + configs.BACKWARD_CONFIGS))
    q = jnp.zeros((1, 300, 4, 256), jnp.bfloat16)
    b = jnp.zeros((1, 1, 4, 300), jnp.int32)
    lse = jnp.zeros((1, 300, 4), jnp.float32)
    fwd = jax.jit(lambda q, b: cuda.forward(q, q, q, b, scale=0.1, structure="causal", sm_margin=3))
    hlo = fwd.lower(q, b).as_text()
    assert f'config = "{configs.FWD_D256_BN80_PAIRED.name}"' in hlo and "sm_margin = 3" in hlo
    assert f"tensor<{configs.FWD_D256_BN80_PAIRED.workspace_words(1, 1, 300)}xi32>" in hlo
    bwd = jax.jit(lambda q, b, lse: cuda.backward(q, q, q, b, q, lse, q, None, scale=0.1,
                                                  deterministic=True))
    hlo = bwd.lower(q, b, lse).as_text()
    assert f'config = "{configs.BWD_D256.name}"' in hlo and "deterministic = 1" in hlo
    assert "tensor<1x4x5x1xi32>" in hlo  # ordering bits [B, N, 300 / 64 tiles, 1 word]
    # the soft cap: the capped twin of the general kernel, the cap as a float attribute
    fwd = jax.jit(lambda q, b: cuda.forward(q, q, q, b, scale=0.1, structure="causal",
                                            logits_soft_cap=30.0))
    hlo = fwd.lower(q, b).as_text()
    assert f'config = "{configs.FWD_D256_SOFTCAP.name}"' in hlo and "softcap = 3.000000e+01" in hlo
    bwd = jax.jit(lambda q, b, lse: cuda.backward(q, q, q, b, q, lse, q, None, scale=0.1,
                                                  logits_soft_cap=30.0))
    hlo = bwd.lower(q, b, lse).as_text()
    assert f'config = "{configs.BWD_D256_SOFTCAP.name}"' in hlo and "softcap = 3.000000e+01" in hlo


def test_kernel_bounds_clip_keeps_every_row_mask():
    """The Hopper calls clip the bounds to [0, Sq] (no int32 overflow in the kernels' interval
    lengths); every row's mask is that of the raw bounds, anywhere in int32."""
    import numpy as np

    from jax_flashmask.backends.cuda import ops
    from jax_flashmask.masks import dense_from_bounds

    rng = np.random.default_rng(0)
    Sq, Sk = 37, 50
    big = rng.integers(-(2 ** 31), 2 ** 31, (2, 3, 4, Sk))
    ends = rng.choice(np.array([-(2 ** 31), 2 ** 31 - 1, 0, -1, Sq, Sq + 1]), (2, 3, 4, Sk))
    small = rng.integers(-5, Sq + 5, (2, 3, 4, Sk))
    raw = np.choose(rng.integers(0, 3, (2, 3, 4, Sk)), [big, ends, small]).astype(np.int32)
    clipped = np.asarray(ops._kernel_bounds(jnp.asarray(raw), Sq))
    assert clipped.min() >= 0 and clipped.max() <= Sq
    assert (np.asarray(dense_from_bounds(jnp.asarray(raw), Sq))
            == np.asarray(dense_from_bounds(jnp.asarray(clipped), Sq))).all()
