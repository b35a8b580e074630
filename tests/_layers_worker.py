"""The Flax NNX and Equinox layers in a jitted optax train step with sharded activations, on 8 host
CPU devices; one group per interpreter (see test_sharded_layers.py).

Run as ``python tests/_layers_worker.py GROUP``; prints one ``ok: ...`` line per check and exits
non-zero on the first failure. Every distributed call is followed by ``block_until_ready``.

Each check trains one step of a small model (attention layer + squared error against a target,
Adam) on one device and on the mesh. Loss, gradients and updated parameters must equal the
single-device step, and the compiled step may hold no all-gather at all:

* data parallel (batch sharded, parameters replicated): the only collectives are the gradient
  all-reduces of the parameters (none larger than the largest parameter);
* batch x heads (tensor parallel, Megatron-style: Q/K/V weights split by output column, O by input
  row, q/k/v pinned to (batch, heads) through the layer's `attention_fn`): besides those, only the
  all-reduce of the output projection's partial sums, ``[B / data, S, F]``. Attention itself moves
  nothing.
"""

from __future__ import annotations

import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flashmask as jf  # noqa: E402
from jax_flashmask import masks  # noqa: E402
from _hlo import large_collectives  # noqa: E402

# distinct sizes: weight Wq 48 x 64 = 3072; per device on 2 x 4, q / attention output 4·64·2·8 =
# 4096 (16384 gathered), k/v 2048 (8192 gathered), layer output [4, 64, 48] = 12288
B, S, F, N, K, D = 8, 64, 48, 8, 4, 8



def log(msg):
    print("ok:", msg, flush=True)


def block(x):
    return jax.block_until_ready(x)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(B, S, F)), jnp.float32)
    target = jnp.asarray(rng.normal(size=(B, S, F)), jnp.float32)
    segments = np.cumsum(rng.random((B, S)) < 0.08, axis=1).astype(np.int32)  # packed documents
    mask = jnp.asarray(masks.from_segment_ids(segments, causal=True).startend_row_indices)
    return x, target, mask


def compare(name, got, want, rtol=5e-5):
    """Per leaf, relative to its largest entry: float32 sums in another order (the tensor-parallel
    output projection adds four partial sums) differ by a few 1e-5."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(1e-6, float(np.max(np.abs(w), initial=0.0)))
        err = float(np.max(np.abs(g - w), initial=0.0)) / scale
        if not err <= rtol:
            raise AssertionError(f"{name}: max relative error {err:.3g} > {rtol}")


def heads_attention(mesh, batch_axis, head_axis):
    """`jf.attention` with q/k/v constrained to (batch, -, heads, -): the layers' `attention_fn`
    hook is where a model pins its activations' head sharding."""
    sh = NamedSharding(mesh, P(batch_axis, None, head_axis, None))

    def attn(q, k, v, *args, **kwargs):
        q, k, v = (jax.lax.with_sharding_constraint(t, sh) for t in (q, k, v))
        return jf.attention(q, k, v, *args, **kwargs)

    return attn


def make_step(apply, tx):
    """One jitted optax step of ``mean((apply(params, x, mask) - target)**2)``."""

    def loss_fn(params, x, target, mask):
        return jnp.mean((apply(params, x, mask) - target) ** 2)

    @jax.jit
    def step(params, opt_state, x, target, mask):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, target, mask)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, grads, optax.apply_updates(params, updates), opt_state

    return step


def _names(path):
    return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def check_step(name, params, make_apply, mesh, batch_axis, head_axis=None, split=None):
    """The step on the mesh equals the step on one device; no all-gather, and no collective larger
    than the largest parameter but the output projection's all-reduce under head sharding.
    `split(names, leaf) -> PartitionSpec` places the parameters (default: replicated)."""
    tx = optax.adam(1e-2)
    x, target, mask = data()
    single = make_step(make_apply(None), tx)
    want = block(single(params, tx.init(params), x, target, mask))

    attention_fn = heads_attention(mesh, batch_axis, head_axis) if head_axis else None
    step = make_step(make_apply(attention_fn), tx)
    rows = NamedSharding(mesh, P(batch_axis))
    place = lambda path, leaf: NamedSharding(mesh, split(_names(path), leaf) if split else P())  # noqa: E731
    with jax.set_mesh(mesh):  # needed by Explicit axes, harmless for Auto ones
        p = jax.device_put(params, jax.tree_util.tree_map_with_path(place, params))
        o = block(jax.jit(tx.init)(p))
        args = (p, o, jax.device_put(x, rows), jax.device_put(target, rows), jax.device_put(mask, rows))
        text = step.lower(*args).compile().as_text()
        got = block(step(*args))
    compare(name, got[:3], want[:3])

    largest = max(leaf.size for leaf in jax.tree.leaves(params))
    combine = (B // mesh.shape[batch_axis]) * S * F  # the output projection's partial sums
    found = large_collectives(text)
    bad = [c for c in found if c[0] == "all-gather" or
           (c[1] > largest and not (head_axis and c == ("all-reduce", combine)))]
    if bad:
        raise AssertionError(f"{name}: all-gathers or collectives larger than the largest parameter "
                             f"({largest}){' or the O all-reduce' if head_axis else ''}: {bad} (all: {found})")
    log(f"{name}: loss, grads and updated params equal one device; collectives "
        f"{sorted(set(found))} (largest parameter {largest})")


def flax_params_and_apply():
    from flax import nnx

    from jax_flashmask.nn.flax import FlashMaskAttention

    layer = FlashMaskAttention(F, N, num_kv_heads=K, head_dim=D, causal=True, implementation="xla",
                               rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)

    def make_apply(attention_fn):
        def apply(params, x, mask):
            return nnx.merge(graphdef, params)(x, mask, attention_fn=attention_fn)

        return apply

    def split(names, leaf):  # nnx.Linear kernel [in, out]
        if "kernel" in names and {"q_proj", "k_proj", "v_proj"} & set(names):
            return P(None, "model")
        return P("model", None) if "kernel" in names and "o_proj" in names else P()

    return params, make_apply, split


def equinox_params_and_apply(vmapped=False):
    import equinox as eqx

    from jax_flashmask.nn.equinox import FlashMaskAttention

    layer = FlashMaskAttention(F, N, num_kv_heads=K, head_dim=D, causal=True, implementation="xla",
                               key=jax.random.PRNGKey(0))
    params, static = eqx.partition(layer, eqx.is_array)

    def make_apply(attention_fn):
        def apply(params, x, mask):
            model = eqx.combine(params, static)
            if vmapped:  # equinox style: the layer on one sequence, vmapped over the batch
                return jax.vmap(lambda xi, mi: model(xi, mi, attention_fn=attention_fn))(x, mask)
            return model(x, mask, attention_fn=attention_fn)

        return apply

    def split(names, leaf):  # eqx.nn.Linear weight [out, in]
        if "weight" in names and {"q_proj", "k_proj", "v_proj"} & set(names):
            return P("model", None)
        return P(None, "model") if "weight" in names and "o_proj" in names else P()

    return params, make_apply, split


def mesh(shape, names, explicit=False):
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape),
                         devices=jax.devices()[: int(np.prod(shape))])


def run_layouts(label, params_and_apply):
    params, make_apply, split = params_and_apply()
    check_step(f"{label}, batch 8", params, make_apply, mesh((8,), ("data",)), "data")
    check_step(f"{label}, batch 4", params, make_apply, mesh((4,), ("data",)), "data")
    # jax.make_mesh's default axes are Explicit (sharding in types)
    check_step(f"{label}, batch 8, explicit axes", params, make_apply, mesh((8,), ("data",), explicit=True),
               "data")
    check_step(f"{label}, batch 2 x heads 4 (tensor parallel)", params, make_apply,
               mesh((2, 4), ("data", "model")), "data", "model", split)


GROUPS = {
    "flax": lambda: run_layouts("flax nnx", flax_params_and_apply),
    "equinox": lambda: run_layouts("equinox", equinox_params_and_apply),
    "equinox_vmap": lambda: check_step("equinox under vmap, batch 8", *equinox_params_and_apply(vmapped=True)[:2],
                                       mesh((8,), ("data",)), "data"),
}

if __name__ == "__main__":
    GROUPS[sys.argv[1]]()
    print("done", flush=True)
