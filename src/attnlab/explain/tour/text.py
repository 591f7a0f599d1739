"""The tour's words by language: each language's file (``en.py``, ``zh.py``) holds all of them.

Every language has the same keys; ``tests/test_tour.py`` checks that, so a step
added in one language and forgotten in the other fails the suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from attnlab.explain.tour import en, zh

LANGS = ("en", "zh")
_MODULES: dict[str, ModuleType] = {"en": en, "zh": zh}


@dataclass(frozen=True)
class TourText:
    steps: dict[str, tuple[str, str]]  # key -> (title, explanation)
    values: dict[str, str]  # key -> what a step without a tensor shows (the overview map, the summary)
    checks: dict[str, str]  # check key -> its label
    words: dict[str, str]  # every other phrase: headings, axis names, the check summary


def text_for(lang: str) -> TourText:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {list(LANGS)}, got {lang!r}")
    m = _MODULES[lang]
    return TourText(steps=m.STEPS, values=m.VALUES, checks=m.CHECKS, words=m.WORDS)
