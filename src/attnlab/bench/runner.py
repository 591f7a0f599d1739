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

import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch

from attnlab._checks import check_heads, check_positive_int
from attnlab.bench.impls import IMPLEMENTATIONS, memory_model
from attnlab.bench.results import BenchResult, Case, Fit, Machine
from attnlab.bench.spawn import Worker, _spawn, available_bytes, stop_workers

PREFILL_IMPLS = (
    "book-wrapper", "book-mha", "torch-mha", "plain-sdpa",
    "attnlab-auto", "attnlab-eager", "attnlab-sdpa", "attnlab-flash",
)  # fmt: skip
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


def nominal_flops(mode: str, b: int, t: int, d: int) -> float:
    """Causal attention layer: QKV and output projections 8btd^2, scores and @V 2bt^2d (half of 4bt^2d)."""
    if mode == "decode":
        return 8 * b * d * d + 4 * b * t * d
    forward = 8 * b * t * d * d + 2 * b * t * t * d
    return 3 * forward if mode == "backward" else forward  # backward is about twice the forward


_TIMING = ("repeats", "warmup", "check_len", "threads")  # what a worker's spec takes from the config as it is


def plan(config: BenchConfig) -> list[dict[str, Any]]:
    """Every case to run, in order: prefill cases per length, then decode cases."""
    base = {k: getattr(config, k) for k in ("batch", "d_model", "heads", "dtype", *_TIMING)}
    specs = [dict(base, impl=i, seq=t, mode=config.mode) for t in config.seq_lens for i in config.impls]
    if config.decode:
        specs += [dict(base, impl=i, seq=t, mode="decode") for t in config.seq_lens for i in DECODE_IMPLS]
    return specs


def measure_machine(config: BenchConfig, worker: Worker = _spawn) -> tuple[Machine, float]:
    """This machine now: torch, threads, free memory, the float32 matmul rate; and how long one worker took."""
    started = time.perf_counter()
    matmul = worker({"mode": "matmul", "threads": config.threads}, config.timeout_s).get("matmul_gflops")
    machine = Machine(
        torch=torch.__version__,
        cpus=os.cpu_count(),
        threads=config.threads or torch.get_num_threads(),
        available_bytes=available_bytes(),
        matmul_gflops=matmul,
    )
    return machine, time.perf_counter() - started


def estimate_seconds(config: BenchConfig, machine: Machine, spawn_s: float) -> list[float]:
    """A rough forecast of each planned case (its own process, its share of the interleaved timing), in seconds.

    Nominal FLOPs at a quarter of the matmul rate, plus the start of a process:
    good to a factor of two or so, enough to say "about 3 minutes" before a
    run and to pace the progress bar.
    """
    rate = (machine.matmul_gflops or 10.0) * 1e9 * 0.25
    out = []
    for spec in plan(config):
        one = nominal_flops(spec["mode"], spec["batch"], spec["seq"], spec["d_model"]) / rate
        # its own process: build, check, one warm-up, one run, one measured for memory; then its interleaved turns
        out.append(spawn_s * (1 + 1 / max(len(config.impls), 1)) + one * (3 + config.warmup + config.repeats))
    return out


def run(
    config: BenchConfig,
    *,
    progress: Callable[[float, float, str], None] | None = None,
    worker: Worker = _spawn,
    machine: tuple[Machine, float] | None = None,
) -> BenchResult:
    """Run every case of ``config``; ``progress(done_s, total_s, label)`` is called as cases finish.

    Each case runs once in its own process (the check against float64 and the
    memory; two processes at a time when two of the largest fit in memory
    together, since these runs are not timed); then the cases of one length and mode that passed are timed
    together in one process, their repeats interleaved, so the ratios between
    implementations come from the same moments of the machine's load.
    """
    config.validate()
    machine_info, spawn_s = machine or measure_machine(config, worker)
    result = BenchResult(machine=machine_info, config=asdict(config))
    specs = plan(config)
    estimates = estimate_seconds(config, machine_info, spawn_s)
    total, done = sum(estimates), 0.0
    free = machine_info.available_bytes
    dtype_bytes = torch.empty((), dtype=getattr(torch, config.dtype)).element_size()
    needs = [
        memory_model(
            spec["impl"],
            batch=spec["batch"],
            seq=spec["seq"] + (spec["mode"] == "decode"),
            d=spec["d_model"],
            heads=spec["heads"],
            dtype_bytes=dtype_bytes,
            backward=spec["mode"] == "backward",
        )
        for spec in specs
    ]
    budget = config.memory_fraction * free
    # the own-process runs only check and measure memory (the interleaved runs below time): two at a time
    # when two of the largest fit in memory together
    jobs = 2 if 2 * max(needs, default=0) <= budget else 1
    lock = threading.Lock()
    stopping = threading.Event()  # Ctrl-C: no new case starts

    def own_run(item: tuple[dict[str, Any], int, float]) -> dict[str, Any]:
        nonlocal done
        spec, need, estimate = item
        if stopping.is_set():
            return {**spec, "status": INTERRUPTED}
        if need > budget:
            answer = {
                **spec,
                "status": f"skipped: predicted {need / 2**30:.1f} GiB > {config.memory_fraction:.0%} "
                f"of the {free / 2**30:.1f} GiB available",
            }
        else:
            own = {**spec, "repeats": 1, "warmup": 1, "memory_limit_bytes": int(budget / jobs)}
            answer = worker(own, config.timeout_s)
        if stopping.is_set():  # its worker was stopped by Ctrl-C (or finished as it came): not kept
            return {**spec, "status": INTERRUPTED}
        with lock:
            done += estimate
            if progress:
                progress(done, total, f"{spec['impl']} {spec['mode']} T={spec['seq']}")
        return answer

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(own_run, item) for item in zip(specs, needs, estimates, strict=True)]
    try:
        answers = [future.result() for future in futures]
    except KeyboardInterrupt:  # the cases finished stay; the rest, and the one each worker was running, do not
        stopping.set()
        stop_workers()
        pool.shutdown(wait=True, cancel_futures=True)
        answers = [_finished(future, spec) for future, spec in zip(futures, specs, strict=True)]
    pool.shutdown()
    groups: dict[tuple[str, int], list[Case]] = {}
    for spec, need, answer in zip(specs, needs, answers, strict=True):
        case = Case.from_worker({**spec, **answer})
        case.predicted_bytes = need
        result.cases.append(case)
        groups.setdefault((spec["mode"], spec["seq"]), []).append(case)
    for (mode, seq), cases in groups.items():
        if stopping.is_set():  # not timed together: not a row of the tables
            for c in (c for c in cases if c.ok):
                c.status = INTERRUPTED
            continue
        if progress:
            progress(done, total, f"interleaved timing, {mode} T={seq}")
        try:
            _time_together([c for c in cases if c.ok], config, worker)
        except KeyboardInterrupt:  # this length's cases were not timed together: not rows either
            stopping.set()
            for c in (c for c in cases if c.ok):
                c.status = INTERRUPTED
    result.left = [f"{c.impl} {c.mode} T={c.seq}" for c in result.cases if c.status == INTERRUPTED]
    if progress and not stopping.is_set():
        progress(total, total, "done")
    summarize(result)
    return result


INTERRUPTED = "not measured: interrupted"


def _finished(future: Future[dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    """A case's answer if its worker finished before Ctrl-C, else that it was interrupted."""
    if future.cancelled() or future.exception() is not None:
        return {**spec, "status": INTERRUPTED}
    return future.result()


def _time_together(cases: list[Case], config: BenchConfig, worker: Worker) -> None:
    """Replace each case's single timing with its interleaved samples (or mark it failed)."""
    if not cases:
        return
    first = cases[0]
    shape = {k: getattr(first, k) for k in ("mode", "seq", "batch", "d_model", "heads", "dtype")}  # shared by all
    spec = {"impls": [c.impl for c in cases], **shape, **{k: getattr(config, k) for k in _TIMING}}
    answer = worker(spec, config.timeout_s * len(cases))
    samples = answer.get("samples_ms")
    for c in cases:
        if not isinstance(samples, dict) or not samples.get(c.impl):
            c.status = f"failed: interleaved timing: {answer.get('status', 'no samples')}"
            c.median_ms = None
            continue
        c.samples_ms = list(samples[c.impl])
        c.median_ms = statistics.median(c.samples_ms)


def with_overrides(config: BenchConfig, **changes: Any) -> BenchConfig:
    return replace(config, **{k: v for k, v in changes.items() if v is not None})


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
        fastest = min(cases, key=lambda c: c.median_ms or math.inf)
        for c in cases:
            assert c.median_ms is not None and fastest.median_ms is not None
            c.ratio_to_fastest = c.median_ms / fastest.median_ms
            paired = [a / b for a, b in zip(c.samples_ms, fastest.samples_ms, strict=False) if b > 0]
            if len(paired) >= 2 and len(c.samples_ms) == len(fastest.samples_ms):  # round r against round r
                c.ratio_spread = (max(paired) - min(paired)) / statistics.median(paired)
    for impl in dict.fromkeys(c.impl for c in result.cases):
        for mode in dict.fromkeys(c.mode for c in result.cases):
            ok = sorted((c for c in result.cases if c.impl == impl and c.mode == mode and c.ok), key=lambda c: c.seq)
            if len(ok) >= 2:
                seqs = [float(c.seq) for c in ok]
                rounds = min(len(c.samples_ms) for c in ok)
                per_round = [_slope(seqs, [c.samples_ms[r] for c in ok]) for r in range(rounds)]
                slopes = [v for v in per_round if v is not None]
                result.fits[f"{impl} {mode}"] = Fit(
                    time_exponent=_slope(seqs, [c.median_ms or 0.0 for c in ok]),
                    memory_exponent=_slope(seqs, [float(c.peak_allocated_bytes or 0) for c in ok]),
                    time_exponent_range=(min(slopes), max(slopes)) if len(slopes) >= 2 else None,
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
