"""`examples/train_lm.py` end to end with a tiny config: the loss falls and stays finite."""

import importlib.util
import pathlib

import numpy as np
import pytest

pytest.importorskip("flax.nnx")
pytest.importorskip("optax")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_lm.py"


@pytest.fixture(scope="module")
def train_lm():
    spec = importlib.util.spec_from_file_location("train_lm_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_packing_and_mask(train_lm):
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[train_lm.BOS], rng.integers(0, 256, n)]).astype(np.int32)
            for n in (5, 17, 9, 30, 3)]
    p = train_lm.pack(docs, num_seqs=4, seq_len=16, rng=rng, head_bytes=4)
    assert p.tokens.shape == p.targets.shape == p.segment_ids.shape == (4, 16)
    stream = np.concatenate([p.tokens.ravel(), p.targets[-1, -1:]])
    np.testing.assert_array_equal(p.targets.ravel(), stream[1:])  # next-token targets
    # no loss where the target starts another document (it is always that document's BOS)
    assert np.all(p.targets[p.weight == 0] == train_lm.BOS)
    assert np.all(p.weight[p.targets == train_lm.BOS] == 0)
    assert p.head.sum() > 0 and np.all(p.head <= p.weight)
    ind = train_lm.mask_indices(p.segment_ids)
    assert ind.shape == (4, 1, 16, 1)
    # causal_document: column j is visible to rows [j, end of j's document)
    for r in range(4):
        seg = p.segment_ids[r]
        for j in range(16):
            end = j + np.argmax(np.append(seg[j:] != seg[j], True))
            assert ind[r, 0, j, 0] == end


def test_train_tiny_loss_decreases(train_lm, tmp_path):
    hist = train_lm.main(["--preset", "tiny", "--layers", "1", "--steps", "16", "--eval-every", "16",
                          "--max-files", "400", "--no-progress", "--no-plot",
                          "--out-dir", str(tmp_path)])["document"]
    losses = np.asarray(hist["train_loss"])
    assert losses.shape == (16,) and np.isfinite(losses).all()
    assert losses[-4:].mean() < losses[:4].mean() - 0.3, losses
    ((step, held_out, head),) = hist["eval"]
    assert step == 16 and np.isfinite([held_out, head]).all()
    assert held_out < losses[0] - 0.5  # ~ln(257) = 5.55 at init


def test_plot(train_lm, tmp_path):
    pytest.importorskip("matplotlib")
    fake = [dict(mask=m, train_loss=list(np.linspace(5, 2, 20) + o), eval=[(10, 3 + o, 3.5), (20, 2 + o, 2.5)])
            for m, o in (("causal", 0.1), ("document", 0.0))]
    path = train_lm.plot_histories(fake, tmp_path / "curves.png", 32)
    assert pathlib.Path(path).stat().st_size > 1000


# -- sharded training on 4 host CPU devices (a subprocess: the device count is fixed at jax start) --
_SHARDED = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("train_lm_example", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
common = ["--preset", "tiny", "--layers", "1", "--steps", "4", "--eval-every", "4", "--max-files", "200",
          "--no-progress", "--no-plot", "--out-dir", sys.argv[2], "--implementation", "xla"]
runs = {}
for name, extra in (("one", ["--devices", "1"]), ("dp4", []), ("dp2_tp2", ["--tensor-parallel", "2"])):
    h = mod.main(common + extra)["document"]
    runs[name] = dict(mesh=h["mesh"], tiles=h["tiles_per_device"], loss=h["train_loss"], eval=h["eval"],
                      collectives=h["collectives"])
print("RESULT " + json.dumps(runs))
"""


def test_sharded_training_divides_attention_and_matches_one_device(tmp_path):
    """Data parallel over 4 devices visits a quarter of the attention tiles per device (read from
    the compiled step), compiles with no all-gather, and trains to the same losses as one device;
    so does data 2 x tensor 2."""
    import json
    import subprocess
    import sys

    from _subprocess import worker_env

    env = worker_env(devices=4)
    root = str(EXAMPLE.parents[1])
    proc = subprocess.run([sys.executable, "-c", _SHARDED, str(EXAMPLE), str(tmp_path)], env=env,
                          cwd=root, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    runs = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    one, dp4, tp = runs["one"], runs["dp4"], runs["dp2_tp2"]
    assert one["mesh"] == {"data": 1, "context": 1, "tensor": 1}
    assert dp4["mesh"] == {"data": 4, "context": 1, "tensor": 1}
    assert tp["mesh"] == {"data": 2, "context": 1, "tensor": 2}
    # batch 8, S = 128 (one query tile), one mask head: forward + dQ + dK/dV loops of 8 tiles
    assert one["tiles"] == 24, one
    assert dp4["tiles"] * 4 == one["tiles"], (dp4, one)
    assert tp["tiles"] * 2 == one["tiles"], (tp, one)
    # nothing gathers activations: the gradients' all-reduce (and tensor parallelism's all-reduces
    # after the O and MLP-down projections) is all the traffic
    assert one["collectives"] == {}, one
    assert set(dp4["collectives"]) == {"all-reduce"}, dp4
    assert set(tp["collectives"]) == {"all-reduce"}, tp
    # same seed, same batches: float32 sums in another order, amplified a little by 4 Adam steps
    for run in (dp4, tp):
        np.testing.assert_allclose(run["loss"], one["loss"], rtol=2e-5)
        np.testing.assert_allclose(run["eval"], one["eval"], rtol=2e-5)
