"""Masks as O(S) column-wise row boundaries (FlashMask): representation, builders, dense view.

`_core` holds the representation (validation, canonical D=4 form, dense view); `_builders` the
twelve benchmark masks of FlashMask's suite, the jit-friendly builders from data (segment ids,
windows, lengths) and the converters from a dense mask or a mask function; `_plot` the pictures.
"""

from ._core import *  # noqa: F401,F403
from ._core import __all__ as _core_all
from ._builders import *  # noqa: F401,F403
from ._builders import __all__ as _builders_all
from ._plot import *  # noqa: F401,F403
from ._plot import __all__ as _plot_all

__all__ = list(_core_all) + list(_builders_all) + list(_plot_all)
