"""Clear errors for the JAX transformations `jax_flashmask.attention` does not support.

The op is a `jax.custom_vjp` (reverse mode only) whose kernels run loops with data-dependent trip
counts (portable) or custom calls (Hopper), which JAX cannot always differentiate. Forward mode
applied to the op fails with JAX's generic "can't apply forward-mode autodiff (jvp) to a
custom_vjp function", a second derivative through the Hopper kernels with "Differentiation rule
for 'ffi_call' not implemented"; both are rewritten here, where they surface while the op is
traced, into a message that names the library and what it supports.
"""

from __future__ import annotations

import contextlib


SUPPORTED = (
    "supported: jax.jit, jax.vmap, jax.grad / jax.vjp / jax.value_and_grad / jax.jacrev, "
    "jax.checkpoint (remat), shard_map, and forward over reverse (jax.jvp(jax.grad(f)), "
    "jax.hessian) on implementation='xla' and 'reference'"
)

FORWARD_MODE_MESSAGE = (
    "jax_flashmask.attention does not support forward-mode differentiation applied to it directly "
    "(jax.jvp, jax.jacfwd, jax.linearize): it defines a reverse-mode rule only (it is a "
    "jax.custom_vjp). Use jax.jacrev instead of jax.jacfwd; " + SUPPORTED + "."
)

HIGHER_ORDER_MESSAGE = (
    "jax_flashmask.attention cannot differentiate its own kernels here: the Hopper kernels "
    "(implementation='cuda') have no derivative of their own, so second derivatives (grad of grad, "
    "jax.hessian, jvp of grad) need implementation='xla' (forward over reverse) or 'reference' "
    "(any order); " + SUPPORTED + "."
)


@contextlib.contextmanager
def explain_forward_mode():
    """Re-raise JAX's forward-mode error for a custom_vjp, raised while the op is traced under
    jax.jvp / jacfwd, as a TypeError naming jax_flashmask (same type, so callers' handlers hold).

    Forward mode applied to an already-jitted caller (``jax.jvp(jax.jit(f))``) re-traces the jitted
    program without running this code: JAX's own message (mentioning custom_vjp) is raised then.
    """
    try:
        yield
    except TypeError as e:
        text = str(e)
        if "forward-mode" in text and "custom_vjp" in text:
            raise TypeError(FORWARD_MODE_MESSAGE) from e
        raise


# What JAX raises at trace time when a derivative reaches a custom call without a rule.
_HIGHER_ORDER_SIGNS = (
    "Differentiation rule for",
    "Transpose rule (for reverse-mode differentiation) for",
    "cannot be differentiated",  # jax >= 0.11: "The FFI call to `...` cannot be differentiated"
)


@contextlib.contextmanager
def explain_higher_order():
    """Around the custom_vjp's forward / backward kernels: those run undifferentiated for a
    first derivative; when a second derivative reaches a kernel JAX cannot differentiate (the
    Hopper custom calls), re-raise as ``NotImplementedError(HIGHER_ORDER_MESSAGE)``. What JAX can
    differentiate keeps working: forward over reverse on the portable path, any order on the
    dense reference.

    Grad of grad on the portable path fails later, while JAX transposes the backward's loops
    (their trip counts are data), outside this code: JAX's own message (lax.fori_loop) is raised.
    """
    try:
        yield
    except (ValueError, NotImplementedError, TypeError) as e:
        if any(sign in str(e) for sign in _HIGHER_ORDER_SIGNS):
            raise NotImplementedError(HIGHER_ORDER_MESSAGE) from e
        raise
