"""The balanced token layout: permute inputs once per step, un-permute outputs.

With a plan ``[P, m]`` (sorted chunk ids per rank) over ``N = P*m`` chunks of ``C = S/N`` tokens,
the *permuted* sequence is the concatenation, rank by rank, of each rank's chunks in increasing
order. Sharding the permuted sequence evenly over ``P`` devices gives every rank exactly its chunks.
Permute q/k/v inputs (or better: token ids, labels, loss weights and position ids) once per step,
run every layer in the permuted layout, un-permute what has to leave it. The mask stays in global
(un-permuted) coordinates.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .balance import check_plan
from .localize import chunk_token_index

__all__ = ["token_positions", "permute_tokens", "unpermute_tokens", "inverse_positions"]


def _sorted_plan(plan, xp):
    return xp.sort(xp.asarray(plan), axis=-1)


def token_positions(plan, seq_len: int, xp=jnp):
    """``[S]`` int32: global position of every token of the permuted sequence (use for RoPE).

    A concrete `plan` is validated (`check_plan`); a plan traced under ``jit`` only for its dtype
    and rank: its ids are data and are not checked.
    """
    check_plan(plan)
    plan = _sorted_plan(plan, xp)
    n = int(np.prod(plan.shape))
    if seq_len % n:
        raise ValueError(f"seq_len={seq_len} is not divisible by the plan's {n} chunks")
    return chunk_token_index(plan.reshape(-1), seq_len // n, xp=xp).astype(xp.int32)


def inverse_positions(plan, seq_len: int, xp=jnp):
    """``[S]`` int32: where each global position sits in the permuted sequence."""
    pos = token_positions(plan, seq_len, xp=xp)
    if xp is np:
        inv = np.empty_like(pos)
        inv[pos] = np.arange(seq_len, dtype=pos.dtype)
        return inv
    return jnp.zeros_like(pos).at[pos].set(jnp.arange(seq_len, dtype=pos.dtype))


def permute_tokens(x, plan, axis: int = 1, xp=jnp):
    """Global order -> permuted (balanced) layout along `axis`. Works under jit with a traced plan."""
    return xp.take(x, token_positions(plan, x.shape[axis], xp=xp), axis=axis)


def unpermute_tokens(x, plan, axis: int = 1, xp=jnp):
    """Permuted layout -> global order along `axis` (the inverse of `permute_tokens`)."""
    return xp.take(x, inverse_positions(plan, x.shape[axis], xp=xp), axis=axis)
