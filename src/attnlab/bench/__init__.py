"""``attnlab bench``: every implementation, checked, then timed side by side; typed results."""

from attnlab.bench.memory import PeakMemory
from attnlab.bench.results import BenchResult, Case, Fit, Longest, Machine

__all__ = ["BenchResult", "Case", "Fit", "Longest", "Machine", "PeakMemory"]
