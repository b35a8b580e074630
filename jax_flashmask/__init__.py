"""jax_flashmask: FlashMask attention for JAX.

`attention` takes masks as O(S) column-wise row boundaries (`jax_flashmask.masks`), skips fully
masked tiles, and runs on Hopper kernels (``implementation="cuda"``) or a portable blocked path
(``"xla"``) on any backend.
"""

from . import masks
from ._api import attention
from ._dot_product_attention import dot_product_attention
from .masks import FlashMask

__version__ = "0.1.0"
__all__ = ["attention", "dot_product_attention", "masks", "FlashMask", "__version__"]
