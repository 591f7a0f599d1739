"""Heatmaps of attention matrices with matplotlib: token labels, values, a grid of heads.

viridis is the colormap: perceptually uniform and readable with the common
forms of colour blindness. Cells carry their values when the matrix is small
enough to read them (at most 12 x 12). Masked entries (-inf scores) are drawn
grey with no number. Figures save as PNG or SVG by file suffix.

Every figure is sized for the HTML report's page (``render.html``), where it is
shown at its own size: a figure that fits half a section is drawn to fit it, a
larger one to fit the section's width, a long row of columns is wrapped into
panels, and no label is drawn below ``SMALLEST_PT``. ``page_figure`` notes the
smallest text it drew, so the report's browser test can check what a reader sees.

Drawn with matplotlib's object API (``matplotlib.figure.Figure``), never
pyplot: importing this module sets no backend and no global state, and a
figure is freed when it is no longer referenced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from attnlab.explain.render.fonts import drawable, fonts
from attnlab.explain.render.html import text_width
from attnlab.models.graphemes import visible

CMAP = "viridis"
ANNOTATE_MAX = 12
AXES = ("keys", "queries")  # (x, y) labels of an attention matrix; reports pass their own language's
PNG_DPI = 90  # the report's PNGs; a point is 1.25 px
# The page's widths (render.html, a 1280 px window: 580 px half a section, 1178 px a whole one) in inches at PNG_DPI,
# a little under, so that a figure drawn to them is shown at its own size, never shrunk.
HALF_INCHES = 6.4
PAGE_INCHES = 13.0
SMALLEST_PT = 6.0  # 7.5 px at PNG_DPI: the smallest label drawn; below it a figure takes more room, or wraps
LABEL_PT = 8.0  # a token label's size when its row has room
PANEL_COLUMNS = 28  # a wide grid (steps x tokens) wraps into panels of at most this many columns, one above the next
MARGIN = 1.6  # inches around a heatmap's cells for its tick labels, axis labels and title
COLORBAR = 0.8  # inches for a heatmap's colour bar


def safe_label(text: str) -> str:
    """Labels are plain text: '$' would start matplotlib mathtext, so escape it; a glyph no font has gets its name;
    a mark that draws nothing alone (U+0301 with nothing before it, U+200D) is made visible (``visible``)."""
    return drawable(visible(text)).replace("$", r"\$")


def _label_pt(size: float, longest: int) -> float:
    """The size of a token label (points) that fits its row when ``longest`` rows share ``size`` inches."""
    per_label = (size - MARGIN) / max(longest, 1)  # inches a token's row takes
    return min(LABEL_PT, 72 * per_label * 0.85)


def _angle(column: float, tick_size: float, labels: Sequence[str]) -> float:
    """The angle of column labels ``column`` inches apart: level when the longest fits its column, else slanted
    (45 degrees) while neighbours stay apart, else upright (90).

    Slanted labels one column apart are sin 45 = 0.71 of a column apart across their lines, upright ones a whole
    column; either needs 1/0.85 of its size there, as a row does (``_label_pt``).
    """
    room = 72 * column  # points
    widest = max((text_width(safe_label(s)) for s in labels), default=0) * 0.7 * tick_size  # 0.7 em a character
    if widest <= 0.9 * room:
        return 0.0
    return 45.0 if 0.85 * 0.71 * room >= tick_size else 90.0


def _fit(natural: float, longest: int, half: float, page: float) -> float:
    """A heatmap's side (inches): its natural size, within half a section (``half``) while its labels keep their
    full size there, else within the section's width (``page``)."""
    if _label_pt(min(natural, half), longest) >= LABEL_PT:
        return min(natural, half)
    return min(natural, page)


def _check_fits(shape: tuple[int, ...], row_labels: Sequence[str], col_labels: Sequence[str]) -> None:
    if len(shape) != 2:
        raise ValueError(f"a heatmap needs a 2-D matrix, got shape {shape}")
    if len(row_labels) != shape[0] or len(col_labels) != shape[1]:
        raise ValueError(
            f"labels do not fit the matrix {shape}: {len(row_labels)} row and {len(col_labels)} column labels"
        )


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
    tick_size: float = LABEL_PT,
    colorbar: bool = True,
    rotation: float = 45.0,
) -> AxesImage:
    m = matrix.detach().to(torch.float64).cpu().numpy()
    _check_fits(m.shape, row_labels, col_labels)
    masked = np.ma.masked_invalid(m)
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad="#d9d9d9")  # masked (-inf) cells grey
    vmin, vmax = limits if limits is not None else (None, None)
    image = ax.imshow(masked, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(
        range(m.shape[1]),
        [safe_label(s) for s in col_labels],
        rotation=rotation,
        ha="right" if 0 < rotation < 90 else "center",
        fontsize=tick_size,
    )
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
    if colorbar:
        figure = ax.get_figure()
        assert figure is not None
        figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return image


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
    ``wide``: a few rows of many columns (steps x tokens), its columns wrapped into panels of at most
    ``PANEL_COLUMNS``, stacked, on one colour scale (default: square, for a queries x keys matrix).
    """
    col_labels = row_labels if col_labels is None else col_labels
    if wide:
        return _wide(matrix, row_labels, col_labels, title=title, annotate=annotate, axes=axes, limits=limits)
    longest = max(len(row_labels), len(col_labels))
    numbered = annotate if annotate is not None else (cells is not None or longest <= ANNOTATE_MAX)
    extra = COLORBAR + (1.2 if cells is not None else 0)  # beside the cells: the colour bar, wider cell texts
    natural = max(3.2, (0.55 if numbered else 0.3) * longest + MARGIN)
    half = natural if cells is not None else HALF_INCHES - extra  # a cell's words need its natural size
    size = _fit(natural, longest, half, PAGE_INCHES - extra)
    with fonts():  # texts keep the font they are created with
        fig = Figure(figsize=(size + extra, size))
        ax = fig.subplots()
        tick_size = max(SMALLEST_PT, _label_pt(size, longest))
        rotation = _angle((size - MARGIN) / longest, tick_size, col_labels)
        _draw(ax, matrix, row_labels, col_labels, title, annotate, axes, cells, limits, tick_size, rotation=rotation)
        fig.tight_layout()
    return fig


def _wide(
    matrix: torch.Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str,
    annotate: bool | None,
    axes: tuple[str, str],
    limits: tuple[float, float] | None,
) -> Figure:
    """Rows of many columns as panels of at most PANEL_COLUMNS columns, one above the next, within the page's width.

    One row of 56 tokens at full-size labels is about 3000 px wide, which a page shrinks until nothing can be read
    (issue 31); wrapped, every panel keeps its labels at LABEL_PT and the figure fits the section.
    """
    m = matrix.detach().to(torch.float64).cpu()
    _check_fits(tuple(m.shape), row_labels, col_labels)
    finite = m[torch.isfinite(m)]
    if limits is None and finite.numel():  # one colour scale for every panel: the whole matrix's range
        limits = (float(finite.min()), float(finite.max()))
    columns = m.shape[1]
    panels = max(1, math.ceil(columns / PANEL_COLUMNS))
    per = math.ceil(columns / panels)  # panels of equal width; the last may hold fewer columns
    width = min(PAGE_INCHES, 0.4 * per + 2.4)  # 0.4 in a column: room for a number or a slanted token
    height = panels * (0.32 * len(row_labels) + 1.2) + 0.4
    rotation = _angle((width - 2.4) / per, LABEL_PT, col_labels)
    with fonts():
        fig = Figure(figsize=(width, height), layout="constrained")  # constrained: one colour bar for every panel
        grid = list(fig.subplots(panels, 1, squeeze=False)[:, 0])
        image = None
        for k, ax in enumerate(grid):
            start, stop = k * per, min((k + 1) * per, columns)
            name = f"{axes[0]} {start}-{stop - 1}"  # which positions this panel holds
            panel = (m[:, start:stop], row_labels, col_labels[start:stop], "", annotate, (name, axes[1]))  # untitled
            image = _draw(ax, *panel, limits=limits, colorbar=False, rotation=rotation)
            ax.set_xlim(-0.5, per - 0.5)  # a shorter last panel keeps the others' column width
        assert image is not None
        fig.colorbar(image, ax=grid, fraction=0.046 / panels, pad=0.02)
        if title:
            fig.suptitle(safe_label(title), fontsize=9)
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
    width: float = PAGE_INCHES,
) -> Figure:
    """A grid of heatmaps, one per head, from (H, Tq, Tk) weights; ``head_titles`` (one per head) name them.

    Heads sit two a row. A cell is large enough for its number when numbers are written, and smaller when not.
    ``width`` (inches, default the page's) caps the grid's width, so that the picture is shown at its own size on a
    page rather than shrunk: the heads get smaller and their token labels with them, down to ``SMALLEST_PT``;
    past that (some 40 tokens on the page), the heads go one a row, with labels at full size.
    """
    if weights.dim() != 3:
        raise ValueError(f"head_grid needs (heads, Tq, Tk) weights, got shape {tuple(weights.shape)}")
    heads = weights.shape[0]
    longest = max(len(labels), len(col_labels or labels))
    numbered = annotate if annotate is not None else longest <= ANNOTATE_MAX
    size = max(3.2, (0.55 if numbered else 0.3) * longest + MARGIN)
    cols = min(heads, 2)
    if cols == 2 and _label_pt(min(size, width / 2 - COLORBAR), longest) < SMALLEST_PT:
        cols = 1  # side by side, the labels would be too small to read
        size = min(size, MARGIN + longest * LABEL_PT / (72 * 0.85))  # as large as full-size labels need
    size = min(size, width / cols - COLORBAR)
    rows = (heads + cols - 1) // cols
    tick_size = max(SMALLEST_PT, _label_pt(size, longest))
    rotation = _angle((size - MARGIN) / longest, tick_size, col_labels or labels)
    height = rows * size
    with fonts():  # texts keep the font they are created with
        fig = Figure(figsize=(cols * (size + COLORBAR), height))
        grid = fig.subplots(rows, cols, squeeze=False)
        for h in range(rows * cols):
            ax = grid[h // cols][h % cols]
            if h < heads:
                named = head_titles[h] if head_titles is not None else head_title.format(h=h)
                cols_named = col_labels or labels
                _draw(ax, weights[h], labels, cols_named, named, annotate, axes, tick_size=tick_size, rotation=rotation)
            else:
                ax.axis("off")
        if title:  # 0.1 in from the top: the default (2% of the height) lands inside a tall grid's first head
            fig.suptitle(safe_label(title), fontsize=10, y=1 - 0.1 / height, va="top")
        fig.tight_layout()
    return fig
