"""Loading the compiled extension ``jax_flashmask._flashmask_cuda`` and registering its FFI targets.

The extension (nanobind) exports the FFI handler capsules and the names of the kernel
configurations it was built with. Importing this module never fails: where the extension or a
GPU is missing, `unavailable_reason` says why.
"""

from __future__ import annotations

import functools
import threading

import jax

_lock = threading.Lock()
_state: dict = {}


def load():
    """Import the extension and register its targets once; returns (module or None, reason)."""
    with _lock:
        if "mod" in _state:
            return _state["mod"], _state["reason"]
        mod, reason = None, ""
        try:
            from ... import _flashmask_cuda as mod  # type: ignore[attr-defined]
        except ImportError as e:  # not built (CPU-only build, no nvcc) or not loadable
            reason = f"the CUDA extension jax_flashmask._flashmask_cuda is not built or not loadable ({e})"
        if mod is not None:
            try:
                # Start the backends first: a registration for a platform whose plugin has not
                # started is queued and applied when it starts, where a failure (e.g. handlers
                # built against a newer XLA FFI API than this jaxlib's) is only logged and every
                # call fails later with "No FFI handler registered". Registered now, it raises.
                jax.devices()
            except Exception:  # noqa: BLE001 - no backend can start: the registration stays queued
                pass
            try:
                for name, capsule in mod.registrations().items():
                    jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            except Exception as e:  # noqa: BLE001 - report, do not crash the import
                mod, reason = None, f"registering the FFI targets failed: {e}"
        _state["mod"], _state["reason"] = mod, reason
        return mod, reason


def compiled_configs() -> frozenset:
    """Names of the kernel configurations in the built extension (empty when it is not loaded)."""
    mod, _ = load()
    fn = getattr(mod, "compiled_configs", None) if mod is not None else None
    return frozenset(c for c in str(fn()).split(",") if c) if fn is not None else frozenset()


@functools.lru_cache(maxsize=None)
def _device_reason() -> str:
    try:
        gpus = jax.devices("gpu")
    except Exception:  # noqa: BLE001 - no GPU backend at all
        return "no CUDA GPU visible to JAX"
    if not gpus:
        return "no CUDA GPU visible to JAX"
    for d in gpus:
        cc = getattr(d, "compute_capability", None)
        if cc is None:
            continue
        try:
            major = int(str(cc).split(".")[0])
        except ValueError:
            continue
        if major != 9:
            return f"the kernels need an sm_90 (Hopper) GPU; found compute capability {cc}"
    if getattr(gpus[0], "platform", "gpu") not in ("gpu", "cuda"):
        return "the GPU backend is not CUDA"
    return ""


def unavailable_reason() -> str:
    """Why the CUDA kernels cannot run here ('' when they can)."""
    mod, reason = load()
    if mod is None:
        return reason
    return _device_reason()


def is_available() -> bool:
    return unavailable_reason() == ""
