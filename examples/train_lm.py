#!/usr/bin/env python
"""Train a small byte-level decoder-only LM on packed documents with a FlashMask document mask.

The corpus ships with every Python install: the standard library's own ``.py`` files. Each file is
a document (its first N bytes, N drawn per file from ``--doc-len``), byte-tokenised with a BOS
token in front, and documents are packed back to back into fixed-length sequences. Segment ids
become the ``causal_document`` mask through `jax_flashmask.masks.from_segment_ids`; the attention
layer is `jax_flashmask.nn.flax.FlashMaskAttention` (Flax NNX).

    python examples/train_lm.py                    # CPU-sized default, a few minutes
    python examples/train_lm.py --compare          # plain causal vs causal_document, plots both
    python examples/train_lm.py --preset gpu --compare   # a GPU-sized run (bf16, S=2048)

Sharded with ``jax.jit`` and ``NamedSharding`` on a mesh ``data x context x tensor`` over all
devices (or the first ``--devices N``; on CPU try ``XLA_FLAGS=--xla_force_host_platform_device_count=4``):
the batch is split over "data" (each device computes attention for its own rows only: the tiles
per device that the script prints drop by the data-parallel degree), ``--tensor-parallel N``
splits the heads over N devices (Megatron-style: Q/K/V and MLP-up weights split by output column,
O and MLP-down by input row, so a GQA group stays on one device and attention needs no
communication), and ``--context-parallel P`` splits the sequence over P devices with
`jax_flashmask.context_parallel` (see `_context_parallel_hook`).

What the mask buys: with a plain causal mask every token also attends to the unrelated documents
packed before it. ``--compare`` trains the same model (same init, same batches) both ways and
evaluates each, with the mask it was trained with, on held-out files (never seen in training)
packed the same way: the loss over all bytes, and the loss over the first ``--head-bytes`` bytes
of each document, where the leaked context is largest relative to the document's own and where
the document model knows it is at a file's start. Plot and ``train_lm.json`` go to ``--out-dir``
(default ``examples/runs/``).

Needs: ``pip install 'jax_flashmask[flax,examples]'`` (flax, optax; tqdm and matplotlib optional).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import re
import sys
import sysconfig
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashmask as jfm
from jax_flashmask.masks import FlashMask, from_segment_ids

try:
    import optax
    from flax import nnx

    from jax_flashmask.nn.flax import FlashMaskAttention
except ImportError as e:  # pragma: no cover
    raise SystemExit(f"{e}\nthis example needs: pip install 'jax_flashmask[flax,examples]'") from e

BOS = 256
VOCAB = 257
MASKS = {
    "causal": "plain causal (attends across documents)",
    "document": "causal_document (FlashMask)",
}

PRESETS = {
    # a few seconds: for tests
    "tiny": dict(seq_len=128, batch_size=8, d_model=64, layers=2, heads=4, kv_heads=2, steps=20,
                 lr=3e-3, eval_every=10, eval_seqs=16, doc_len=(32, 256), dtype="float32"),
    # CPU-sized default: a couple of minutes per model on 2 cores
    "cpu": dict(seq_len=256, batch_size=8, d_model=128, layers=2, heads=4, kv_heads=2, steps=250,
                lr=3e-3, eval_every=50, eval_seqs=96, doc_len=(64, 512), dtype="float32"),
    # one GPU (H100/H200-class): ~11M parameters, bf16 compute, ~40M tokens (a few epochs)
    "gpu": dict(seq_len=2048, batch_size=32, d_model=384, layers=6, heads=6, kv_heads=2, steps=600,
                lr=1e-3, eval_every=100, eval_seqs=256, doc_len=(256, 16384), dtype="bfloat16"),
}


# ----------------------------------------------------------------------------------------- data
def stdlib_sources():
    """Sorted paths of the standard library's ``.py`` files (no site-packages)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return root, files


def load_documents(doc_len, seed, max_files=None):
    """(train, held-out) lists of uint16 token arrays: BOS + the file's first N bytes.

    The split is by file (a hash of its path, 1 in 10 held out), so held-out documents were never
    trained on. N is drawn per file in ``doc_len`` from a seed derived from the path.
    """
    root, files = stdlib_sources()
    if max_files:
        files = files[:: max(1, len(files) // max_files)]
    lo, hi = doc_len
    train, held = [], []
    for path in files:
        rel = path.relative_to(root).as_posix()
        h = zlib.crc32(rel.encode())
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not data.strip():
            continue
        n = int(np.random.default_rng([h, seed]).integers(lo, hi + 1))
        doc = np.concatenate([[BOS], np.frombuffer(data[:n], np.uint8)]).astype(np.int32)
        (held if h % 10 == 0 else train).append(doc)
    if not train or not held:
        raise SystemExit(f"found too few standard-library sources under {root}")
    return train, held


@dataclasses.dataclass
class Packed:
    tokens: np.ndarray  # int32 [n, S] inputs
    targets: np.ndarray  # int32 [n, S] next tokens
    segment_ids: np.ndarray  # int32 [n, S] document index (contiguous runs)
    weight: np.ndarray  # float32 [n, S] 1 where the target is in the input's document
    head: np.ndarray  # float32 [n, S] 1 where the target is among a document's first head bytes


def pack(docs, num_seqs, seq_len, rng, head_bytes):
    """Concatenate shuffled documents (reshuffled every pass) and cut the stream into sequences.

    A document that crosses a sequence boundary continues in the next sequence as a new segment.
    The loss skips targets that belong to the next document (nothing in a document predicts it).
    """
    need = num_seqs * seq_len + 1
    toks, segs, offs = [], [], []
    total, doc_id = 0, 0
    while total < need:
        for i in rng.permutation(len(docs)):
            d = docs[i]
            toks.append(d)
            segs.append(np.full(len(d), doc_id, np.int32))
            offs.append(np.arange(len(d), dtype=np.int32))
            doc_id += 1
            total += len(d)
            if total >= need:
                break
    tok, seg, off = (np.concatenate(a)[:need] for a in (toks, segs, offs))
    cut = lambda a, shift: a[shift: shift + num_seqs * seq_len].reshape(num_seqs, seq_len)  # noqa: E731
    seg_in, seg_out = cut(seg, 0), cut(seg, 1)
    weight = (seg_in == seg_out).astype(np.float32)
    # offset 0 is BOS, so offsets 1..head_bytes are the document's first head_bytes bytes
    head = weight * (cut(off, 1) <= head_bytes)
    return Packed(cut(tok, 0), cut(tok, 1), seg_in, weight, head)


def mask_indices(segment_ids):
    """causal_document mask of a batch of packed sequences: int32 [n, 1, S, 1]."""
    return np.asarray(from_segment_ids(segment_ids, causal=True).startend_row_indices)


# ---------------------------------------------------------------------------------------- model
_List = getattr(nnx, "List", list)


class Block(nnx.Module):
    def __init__(self, d, heads, kv_heads, implementation, dtype, rngs):
        self.norm1 = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)
        self.attn = FlashMaskAttention(d, heads, num_kv_heads=kv_heads, causal=True,
                                       implementation=implementation, dtype=dtype, rngs=rngs)
        self.norm2 = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, dtype=dtype, rngs=rngs)

    def __call__(self, x, mask, positions=None, attention_fn=None):
        x = x + self.attn(self.norm1(x), mask, positions=positions, attention_fn=attention_fn)
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class LM(nnx.Module):
    """Pre-norm decoder: byte embedding (tied with the output), blocks of RoPE attention + MLP."""

    def __init__(self, d, layers, heads, kv_heads, implementation=None, dtype=jnp.float32, *, rngs):
        self.embed = nnx.Embed(VOCAB, d, dtype=dtype, rngs=rngs)
        self.blocks = _List([Block(d, heads, kv_heads, implementation, dtype, rngs) for _ in range(layers)])
        self.norm = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)

    def __call__(self, tokens, mask=None, positions=None, attention_fn=None):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, mask, positions, attention_fn)
        return self.embed.attend(self.norm(x)).astype(jnp.float32)


# ------------------------------------------------------------------------- context parallel hook
def _context_parallel_hook(cp_size, seq_len):
    """`jax_flashmask.context_parallel` when ``--context-parallel P`` > 1 (else None).

    With P > 1 every sequence is cut into 2P chunks; each step a plan (int32 [P, 2], data: no
    recompile) assigns chunks to the P ranks of the mesh's "context" axis: the sparsity-aware
    `balanced_plan` for document masks, `dual_chunk_plan` for the plain causal mask. Tokens,
    targets and loss weights are permuted into that layout on the host, RoPE gets the permuted
    global positions, the mask stays global, and every attention layer calls
    `context_parallel_attention` (a `FlashMaskAttention` ``attention_fn``).
    """
    if cp_size <= 1:
        return None
    try:
        from jax_flashmask import context_parallel as cp

        for name in ("context_parallel_attention", "balanced_plan", "chunk_workloads",
                     "dual_chunk_plan", "permute_tokens", "token_positions"):
            getattr(cp, name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"--context-parallel needs jax_flashmask.context_parallel: {e}") from e
    if seq_len % (2 * cp_size):
        raise SystemExit(f"--context-parallel {cp_size}: seq_len {seq_len} must be a multiple of {2 * cp_size}")
    if len(jax.devices()) < cp_size:
        raise SystemExit(f"--context-parallel {cp_size} needs {cp_size} devices, found {len(jax.devices())} "
                         "(on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    return cp


# ------------------------------------------------------------------------------------- sharding
def make_mesh(batch_size, cp_size=1, tp_size=1, num_devices=None):
    """Mesh ("data", "context", "tensor"): data parallel over what context x tensor leave over."""
    devices = jax.devices()[:num_devices] if num_devices else jax.devices()
    if len(devices) < cp_size * tp_size:
        raise SystemExit(f"--context-parallel {cp_size} x --tensor-parallel {tp_size} needs "
                         f"{cp_size * tp_size} devices, found {len(devices)} "
                         "(on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    dp = max(1, len(devices) // (cp_size * tp_size))
    while batch_size % dp:
        dp -= 1
    grid = np.array(devices[: dp * cp_size * tp_size]).reshape(dp, cp_size, tp_size)
    return Mesh(grid, ("data", "context", "tensor"))


# Megatron-style tensor parallelism: these weights are split by output column (Q/K/V heads, MLP
# hidden units) and these by input row (O, MLP down), so the heads of q/k/v and the attention
# output stay on their device; attention and MLP each need one all-reduce of [B, S, d_model]
# forward (after O / down) and one backward (into the layer's input).
_COLUMN_SPLIT = ("q_proj", "k_proj", "v_proj", "up")
_ROW_SPLIT = ("o_proj", "down")


def param_spec(path, leaf):
    """PartitionSpec of one parameter (its state path) under --tensor-parallel."""
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    if getattr(leaf, "ndim", 0) == 0:
        return P()
    if any(n in _COLUMN_SPLIT for n in names):
        return P(None, "tensor") if "kernel" in names else P("tensor")  # kernel [in, out], bias [out]
    if any(n in _ROW_SPLIT for n in names) and "kernel" in names:
        return P("tensor", None)
    return P()


def check_tensor_parallel(cfg, tp):
    if tp <= 1:
        return
    for name, n in (("heads", cfg["heads"]), ("kv-heads", cfg["kv_heads"]), ("4 * d-model", 4 * cfg["d_model"])):
        if n % tp:
            raise SystemExit(f"--tensor-parallel {tp}: {name} = {n} is not a multiple of {tp} "
                             "(each device holds whole GQA groups)")


def heads_sharded_attention(mesh):
    """`jax_flashmask.attention` with q/k/v pinned to (batch on "data", heads on "tensor"):
    what the sharded projections produce anyway; the constraint makes it the layout's contract."""
    heads = NamedSharding(mesh, P("data", None, "tensor", None))

    def attn(q, k, v, *args, **kwargs):
        q, k, v = (jax.lax.with_sharding_constraint(x, heads) for x in (q, k, v))
        return jfm.attention(q, k, v, *args, **kwargs)

    return attn


def attention_tiles(hlo_text):
    """Attention tiles one device visits per compiled step, read from the compiled program.

    The portable implementation maps over query tiles (forward, dQ) and key tiles (dK/dV) with
    `lax.map`: loops with a static trip count, whose sum is the number of (batch row, mask head,
    tile) triples this device computes. (Inner loops over key blocks have dynamic counts.) A loop
    of a single trip is removed by XLA, so the count is exact when each loop runs >= 2 tiles.
    None when the program has no such loops (the Hopper kernels' tiles live inside the kernels)."""
    return sum(int(n) for n in re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', hlo_text)) or None


def collective_counts(hlo_text):
    """{collective op: how many} in a compiled program (data parallel: only the gradients'
    all-reduce; nothing gathers activations)."""
    ops = re.findall(r"\s(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(",
                     hlo_text)
    return {op: ops.count(op) for op in sorted(set(ops))}


# ------------------------------------------------------------------------------------- training
def xent(logits, targets, weights):
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return nll, jnp.sum(nll * weights)


def train(cfg, mask_kind, train_docs, held_docs, *, mesh, cp=None, progress=True, log=print):
    """Train one model; returns its history (train loss per step, held-out evals)."""
    dtype = jnp.dtype(cfg["dtype"])
    S, Bsz, steps = cfg["seq_len"], cfg["batch_size"], cfg["steps"]
    rng = np.random.default_rng(cfg["seed"])
    data = pack(train_docs, steps * Bsz, S, rng, cfg["head_bytes"])
    evald = pack(held_docs, cfg["eval_seqs"], S, np.random.default_rng(cfg["seed"] + 1), cfg["head_bytes"])
    use_mask = mask_kind == "document"

    def create():  # same seed, same init for both masks
        return LM(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["implementation"],
                  dtype, rngs=nnx.Rngs(cfg["seed"]))

    replicated = NamedSharding(mesh, P())
    tensor_parallel = mesh.shape["tensor"] > 1
    graphdef, abstract, rest = nnx.split(nnx.eval_shape(create), nnx.Param, ...)
    # replicated, or split over "tensor" (param_spec); one compiled init, not op by op
    spec_of = param_spec if tensor_parallel else (lambda path, leaf: P())
    param_shardings = jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, spec_of(path, leaf)), abstract)
    params = jax.jit(lambda: nnx.state(create(), nnx.Param), out_shardings=param_shardings)()
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg["lr"], max(1, steps // 10), steps, cfg["lr"] / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, b2=0.98, weight_decay=0.01))
    # Adam's moments are split like their parameters; step counts are replicated
    opt_shardings = optax.tree_map_params(tx, lambda _, sh: sh, jax.eval_shape(tx.init, params),
                                          param_shardings, transform_non_params=lambda _: replicated)
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)

    # [B, S] arrays: batch over "data", sequence over "context" (size 1 without --context-parallel)
    batch_sharding = NamedSharding(mesh, P("data", "context"))
    mask_sharding = NamedSharding(mesh, P("data"))  # [B, 1, S, 1]: global, every rank holds it

    def forward(params, batch):
        m = nnx.merge(graphdef, params, rest)
        mask = FlashMask(batch["mask"], causal=True) if use_mask else None
        if cp is None:
            attn = heads_sharded_attention(mesh) if tensor_parallel else None
            return m(batch["tokens"], mask, attention_fn=attn)
        attn = functools.partial(cp.context_parallel_attention, plan=batch["plan"], mesh=mesh,
                                 axis_name="context", batch_axis="data",
                                 head_axis="tensor" if tensor_parallel else None)
        return m(batch["tokens"], mask, positions=batch["positions"], attention_fn=attn)

    def loss_fn(params, batch):
        nll, total = xent(forward(params, batch), batch["targets"], batch["weight"])
        return total / jnp.maximum(jnp.sum(batch["weight"]), 1.0)

    # shardings pinned on both sides: the compiled step takes back what it returns
    @functools.partial(jax.jit, in_shardings=(param_shardings, opt_shardings, None),
                       out_shardings=(param_shardings, opt_shardings, replicated))
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def eval_step(params, batch):
        nll, total = xent(forward(params, batch), batch["targets"], batch["weight"])
        return jnp.stack([total, jnp.sum(batch["weight"]),
                          jnp.sum(nll * batch["head"]), jnp.sum(batch["head"])])

    def device_batch(p: Packed, sl):
        b = dict(tokens=p.tokens[sl], targets=p.targets[sl], weight=p.weight[sl], head=p.head[sl])
        extra = {}
        if use_mask:
            extra["mask"] = mask_indices(p.segment_ids[sl])
        if cp is not None:  # permute the sequence axis into the plan's layout
            P_ = cfg["context_parallel"]
            if use_mask:
                work = cp.chunk_workloads(FlashMask(jnp.asarray(extra["mask"]), causal=True), 2 * P_,
                                          tile_q=min(64, S // (2 * P_)), tile_k=min(64, S // (2 * P_)))
                plan = np.asarray(cp.balanced_plan(work, P_).plan, np.int32)
            else:
                plan = np.asarray(cp.dual_chunk_plan(P_, 2 * P_), np.int32)
            b = {k: np.asarray(cp.permute_tokens(v, plan, axis=1, xp=np)) for k, v in b.items()}
            extra["plan"] = plan
            extra["positions"] = np.asarray(cp.token_positions(plan, S, xp=np), np.int32)
        b = jax.device_put(b, batch_sharding)
        for k, v in extra.items():
            b[k] = jax.device_put(v, mask_sharding if k == "mask" else replicated)
        return b

    eval_batches = [device_batch(evald, slice(i, i + Bsz))
                    for i in range(0, cfg["eval_seqs"] - Bsz + 1, Bsz)]

    def evaluate(params):
        tot = sum(np.asarray(eval_step(params, b)) for b in eval_batches)
        return float(tot[0] / tot[1]), float(tot[2] / tot[3])

    hist = dict(mask=mask_kind, train_loss=[], eval=[])
    # compiled once up front, so that the per-device work can be read from the program
    step_fn = train_step.lower(params, opt_state, device_batch(data, slice(0, Bsz))).compile()
    hlo = step_fn.as_text()
    hist["tiles_per_device"] = attention_tiles(hlo)
    hist["collectives"] = collective_counts(hlo)
    hist["mesh"] = dict(mesh.shape)
    if hist["tiles_per_device"] is not None:
        log(f"  [{mask_kind}] mesh {dict(mesh.shape)}: {hist['tiles_per_device']} attention tiles per "
            "device and step (forward + backward, from the compiled program)")
    bar = _progress(steps, f"{mask_kind:>8}", progress)
    post = {}  # last held-out numbers, kept in the bar's postfix
    t0 = time.perf_counter()
    for step in range(steps):
        batch = device_batch(data, slice(step * Bsz, (step + 1) * Bsz))
        params, opt_state, loss = step_fn(params, opt_state, batch)
        loss = float(loss)
        if not math.isfinite(loss):
            raise FloatingPointError(f"{mask_kind}: loss is {loss} at step {step}")
        hist["train_loss"].append(loss)
        if (step + 1) % cfg["eval_every"] == 0 or step + 1 == steps:
            ev, head = evaluate(params)
            hist["eval"].append((step + 1, ev, head))
            post.update(heldout=f"{ev:.3f}", head=f"{head:.3f}")
            bar.set_postfix(loss=f"{loss:.3f}", **post)
            if not bar.live:
                log(f"  [{mask_kind}] step {step + 1:5d}  train {loss:.3f}  held-out {ev:.3f}  "
                    f"first {cfg['head_bytes']} bytes {head:.3f}  ({time.perf_counter() - t0:.0f}s)")
        elif bar.live:
            bar.set_postfix(loss=f"{loss:.3f}", **post, refresh=False)
        bar.update(1)
    bar.close()
    hist["seconds"] = time.perf_counter() - t0
    hist["tokens_per_s"] = steps * Bsz * S / hist["seconds"]
    return hist


class _Bar:
    """Minimal stand-in when tqdm is missing (or --no-progress): the caller prints eval lines."""

    live = False

    def __init__(self, *a, **k):
        pass

    def update(self, n=1):
        pass

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass


def _progress(total, desc, enabled):
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            bar = tqdm(total=total, desc=desc, dynamic_ncols=True, leave=True)
            bar.live = True
            return bar
    return _Bar()


# ----------------------------------------------------------------------------------------- plot
def plot_histories(hists, path, head_bytes):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for h, color in zip(hists, ("tab:red", "tab:blue")):
        label = MASKS[h["mask"]]
        tl = np.asarray(h["train_loss"])
        k = max(1, len(tl) // 30)
        smooth = np.convolve(tl, np.ones(k) / k, mode="valid")
        a1.plot(np.arange(k, len(tl) + 1), smooth, color=color, label=label)
        ev = np.asarray(h["eval"])
        a2.plot(ev[:, 0], ev[:, 1], "o-", color=color, label=f"{label}: all bytes")
        a2.plot(ev[:, 0], ev[:, 2], "s--", color=color, label=f"{label}: first {head_bytes} bytes")
    a1.set(title="training loss (packed sequences)", xlabel="step", ylabel="nats / byte")
    a2.set(title="held-out loss (unseen stdlib files, packed)", xlabel="step", ylabel="nats / byte")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


# ------------------------------------------------------------------------------------------ CLI
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                   help="model/data size (default cpu; gpu = S=2048, 6 layers, bf16)")
    p.add_argument("--mask", choices=sorted(MASKS), default="document",
                   help="document = causal_document FlashMask from segment ids; causal = plain causal")
    p.add_argument("--compare", action="store_true", help="train with both masks, compare held-out loss")
    for name, typ in (("steps", int), ("batch-size", int), ("seq-len", int), ("d-model", int),
                      ("layers", int), ("heads", int), ("kv-heads", int), ("lr", float),
                      ("eval-every", int), ("eval-seqs", int), ("dtype", str)):
        p.add_argument(f"--{name}", type=typ, default=None, help="override the preset")
    p.add_argument("--doc-len", type=lambda s: tuple(int(v) for v in s.split(",")), default=None,
                   metavar="MIN,MAX", help="bytes kept per file, drawn per file (override the preset)")
    p.add_argument("--head-bytes", type=int, default=32,
                   help="the 'first bytes of each document' held-out metric (default 32)")
    p.add_argument("--max-files", type=int, default=None, help="use a subset of the stdlib files")
    p.add_argument("--implementation", default=None, choices=["cuda", "xla", "reference"],
                   help="jax_flashmask.attention implementation (default: best available)")
    p.add_argument("--context-parallel", type=int, default=1, metavar="P",
                   help="split sequences over P devices (needs jax_flashmask.context_parallel)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="split the heads (and MLP) over N devices; heads and kv-heads divisible by N")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="use the first N devices (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=str(pathlib.Path(__file__).resolve().parent / "runs"),
                   help="where the plot and train_lm.json go (default examples/runs/)")
    p.add_argument("--plot", default=None, help="PNG path of the loss curves (default OUT_DIR/train_lm.png)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="print eval lines instead of a tqdm bar")
    return p.parse_args(argv)


def config_from(args):
    cfg = dict(PRESETS[args.preset])
    for k in ("steps", "batch_size", "seq_len", "d_model", "layers", "heads", "kv_heads", "lr",
              "eval_every", "eval_seqs", "dtype", "doc_len"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    cfg.update(head_bytes=args.head_bytes, seed=args.seed, implementation=args.implementation,
               context_parallel=args.context_parallel, tensor_parallel=args.tensor_parallel)
    cfg["eval_seqs"] = max(cfg["eval_seqs"], cfg["batch_size"])
    return cfg


def main(argv=None):
    """Run; returns ``{mask: history}`` (history: train_loss list, eval [(step, all, head)], ...)."""
    args = parse_args(argv)
    cfg = config_from(args)
    cp = _context_parallel_hook(cfg["context_parallel"], cfg["seq_len"])
    check_tensor_parallel(cfg, cfg["tensor_parallel"])
    mesh = make_mesh(cfg["batch_size"], cfg["context_parallel"], cfg["tensor_parallel"], args.devices)
    train_docs, held_docs = load_documents(cfg["doc_len"], cfg["seed"], args.max_files)
    kinds = ["causal", "document"] if args.compare else [args.mask]
    print(f"jax {jax.__version__} on {len(mesh.devices.flat)} {jax.default_backend()} device(s), "
          f"mesh {dict(mesh.shape)}; {len(train_docs)} training / {len(held_docs)} held-out stdlib files "
          f"(Python {sys.version.split()[0]}), docs {cfg['doc_len'][0]}-{cfg['doc_len'][1]} bytes, "
          f"S={cfg['seq_len']}, batch {cfg['batch_size']}, {cfg['steps']} steps")
    hists = []
    for kind in kinds:
        print(f"training with the {MASKS[kind]} mask")
        h = train(cfg, kind, train_docs, held_docs, mesh=mesh, cp=cp, progress=not args.no_progress)
        hists.append(h)
        print(f"  done in {h['seconds']:.0f}s ({h['tokens_per_s']:.0f} tokens/s)")
    head = cfg["head_bytes"]
    print(f"\nheld-out loss, nats/byte (unseen files):   all bytes   first {head} bytes of each doc")
    for h in hists:
        _, ev, hd = h["eval"][-1]
        print(f"  {MASKS[h['mask']]:<40} {ev:9.4f}   {hd:9.4f}")
    if len(hists) == 2:
        (_, c_all, c_head), (_, d_all, d_head) = hists[0]["eval"][-1], hists[1]["eval"][-1]
        print(f"  document mask - causal mask:             {d_all - c_all:+9.4f}   {d_head - c_head:+9.4f}")
    out_dir = pathlib.Path(args.out_dir)
    if not args.no_plot:
        path = plot_histories(hists, args.plot or out_dir / "train_lm.png", head)
        if path:
            print(f"loss curves: {path}")
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "train_lm.json", "w") as f:
            json.dump(dict(config={k: v for k, v in cfg.items()}, histories=hists), f, indent=1)
    return {h["mask"]: h for h in hists}


if __name__ == "__main__":
    main()
