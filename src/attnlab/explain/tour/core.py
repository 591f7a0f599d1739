"""What every part of the tour shares: a step, the checks in the reader's language, the book's print format.

A step's checks compare its tensor with the number the book prints
(``attnlab.book.golden``) or, where the notes print none, with an invariant
the chapter states (rows sum to 1, the future is hidden, two methods agree).
Their labels come from the language's text (``tour/en.py``, ``tour/zh.py``),
so a Chinese tour never shows an English check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from attnlab.book import golden
from attnlab.explain.checks import Check


@dataclass(frozen=True)
class TourStep:
    key: str
    title: str
    text: str
    code: str
    value: str
    checks: tuple[Check, ...] = field(default_factory=tuple)
    heat: torch.Tensor | None = None  # a (T, T) or (heads, T, T) matrix for the report's heatmap
    heat_axes: str = "attention"  # "attention" (queries x keys) or "features" (tokens x dimensions)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _book_tensor(expected: object) -> torch.Tensor:
    """The book's numbers as float64; ``None`` stands for a printed ``-inf``."""

    def conv(x: object) -> object:
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return float("-inf") if x is None else x

    return torch.tensor(conv(expected), dtype=torch.float64)


class Checker:
    """Makes a step's checks, labelled in the tour's language, and its other words.

    ``book(name, actual, expected)`` compares with a printed value at the
    printed precision (4 decimals); ``holds(key, condition)`` states an
    invariant whose words are ``checks[key]``; ``say(key)`` is any other
    phrase a step prints (``words[key]``).
    """

    def __init__(self, *, checks: Mapping[str, str], words: Mapping[str, str]) -> None:
        self.checks = checks
        self.words = words

    def say(self, key: str, **values: object) -> str:
        return self.words[key].format(**values)

    def book(self, name: str, actual: torch.Tensor | float, expected: object) -> Check:
        actual_t = torch.as_tensor(actual, dtype=torch.float64).detach()
        expected_t = _book_tensor(expected)
        label = self.checks["book"].format(name=name)
        if actual_t.shape != expected_t.shape:
            return Check(
                label, False, self.checks["book_shape"].format(got=tuple(actual_t.shape), book=tuple(expected_t.shape))
            )
        finite = torch.isfinite(expected_t)
        if not torch.equal(actual_t[~finite], expected_t[~finite]):
            return Check(label, False, self.checks["inf"])
        err = (actual_t[finite] - expected_t[finite]).abs().max().item() if finite.any() else 0.0
        return Check(label, err <= golden.ATOL, self.checks["diff"].format(err=err))

    def holds(self, key: str, condition: bool, detail: str = "", **words: object) -> Check:
        return Check(self.checks[key].format(**words), bool(condition), detail)


def fmt(t: torch.Tensor) -> str:
    """Print as the book does: torch's own repr at 4 decimals, fixed notation, without grad noise."""
    with _fixed():
        return str(t.detach())


@contextmanager
def _fixed() -> Iterator[None]:
    """torch's print options in fixed notation (no 1.0000e+00), restored afterwards."""
    saved = torch._tensor_str.PRINT_OPTS.sci_mode
    torch.set_printoptions(sci_mode=False)
    try:
        yield
    finally:
        torch.set_printoptions(sci_mode=saved)


Add = Callable[..., None]  # add(key, code, value, *checks, heat=None, heat_axes="attention")
