"""The implementations behind `jax_flashmask.attention`, and the choice between them.

Every implementation is a pair of functions with one signature:

* ``forward(q, k, v, bounds, *, scale) -> (out, lse)``
* ``backward(q, k, v, bounds, out, lse, dout, dlse, *, scale, deterministic) -> (dq, dk, dv)``

with ``bounds`` the canonical ``[B, Hm, 4, Sk]`` vectors (`jax_flashmask.masks.canonical_bounds`).

* ``"reference"`` (`reference`): dense, materialises the mask; for tests and small problems.
* ``"xla"`` (`portable`): blocked online softmax in pure JAX that skips masked tiles; any backend.
* ``"cuda"`` (`cuda`): the sm_90a kernels behind XLA FFI custom calls.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from . import portable, reference

from . import cuda  # imports without the compiled extension: cuda.is_available() says why not

IMPLEMENTATIONS = (None, "cuda", "xla", "reference")

__all__ = ["IMPLEMENTATIONS", "choose", "kernels", "cuda_unavailable_reason"]


def cuda_unavailable_reason() -> str | None:
    """Why the Hopper kernels cannot run in this process (None when they can)."""
    if not cuda.is_available():
        return cuda.unavailable_reason()
    return None


def choose(implementation, query) -> str:
    """The implementation that runs: `implementation` itself (checked), or for None the Hopper
    kernels when they are available and support the problem, else the portable path."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation is not None:
        if implementation == "cuda":
            reason = cuda_unavailable_reason()
            if reason is not None:
                raise NotImplementedError(
                    f"implementation='cuda' is not available: {reason}. "
                    "Use implementation='xla' (portable) or None (best available).")
            cuda.check_supported(query.shape, query.dtype, query.shape[-1])
        return implementation
    if cuda_unavailable_reason() is None:
        try:
            cuda.check_supported(query.shape, query.dtype, query.shape[-1])
            return "cuda"
        except (NotImplementedError, ValueError):
            pass
    return "xla"


def _reference_backward(q, k, v, bounds, out, lse, dout, dlse, *, scale, deterministic=False,
                        **options):
    # Dense autodiff: einsums, row sums and a repeat's transpose (a sum): no unordered reduction.
    del out, deterministic
    f = lambda q, k, v: reference.attention(q, k, v, bounds, scale=scale, **options)  # noqa: E731
    _, vjp = jax.vjp(f, q, k, v)
    dq, dk, dv = vjp((dout, dlse))
    # rows with lse = -inf (no visible score): dq = 0, not the 0 * Inf of a key other rows see
    return jnp.where(jnp.isneginf(lse)[..., None], jnp.zeros((), dq.dtype), dq), dk, dv


def kernels(implementation: str, sm_margin: int = 0, structure: str = "general",
            logits_soft_cap: float | None = None):
    """(forward, backward) of an implementation. `sm_margin` and `structure` ("full" / "causal"
    when no mask vectors were given: picks the Hopper forward's configuration) only mean something
    to the Hopper kernels; `logits_soft_cap` is bound into both functions when set."""
    if implementation == "reference":
        pair = reference.attention, _reference_backward
    elif implementation == "cuda":
        pair = (functools.partial(cuda.forward, sm_margin=sm_margin, structure=structure),
                functools.partial(cuda.backward, sm_margin=sm_margin))
    elif implementation == "xla":
        pair = portable.forward, portable.backward
    else:
        raise ValueError(f"unknown implementation {implementation!r}")
    if logits_soft_cap is None:
        return pair
    return tuple(functools.partial(f, logits_soft_cap=logits_soft_cap) for f in pair)
