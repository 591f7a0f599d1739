"""Figures sized for the report's page (issue 31): wrapped into panels, kept within the page, their text measured."""

from __future__ import annotations

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from attnlab.explain.render.figure_output import page_figure
from attnlab.explain.render.heatmap import (
    CMAP,
    PAGE_INCHES,
    PANEL_COLUMNS,
    PNG_DPI,
    SMALLEST_PT,
    head_grid,
    heatmap,
)
from attnlab.explain.render.html import HALF_PX, Report, Section

PAGE_PX = 1178  # a section's width at a 1280 px window (render.html)


def test_a_wide_grid_wraps_into_panels_on_one_colour_scale() -> None:
    """The h2o figure's 8 steps x 56 tokens: panels of at most PANEL_COLUMNS columns, one above the next, holding
    the grid's values in order, each drawn with the same colours (a panel without 0 keeps 0.5 teal, not dark)."""
    grid = torch.full((8, 56), 1.0)
    grid[:, 20:28] = 0.5  # let go
    grid[4:, 10:14] = 0.0  # not read yet, in the first panel only
    grid[:, 40:50] = 0.5
    fig = heatmap(grid, [f"after {n} tokens" for n in range(8)], [chr(97 + i % 26) for i in range(56)], wide=True)
    images = [image for ax in fig.axes for image in ax.images]
    assert len(images) == 2 and all(image.get_array().shape[1] <= PANEL_COLUMNS for image in images)
    drawn = np.concatenate([np.ma.getdata(image.get_array()) for image in images], axis=1)
    np.testing.assert_array_equal(drawn, grid.numpy())  # every value once, in order
    viridis = matplotlib.colormaps[CMAP]
    for image in images:
        assert image.get_clim() == (0.0, 1.0)
        np.testing.assert_allclose(image.to_rgba(np.array([1.0, 0.5, 0.0])), viridis([1.0, 0.5, 0.0]))
    assert len(fig.axes) == 3  # two panels and one colour bar
    assert fig.get_figwidth() <= PAGE_INCHES
    shown = page_figure(fig, "h2o")
    assert shown.width_px <= PAGE_PX and shown.text_px is not None
    assert shown.text_px >= SMALLEST_PT * PNG_DPI / 72


def test_a_long_grid_of_heads_keeps_legible_labels_within_the_page() -> None:
    """64 tokens (the report's most): two heads side by side would need 4-point labels; one a row keeps 8."""
    weights = torch.softmax(torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(0)), -1)
    fig = head_grid(weights, [f"t{i}" for i in range(64)])
    assert fig.get_figwidth() <= PAGE_INCHES
    heads = [ax for ax in fig.axes if ax.images]
    assert len(heads) == 2 and heads[0].get_position().y0 > heads[1].get_position().y1  # one above the other
    shown = page_figure(fig, "layer 0")
    assert HALF_PX < shown.width_px <= PAGE_PX  # the page gives it a section's width and shows it at its own size
    assert shown.text_px is not None and shown.text_px >= SMALLEST_PT * PNG_DPI / 72


def test_the_smallest_text_is_measured_as_drawn() -> None:
    """text_px is the smallest text the PNG holds, in its pixels; a hidden or empty text is not drawn, so not counted."""
    fig = Figure(figsize=(3, 2))
    fig.text(0.1, 0.5, "big", fontsize=12)
    fig.text(0.1, 0.2, "small", fontsize=5)
    fig.text(0.5, 0.5, "hidden", fontsize=2).set_visible(False)
    fig.text(0.5, 0.2, "   ", fontsize=1)
    shown = page_figure(fig, "t")
    assert shown.text_px == 5 * PNG_DPI / 72
    assert shown.width_px == 3 * PNG_DPI


def test_the_page_gives_wide_figures_and_long_numbers_a_sections_width() -> None:
    """A figure wider than half a section, or a value line longer than half holds (a CJK character counts twice),
    takes the whole width; the figure's measured text is written for the browser test."""
    narrow = page_figure(Figure(figsize=(HALF_PX / PNG_DPI, 1)), "narrow")
    wide = page_figure(Figure(figsize=((HALF_PX + 20) / PNG_DPI, 1)), "wide")
    wide.text_px = 9.5

    def kind(section: Section) -> str:
        page = Report(title="t", intro="", lang="en", sections=[section]).to_html()
        head = page[page.index('<section class="') :]
        return head[len('<section class="') : head.index('"', len('<section class="'))]

    assert kind(Section(key="a", title="a", figures=[narrow], value="x" * 80)) == "step"
    assert kind(Section(key="b", title="b", figures=[wide])) == "step wide"
    assert kind(Section(key="c", title="c", figures=[narrow], value="1\n" + "x" * 81)) == "step wide wide-text"
    assert kind(Section(key="d", title="d", figures=[narrow], value="注" * 41)) == "step wide wide-text"
    assert kind(Section(key="e", title="e", value="x" * 100)) == "step text-only wide-text"
    page = Report(title="t", intro="", lang="en", sections=[Section(key="f", title="f", figures=[wide])]).to_html()
    assert 'data-text-px="9.50"' in page
    assert (
        "data-text-px"
        not in Report(
            title="t", intro="", lang="en", sections=[Section(key="g", title="g", figures=[narrow])]
        ).to_html()
    )
