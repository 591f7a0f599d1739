"""The guided tour of chapter 3: each step's code, tensor and checks against the book, in English or Chinese.

:func:`build_tour` recomputes the chapter in the order of the reading notes
and returns the steps; it prints nothing (the CLI renders them). The steps
live in four parts (``simplified``, ``trainable``, ``causal``, then ``after``: what came after the
chapter); their words
in ``en.py`` and ``zh.py``, one entry per step, so a translator reads one file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.explain.checks import Check
from attnlab.explain.tour.after import what_came_after
from attnlab.explain.tour.causal import causal, kv_cache_steps, kv_step_lines
from attnlab.explain.tour.core import Checker, TourStep, fmt
from attnlab.explain.tour.simplified import simplified
from attnlab.explain.tour.text import LANGS, text_for
from attnlab.explain.tour.trainable import trainable

__all__ = ["LANGS", "TourStep", "build_tour", "fmt", "kv_cache_steps", "kv_step_lines", "mismatches", "text_for"]


def build_tour(lang: str = "en") -> list[TourStep]:
    """Recompute chapter 3 step by step, then what came after it. Seeds are set where the book sets them."""
    text = text_for(lang)
    checker = Checker(checks=text.checks, words=text.words)
    steps: list[TourStep] = []

    def add(
        key: str, code: str, value: str, *checks: Check, heat: torch.Tensor | None = None, heat_axes: str = "attention"
    ) -> None:
        title, body = text.steps[key]
        steps.append(TourStep(key, title, body, code, value or text.values.get(key, ""), checks, heat, heat_axes))

    # The book seeds torch's global generator; fork_rng gives that state back afterwards, so
    # building the tour leaves the caller's random numbers as they were.
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        simplified(add, checker)
        trainable(add, checker)
        causal(add, checker)
        what_came_after(add, checker)  # what came after the chapter: the variants of the attention zoo
    return steps


def mismatches(steps: Sequence[TourStep]) -> list[tuple[str, Check]]:
    return [(s.key, c) for s in steps for c in s.checks if not c.ok]
