"""Interleaved timing, the one loop every benchmark of attnlab times with (issue 32).

Machines are shared and noisy. Timing one case in a block and then the next
lets a busy moment fall on one case alone. Here every case is warmed up, then
timed round by round, each round calling every case once in an order rotated
by the round, so a busy moment touches every case alike. A figure is the
median of its rounds; its spread, (max - min) / median, says how far the
rounds disagree, and one over ``NOISY`` is too noisy to be a finding.

>>> times = interleaved({"short": lambda: sum(range(100)), "long": lambda: sum(range(10_000))}, rounds=3)
>>> {name: len(seconds) for name, seconds in times.items()}
{'short': 3, 'long': 3}
>>> rotated(["a", "b", "c"], 1)
['b', 'c', 'a']
>>> spread([2.0, 3.0, 2.5])
0.4
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

NOISY = 0.25  # rounds spreading more than this (relative to their median): too noisy to trust

Call = Callable[[], object]


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: the names rotated by r, so that each goes first in turn."""
    k = r % len(names) if names else 0
    return [*names[k:], *names[:k]]


def timed_rounds(
    prepared: Mapping[str, Callable[[], Call]], rounds: int, *, warmup: int = 0
) -> Iterator[dict[str, float]]:
    """Each round's seconds per case, round by round (a caller keeps the rounds done if it stops early).

    ``prepared[name]()`` makes what one timed call needs (a fresh cache, say), untimed, and returns the call to
    time. Each case is warmed up ``warmup`` times first (prepared and called, untimed).
    """
    names = list(prepared)
    for _ in range(warmup):
        for name in names:
            prepared[name]()()
    for r in range(rounds):
        took: dict[str, float] = {}
        for name in rotated(names, r):
            call = prepared[name]()
            began = time.perf_counter()
            call()
            took[name] = time.perf_counter() - began
        yield took


def interleaved(cases: Mapping[str, Call], rounds: int, *, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each case in each of ``rounds`` interleaved rounds, after ``warmup`` untimed calls of each."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    same = {name: _returning(call) for name, call in cases.items()}
    for took in timed_rounds(same, rounds, warmup=warmup):
        for name, seconds in took.items():
            times[name].append(seconds)
    return times


def _returning(call: Call) -> Callable[[], Call]:
    return lambda: call


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of a case's rounds (or of per-round ratios): 0 for fewer than two."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def ratios(times: Mapping[str, Sequence[float]], name: str, base: str) -> list[float]:
    """``name``'s time over ``base``'s, round by round: a ratio from the same moments of the machine."""
    return [t / b for t, b in zip(times[name], times[base], strict=True)]
