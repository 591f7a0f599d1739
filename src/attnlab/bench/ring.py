"""Ring attention measured per rank: agreement with one process, time, memory, bytes sent; the longest sequence
that fits a per-process memory cap.

:func:`rank_report` runs inside a joined process group (``attnlab ring`` under
``torchrun``, or a rank of :func:`measure`, which starts them on this machine).
It checks the ring against one-process ``attention()`` on ``check_len`` tokens
(output and the gradients of q, k, v), then makes this rank's shard of a
``seq_len`` sequence and runs it forward.

With ``memory_limit_mib`` the rank caps its own data segment (``RLIMIT_DATA``:
the heap and private writable mappings, where tensors live) at what it holds
after a small warm-up run plus the limit, so an allocation past it fails
for real and the run stops with :class:`MemoryError`. The cap covers the
shard, the blocks received, the kernel's work and the merge. With
``ring=False`` and one process, the same run is plain one-process flash
attention: the baseline of :func:`longest`, which doubles the length while
it fits and bisects between the last fit and the first failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from attnlab.distributed.collectives import Layout, RingStats, gather_sequence, padded_length, shard_sequence
from attnlab.distributed.launch import RankError, launch
from attnlab.distributed.ring import ring_attention
from attnlab.functional.attention import attention

ALLOCATION_FAILED = ("can't allocate memory", "out of memory")  # what PyTorch's CPU and CUDA allocators say
M_MMAP_THRESHOLD = -3  # glibc mallopt: fixed mmap threshold, so freed tensors go back to the system at once


@dataclass(frozen=True, kw_only=True)
class RingRun:
    """One run: the long sequence, its shape, what to check and what to measure."""

    seq_len: int = 65536
    heads: int = 4
    head_dim: int = 64
    layout: Layout = "zigzag"
    causal: bool = True
    check_len: int = 512  # tokens of the check against one process; 0: no check
    count_tensors: bool = False  # run again under bench.memory.PeakMemory (slower) to count peak tensor bytes
    memory_limit_mib: int | None = None  # cap this process's data segment at warm-up + this (CPU only)
    ring: bool = True  # False (one process only): plain flash attention, the baseline


@dataclass(frozen=True)
class RankReport:
    """What one rank measured; bytes are bytes."""

    rank: int
    local_tokens: int
    seconds: float
    peak_growth_bytes: int  # CPU: peak RSS growth during the run; CUDA: peak allocated during the run
    sent_bytes: int
    check_error: float | None  # max |ring - one process| over the output and the three gradients
    peak_tensor_bytes: int | None = None


def _check_against_one_process(run: RingRun, device: torch.device) -> float:
    g = torch.Generator().manual_seed(0)  # the same short sequence on every rank
    t, h, d = run.check_len, run.heads, run.head_dim
    q, k, v = (torch.randn(1, h, t, d, generator=g).to(device).requires_grad_() for _ in range(3))
    expected = attention(q, k, v, is_causal=run.causal, backend="flash")
    expected.sum().backward()
    local = [shard_sequence(x.detach(), 2, layout=run.layout).requires_grad_() for x in (q, k, v)]
    out = ring_attention(*local, is_causal=run.causal, layout=run.layout, seq_len=t)
    out.sum().backward()
    errors = [(gather_sequence(out.detach(), 2, length=t, layout=run.layout) - expected).abs().max().item()]
    for mine, whole in zip(local, (q, k, v), strict=True):
        assert mine.grad is not None and whole.grad is not None
        errors.append((gather_sequence(mine.grad, 2, length=t, layout=run.layout) - whole.grad).abs().max().item())
    return max(errors)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"))


def _data_segment_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status: the memory cap needs Linux")


@contextlib.contextmanager
def _data_capped(limit_mib: int | None) -> Iterator[None]:
    """Inside: this process is capped at its data segment on entry (after a trim) plus ``limit_mib``; lifted on
    exit, so the answer can go home (sending starts a thread, whose stack counts)."""
    if limit_mib is None:
        yield
        return
    gc.collect()
    _libc().malloc_trim(0)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_data_segment_bytes() + limit_mib * 2**20, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _forward(run: RingRun, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stats: RingStats | None) -> None:
    with torch.no_grad():
        if run.ring:
            ring_attention(q, k, v, is_causal=run.causal, layout=run.layout, seq_len=run.seq_len, stats=stats)
        else:
            attention(q, k, v, is_causal=run.causal, backend="flash")


def _out_of_memory(err: BaseException | None) -> bool:
    """An allocation that failed, maybe wrapped (a mask_mod's error names the mod and keeps the cause)."""
    while err is not None:
        if isinstance(err, MemoryError) or any(s in str(err).lower() for s in ALLOCATION_FAILED):
            return True
        err = err.__cause__ or err.__context__
    return False


def rank_report(run: RingRun) -> RankReport:
    """This rank's measurements of ``run``, in a joined process group (tensors on cuda:LOCAL_RANK under nccl)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if not run.ring and size > 1:
        raise ValueError(f"ring=False is the one-process baseline; it runs on 1 process, not {size}")
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if run.memory_limit_mib is not None:
        if cuda:
            raise ValueError("memory_limit_mib caps host memory; it applies to CPU runs (gloo), not nccl")
        if not sys.platform.startswith("linux"):
            raise ValueError(f"memory_limit_mib needs Linux (RLIMIT_DATA, /proc, glibc), not {sys.platform}")
        _libc().mallopt(M_MMAP_THRESHOLD, 128 * 1024)  # tensors in their own mappings: freed means returned
    check_error = _check_against_one_process(run, device) if run.check_len > 0 and run.ring else None
    per_rank = padded_length(run.seq_len, size, run.layout) // size if run.ring else run.seq_len
    warm = torch.zeros(1, 1, 2 * size, 8, device=device)
    _forward(RingRun(seq_len=2 * size, causal=run.causal, layout=run.layout, ring=run.ring), warm, warm, warm, None)
    del warm
    stats = RingStats()
    dist.barrier()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    try:
        with _data_capped(run.memory_limit_mib):  # the shard counts against the cap too
            g = torch.Generator().manual_seed(rank + 1)  # each rank makes its own shard
            q, k, v = (torch.randn(1, run.heads, per_rank, run.head_dim, generator=g).to(device) for _ in range(3))
            began = time.perf_counter()
            _forward(run, q, k, v, stats)
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - began
    except Exception as err:
        if not _out_of_memory(err):
            raise
        room = "this process's memory" if run.memory_limit_mib is None else f"{run.memory_limit_mib} MiB"
        raise MemoryError(f"{run.seq_len} tokens ({per_rank} on this rank) do not fit in {room}") from None
    if cuda:
        growth = torch.cuda.max_memory_allocated(device) - before
    else:
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    peak = None
    if run.count_tensors:  # a second run under the counter (it slows every op): tensors made during the call
        from attnlab.bench.memory import PeakMemory

        with PeakMemory() as mem:
            _forward(run, q, k, v, None)
        peak = mem.peak_bytes
    return RankReport(rank, per_rank, seconds, growth, stats.forward_bytes, check_error, peak)


def measure(run: RingRun, nproc: int, *, timeout_s: float = 3600.0) -> list[RankReport]:
    """``run`` on ``nproc`` gloo processes started on this machine (one thread each); their reports, by rank."""
    reports: list[RankReport] = launch(rank_report, nproc, args=(run,), timeout_s=timeout_s)
    return reports


@dataclass
class Longest:
    """The longest ``seq_len`` that ran within the cap (``fits``), the shortest that did not (``fails``), and
    every trial: (length, fitted, seconds of the slowest rank or None)."""

    nproc: int
    ring: bool
    memory_limit_mib: int
    fits: int = 0
    fails: int | None = None
    trials: list[tuple[int, bool, float | None]] = field(default_factory=list)


def longest(
    run: RingRun,
    nproc: int,
    *,
    start: int = 4096,
    resolution: float = 1 / 16,
    timeout_s: float = 3600.0,
    on_trial: Callable[[int, bool, float | None], None] | None = None,
) -> Longest:
    """Double ``seq_len`` from ``start`` while ``run`` fits its ``memory_limit_mib``, then bisect until the gap
    between the longest fit and the shortest failure is at most ``resolution`` of the fit. ``on_trial(length,
    fitted, seconds)`` hears of each trial as it ends."""
    if run.memory_limit_mib is None:
        raise ValueError("longest needs a memory cap: RingRun(memory_limit_mib=...)")
    found = Longest(nproc=nproc, ring=run.ring, memory_limit_mib=run.memory_limit_mib)

    def trial(n: int) -> bool:
        try:
            reports = measure(RingRun(**{**run.__dict__, "seq_len": n, "check_len": 0}), nproc, timeout_s=timeout_s)
        except RankError as err:
            if err.kind != "MemoryError":
                raise
            found.trials.append((n, False, None))
        else:
            found.trials.append((n, True, max(r.seconds for r in reports)))
        if on_trial is not None:
            on_trial(*found.trials[-1])
        return found.trials[-1][1]

    n = start
    while trial(n):
        found.fits, n = n, 2 * n
    found.fails = n
    while found.fails - found.fits > resolution * max(found.fits, start):
        middle = (found.fits + found.fails) // 2
        if trial(middle):
            found.fits = middle
        else:
            found.fails = middle
    return found
