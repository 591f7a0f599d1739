"""``attnlab bench``: plan the cases, run each in a fresh process, summarize.

Method: every implementation is built from the same weights and checked
against a float64 reference before it is timed (one that disagrees is refused,
not timed); warm-up, then the median of ``repeats`` runs; one subprocess per
case so peak memory is the case's own; cases predicted not to fit in free
memory are skipped with a note. Rates are nominal FLOPs of causal attention
(projections plus half the score matrix) over the median time, and as a
fraction of this machine's float32 matmul rate measured in the same run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch

from attnlab._checks import check_heads, check_positive_int
from attnlab.bench.impls import IMPLEMENTATIONS, memory_model
from attnlab.bench.results import BenchResult, Case, Fit, Longest, Machine

PREFILL_IMPLS = (
    "book-wrapper",
    "book-mha",
    "torch-mha",
    "plain-sdpa",
    "attnlab-auto",
    "attnlab-eager",
    "attnlab-sdpa",
    "attnlab-flash",
)
DECODE_IMPLS = ("attnlab-auto+kvcache", "attnlab-auto", "book-mha")
Mode = Literal["forward", "backward"]


@dataclass(frozen=True)
class BenchConfig:
    seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096)
    batch: int = 1
    d_model: int = 768
    heads: int = 12
    dtype: str = "float32"
    mode: Mode = "forward"  # "backward" times forward + backward
    repeats: int = 5
    warmup: int = 2
    impls: tuple[str, ...] = PREFILL_IMPLS
    decode: bool = True
    check_len: int = 256
    timeout_s: float = 900.0
    threads: int | None = None
    memory_fraction: float = 0.7  # of MemAvailable a case may be predicted to use

    def validate(self) -> None:
        unknown = [i for i in self.impls if i not in IMPLEMENTATIONS]
        if unknown:
            raise ValueError(f"unknown implementations {unknown}; known: {list(IMPLEMENTATIONS)}")
        if not self.seq_lens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in self.seq_lens):
            raise ValueError(f"seq_lens must be positive ints, got {list(self.seq_lens)}")
        check_positive_int("batch", self.batch, limit=2**16)
        check_positive_int("d_model", self.d_model, limit=2**16)
        check_heads(self.d_model, self.heads, names=("d_model", "heads"))
        check_positive_int("repeats", self.repeats, limit=10_000)
        if self.threads is not None:
            check_positive_int("threads", self.threads, limit=4096)
        if self.mode not in ("forward", "backward"):
            raise ValueError(f"mode must be 'forward' or 'backward', got {self.mode!r}")


# A smoke run: every implementation once, tiny shapes (each case still gets its own process).
QUICK = BenchConfig(seq_lens=(64,), batch=2, d_model=64, heads=4, repeats=3, warmup=1, check_len=64)


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def nominal_flops(mode: str, b: int, t: int, d: int) -> float:
    """Causal attention layer: QKV and output projections 8btd^2, scores and @V 2bt^2d (half of 4bt^2d)."""
    if mode == "decode":
        return 8 * b * d * d + 4 * b * t * d
    forward = 8 * b * t * d * d + 2 * b * t * t * d
    return 3 * forward if mode == "backward" else forward  # backward is about twice the forward


def _spawn(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "attnlab.bench.worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**spec, "status": f"failed: exceeded {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return {**spec, "status": f"failed: {tail[0][:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


Worker = Callable[[dict[str, Any], float], dict[str, Any]]


def plan(config: BenchConfig) -> list[dict[str, Any]]:
    """Every case to run, in order: prefill cases per length, then decode cases."""
    base = dict(
        batch=config.batch,
        d_model=config.d_model,
        heads=config.heads,
        dtype=config.dtype,
        repeats=config.repeats,
        warmup=config.warmup,
        check_len=config.check_len,
        threads=config.threads,
    )
    specs = [dict(base, impl=i, seq=t, mode=config.mode) for t in config.seq_lens for i in config.impls]
    if config.decode:
        specs += [dict(base, impl=i, seq=t, mode="decode") for t in config.seq_lens for i in DECODE_IMPLS]
    return specs


def run(
    config: BenchConfig, *, progress: Callable[[int, int, str], None] | None = None, worker: Worker = _spawn
) -> BenchResult:
    """Run every case of ``config``; ``progress(done, total, label)`` is called as cases finish."""
    config.validate()
    free = available_bytes()
    matmul = worker({"mode": "matmul", "threads": config.threads}, config.timeout_s).get("matmul_gflops")
    machine = Machine(
        torch=torch.__version__,
        cpus=os.cpu_count(),
        threads=config.threads or torch.get_num_threads(),
        available_bytes=free,
        matmul_gflops=matmul,
    )
    result = BenchResult(machine=machine, config=asdict(config))
    specs = plan(config)
    dtype_bytes = torch.empty((), dtype=getattr(torch, config.dtype)).element_size()
    for n, spec in enumerate(specs):
        label = f"{spec['impl']} {spec['mode']} T={spec['seq']}"
        if progress:
            progress(n, len(specs), label)
        need = memory_model(
            spec["impl"],
            batch=spec["batch"],
            seq=spec["seq"] + (spec["mode"] == "decode"),
            d=spec["d_model"],
            heads=spec["heads"],
            dtype_bytes=dtype_bytes,
            backward=spec["mode"] == "backward",
        )
        if need > config.memory_fraction * free:
            answer = {
                **spec,
                "status": f"skipped: predicted {need / 2**30:.1f} GiB > {config.memory_fraction:.0%} "
                f"of the {free / 2**30:.1f} GiB available",
            }
        else:
            answer = worker({**spec, "memory_limit_bytes": int(config.memory_fraction * free)}, config.timeout_s)
        case = Case.from_worker({**spec, **answer})
        case.predicted_bytes = need
        result.cases.append(case)
    if progress:
        progress(len(specs), len(specs), "done")
    summarize(result)
    return result


def summarize(result: BenchResult) -> None:
    """Add rates, roofline fractions, ratios to the fastest of the same run, and fitted exponents."""
    matmul = result.machine.matmul_gflops
    groups: dict[tuple[str, int], list[Case]] = {}
    for c in result.cases:
        if c.ok:
            assert c.median_ms is not None
            c.gflops = nominal_flops(c.mode, c.batch, c.seq, c.d_model) / (c.median_ms / 1e3) / 1e9
            c.roofline_fraction = c.gflops / matmul if matmul else None
            groups.setdefault((c.mode, c.seq), []).append(c)
    for cases in groups.values():
        fastest = min(c.median_ms for c in cases if c.median_ms is not None)
        for c in cases:
            assert c.median_ms is not None
            c.ratio_to_fastest = c.median_ms / fastest
    for impl in dict.fromkeys(c.impl for c in result.cases):
        for mode in dict.fromkeys(c.mode for c in result.cases):
            ok = sorted((c for c in result.cases if c.impl == impl and c.mode == mode and c.ok), key=lambda c: c.seq)
            if len(ok) >= 2:
                result.fits[f"{impl} {mode}"] = Fit(
                    time_exponent=_slope([c.seq for c in ok], [c.median_ms or 0.0 for c in ok]),
                    memory_exponent=_slope([c.seq for c in ok], [c.peak_allocated_bytes or 0 for c in ok]),
                )


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x: the scaling exponent."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=False) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def longest(
    impls: tuple[str, ...],
    *,
    start: int = 1024,
    d_model: int = 768,
    heads: int = 12,
    time_limit_s: float = 300.0,
    memory_fraction: float = 0.7,
    worker: Worker = _spawn,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Longest]:
    """The longest sequence each implementation runs (batch 1, forward), doubling T.

    Stops at the first length predicted to exceed free memory, predicted to
    take longer than ``time_limit_s`` (time grows about 4x per doubling), or
    that fails. Returns, per implementation, the longest length that ran and why it stopped.
    """
    free = available_bytes()
    rows: list[Longest] = []
    for n, impl in enumerate(impls):
        t, best, last_ms, reason = start, None, None, ""
        while True:
            if progress:
                progress(n, len(impls), f"longest {impl} T={t}")
            need = memory_model(impl, batch=1, seq=t, d=d_model, heads=heads, dtype_bytes=4, backward=False)
            if need > memory_fraction * free:
                reason = f"T={t} predicted to need {need / 2**30:.1f} GiB of {free / 2**30:.1f} GiB available"
                break
            if last_ms is not None and 4 * last_ms / 1e3 > time_limit_s:
                reason = f"T={t} predicted to take about {4 * last_ms / 1e3:.0f} s, over the {time_limit_s:.0f} s limit"
                break
            spec = dict(
                impl=impl,
                seq=t,
                batch=1,
                d_model=d_model,
                heads=heads,
                dtype="float32",
                mode="forward",
                repeats=1,
                warmup=0,
                check_len=256,
                threads=None,
                memory_limit_bytes=int(memory_fraction * free),
            )
            case = worker(spec, max(time_limit_s * 2, 60.0))
            if case.get("status") != "ok":
                reason = f"T={t}: {case.get('status')}"
                break
            best, last_ms = case, case["median_ms"]
            t *= 2
        rows.append(
            Longest(
                impl=impl,
                longest_seq=best["seq"] if best else None,
                median_ms=best["median_ms"] if best else None,
                peak_rss_bytes=best["peak_rss_bytes"] if best else None,
                stopped=reason,
            )
        )
    return rows


def with_overrides(config: BenchConfig, **changes: Any) -> BenchConfig:
    return replace(config, **{k: v for k, v in changes.items() if v is not None})
