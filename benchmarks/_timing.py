"""What the benchmark scripts share: interleaved rounds (``attnlab.bench.timing``, the one timing loop), and
ratios reported with their spread.

A ratio is the median of the per-round ratios, and one whose rounds spread by more than NOISY is marked as
not a finding.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from attnlab.bench.timing import NOISY, interleaved, ratios, spread

__all__ = ["NOISY", "interleaved", "report"]


def report(times: Mapping[str, list[float]], base: str, *, width: int = 34) -> None:
    """Each case's median and its time as a multiple of ``base``'s (median of per-round ratios), with the spread."""
    for name, ts in times.items():
        per_round = ratios(times, name, base)
        ratio = statistics.median(per_round)
        wide = spread(per_round)
        flag = "" if wide <= NOISY else "  (too noisy to trust)"
        print(
            f"  {name:<{width}} {statistics.median(ts) * 1e3:8.1f} ms   {ratio:5.2f}x {base}  spread {wide:4.0%}{flag}"
        )
