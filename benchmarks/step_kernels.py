"""The kernels of one fwd+bwd step, ours against cuDNN (d = 128, bf16, 8K, B = 2, H = 32).

    ncu --metrics gpu__time_duration.sum --csv python benchmarks/step_kernels.py run cudnn full > c.csv
    python benchmarks/step_kernels.py table c.csv 9      # the last 9 kernels (the third step)

`run IMPL MASK` (IMPL: cudnn | ours, MASK: full | causal) runs the jitted jax.vjp step three
times; under ncu the last step's launches name every pass (forward, D / dq_accum preparation,
backward, dQ conversion) with its duration. `table` prints the tail of ncu's CSV. `stalls`
reads ncu's per-instruction source page of one kernel (warp-stall sampling):

    ncu --section WarpStateStats --section SourceCounters -k regex:flashmask_bwd --launch-skip 1 \
        --launch-count 1 --page source --print-source sass --csv \
        python benchmarks/step_kernels.py run ours full > src.csv
    python benchmarks/step_kernels.py stalls src.csv 40   # totals per reason, the 40 top instructions
"""

from __future__ import annotations

import csv
import sys


def attention_fn(impl: str, causal: bool):
    """(q, k, v) -> out for IMPL "cudnn" (jax.nn.dot_product_attention) or "ours" (the Hopper
    kernels through jax_flashmask.attention); benchmarks/power_probe.py times the same two."""
    import jax

    if impl == "cudnn":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    import jax_flashmask as jf

    return lambda q, k, v: jf.attention(q, k, v, causal=causal, implementation="cuda")


def run(impl: str, mask: str) -> None:
    import jax
    import jax.numpy as jnp

    q, k, v, g = (jax.random.normal(kk, (2, 8192, 32, 128), jnp.bfloat16)
                  for kk in jax.random.split(jax.random.PRNGKey(0), 4))
    att = attention_fn(impl, mask == "causal")
    step = jax.jit(lambda q, k, v, g: jax.vjp(att, q, k, v)[1](g))
    for _ in range(3):
        jax.block_until_ready(step(q, k, v, g))


def table(path: str, last: int) -> None:
    with open(path) as fh:
        lines = [line for line in fh if line.startswith('"')]
    rows = [(int(r["ID"]), r["Kernel Name"][:90], float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
            for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
    print(f"{len(rows)} kernels; last {last}:")
    for i, name, val, unit in rows[-last:]:
        print(f"{i:5d} {val:12.1f} {unit:5s} {name}")


def stalls(path: str, top: int) -> None:
    with open(path) as fh:
        rows = list(csv.reader(fh))
    head = next(r for r in rows if r and r[0] == "Address")
    data = [r for r in rows if r and r[0].startswith("0x") and len(r) == len(head)]
    col = {h: i for i, h in enumerate(head)}
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    n_all = col["Warp Stall Sampling (All Samples)"]
    total = sum(int(r[n_all]) for r in data)
    print(f"{len(data)} instructions, {total} samples; per reason:")
    for v, k in sorted(((sum(int(r[col[k]]) for r in data), k) for k in reasons), reverse=True)[:10]:
        print(f"  {k[6:]:16s} {v:8d} {100 * v / total:5.1f} %")
    print(f"top {top} instructions (index in the kernel, samples, share, SASS, two main reasons):")
    for i in sorted(sorted(range(len(data)), key=lambda i: -int(data[i][n_all]))[:top]):
        r = data[i]
        why = sorted(((int(r[col[k]]), k[6:]) for k in reasons), reverse=True)[:2]
        print(f"{i:5d} {int(r[n_all]):7d} {100 * int(r[n_all]) / total:5.1f} %  {r[1].strip()[:58]:58s} {why}")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "run":
        run(argv[1], argv[2])
    elif len(argv) in (2, 3) and argv[0] == "table":
        table(argv[1], int(argv[2]) if len(argv) == 3 else 12)
    elif len(argv) in (2, 3) and argv[0] == "stalls":
        stalls(argv[1], int(argv[2]) if len(argv) == 3 else 40)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
