"""What the benchmark scripts share: interleaved rounds (``attnlab.bench.timing``, the one timing loop), and
ratios reported with their spread.

A ratio is the median of the per-round ratios, and one whose rounds spread by more than NOISY is marked as
not a finding.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def save(result: dict[str, Any], path: Path | None) -> None:
    """Write a benchmark's result file atomically (a temporary beside it, then replaced); None: nothing."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
