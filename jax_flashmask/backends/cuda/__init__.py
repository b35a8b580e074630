"""Hopper (sm_90a) FlashMask kernels behind XLA FFI custom calls.

_extension: loading the compiled extension and registering its FFI targets; configs: the kernel
configurations that exist and the table that picks one per call; ops: the FFI calls.
"""

from ._extension import compiled_configs, is_available, unavailable_reason
from .configs import BackwardConfig, ForwardConfig, backward_config, forward_config
from .ops import (BWD_TARGET, FWD_TARGET, backward, check_supported, forward, run_backward,
                  run_forward)

__all__ = ["is_available", "unavailable_reason", "compiled_configs", "check_supported",
           "forward", "backward", "run_forward", "run_backward", "FWD_TARGET", "BWD_TARGET",
           "ForwardConfig", "BackwardConfig", "forward_config", "backward_config"]
