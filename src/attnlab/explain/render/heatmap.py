"""Heatmaps of attention matrices with matplotlib: token labels, values, a grid of heads.

viridis is the colormap: perceptually uniform and readable with the common
forms of colour blindness. Cells carry their values when the matrix is small
enough to read them (at most 12 x 12). Masked entries (-inf scores) are drawn
grey with no number. Figures save as PNG or SVG by file suffix.

Drawn with matplotlib's object API (``matplotlib.figure.Figure``), never
pyplot: importing this module sets no backend and no global state, and a
figure is freed when it is no longer referenced.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnlab.explain.render.fonts import drawable, fonts

CMAP = "viridis"
ANNOTATE_MAX = 12
AXES = ("keys", "queries")  # (x, y) labels of an attention matrix; reports pass their own language's


def safe_label(text: str) -> str:
    """Labels are plain text: '$' would start matplotlib mathtext, so escape it; a glyph no font has gets its name."""
    return drawable(text).replace("$", r"\$")


def _draw(
    ax: Axes,
    matrix: torch.Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    annotate: bool | None,
    axes: tuple[str, str],
    cells: Sequence[Sequence[str]] | None = None,
    limits: tuple[float, float] | None = None,
    tick_size: float = 8,
) -> None:
    m = matrix.detach().to(torch.float64).cpu().numpy()
    if m.ndim != 2:
        raise ValueError(f"a heatmap needs a 2-D matrix, got shape {tuple(matrix.shape)}")
    if len(row_labels) != m.shape[0] or len(col_labels) != m.shape[1]:
        raise ValueError(
            f"labels do not fit the matrix {m.shape}: {len(row_labels)} row and {len(col_labels)} column labels"
        )
    masked = np.ma.masked_invalid(m)
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad="#d9d9d9")  # masked (-inf) cells grey
    vmin, vmax = limits if limits is not None else (None, None)
    image = ax.imshow(masked, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(m.shape[1]), [safe_label(s) for s in col_labels], rotation=45, ha="right", fontsize=tick_size)
    ax.set_yticks(range(m.shape[0]), [safe_label(s) for s in row_labels], fontsize=tick_size)
    ax.set_xlabel(safe_label(axes[0]), fontsize=8)
    ax.set_ylabel(safe_label(axes[1]), fontsize=8)
    ax.set_title(safe_label(title), fontsize=9)
    if annotate is None:
        annotate = max(m.shape) <= ANNOTATE_MAX
    if (annotate or cells is not None) and masked.count():
        lo, hi = limits if limits is not None else (float(masked.min()), float(masked.max()))
        mid = (lo + hi) / 2
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                if np.isfinite(m[i, j]):
                    color = "black" if m[i, j] > mid else "white"  # dark text on the light (yellow) end
                    text = f"{m[i, j]:.2f}" if cells is None else safe_label(cells[i][j])
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
    figure = ax.get_figure()
    assert figure is not None
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def heatmap(
    matrix: torch.Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str] | None = None,
    *,
    title: str = "",
    annotate: bool | None = None,
    axes: tuple[str, str] = AXES,
    cells: Sequence[Sequence[str]] | None = None,
    limits: tuple[float, float] | None = None,
    wide: bool = False,
) -> Figure:
    """One (rows, cols) matrix as a labelled heatmap; ``axes`` names the (x, y) axes.

    ``cells``: a text per cell instead of its value; ``limits``: the colour scale (default: the matrix's range);
    ``wide``: as wide as its columns and as tall as its rows (default: square, for a queries x keys matrix).
    """
    col_labels = row_labels if col_labels is None else col_labels
    size = max(3.2, 0.55 * max(len(row_labels), len(col_labels)) + 1.6)
    height = max(2.4, 0.4 * len(row_labels) + 1.8) if wide else size
    with fonts():  # texts keep the font they are created with
        fig = Figure(figsize=(size + 0.8 + (1.2 if cells is not None else 0), height))
        ax = fig.subplots()
        _draw(ax, matrix, row_labels, col_labels, title, annotate, axes, cells, limits)
        fig.tight_layout()
    return fig


def head_grid(
    weights: torch.Tensor,
    labels: Sequence[str],
    *,
    title: str = "",
    annotate: bool | None = None,
    col_labels: Sequence[str] | None = None,
    axes: tuple[str, str] = AXES,
    head_title: str = "head {h}",
    head_titles: Sequence[str] | None = None,
    width: float | None = None,
) -> Figure:
    """A grid of heatmaps, one per head, from (H, Tq, Tk) weights; ``head_titles`` (one per head) name them.

    Each head keeps the size it would have alone (the grid grows; it never
    shrinks the heads), so small multiples stay as legible as one heatmap.
    A cell is large enough for its number when numbers are written, and
    smaller when not, so that a grid of two heads stays near a page's width.
    ``width`` (inches) caps the grid's width, so that the picture is shown at its own size on a page rather
    than shrunk: the heads get smaller and their token labels with them, down to a 4-point floor.
    """
    if weights.dim() != 3:
        raise ValueError(f"head_grid needs (heads, Tq, Tk) weights, got shape {tuple(weights.shape)}")
    heads = weights.shape[0]
    cols = min(heads, 2)
    rows = (heads + cols - 1) // cols
    longest = max(len(labels), len(col_labels or labels))
    numbered = annotate if annotate is not None else longest <= ANNOTATE_MAX
    size = max(3.2, (0.55 if numbered else 0.3) * longest + 1.6)
    if width is not None:
        size = min(size, width / cols - 0.8)
    per_label = (size - 1.6) / max(longest, 1)  # inches a token's row takes
    tick_size = max(4.0, min(8.0, 72 * per_label * 0.85))  # a label fits its row
    with fonts():  # texts keep the font they are created with
        fig = Figure(figsize=(cols * (size + 0.8), rows * size))
        grid = fig.subplots(rows, cols, squeeze=False)
        for h in range(rows * cols):
            ax = grid[h // cols][h % cols]
            if h < heads:
                named = head_titles[h] if head_titles is not None else head_title.format(h=h)
                _draw(ax, weights[h], labels, col_labels or labels, named, annotate, axes, tick_size=tick_size)
            else:
                ax.axis("off")
        if title:
            fig.suptitle(safe_label(title), fontsize=10)
        fig.tight_layout()
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Save as PNG or SVG, chosen by the suffix."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"save heatmaps as .png or .svg, got {path.name!r}")
    with fonts():  # glyphs are looked up when drawn, here
        fig.savefig(path, dpi=110)
    return path


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for inlining in the HTML report)."""
    buffer = io.BytesIO()
    with fonts():
        fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
