"""Every ```python block of README.md runs as written.

The blocks run one after another in a fresh subprocess on 4 host CPU devices (the
context-parallel snippet shards over them), each in its own empty namespace (a block must be
self-contained: its imports and inputs included), in a temporary working directory (for files a
block writes). A block containing the comment ``# readme-test: skip (<reason>)`` is not run; keep
that for blocks that cannot run on a CPU (a GPU, many hosts).
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest
from _subprocess import worker_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"#\s*readme-test:\s*skip\b(.*)")


def python_blocks(text: str):
    """[(first line number, source)] of the ```python fenced blocks."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip().startswith("```python"):
            start, body = i + 2, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((start, "\n".join(body) + "\n"))
        i += 1
    return blocks


BLOCKS = python_blocks(README.read_text())

RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
results = {}
for line, src in blocks:
    try:
        exec(compile(src, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
        results[line] = None
    except BaseException:
        results[line] = traceback.format_exc()
    import jax
    jax.effects_barrier()
json.dump(results, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    todo = [(line, src) for line, src in BLOCKS if not SKIP.search(src)]
    (tmp / "blocks.json").write_text(json.dumps(todo))
    env = worker_env(devices=4)
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp / "blocks.json"), str(tmp / "out.json")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        pytest.fail(f"README runner crashed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads((tmp / "out.json").read_text()).items()}


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("line,src", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(results, line, src):
    skip = SKIP.search(src)
    if skip:
        pytest.skip(f"README.md:{line}: {skip.group(1).strip() or 'marked readme-test: skip'}")
    if results[line] is not None:
        pytest.fail(f"README.md:{line} failed:\n{src}\n{results[line]}")
