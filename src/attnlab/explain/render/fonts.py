"""Fonts for the heatmaps: Chinese and emoji found by file, and a clear fallback for a glyph no font has.

matplotlib keeps a cache of the fonts it saw the first time it ran. A CJK font
installed after that (``make demo`` first, then the font) is not in the cache,
so every Chinese label rendered as a box with a "Glyph missing" warning. Here
the font files are looked up on disk each run and registered with
``fontManager.addfont`` when the cache lacks them, so a stale cache no longer
matters.

A character that no registered font can draw (an emoji on a machine without
Symbola, say) is replaced by its Unicode name in brackets, e.g. ``[GRINNING
FACE]``: readable, and never a box or a warning.
"""

from __future__ import annotations

import functools
import logging
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

# Font files by name, in order of preference. Chinese first, then Symbola: its
# emoji are outlines, which matplotlib can draw (colour emoji fonts are bitmaps
# it cannot).
CJK_FILES = ("wqy-zenhei.ttc", "NotoSansCJK-Regular.ttc", "NotoSansCJKsc-Regular.otf", "DroidSansFallbackFull.ttf")
SYMBOL_FILES = ("Symbola.ttf", "Symbola_hint.ttf")
FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", str(Path.home() / ".local/share/fonts"))


def _find(names: tuple[str, ...]) -> Path | None:
    for name in names:
        for folder in FONT_DIRS:
            root = Path(folder)
            if root.is_dir():
                hit = next(root.rglob(name), None)
                if hit is not None:
                    return hit
    return None


def _names(path: Path) -> list[str]:
    return [f.name for f in font_manager.fontManager.ttflist if Path(f.fname).resolve() == path.resolve()]


def _register(path: Path) -> str:
    """Add the font file to matplotlib's manager if its cache lacks it; return its (first) family name."""
    if not _names(path):
        font_manager.fontManager.addfont(str(path))
    return _names(path)[0]  # a .ttc holds several faces ("WenQuanYi Zen Hei", "... Mono"): the first is the plain one


@functools.cache
def font_family() -> tuple[str, ...]:
    """The family list for ``font.family``: DejaVu Sans, then the CJK and symbol fonts found on disk."""
    family = ["DejaVu Sans"]
    for names in (CJK_FILES, SYMBOL_FILES):
        path = _find(names)
        if path is not None:
            family.append(_register(path))
    return tuple(dict.fromkeys(family))


@functools.cache
def _covered() -> frozenset[int]:
    """Every code point some font of :func:`font_family` can draw."""
    by_name = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    points: set[int] = set()
    for name in font_family():
        if name in by_name:
            points.update(FT2Font(by_name[name]).get_charmap())
    return frozenset(points)


def has_cjk() -> bool:
    """Whether a font that draws Chinese was found (the tests need one under CI)."""
    return ord("注") in _covered()


def drawable(text: str) -> str:
    """The text with each character no font can draw replaced by its name, e.g. ``[GRINNING FACE]``."""
    covered = _covered()
    out = []
    for ch in text:
        if ord(ch) in covered or ch.isspace():
            out.append(ch)
        elif unicodedata.category(ch) in ("Mn", "Cf"):
            continue  # a variation selector or a joiner no font has: it draws nothing alone, so drop it
        else:
            out.append(f"[{unicodedata.name(ch, f'U+{ord(ch):04X}')}]")
    return "".join(out)


class _WeightNote(logging.Filter):
    """Drops matplotlib's "Failed to find font weight normal for WenQuanYi Zen Hei, now using 500": the CJK
    fonts come in one weight, and using it is right, so the note is noise (and library code never prints)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("findfont: Failed to find font weight")


@contextmanager
def fonts() -> Iterator[None]:
    """Draw with :func:`font_family`, without matplotlib's note about the CJK font's weight."""
    log, note = logging.getLogger("matplotlib.font_manager"), _WeightNote()
    log.addFilter(note)
    try:
        with matplotlib.rc_context({"font.family": list(font_family())}):
            yield
    finally:
        log.removeFilter(note)


def reset() -> None:
    """Forget what was found (a test that removes a font from the manager calls this)."""
    font_family.cache_clear()
    _covered.cache_clear()
