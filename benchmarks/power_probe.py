"""Sustained-run clocks and power: ours against cuDNN, d = 128, 8K, bf16 (issue 3/4 analysis).

Each phase calls one jitted function back to back (each call ended by block_until_ready) for
`--secs` seconds while `nvidia-smi` samples SM clock, power and the throttle reasons every 100 ms;
per phase it reports the median time per call, TFLOP/s (FlashMask convention, backward = 2.5x the
forward FLOPs), the median SM clock and power of the samples inside the phase, and TFLOP/s per
GHz (what the kernel does per clock, the part a power cap does not set).
Usage (H200): python benchmarks/power_probe.py [--secs 5] [--masks full causal] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp


class ClockSampler:
    """nvidia-smi sampling SM clock, power and throttle reasons every 100 ms from construction to
    stop(); annotate(phase) adds the medians of the samples inside [t0 + 0.5 s, t1] (the first half
    second is the clock settling) and TFLOP/s per GHz. variant_ab.py uses it too."""

    def __init__(self):
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                                      "--format=csv,noheader,nounits", "-lms", "100"],
                                     stdout=subprocess.PIPE, text=True)
        self.samples = []

    def stop(self):
        self.proc.terminate()
        for line in self.proc.stdout.read().splitlines():
            parts = [x.strip() for x in line.split(",")]
            try:
                ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + parts[0].split(".")[1])
                self.samples.append((ts, float(parts[1]), float(parts[2]), parts[3]))
            except (ValueError, IndexError):
                continue

    def annotate(self, p):
        inside = [s for s in self.samples if p["t0"] + 0.5 <= s[0] <= p["t1"]]
        if inside:
            p["mhz"] = statistics.median(s[1] for s in inside)
            p["watts"] = statistics.median(s[2] for s in inside)
            p["reasons"] = sorted({s[3] for s in inside})
            p["tflops_per_ghz"] = p["tflops"] / (p["mhz"] / 1e3)


def sustained(f, args, secs):
    """Calls f(*args) back to back (each ended by block_until_ready) for `secs` seconds after two
    warm-up calls: dict(t0, t1, ms = median per call, calls)."""
    jax.block_until_ready(f(*args))
    jax.block_until_ready(f(*args))
    ts, t0 = [], time.time()
    while time.time() - t0 < secs:
        s = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - s)
    return dict(t0=t0, t1=time.time(), ms=statistics.median(ts) * 1e3, calls=len(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--masks", nargs="+", default=["full", "causal"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from step_kernels import attention_fn  # a sibling script (benchmarks/ is sys.path[0])

    S, H, D = a.seq, 32, 128
    B = max(1, a.tokens // S)
    q, k, v, g = (jax.random.normal(kk, (B, S, H, D), jnp.bfloat16)
                  for kk in jax.random.split(jax.random.PRNGKey(0), 4))
    smi = ClockSampler()
    phases = []
    for mask in a.masks:
        causal = mask == "causal"
        fl = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)  # ~ (1 - rho) at 128-row tiles
        for name in ("cudnn", "ours"):
            att = attention_fn(name, causal)
            for kind in ("fwd", "fwd+bwd"):
                if kind == "fwd":
                    f, args, flops = jax.jit(att), (q, k, v), fl
                else:
                    f = jax.jit(lambda q, k, v, g, att=att: jax.vjp(att, q, k, v)[1](g))
                    args, flops = (q, k, v, g), 3.5 * fl
                ph = sustained(f, args, a.secs)
                phases.append(dict(mask=mask, impl=name, kind=kind, **ph, tflops=flops / ph["ms"] / 1e9))
                time.sleep(1.0)  # let the clock recover between phases
    smi.stop()
    print(f"{'mask':7s} {'impl':6s} {'kind':8s} {'ms':>8s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>5s} {'TF/GHz':>7s} reasons")
    for p in phases:
        smi.annotate(p)
        print(f"{p['mask']:7s} {p['impl']:6s} {p['kind']:8s} {p['ms']:8.2f} {p['tflops']:8.1f} "
              f"{p.get('mhz', 0):6.0f} {p.get('watts', 0):5.0f} {p.get('tflops_per_ghz', 0):7.1f} {p.get('reasons')}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(device=str(jax.devices()[0]), B=B, S=S, H=H, d=D, phases=phases), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
