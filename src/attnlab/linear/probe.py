"""Timing a product as decoding meets it: through copies of a weight that together exceed the caches.

A decode step reads every weight once from memory, so a probe that multiplied
one weight again and again would time the caches instead. :func:`stream_copies`
sizes a list of copies, each its own memory, to :func:`stream_bytes` (256 MiB,
or twice the last-level cache this machine reports); :func:`pass_seconds` times
a pass through them and :func:`interleaved_seconds` lets several ways take
turns, pass by pass, so that a machine that slows down midway favours none.
The layout probe (:mod:`attnlab.linear.layout`) and the int8 kernels' probe
(:mod:`attnlab.linear.quantized`) both time through these.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

Name = TypeVar("Name", bound=str)  # what interleaved_seconds' callers name their calls by: a layout, a kernel
STREAM_BYTES = 256 * 2**20  # the least a stream probe cycles through; twice the last-level cache where that is more
MAX_COPIES = 1024  # of one weight in a probe: a weight smaller than stream_bytes() / 1024 is timed in cache,
SMALL_COPIES = 64  # and then through this many copies (more would add calls, not bytes from memory)


def stream_copies(d_in: int, d_out: int, dtype: torch.dtype) -> tuple[int, int]:
    """A (d_out, d_in) ``dtype`` weight's bytes, and how many copies of it a stream probe cycles through: enough
    to reach :func:`stream_bytes`, where :data:`MAX_COPIES` do; a weight smaller than that stays in cache
    however many copies there are (the calls, not memory, bound it), and is timed through :data:`SMALL_COPIES`."""
    size = d_in * d_out * torch.empty((), dtype=dtype).element_size()
    return size, SMALL_COPIES if in_cache(d_in, d_out, dtype) else max(1, -(-stream_bytes() // size))


def in_cache(d_in: int, d_out: int, dtype: torch.dtype) -> bool:
    """Whether a (d_out, d_in) ``dtype`` weight is small enough that its probe times it in the caches
    (:func:`stream_copies`): a decode step reads it from there too, and its calls, not memory, bound it."""
    size = d_in * d_out * torch.empty((), dtype=dtype).element_size()  # int8 too, which finfo refuses
    return -(-stream_bytes() // max(size, 1)) > MAX_COPIES


@functools.cache
def stream_bytes() -> int:
    """The bytes a stream probe cycles through: :data:`STREAM_BYTES`, or twice this machine's last-level cache
    where that is more (a machine of docs/benchmarks.md has 480 MiB of L3), so that no weight is read from it."""
    return max(STREAM_BYTES, 2 * last_level_cache_bytes())


def last_level_cache_bytes() -> int:
    """The outermost CPU cache's bytes as Linux reports them (sysfs), summed over its instances (one per group
    of cores that share it); 0 where the OS reports none."""
    sizes: dict[tuple[int, str], int] = {}  # (level, the cores sharing it) -> bytes
    for entry in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level, size, shared = (entry.joinpath(f).read_text().strip() for f in ("level", "size", "shared_cpu_list"))
            kind = entry.joinpath("type").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if kind != "Instruction" and size[:-1].isdigit() and size[-1] in units:
            sizes[(int(level), shared)] = int(size[:-1]) * units[size[-1]]
    top = max((level for level, _ in sizes), default=0)
    return sum(size for (level, _), size in sizes.items() if level == top)


def interleaved_passes(calls: dict[Name, list[Callable[[], object]]], repeats: int) -> dict[Name, list[float]]:
    """Each name's seconds for each of ``repeats`` passes through its calls, the names taking turns pass by pass,
    after one pass each that warms up (and packs the "packed" layout's copies)."""
    times: dict[Name, list[float]] = {name: [] for name in calls}
    for _ in range(repeats + 1):
        for name, each in calls.items():
            times[name].append(pass_seconds(each, 0))
    return {name: spent[1:] for name, spent in times.items()}


def interleaved_seconds(calls: dict[Name, list[Callable[[], object]]], repeats: int) -> dict[Name, float]:
    """Each name's median seconds of :func:`interleaved_passes`."""
    return {name: statistics.median(spent) for name, spent in interleaved_passes(calls, repeats).items()}


def pass_seconds(calls: Sequence[Callable[[], object]], repeats: int) -> float:
    """The median seconds of ``repeats`` passes through ``calls``, after one pass that warms up: how fast a
    list of weights that together exceed the caches streams, one product each (the probes here and in
    ``attnlab.linear.quantized``). With ``repeats=0``, the seconds of one pass."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for call in calls:
            call()
        times.append(time.perf_counter() - start)
    return times[0] if repeats == 0 else statistics.median(times[1:])
