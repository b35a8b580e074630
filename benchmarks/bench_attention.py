#!/usr/bin/env python3
"""Side-by-side attention benchmark: jax_flashmask vs cuDNN (through JAX) vs FlexAttention (torch).

One run times every implementation on the same masks, so the numbers compare on one machine
(SPEC §5: absolute numbers drift between machines and runs). Protocol (defaults): bf16, H = 32
query and kv heads, head dim 128, total tokens 128K (B = 131072 / S), S ∈ {8K, 32K, 128K}, the
twelve masks of FlashMask's suite; also head dims 64 and 256 at 8K and 32K.

    python benchmarks/bench_attention.py                      # the whole protocol
    python benchmarks/bench_attention.py --quick              # S=8K, d=128, six masks
    python benchmarks/bench_attention.py --masks causal,document --seqlens 8192 --impls cudnn,flex
    python benchmarks/bench_attention.py --render benchmarks/results/h100_2026-12-05_peers.json \
        --out-dir /tmp/r --out-prefix peers   # re-draw table and chart, no GPU
    python benchmarks/bench_attention.py --render a.json b.json --out-prefix h200_DATE  # merge

FLOPs: the FlashMask convention ``4·B·H·Sq·Sk·d·(1−ρ)`` forward, ρ the fraction of fully masked
128×128 tiles, and ×2.5 for the backward (timed as (fwd+bwd) − fwd); the exact visible-area count
``4·B·H·d·#visible cells`` is reported beside it. Every implementation is checked once per case
against a float32 reference: its first call at the timed shape (the compile and warm-up anyway)
is compared on batch row 0, the first two heads and a few hundred sampled query rows, so the real
mask at the real length is checked; output and dQ errors go into the table, a failed check is
marked and its numbers flagged "wrong".

Only numpy is needed at import time; jax, torch, triton, matplotlib and tqdm are imported when used,
so the pure parts (masks, ρ, FLOPs, tables) run anywhere (tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

# JAX must not grab 75% of the GPU: torch shares the card in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

REPO = Path(__file__).resolve().parent.parent
# An installed jax_flashmask (e.g. a wheel with the CUDA extension on PYTHONPATH) wins; otherwise
# use the checkout this script lives in. meta.env.jax_flashmask records which one ran.
if importlib.util.find_spec("jax_flashmask") is None and str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from jax_flashmask.masks import BENCHMARK_MASKS as MASK_NAMES  # noqa: E402  (SPEC §2 order)
IMPLS = ("ours", "cudnn", "flex", "flex_flash", "fa4_jax")
TILE = 128
BWD_FACTOR = 2.5
QUICK_MASKS = ("full", "causal", "sliding_window", "causal_document", "document", "share_question")

# Check tolerances (relative Frobenius error against the float32 reference on bf16 inputs; bf16
# operands land between 1e-3 and 1e-2, METHOD.md).
TOL_OUT = 2e-2
TOL_DQ = 5e-2


# ---------------------------------------------------------------------------------------------
# Masks (jax_flashmask.masks builders, SPEC §2), ρ, FLOPs
# ---------------------------------------------------------------------------------------------


def mask_suite(S: int, seed: int) -> dict:
    """``{name: (startend_row_indices int32 [1, 1, S, D] numpy, causal)}`` from the package's suite.

    `jax_flashmask.masks.benchmark_suite` holds the twelve masks with FlashMask's parameters; the
    random ones (documents, evictions) are drawn from (seed, S), so every implementation and every
    head dim sees the same masks at a given S.
    """
    from jax_flashmask.masks import benchmark_suite

    suite = benchmark_suite(S, seed=np.random.SeedSequence([seed, S]))
    return {name: (np.asarray(m.startend_row_indices, np.int32), bool(m.causal)) for name, m in suite.items()}


def fully_masked_tiles(bounds: np.ndarray, q_len: int, tile: int = TILE, chunk: int = 64) -> tuple[int, int]:
    """(fully masked tiles, all tiles) at ``tile×tile``, summed over the mask's batch and heads.

    Exact: a tile counts when every one of its cells is masked, the union of a column's two row
    ranges included (`jax_flashmask.masks.block_sparsity` is the kernel's block min/max test, a
    sufficient one, so it can count fewer). O(Sq/tile · Sk) work, never an Sq×Sk array.
    `bounds` is the canonical int ``[B, Hm, 4, Sk]`` (LTS, LTE, UTS, UTE).
    """
    b, hm, _, sk = bounds.shape
    nq = -(-q_len // tile)
    nk = -(-sk // tile)
    pad = nk * tile - sk
    masked = 0
    for bi in range(b):
        for hi in range(hm):
            a0, a1, b0, b1 = (bounds[bi, hi, k].astype(np.int64) for k in range(4))
            # An empty range takes the other one's place (it covers nothing).
            a_empty = a0 >= a1
            a0, a1 = np.where(a_empty, b0, a0), np.where(a_empty, b1, a1)
            touch = (a0 <= b1) & (b0 <= a1) & (b0 < b1)
            u0 = np.where(touch, np.minimum(a0, b0), a0)
            u1 = np.where(touch, np.maximum(a1, b1), a1)
            for t0 in range(0, nq, chunk):
                ts = np.arange(t0, min(nq, t0 + chunk))
                ms = (ts * tile)[:, None]
                me = np.minimum((ts + 1) * tile, q_len)[:, None]
                cov = ((a0 <= ms) & (me <= a1)) | ((b0 <= ms) & (me <= b1)) | ((u0 <= ms) & (me <= u1))
                if pad:  # columns past Sk do not exist: treat them as masked
                    cov = np.concatenate([cov, np.ones((cov.shape[0], pad), bool)], axis=1)
                masked += int(cov.reshape(cov.shape[0], nk, tile).all(axis=2).sum())
    return masked, b * hm * nq * nk


def tile_sparsity(bounds: np.ndarray, q_len: int, tile: int = TILE) -> float:
    """ρ: fraction of fully masked ``tile×tile`` tiles (exact)."""
    m, n = fully_masked_tiles(bounds, q_len, tile)
    return m / n


def mask_stats(sri: np.ndarray, causal: bool, q_len: int) -> dict:
    """ρ (exact), ρ_skip (the kernel's block test), visible fraction and visible cells per (b, h)."""
    from jax_flashmask.masks import block_sparsity, canonical_bounds_np, visible_fraction

    bounds = canonical_bounds_np(sri, causal=causal, q_len=q_len)
    vis = visible_fraction(sri, q_len, causal=causal)
    return {
        "rho": tile_sparsity(bounds, q_len),
        "rho_skip": block_sparsity(sri, q_len, TILE, causal=causal),
        "visible_frac": vis,
        "visible_cells_per_bh": vis * q_len * sri.shape[2],
    }

def attention_flops(B: int, H: int, Sq: int, Sk: int, d: int, rho: float, visible_cells_per_bh: float) -> dict:
    """Forward FLOPs in the FlashMask convention and exactly (visible area); backward = ×2.5."""
    tile = 4.0 * B * H * Sq * Sk * d * (1.0 - rho)
    exact = 4.0 * B * H * d * visible_cells_per_bh
    return {"fwd_flops": tile, "fwd_flops_exact": exact}


def tflops_from_times(fwd_flops: float, fwd_ms: float | None, fwdbwd_ms: float | None) -> dict:
    """fwd, bwd (= (fwd+bwd) − fwd, ×2.5 FLOPs) and total TFLOP/s; None where not measurable."""
    out = {"fwd": None, "bwd": None, "total": None, "bwd_ms": None}
    if fwd_ms:
        out["fwd"] = fwd_flops / (fwd_ms * 1e-3) / 1e12
    if fwdbwd_ms:
        out["total"] = (1.0 + BWD_FACTOR) * fwd_flops / (fwdbwd_ms * 1e-3) / 1e12
        if fwd_ms and fwdbwd_ms > fwd_ms:
            bwd_ms = fwdbwd_ms - fwd_ms
            out["bwd_ms"] = bwd_ms
            out["bwd"] = BWD_FACTOR * fwd_flops / (bwd_ms * 1e-3) / 1e12
    return out


# ---------------------------------------------------------------------------------------------
# Dense reference on a slice of query rows (numpy float32; never Sq×Sk)
# ---------------------------------------------------------------------------------------------


def reference_rows(q, k, v, do, bounds, rows, scale):
    """Output and dQ of masked softmax attention for query `rows`, per head.

    q, do: [Sq, Hc, d]; k, v: [Sk, Hc, d] (float32); bounds: [4, Sk] (one mask for every head).
    Fully masked rows give output 0 and dQ 0. Returns (out [R, Hc, d], dq [R, Hc, d]).
    """
    i = np.asarray(rows)[:, None]
    lts, lte, uts, ute = (bounds[c][None, :] for c in range(4))
    masked = ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))  # [R, Sk]
    any_vis = ~masked.all(axis=1, keepdims=True)
    outs, dqs = [], []
    for h in range(q.shape[1]):
        qh, kh, vh, doh = q[rows, h], k[:, h], v[:, h], do[rows, h]
        s = (qh @ kh.T) * scale
        s = np.where(masked, -np.inf, s)
        mx = np.where(any_vis, s.max(axis=1, keepdims=True), 0.0)
        p = np.exp(s - mx)
        p = np.where(masked, 0.0, p)
        den = p.sum(axis=1, keepdims=True)
        p = p / np.where(den > 0, den, 1.0)
        o = p @ vh
        dp = doh @ vh.T
        dsum = (doh * o).sum(axis=1, keepdims=True)
        ds = p * (dp - dsum)
        outs.append(o)
        dqs.append((ds @ kh) * scale)
    return np.stack(outs, axis=1), np.stack(dqs, axis=1)


def compare(got, ref) -> dict:
    """Max abs error, relative Frobenius error and whether `got` is all finite (NaN never passes)."""
    got = np.asarray(got, np.float32)
    ref = np.asarray(ref, np.float32)
    if not np.isfinite(got).all():
        return {"max_abs": float("nan"), "rel": float("nan"), "finite": False}
    diff = got - ref
    den = float(np.linalg.norm(ref)) or 1.0
    return {"max_abs": float(np.abs(diff).max()), "rel": float(np.linalg.norm(diff)) / den, "finite": True}


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def time_jax(fn, args, *, iters: int, min_iters: int, budget_s: float, out_bytes: int,
             sample_ms: float = 20.0, max_live_bytes: int = 8 << 30) -> list[float]:
    """Milliseconds per call of `fn(*args)` under jit, one value per sample: warm-up, then samples
    of back-to-back calls.

    Each sample dispatches `inner` calls and blocks once (JAX dispatch is asynchronous, so the
    host overhead hides behind the device work); inner is chosen so a sample lasts ~`sample_ms`
    and the outputs alive at once stay under `max_live_bytes`.
    """
    import jax

    jax.block_until_ready(fn(*args))  # compile + first run
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    est = max(time.perf_counter() - t0, 1e-6)
    inner = int(max(1, min(round(sample_ms * 1e-3 / est), max_live_bytes // max(out_bytes, 1), 50)))
    n = int(max(min_iters, min(iters, budget_s / (est * inner))))
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        outs = [fn(*args) for _ in range(inner)]
        jax.block_until_ready(outs)
        samples.append((time.perf_counter() - t0) / inner * 1e3)
        del outs
    return samples


def time_torch(fn, *, iters: int, min_iters: int, budget_s: float, grad_to_none=None) -> list[float]:
    """Milliseconds of each call timed by CUDA events (triton.testing.do_bench, return_mode="all")."""
    import torch
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    rep = max(min(iters * est_ms, budget_s * 1e3), min_iters * est_ms, 100.0)
    warmup = max(25.0, 2 * est_ms)
    return [float(t) for t in do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="all")]


# ---------------------------------------------------------------------------------------------
# Implementations
# ---------------------------------------------------------------------------------------------


class Skip(Exception):
    """The implementation cannot run this case (reason in the message)."""


class Case:
    """One (mask, S, d) problem: the mask, its statistics and shapes."""

    def __init__(self, mask: str, S: int, d: int, B: int, H: int, sri: np.ndarray, causal: bool,
                 stats: dict | None = None):
        from jax_flashmask.masks import canonical_bounds_np

        self.mask, self.S, self.d, self.B, self.H = mask, S, d, B, H
        self.sri, self.causal = sri, causal
        if sri.shape[:2] != (1, 1) or sri.shape[2] != S:
            raise ValueError(f"{mask}: expected startend_row_indices [1, 1, {S}, D], got {sri.shape}")
        self.bounds = canonical_bounds_np(sri, causal=causal, q_len=S)  # [1, 1, 4, S]
        self.stats = stats or mask_stats(sri, causal, S)
        self.flops = attention_flops(B, H, S, S, d, self.stats["rho"], self.stats["visible_cells_per_bh"])
        # sliding window: the window the vectors hold (LTS[0] = w + 1), so cuDNN gets the same mask
        self.window = int(self.bounds[0, 0, 0, 0]) - 1 if mask == "sliding_window" else None


class JaxImpl:
    """Shared JAX plumbing: [B, S, H, d] bf16 inputs, jit, vjp for the backward."""

    name = "?"
    framework = "jax"

    def __init__(self, args):
        self.args = args
        self._fwd = {}
        self._fb = {}

    def supports(self, case: Case):
        return None  # or a reason string

    def attn(self, case: Case):  # -> f(q, k, v, sri) in [B, S, H, d]
        raise NotImplementedError

    def _fns(self, case: Case):
        import jax

        key = self.cache_key(case)
        if key not in self._fwd:
            f = self.attn(case)
            self._fwd[key] = jax.jit(f)

            def fb(q, k, v, do, sri):
                _, vjp = jax.vjp(lambda q_, k_, v_: f(q_, k_, v_, sri), q, k, v)
                return vjp(do)

            self._fb[key] = jax.jit(fb)
        return self._fwd[key], self._fb[key]

    def cache_key(self, case: Case):
        return (case.mask, case.causal, case.sri.shape[-1])

    def _sri(self, case: Case):
        import jax.numpy as jnp

        return jnp.asarray(np.broadcast_to(case.sri, (case.B,) + case.sri.shape[1:]))

    def host_slice(self, inputs, hc: int):
        """Batch row 0, heads [0, hc) of q, k, v, dO as float32 numpy ``[S, hc, d]``."""
        import jax.numpy as jnp

        return [np.asarray(x[0, :, :hc].astype(jnp.float32)) for x in inputs]

    def check(self, case: Case, inputs, ref, phase: str) -> dict:
        """Run the timed configuration once; compare output ("fwd") or dQ ("bwd") with `ref` on
        rows of batch 0, heads [0, hc)."""
        import jax.numpy as jnp

        fwd, fb = self._fns(case)
        q, k, v, do = inputs
        sri = self._sri(case)
        rows, hc = ref["rows"], ref["out"].shape[1]
        if phase == "fwd":
            return compare(np.asarray(fwd(q, k, v, sri)[0, rows, :hc].astype(jnp.float32)), ref["out"])
        return compare(np.asarray(fb(q, k, v, do, sri)[0][0, rows, :hc].astype(jnp.float32)), ref["dq"])

    def inputs(self, S, d, B, H, seed):
        import jax
        import jax.numpy as jnp

        keys = jax.random.split(jax.random.key(seed), 4)
        return [jax.random.normal(kk, (B, S, H, d), jnp.bfloat16) for kk in keys]

    def time(self, case: Case, inputs, phase: str) -> list[float]:
        """Samples (ms) of the forward ("fwd") or of forward+backward ("bwd")."""
        fwd, fb = self._fns(case)
        q, k, v, do = inputs
        sri = self._sri(case)
        a = self.args
        nbytes = q.size * q.dtype.itemsize
        if phase == "fwd":
            fn, fargs, out_bytes = fwd, (q, k, v, sri), nbytes
        else:
            fn, fargs, out_bytes = fb, (q, k, v, do, sri), 3 * nbytes
        return time_jax(fn, fargs, iters=a.iters, min_iters=a.min_iters, budget_s=a.budget_s,
                        out_bytes=out_bytes)


class OursImpl(JaxImpl):
    name = "ours"

    def __init__(self, args):
        super().__init__(args)
        try:
            import jax_flashmask
        except Exception as e:  # noqa: BLE001
            raise Skip(f"import jax_flashmask failed: {type(e).__name__}: {e}") from e
        self.fn = getattr(jax_flashmask, "attention", None)
        if self.fn is None:
            raise Skip("jax_flashmask.attention does not exist yet")

    # full and causal are called as a user would (and as cuDNN / Flex get them): no mask vectors,
    # causal=True or not; the kernel then knows the structure (_cuda.DEFAULT_VARIANTS)
    UNMASKED = ("full", "causal")

    def cache_key(self, case: Case):
        return (case.causal, case.sri.shape[-1], case.mask in self.UNMASKED)

    def attn(self, case: Case):
        impl = self.args.ours_implementation
        kw = {} if impl in (None, "", "default") else {"implementation": impl}
        causal = case.causal
        vectors = case.mask not in self.UNMASKED

        def f(q, k, v, sri):
            return self.fn(q, k, v, sri if vectors else None, causal=causal, **kw)

        return f


class CudnnImpl(JaxImpl):
    name = "cudnn"

    def __init__(self, args):
        super().__init__(args)
        import jax

        if jax.default_backend() != "gpu":
            raise Skip(f"cuDNN needs a GPU backend, JAX has {jax.default_backend()!r}")

    def supports(self, case: Case):
        if case.mask in ("full", "causal", "sliding_window"):
            return None
        return "cuDNN (jax.nn.dot_product_attention) cannot express this mask"

    def attn(self, case: Case):
        import jax

        kw = {"implementation": "cudnn", "is_causal": case.mask != "full"}
        if case.mask == "sliding_window":
            kw["local_window_size"] = (case.window, 0)

        def f(q, k, v, sri):  # the mask is expressed by the flags above, sri unused
            del sri
            return jax.nn.dot_product_attention(q, k, v, **kw)

        return f


class FlexImpl:
    """torch FlexAttention (torch.compile'd), mask_mod indexing the canonical vectors on device."""

    name = "flex"
    framework = "torch"

    def __init__(self, args):
        self.args = args
        try:
            import torch
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception as e:  # noqa: BLE001
            raise Skip(f"torch FlexAttention unavailable: {type(e).__name__}: {e}") from e
        if not torch.cuda.is_available():
            raise Skip("torch sees no CUDA device")
        import torch._dynamo

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 512))
        self.torch = torch
        self._create_block_mask = create_block_mask
        self.flex = torch.compile(flex_attention, dynamic=False)
        self._bufs = {}  # S -> (bounds buffer [4, S] int32, mask_mod): one mask_mod per length
        self._bm = None

    def _block_size(self, case: Case) -> tuple[int, int]:
        """(query, key) rows per block of the block mask."""
        return (TILE, TILE)

    def supports(self, case: Case):
        return None

    def _mask_mod(self, S):
        if S not in self._bufs:
            buf = self.torch.empty((4, S), dtype=self.torch.int32, device="cuda")
            self._bufs[S] = (buf, self._make_mask_mod(buf))
        return self._bufs[S]

    @staticmethod
    def _make_mask_mod(buf):
        def mask_mod(b, h, q_idx, kv_idx):
            lts, lte, uts, ute = buf[0, kv_idx], buf[1, kv_idx], buf[2, kv_idx], buf[3, kv_idx]
            masked = ((lts <= q_idx) & (q_idx < lte)) | ((uts <= q_idx) & (q_idx < ute))
            return ~masked

        return mask_mod

    def prepare(self, case: Case):
        """Load the case's vectors into the per-length buffer and build the block mask."""
        torch = self.torch
        buf, mask_mod = self._mask_mod(case.S)
        buf.copy_(torch.from_numpy(case.bounds[0, 0].astype(np.int32)))
        kw = dict(B=None, H=None, Q_LEN=case.S, KV_LEN=case.S, device="cuda",
                  BLOCK_SIZE=self._block_size(case))
        try:  # _compile=True (checked on torch 2.11) never materialises the S×S mask
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*_compile flag.*", category=DeprecationWarning)
                self._bm = self._create_block_mask(mask_mod, _compile=True, **kw)
        except TypeError:  # a torch without _compile: compile the builder itself
            self._bm = torch.compile(self._create_block_mask)(mask_mod, **kw)
        torch.cuda.synchronize()

    def host_slice(self, inputs, hc: int):
        """Batch row 0, heads [0, hc) of q, k, v, dO as float32 numpy ``[S, hc, d]``."""
        return [x[0, :hc].transpose(0, 1).float().cpu().numpy() for x in inputs]

    def check(self, case: Case, inputs, ref, phase: str) -> dict:
        """Run the timed configuration once; compare output ("fwd") or dQ ("bwd") with `ref` on
        rows of batch 0, heads [0, hc)."""
        torch = self.torch
        q, k, v, do = inputs
        hc = ref["out"].shape[1]
        rows = torch.as_tensor(ref["rows"], device="cuda")
        if phase == "fwd":
            with torch.no_grad():
                got = self.flex(q, k, v, block_mask=self._bm)[0, :hc, rows]
            return compare(got.transpose(0, 1).float().cpu().numpy(), ref["out"])
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
        self.flex(qg, kg, vg, block_mask=self._bm).backward(do)
        return compare(qg.grad[0, :hc, rows].transpose(0, 1).float().cpu().numpy(), ref["dq"])

    def inputs(self, S, d, B, H, seed):
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(seed)
        return [torch.randn((B, H, S, d), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)]

    def time(self, case: Case, inputs, phase: str) -> list[float]:
        """Samples (ms) of the forward ("fwd") or of forward+backward ("bwd")."""
        torch = self.torch
        a = self.args
        q, k, v, do = inputs
        bm = self._bm
        kw = dict(iters=a.iters, min_iters=a.min_iters, budget_s=a.budget_s)
        if phase == "fwd":

            def fwd():
                with torch.no_grad():
                    self.flex(q, k, v, block_mask=bm)

            return time_torch(fwd, **kw)
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

        def fb():
            self.flex(qg, kg, vg, block_mask=bm).backward(do)

        return time_torch(fb, grad_to_none=[qg, kg, vg], **kw)


def fitted_block_size(block: tuple[int, int], error: str) -> tuple[int, int] | None:
    """The block size that meets a FlashAttention-4 block-sparsity refusal, "sparse_block_size[1]
    to be a multiple of tile_n=80" or "sparse_block_size[1]=160 to match tile_n=80" (its sm90
    kernels at d = 256 take their own 80-key tile and nothing else): the refused axis becomes the
    tile. None when `error` is not such a refusal or the block already meets it."""
    m = re.search(r"sparse_block_size\[([01])\](?:=\d+)? to (be a multiple of|match) tile_\w+=(\d+)",
                  error)
    if not m:
        return None
    axis, tile = int(m.group(1)), int(m.group(3))
    met = block[axis] == tile if m.group(2) == "match" else block[axis] % tile == 0
    return None if met else tuple(tile if i == axis else b for i, b in enumerate(block))


class FlexFlashImpl(FlexImpl):
    """FlexAttention's FlashAttention-4 backend (kernel_options BACKEND="FLASH": CuTe DSL kernels
    of the flash-attn-4 package), the same mask_mod and block mask as `flex`."""

    name = "flex_flash"

    def __init__(self, args):
        super().__init__(args)
        import functools

        try:
            import flash_attn.cute  # noqa: F401  the kernels the FLASH backend calls
            from torch.nn.attention.flex_attention import flex_attention
        except Exception as e:  # noqa: BLE001
            raise Skip(f"flash-attn-4 (FLASH backend) unavailable: {type(e).__name__}: {e}") from e
        self.flex = self.torch.compile(
            functools.partial(flex_attention, kernel_options={"BACKEND": "FLASH"}), dynamic=False)
        self._blocks = {}  # head dim -> block size its kernels accepted

    def _block_size(self, case: Case) -> tuple[int, int]:
        return self._blocks.get(case.d, (TILE, TILE))

    def _fitting(self, run, case: Case, *args):
        """`run(case, *args)`, rebuilding the block mask when the kernels ask for blocks made of
        their tiles (FA4's sm90 tile at d = 256 holds 80 keys; 128-key blocks are refused)."""
        for _ in range(3):
            try:
                return run(case, *args)
            except ValueError as e:
                block = fitted_block_size(self._block_size(case), str(e))
                if block is None:
                    raise
                self._blocks[case.d] = block
                self.prepare(case)
        return run(case, *args)

    def check(self, case: Case, inputs, ref, phase: str) -> dict:
        return self._fitting(super().check, case, inputs, ref, phase)

    def time(self, case: Case, inputs, phase: str) -> list[float]:
        return self._fitting(super().time, case, inputs, phase)

    @staticmethod
    def _make_mask_mod(buf):
        # the CuTe DSL traces the mask_mod: one captured 1-D tensor per vector (an integer index
        # into a 2-D buffer is refused: "Expected TensorSSA, but got int") and no `~`
        lts, lte, uts, ute = buf[0], buf[1], buf[2], buf[3]

        def mask_mod(b, h, q_idx, kv_idx):
            return (((q_idx < lts[kv_idx]) | (q_idx >= lte[kv_idx]))
                    & ((q_idx < uts[kv_idx]) | (q_idx >= ute[kv_idx])))

        return mask_mod


class Fa4JaxImpl(JaxImpl):
    """fa4-jax (FlashAttention-4's CuTe DSL kernels for JAX) as a user would call it: full,
    causal and the sliding window natively (out-of-band key blocks skipped); every other mask as
    a mask_mod over the canonical vectors, with causal=True where the mask is causal (its band is
    still skipped; fa4-jax wires no block sparsity for mask mods, so the rest is visited)."""

    name = "fa4_jax"

    def __init__(self, args):
        super().__init__(args)
        import dataclasses

        try:
            import fa4_jax
        except Exception as e:  # noqa: BLE001
            raise Skip(f"fa4-jax unavailable: {type(e).__name__}: {e}") from e
        self.fa4 = fa4_jax

        @dataclasses.dataclass(frozen=True)
        class BoundsMask(fa4_jax.MaskMod):
            # allowed unless LTS <= q < LTE or UTS <= q < UTE (column kv); arrays [B, S]
            lts: object
            lte: object
            uts: object
            ute: object

            def __call__(self, b, h, q, kv):
                return (((q < self.lts[b, kv]) | (q >= self.lte[b, kv]))
                        & ((q < self.uts[b, kv]) | (q >= self.ute[b, kv])))

        self.BoundsMask = BoundsMask

    def cache_key(self, case: Case):
        return (case.mask, case.causal, case.sri.shape[-1])

    def attn(self, case: Case):
        import jax.numpy as jnp

        fa4, mask = self.fa4, case.mask
        if mask in ("full", "causal"):
            return lambda q, k, v, sri: fa4.flash_attn(q, k, v, causal=mask == "causal")
        if mask == "sliding_window":
            return lambda q, k, v, sri: fa4.flash_attn(q, k, v, window_size=(case.window, 0))
        vec = [jnp.asarray(np.broadcast_to(case.bounds[0, 0, c], (case.B, case.S)), jnp.int32)
               for c in range(4)]
        mm = self.BoundsMask(*vec)
        return lambda q, k, v, sri: fa4.flash_attn(q, k, v, causal=case.causal, mask_mod=mm)


IMPL_CLASSES = {"ours": OursImpl, "cudnn": CudnnImpl, "flex": FlexImpl, "flex_flash": FlexFlashImpl,
                "fa4_jax": Fa4JaxImpl}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def plan_cases(args) -> list[tuple[int, int]]:
    """(S, d) pairs: every S at the main head dim, the extra head dims at the extra lengths."""
    pairs = []
    for S in args.seqlens:
        for d in args.head_dims:
            pairs.append((S, d))
        for d in args.extra_head_dims:
            if S in args.extra_seqlens and (S, d) not in pairs:
                pairs.append((S, d))
    return pairs


def check_reference(case: Case, host: list, rows: np.ndarray) -> dict:
    """float32 reference output and dQ at `rows` for host slices q, k, v, dO ``[S, hc, d]``."""
    out, dq = reference_rows(*host, case.bounds[0, 0], rows, 1.0 / math.sqrt(case.d))
    return {"rows": rows, "out": out, "dq": dq}


def check_rows(S: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted sample of query rows, always with the first and the last."""
    return np.unique(np.concatenate([[0, S - 1], rng.choice(S, size=min(n, S), replace=False)]))


def free_device_memory():
    gc.collect()
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def environment(with_torch: bool) -> dict:
    env = {"python": platform.python_version(), "host": platform.node()}
    try:
        import jax

        env["jax"] = jax.__version__
        env["jax_backend"] = jax.default_backend()
        env["device"] = jax.devices()[0].device_kind
    except Exception as e:  # noqa: BLE001
        env["jax"] = f"unavailable: {e}"
    try:
        import jax_flashmask

        env["jax_flashmask"] = str(Path(jax_flashmask.__file__).parent)
    except Exception as e:  # noqa: BLE001
        env["jax_flashmask"] = f"unavailable: {type(e).__name__}: {e}"
    from importlib import metadata

    for dist in ("fa4-jax", "flash-attn-4", "nvidia-cutlass-dsl"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if not with_torch:
        return env
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
            env["cudnn_torch"] = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001
        env["torch"] = f"unavailable: {type(e).__name__}"
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    return env


def machine_tag(device: str | None) -> str:
    if not device:
        return "cpu"
    s = device.lower().replace("nvidia", "").strip()
    return "".join(c if c.isalnum() else "_" for c in s).strip("_") or "gpu"


def run(args) -> dict:
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    env = environment(with_torch=bool({"flex", "flex_flash"} & set(args.impls)))
    prefix = args.out_prefix or f"{machine_tag(env.get('device'))}_{date}" + ("_quick" if args.quick else "")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "meta": {
            "date": date,
            "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "env": env,
            "args": {k: v for k, v in vars(args).items()},
            "protocol": (
                f"bf16, H={args.heads} (q and kv), B={args.total_tokens}/S; TFLOP/s = "
                f"4*B*H*S*S*d*(1-rho)/t (rho = fully masked {TILE}x{TILE} tiles); exact = "
                "4*B*H*d*visible/t; bwd = 2.5x FLOPs over (fwd+bwd)-fwd; jax: jit, median of "
                "samples of back-to-back calls ended by block_until_ready; torch: do_bench median"
            ),
        },
        "results": [],
    }

    impls = {}
    for name in args.impls:
        try:
            impls[name] = IMPL_CLASSES[name](args)
        except Skip as e:
            impls[name] = str(e)
        except Exception as e:  # noqa: BLE001
            impls[name] = f"{type(e).__name__}: {e}"

    pairs = plan_cases(args)
    total = len(pairs) * len(args.masks)
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="cases", dynamic_ncols=True, file=sys.stderr, disable=None)
    except Exception:  # noqa: BLE001
        bar = None

    paths = {ext: out_dir / f"{prefix}.{ext}" for ext in ("json", "md", "png")}
    t_start = time.monotonic()
    suites, stats = {}, {}
    for S, d in pairs:
        B = max(1, args.total_tokens // S)
        if S not in suites:
            suites[S] = mask_suite(S, args.seed)
        # Per (S, d): one random input set per framework (device), its host slice for the checks.
        ctx = {"inputs": {}, "hosts": {}}
        for mask in args.masks:
            rng = np.random.default_rng([args.seed, S, d, MASK_NAMES.index(mask)])
            sri, causal = suites[S][mask]
            if (S, mask) not in stats:
                stats[S, mask] = mask_stats(sri, causal, S)
            case = Case(mask, S, d, B, args.heads, sri, causal, stats[S, mask])
            if bar is not None:
                bar.set_postfix_str(f"S={S} d={d} {mask}")
            ctx["refs"] = {}
            ctx["rows"] = None if args.no_check else check_rows(S, args.check_rows, rng)
            out_of_time = args.time_limit_s and time.monotonic() - t_start > args.time_limit_s
            for name in args.impls:
                impl = impls[name]
                row = {
                    "mask": mask, "S": S, "d": d, "B": B, "H": args.heads, "impl": name,
                    "causal": causal, "D": int(sri.shape[-1]),
                    **case.stats, **case.flops,
                }
                if isinstance(impl, str):
                    row.update(status="skipped", reason=impl)
                elif (why := impl.supports(case)) is not None:
                    row.update(status="skipped", reason=why)
                elif out_of_time:
                    row.update(status="not run", reason=f"--time-limit-s {args.time_limit_s:g} reached")
                else:
                    row.update(run_one(impl, case, ctx, args))
                doc["results"].append(row)
                log_row(row, bar)
                # written after every row: a run cut by a timeout keeps what it measured
                write_outputs(doc, paths, args, final=False)
            ctx["refs"] = {}
            free_device_memory()
            if bar is not None:
                bar.update(1)
        ctx.clear()
        free_device_memory()
        try:
            import jax

            jax.clear_caches()
        except Exception:  # noqa: BLE001
            pass
        for impl in impls.values():  # compiled functions of this (S, d) are not needed again
            if isinstance(impl, JaxImpl):
                impl._fwd.clear()
                impl._fb.clear()
    if bar is not None:
        bar.close()
    doc["meta"]["finished_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    write_outputs(doc, paths, args, final=True)
    print(render_markdown(doc, load_anchors(args.anchors)))
    print("wrote " + ", ".join(str(p) for p in paths.values() if p.exists()))
    return doc


def run_one(impl, case: Case, ctx: dict, args) -> dict:
    """Check, then time one implementation on one case; errors become a status, never a crash.

    Each check runs the timed configuration itself once (it doubles as the compile and warm-up) and
    compares rows of batch 0 and the first heads with the float32 reference on the same inputs.
    The backward is a phase of its own: an implementation without one keeps its forward numbers
    (status "ok", bwd_status says why the backward is missing).
    """
    res = {"status": "ok"}
    inputs = ctx["inputs"]
    fw = impl.framework
    ref = None
    times = {}
    for phase in ("fwd",) if args.fwd_only else ("fwd", "bwd"):
        stage = "prepare"
        try:
            if phase == "fwd":
                if isinstance(impl, FlexImpl):
                    impl.prepare(case)
                stage = "inputs"
                if fw not in inputs:  # one input set per framework and (S, d)
                    free_device_memory()
                    inputs[fw] = impl.inputs(case.S, case.d, case.B, case.H, args.seed)
            if ctx["rows"] is not None:
                stage = f"check {phase}"
                if fw not in ctx["hosts"]:
                    ctx["hosts"][fw] = impl.host_slice(inputs[fw], min(args.check_heads, case.H))
                if fw not in ctx["refs"]:
                    ctx["refs"][fw] = check_reference(case, ctx["hosts"][fw], ctx["rows"])
                ref = ctx["refs"][fw]
                c = impl.check(case, inputs[fw], ref, phase)
                key = "out" if phase == "fwd" else "dq"
                res[f"err_{key}"], res[f"rel_{key}"] = c["max_abs"], c["rel"]
                ok = c["finite"] and c["rel"] <= (TOL_OUT if phase == "fwd" else TOL_DQ)
                res["check"] = "FAIL" if not ok or res.get("check") == "FAIL" else "pass"
            stage = f"time {phase}"
            times[phase] = list(impl.time(case, inputs[fw], phase))
        except (Skip, NotImplementedError) as e:  # e.g. ours without its CUDA module / backward
            why = f"{stage}: {type(e).__name__}: {e}"[:600]
            if phase == "fwd":
                return {"status": "skipped", "reason": why}
            res.update(bwd_status="skipped", bwd_reason=why)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".strip()
            if args.verbose:
                traceback.print_exc()
            if "out of memory" in msg.lower() or "RESOURCE_EXHAUSTED" in msg:
                inputs.pop(fw, None)
                ctx["hosts"].pop(fw, None)
            if phase == "fwd":
                return {**res, "status": "error", "reason": f"{stage}: {msg[:600]}"}
            res.update(bwd_status="error", bwd_reason=f"{stage}: {msg[:600]}")
        finally:
            free_device_memory()
    # the median is the figure; the samples stay in the JSON, so that a slow row shows whether
    # every sample or a few were slow
    res["fwd_ms"] = res["fwdbwd_ms"] = None
    for phase, key in (("fwd", "fwd"), ("bwd", "fwdbwd")):
        if phase in times:
            res[f"{key}_ms"] = statistics.median(times[phase])
            res[f"{key}_samples_ms"] = [round(x, 4) for x in times[phase]]
    tf = tflops_from_times(case.flops["fwd_flops"], res["fwd_ms"], res["fwdbwd_ms"])
    te = tflops_from_times(case.flops["fwd_flops_exact"], res["fwd_ms"], res["fwdbwd_ms"])
    res.update(
        fwd_tflops=tf["fwd"], bwd_tflops=tf["bwd"], total_tflops=tf["total"], bwd_ms=tf["bwd_ms"],
        fwd_tflops_exact=te["fwd"], bwd_tflops_exact=te["bwd"], total_tflops_exact=te["total"],
    )
    if res.get("check") == "FAIL":
        res["status"] = "wrong"
    return res


def log_row(row: dict, bar) -> None:
    if row["status"] in ("ok", "wrong"):
        msg = (f"S={row['S']:>6} d={row['d']:>3} {row['mask']:<22} {row['impl']:<5} rho={row['rho']:.3f} "
               f"fwd {_f(row.get('fwd_ms'), 2)} ms {_f(row.get('fwd_tflops'), 1)} TF  "
               f"bwd {_f(row.get('bwd_tflops'), 1)} TF  total {_f(row.get('total_tflops'), 1)} TF  "
               f"err {_e(row.get('err_out'))}/{_e(row.get('err_dq'))} {row.get('check', '')}")
        if row.get("bwd_status"):
            msg += f"  [bwd {row['bwd_status']}: {row.get('bwd_reason', '')}]"
    else:
        msg = f"S={row['S']:>6} d={row['d']:>3} {row['mask']:<22} {row['impl']:<5} {row['status']}: {row.get('reason', '')}"
    (bar.write if bar is not None else print)(msg)


# ---------------------------------------------------------------------------------------------
# Outputs: JSON, markdown, PNG
# ---------------------------------------------------------------------------------------------


def _f(x, nd=1):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _cell(text, n: int) -> str:
    """Text safe inside a markdown table cell, cut to n characters."""
    return str(text).replace("|", "/").replace("\n", " ")[:n]


def _e(x):
    return "—" if x is None else f"{x:.1e}"


def load_anchors(path) -> dict:
    """{(impl, S, mask): {fwd_tflops, bwd_tflops, total_tflops}} from the anchors file, if given."""
    if not path:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for S, masks in raw.get("flexattention_torch_2_11", {}).items():
        for m, r in masks.items():
            out[("flex", int(S), m)] = {k: r.get(k) for k in ("fwd_tflops", "bwd_tflops", "total_tflops")}
    # cuDNN anchors are times; convert with this protocol's FLOPs (exact visible area, as measured).
    for S, masks in raw.get("cudnn_jax_0_11_2_ms", {}).items():
        S = int(S)
        for m, r in masks.items():
            out[("cudnn", S, m)] = {"fwd_ms": r.get("fwd_ms"), "fwdbwd_ms": r.get("fwdbwd_ms")}
    return out


def _anchor_tflops(anchors, row):
    a = anchors.get((row["impl"], row["S"], row["mask"]))
    if not a or row["d"] != 128:
        return None
    if "fwd_ms" in a:  # cuDNN: times; use exact visible-area FLOPs like the anchors did
        t = tflops_from_times(row["fwd_flops_exact"], a["fwd_ms"], a["fwdbwd_ms"])
        return {"fwd_tflops": t["fwd"], "bwd_tflops": t["bwd"], "total_tflops": t["total"], "exact": True}
    return {**a, "exact": False}


_COMMAND_FLAGS = ("impls", "masks", "seqlens", "head_dims", "extra_head_dims", "extra_seqlens", "heads",
                  "total_tokens", "fwd_only", "ours_implementation", "iters", "min_iters", "budget_s",
                  "check_rows", "no_check", "seed", "time_limit_s")


def _meta_runs(meta: dict) -> list[dict]:
    """The runs a results document holds: its merged runs, or itself ({"args": ...})."""
    return meta.get("runs") or [{"args": meta.get("args", {})}]


def command_line(args: dict) -> str:
    """The bench_attention.py command of a run, from the arguments its JSON recorded."""
    parts = ["python3 benchmarks/bench_attention.py"]
    for name in _COMMAND_FLAGS:
        if name not in args:
            continue
        value = args[name]
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif name == "masks" and list(value) == list(MASK_NAMES):
            parts.append(f"{flag} all")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{flag}={','.join(str(x) for x in value)}")
        elif value is not None:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def render_markdown(doc: dict, anchors: dict | None = None) -> str:
    anchors = anchors or {}
    meta = doc["meta"]
    env = meta.get("env", {})
    lines = [
        f"# Attention benchmark — {env.get('device', '?')} — {meta.get('date', '?')}",
        "",
        f"jax {env.get('jax', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}. "
        f"{meta.get('protocol', '')}",
        "",
        "Columns: ρ = fraction of fully masked 128×128 tiles; TF = TFLOP/s in the FlashMask convention "
        "(4·B·H·S²·d·(1−ρ) forward, ×2.5 backward, bwd time = (fwd+bwd) − fwd, total = 3.5× over fwd+bwd); "
        "fwd TF exact = visible-area FLOPs over the same time; err = max |Δ| of output / dQ against a float32 "
        "reference on batch row 0, the first heads and sampled query rows of the timed run; check fails above rel. error "
        f"{TOL_OUT:g} (out) / {TOL_DQ:g} (dQ)."
        + (" anchor = the same figures in the anchors file (d=128 only; cuDNN's from its times with "
           "exact visible-area FLOPs, so compare them with the 'fwd TF exact' column)." if anchors else ""),
        "",
    ]
    runs = _meta_runs(meta)
    lines += ["Command" + ("s" if len(runs) > 1 else "") + " (`meta` in the JSON has the environment):", "", "```"]
    lines += [command_line(run["args"]) for run in runs if run.get("args")] + ["```", ""]
    if meta.get("note"):  # what the commands alone don't say (a run cut short, a machine shared)
        lines += [meta["note"], ""]
    rows = doc["results"]
    groups = []
    for r in rows:
        if (r["S"], r["d"]) not in groups:
            groups.append((r["S"], r["d"]))
    for S, d in groups:
        g = [r for r in rows if r["S"] == S and r["d"] == d]
        B, H = g[0]["B"], g[0]["H"]
        lines += [f"## S = {S}, d = {d} (B = {B}, H = {H})", ""]
        head = "| mask | ρ | impl | fwd ms | fwd+bwd ms | fwd TF | bwd TF | total TF | fwd TF exact | err out / dQ | check |"
        sep = "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"
        if anchors:
            head += " anchor fwd / bwd TF |"
            sep += "---|"
        lines += [head, sep]
        for r in g:
            if r["status"] in ("ok", "wrong"):
                cells = [
                    r["mask"], f"{r['rho']:.3f}", r["impl"], _f(r.get("fwd_ms"), 2), _f(r.get("fwdbwd_ms"), 2),
                    _f(r.get("fwd_tflops")), _f(r.get("bwd_tflops")), _f(r.get("total_tflops")),
                    _f(r.get("fwd_tflops_exact")), f"{_e(r.get('err_out'))} / {_e(r.get('err_dq'))}",
                    r.get("check", "—") if r["status"] == "ok" else "**FAIL**",
                ]
                if r.get("bwd_status"):
                    cells[-1] += f"; bwd {r['bwd_status']}: " + _cell(r.get("bwd_reason", ""), 100)
            else:
                cells = [r["mask"], f"{r['rho']:.3f}", r["impl"], "—", "—", "—", "—", "—", "—", "—",
                         f"{r['status']}: " + _cell(r.get("reason", ""), 120)]
            if anchors:
                a = _anchor_tflops(anchors, r)
                cells.append("—" if not a else f"{_f(a.get('fwd_tflops'))} / {_f(a.get('bwd_tflops'))}"
                             + (" (exact FLOPs)" if a["exact"] else ""))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def render_png(doc: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return False
    rows = [r for r in doc["results"] if r.get("fwd_tflops") is not None]
    if not rows:
        return False
    groups = []
    for r in rows:
        if (r["S"], r["d"]) not in groups:
            groups.append((r["S"], r["d"]))
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    has_bwd = any(r.get("bwd_tflops") is not None for r in rows)
    metrics = [("fwd_tflops", "forward TFLOP/s")] + ([("bwd_tflops", "backward TFLOP/s")] if has_bwd else [])
    fig, axes = plt.subplots(len(metrics), len(groups), figsize=(max(6, 5.5 * len(groups)), 4.2 * len(metrics)),
                             squeeze=False)
    colors = {"ours": "tab:red", "cudnn": "tab:green", "flex": "tab:blue", "flex_flash": "tab:purple",
              "fa4_jax": "tab:orange"}
    for c, (S, d) in enumerate(groups):
        masks = [m for m in MASK_NAMES if any(r["mask"] == m and r["S"] == S and r["d"] == d for r in rows)]
        x = np.arange(len(masks))
        wdt = 0.8 / max(1, len(impls))
        for mi, (key, label) in enumerate(metrics):
            ax = axes[mi][c]
            for ii, impl in enumerate(impls):
                vals = []
                for m in masks:
                    hit = [r for r in rows if r["mask"] == m and r["S"] == S and r["d"] == d and r["impl"] == impl]
                    vals.append((hit[0].get(key) or 0.0) if hit else 0.0)
                ax.bar(x + (ii - (len(impls) - 1) / 2) * wdt, vals, wdt, label=impl, color=colors.get(impl))
            ax.set_xticks(x)
            ax.set_xticklabels(masks, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(label)
            ax.set_title(f"S={S}, d={d}")
            ax.grid(axis="y", alpha=0.3)
            if mi == 0 and c == 0:
                ax.legend(fontsize=8)
    env = doc["meta"].get("env", {})
    fig.suptitle(f"{env.get('device', '?')} {doc['meta'].get('date', '')}: FlashMask-convention TFLOP/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def merge_results(docs: list[dict], names: list[str]) -> dict:
    """One results document from several runs (e.g. one device call per sequence length).

    Rows keep their order; a later file's row for the same (S, d, mask, impl) replaces an earlier one.
    """
    if len(docs) == 1:
        return docs[0]
    rows = {}
    for d in docs:
        for r in d["results"]:
            rows[(r["S"], r["d"], r["mask"], r["impl"])] = r
    meta = dict(docs[0]["meta"])
    meta["merged_from"] = [str(n) for n in names]
    meta["runs"] = [run for d in docs for run in _meta_runs(d["meta"])]
    return {"meta": meta, "results": list(rows.values())}


def write_outputs(doc: dict, paths: dict, args, final: bool) -> None:
    paths["json"].write_text(json.dumps(doc, indent=1, default=_json_default))
    paths["md"].write_text(render_markdown(doc, load_anchors(args.anchors)))
    if final and not args.no_plot:
        render_png(doc, paths["png"])


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _names(valid):
    def parse(s: str) -> list[str]:
        out = [x.strip() for x in s.split(",") if x.strip()]
        if out == ["all"]:
            return list(valid)
        bad = [x for x in out if x not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(valid)}")
        return out

    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--masks", type=_names(MASK_NAMES), default=list(MASK_NAMES), help="comma list or 'all'")
    p.add_argument("--seqlens", type=_ints, default=[8192, 32768, 131072])
    p.add_argument("--head-dims", type=_ints, default=[128], help="head dims run at every S")
    p.add_argument("--extra-head-dims", type=_ints, default=[64, 256], help="head dims run at --extra-seqlens only")
    p.add_argument("--extra-seqlens", type=_ints, default=[8192, 32768])
    p.add_argument("--impls", type=_names(IMPLS), default=list(IMPLS))
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--total-tokens", type=int, default=131072, help="B = total_tokens / S")
    p.add_argument("--fwd-only", action="store_true", help="time the forward only")
    p.add_argument("--quick", action="store_true",
                   help=f"S=8192, d=128, masks {','.join(QUICK_MASKS)} (unless given), fewer repeats")
    p.add_argument("--ours-implementation", default="cuda",
                   help="value of implementation= for jax_flashmask.attention ('default' passes none)")
    p.add_argument("--iters", type=int, default=20, help="most timing samples per measurement (jax)")
    p.add_argument("--min-iters", type=int, default=5, help="fewest timing samples per measurement")
    p.add_argument("--budget-s", type=float, default=3.0, help="rough seconds per measurement")
    p.add_argument("--check-rows", type=int, default=256, help="query rows (batch 0) checked per case")
    p.add_argument("--check-heads", type=int, default=2, help="heads checked per case")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--out-prefix", default=None, help="file name stem; default <machine>_<date>")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--time-limit-s", type=float, default=0,
                   help="start no new case after this many seconds (0 = no limit); the rest is 'not run'")
    p.add_argument("--anchors", default=None, help="anchors JSON: adds an anchor column to the table")
    p.add_argument("--render", nargs="+", default=None, metavar="JSON",
                   help="no benchmark: re-render markdown and PNG of results JSON files; several are "
                        "merged into <out-dir>/<out-prefix>.{json,md,png} (one: in place)")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failing cases")
    args = p.parse_args(argv)
    if args.quick:
        explicit = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        if "--masks" not in explicit:
            args.masks = list(QUICK_MASKS)
        if "--seqlens" not in explicit:
            args.seqlens = [8192]
        if "--head-dims" not in explicit:
            args.head_dims = [128]
        if "--extra-head-dims" not in explicit:
            args.extra_head_dims = []
        if "--iters" not in explicit:
            args.iters = 10
        if "--budget-s" not in explicit:
            args.budget_s = 1.5
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        docs = [json.loads(Path(f).read_text()) for f in args.render]
        doc = merge_results(docs, args.render)
        if len(args.render) == 1 and not args.out_prefix:
            stem = Path(args.render[0]).with_suffix("")
        else:
            if not args.out_prefix:
                raise SystemExit("--render with several files needs --out-prefix")
            stem = Path(args.out_dir) / args.out_prefix
            stem.parent.mkdir(parents=True, exist_ok=True)
            stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=_json_default))
        md = render_markdown(doc, load_anchors(args.anchors))
        stem.with_suffix(".md").write_text(md)
        if not args.no_plot:
            render_png(doc, stem.with_suffix(".png"))
        print(md)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
