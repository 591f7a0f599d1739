"""``attnlab bench``: every implementation, checked, then timed side by side; typed results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.bench.results import BenchResult, Case, Fit, Longest, Machine

if TYPE_CHECKING:
    from attnlab.bench.memory import PeakMemory

__all__ = ["BenchResult", "Case", "Fit", "Longest", "Machine", "PeakMemory"]


def __getattr__(name: str) -> object:
    """``PeakMemory`` on first use: it loads PyTorch, which the command's help and checks do not need."""
    if name == "PeakMemory":
        from attnlab.bench.memory import PeakMemory

        return PeakMemory
    raise AttributeError(f"module 'attnlab.bench' has no attribute {name!r}")
