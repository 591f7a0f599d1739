"""Benchmarks: memory accounting now; the runner lands with `attnlab bench`."""

from attnlab.bench.memory import PeakMemory

__all__ = ["PeakMemory"]
