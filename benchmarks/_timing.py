"""What the benchmark scripts share: interleaved rounds, and ratios reported with their spread.

Machines are shared and noisy: every implementation is warmed up, then timed
round by round with the order rotated, so a busy moment touches all of them
alike; a ratio is the median of the per-round ratios, and one whose rounds
spread by more than NOISY is marked as not a finding.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

NOISY = 0.25  # per-round ratios spreading more than this (relative to their median): too noisy to trust


def interleaved(cases: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per round for each case: each warmed up once (a compile too), then timed, the order rotated."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            began = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - began)
    return times


def report(times: Mapping[str, list[float]], base: str, *, width: int = 34) -> None:
    """Each case's median and its time as a multiple of ``base``'s (median of per-round ratios), with the spread."""
    for name, ts in times.items():
        ratios = [t / b for t, b in zip(ts, times[base], strict=True)]
        ratio = statistics.median(ratios)
        spread = (max(ratios) - min(ratios)) / ratio
        flag = "" if spread <= NOISY else "  (too noisy to trust)"
        print(
            f"  {name:<{width}} {statistics.median(ts) * 1e3:8.1f} ms   {ratio:5.2f}x {base}  spread {spread:4.0%}{flag}"
        )
