"""A drawn figure out of memory: saved to a file (PNG or SVG), as PNG bytes, or as the HTML report's
:class:`~attnlab.explain.render.html.Figure` with the smallest text it drew noted (what a reader sees)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from attnlab.explain.render import html
from attnlab.explain.render.fonts import fonts
from attnlab.explain.render.heatmap import PNG_DPI


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
        fig.savefig(buffer, format="png", dpi=PNG_DPI)
    return buffer.getvalue()


class _NotingRenderer(RendererAgg):
    """Agg, noting the size (pixels) of every text it draws: what is in the PNG, after layout, at its dpi."""

    def __init__(self, width: int, height: int, dpi: float) -> None:
        super().__init__(width, height, dpi)
        self.text_px: list[float] = []

    def clear(self) -> None:
        super().clear()
        self.text_px = []  # a draw starts here: note that draw's texts only

    def draw_text(
        self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False, mtext: Any = None
    ) -> None:
        if s.strip():
            self.text_px.append(float(self.points_to_pixels(prop.get_size_in_points())))  # the font's em, as CSS px
        super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)


class _NotingCanvas(FigureCanvasAgg):
    def get_renderer(self) -> _NotingRenderer:
        w, h = self.get_width_height(physical=True)
        kept = getattr(self, "renderer", None)  # a layout pass asks again mid-draw: the same renderer
        if not (isinstance(kept, _NotingRenderer) and (kept.width, kept.height, kept.dpi) == (w, h, self.figure.dpi)):
            self.renderer = _NotingRenderer(w, h, self.figure.dpi)
        return self.renderer


def page_figure(fig: Figure, title: str) -> html.Figure:
    """``fig`` for the report: its PNG at PNG_DPI, and the smallest text drawn in it in PNG pixels (``text_px``),
    which a page shown at a scale s shows at s * text_px."""
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine(None)  # laid out once (tight_layout): savefig need not draw it twice to lay it out
    canvas = _NotingCanvas(fig)
    buffer = io.BytesIO()
    with fonts():
        fig.savefig(buffer, format="png", dpi=PNG_DPI)
    drawn = canvas.renderer.text_px
    return html.Figure(png=buffer.getvalue(), alt=title, caption=title, text_px=min(drawn) if drawn else None)
