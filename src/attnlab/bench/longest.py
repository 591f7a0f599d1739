"""``attnlab bench --longest``: the longest sequence each implementation runs, doubling T until memory, time or a
failure stops it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnlab.bench.impls import memory_model
from attnlab.bench.results import Longest, Machine
from attnlab.bench.runner import nominal_flops
from attnlab.bench.spawn import Worker, _spawn, available_bytes


@dataclass(frozen=True)
class LongestPlan:
    """What the longest search runs: each implementation from ``start``, doubling T (batch 1, forward)."""

    impls: tuple[str, ...]
    start: int = 1024
    d_model: int = 768
    heads: int = 12
    time_limit_s: float = 300.0
    memory_fraction: float = 0.7


def longest_forecast(plan: LongestPlan, machine: Machine, spawn_s: float) -> float:
    """A rough forecast of the search, in seconds: the doubling simulated with each length's nominal FLOPs at a
    quarter of the matmul rate (as ``estimate_seconds``) and the memory model, to the same stops."""
    rate = (machine.matmul_gflops or 10.0) * 1e9 * 0.25
    total = 0.0
    for impl in plan.impls:
        t, last = plan.start, None
        while True:
            need = memory_model(impl, batch=1, seq=t, d=plan.d_model, heads=plan.heads, dtype_bytes=4, backward=False)
            if need > plan.memory_fraction * machine.available_bytes or (last and 4 * last > plan.time_limit_s):
                break
            last = nominal_flops("forward", 1, t, plan.d_model) / rate
            total += spawn_s + 3 * last  # its own process: the check, one run, one under the memory counter
            t *= 2
    return total


def longest(
    plan: LongestPlan,
    *,
    worker: Worker = _spawn,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Longest]:
    """The longest sequence each implementation of ``plan`` runs (batch 1, forward), doubling T.

    Stops at the first length predicted to exceed free memory, predicted to
    take longer than ``time_limit_s`` (time grows about 4x per doubling), or
    that fails. Returns, per implementation, the longest length that ran and why it stopped. Ctrl-C
    (KeyboardInterrupt) ends the search: the implementation it was on keeps the longest that ran so far
    ("interrupted at T=..."), and those it had not started have no row.
    """
    impls, d_model, heads, time_limit_s = plan.impls, plan.d_model, plan.heads, plan.time_limit_s
    memory_fraction = plan.memory_fraction
    free = available_bytes()
    rows: list[Longest] = []
    for n, impl in enumerate(impls):
        t, best, last_ms, reason = plan.start, None, None, ""
        try:
            while True:
                if progress:
                    progress(n, len(impls), f"longest {impl} T={t}")
                need = memory_model(impl, batch=1, seq=t, d=d_model, heads=heads, dtype_bytes=4, backward=False)
                if need > memory_fraction * free:
                    reason = f"T={t} predicted to need {need / 2**30:.1f} GiB of {free / 2**30:.1f} GiB available"
                    break
                if last_ms is not None and 4 * last_ms / 1e3 > time_limit_s:
                    reason = (
                        f"T={t} predicted to take about {4 * last_ms / 1e3:.0f} s, over the {time_limit_s:.0f} s limit"
                    )
                    break
                spec = dict(impl=impl, seq=t, batch=1, d_model=d_model, heads=heads, dtype="float32", mode="forward")
                spec.update(
                    repeats=1, warmup=0, check_len=256, threads=None, memory_limit_bytes=int(memory_fraction * free)
                )
                case = worker(spec, max(time_limit_s * 2, 60.0))
                if case.get("status") != "ok":
                    reason = f"T={t}: {case.get('status')}"
                    break
                best, last_ms = case, case["median_ms"]
                t *= 2
        except KeyboardInterrupt:
            rows.append(_longest_row(impl, best, f"{INTERRUPTED_AT}{t}, the longest so far"))
            return rows
        rows.append(_longest_row(impl, best, reason))
    return rows


INTERRUPTED_AT = "interrupted at T="


def _longest_row(impl: str, best: dict[str, Any] | None, stopped: str) -> Longest:
    seq, median_ms, rss = (best["seq"], best["median_ms"], best["peak_rss_bytes"]) if best else (None, None, None)
    return Longest(impl, longest_seq=seq, median_ms=median_ms, peak_rss_bytes=rss, stopped=stopped)
