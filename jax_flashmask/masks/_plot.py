"""Mask pictures: the dense view of a mask, sampled so that it stays small for any S.

matplotlib is imported lazily (``pip install matplotlib``); figures are drawn with the Agg canvas
through the object-oriented API, so plotting never touches pyplot's global backend.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import FlashMask

__all__ = ["plot", "plot_suite", "sampled_dense"]

_MAX_PIXELS = 1024


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "jax_flashmask.masks.plot needs matplotlib: pip install matplotlib "
            "(or pip install 'jax_flashmask[plot]')"
        ) from e
    return Figure, FigureCanvasAgg


def _sample(n: int, max_n: int) -> np.ndarray:
    """Indices of at most max_n evenly spread positions in [0, n) (all of them when n <= max_n)."""
    if n <= max_n:
        return np.arange(n)
    return np.floor((np.arange(max_n) + 0.5) * n / max_n).astype(np.int64)


def sampled_dense(
    mask,
    q_len: int | None = None,
    *,
    batch_index: int = 0,
    head: int = 0,
    max_pixels: int = _MAX_PIXELS,
    causal: bool | None = None,
):
    """Boolean ``[rows, cols]`` (True = masked) of one (batch, head), at most `max_pixels` a side.

    Computed from the canonical bounds at evenly sampled rows and columns: never builds Sq×Sk.
    Returns ``(masked, row_index, col_index)``.
    """
    from ._builders import _bounds_np

    bounds, q_len = _bounds_np(mask, q_len, causal)
    b = bounds[batch_index, head]  # [4, Sk]
    sk = b.shape[-1]
    rows = _sample(q_len, max_pixels)
    cols = _sample(sk, max_pixels)
    lts, lte, uts, ute = (b[k, cols][None, :] for k in range(4))
    i = rows[:, None]
    masked = ((lts <= i) & (i < lte)) | ((uts <= i) & (i < ute))
    return masked, rows, cols


def _draw(ax, mask, title, q_len):
    if not isinstance(mask, FlashMask):
        raise ValueError(f"plot: expected a FlashMask, got {type(mask).__name__}")
    masked, _, _ = sampled_dense(mask, q_len)
    sq = q_len if q_len is not None else mask.shape[2]
    sk = mask.shape[2]
    # visible cells dark, masked cells light; extent in token coordinates
    ax.imshow(
        ~masked,
        cmap="Blues",
        vmin=0,
        vmax=1.25,
        interpolation="nearest",
        extent=(0, sk, sq, 0),
        aspect="auto",
    )
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if title is None and isinstance(mask, FlashMask):
        title = f"causal={mask.causal}, D={mask.shape[-1]}"
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot(mask, path=None, ax=None, title: str | None = None, *, q_len: int | None = None):
    """Draw one mask (batch 0, mask head 0): visible cells dark, masked cells light.

    Large masks are sampled at <= 1024 rows and columns from the bounds. With `ax` it draws
    there and returns `ax`; otherwise it makes a figure, writes it to `path` when given (PNG etc.,
    by extension) and returns the figure.
    """
    if ax is not None:
        _draw(ax, mask, title, q_len)
        if path is not None:
            ax.figure.savefig(path, dpi=100, bbox_inches="tight")
        return ax
    Figure, Canvas = _matplotlib()
    fig = Figure(figsize=(4, 4))
    Canvas(fig)
    _draw(fig.add_subplot(1, 1, 1), mask, title, q_len)
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig


def plot_suite(masks: dict, path, *, ncols: int = 4, q_len: int | None = None):
    """Draw a dict ``{name: FlashMask}`` as a grid (title: name and visible fraction) into `path`."""
    from ._builders import visible_fraction

    if not masks:
        raise ValueError("plot_suite: no masks to draw")
    Figure, Canvas = _matplotlib()
    n = len(masks)
    ncols = max(1, min(int(ncols), n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(3.2 * ncols, 3.4 * nrows))
    Canvas(fig)
    for k, (name, m) in enumerate(masks.items()):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        vis = visible_fraction(m, q_len)
        _draw(ax, m, f"{name}\nvisible {vis:.1%}", q_len)
        ax.set_xlabel("")
        ax.set_ylabel("")
        ax.tick_params(labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig
