"""The main job runs end to end: twelve masks, checked against the reference, and a picture."""

import pytest

from jax_flashmask import demo

pytest.importorskip("matplotlib")


def test_demo_small(tmp_path, capsys):
    png = tmp_path / "masks.png"
    demo.main(["--seq-len", "130", "--heads", "2", "--head-dim", "16", "--repeats", "1", "--png", str(png)])
    table = capsys.readouterr().out
    for name in ("full", "causal_document", "global_sliding_window", "random_eviction"):
        assert name in table
    assert table.count(" yes") == 12 and " NO" not in table
    assert png.stat().st_size > 10_000
