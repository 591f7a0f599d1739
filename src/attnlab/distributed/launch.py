"""Start processes: ``launch`` runs a function as every rank of a gloo group on this machine; ``join_from_environment``
joins the group that ``torchrun`` describes.

``launch(fn, nproc, args=...)`` spawns ``nproc`` fresh Python processes. Each
joins one process group on a free local port, calls ``fn(*args)`` and sends
back what it returns (it must pickle). A rank that raises ends every rank at
once: the others may be waiting on it in a send or receive that would never
return. Its error is raised here as :class:`RankError`, with the rank's own
traceback. ``timeout_s`` bounds the whole run, so a deadlock fails instead of
hanging.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist


class RankError(RuntimeError):
    """One rank of a :func:`launch` raised: ``rank``, the exception's ``kind`` (class name), ``message`` and
    ``trace`` (its traceback, as the rank printed it)."""

    def __init__(self, rank: int, kind: str, message: str, trace: str) -> None:
        super().__init__(f"rank {rank} failed: {kind}: {message}")
        self.rank, self.kind, self.message, self.trace = rank, kind, message, trace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    fn: Callable[..., Any], rank: int, size: int, port: int, backend: str, threads: int, args: Sequence[Any], out: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, rank=rank, world_size=size, timeout=datetime.timedelta(minutes=30))
        result = fn(*args)
        out.put((rank, True, result))
        dist.barrier()  # every rank done with the group before any tears it down (a failed rank: killed here)
        dist.destroy_process_group()
    except BaseException as err:  # sent to the parent, which ends every rank and raises it
        out.put((rank, False, (type(err).__name__, str(err), traceback.format_exc())))


def _vanished(rank: int, p: Any) -> RankError:
    return RankError(rank, "ProcessExit", f"exited with code {p.exitcode} before answering", "")


def _check_alive(procs: list[Any], got: dict[int, Any], results: Any) -> None:
    """A rank that died without an answer (killed, crashed in C) is an error now, not a wait until the timeout."""
    for rank, p in enumerate(procs):
        if rank in got or p.exitcode is None:
            continue
        try:  # its answer may still be in the pipe
            while True:
                r, ok, value = results.get(timeout=0.5)
                if not ok:  # another rank failed on the lost connection: the one that vanished is the cause
                    _raise_first_cause(procs, got, r, RankError(r, *value))
                got[r] = value
        except queue.Empty:
            pass
        if rank not in got:
            raise _vanished(rank, p)


def _raise_first_cause(procs: list[Any], got: dict[int, Any], rank: int, error: RankError) -> None:
    """Raise ``error``, unless another rank vanished first: the others then fail on the lost connection, and the
    rank that vanished is the cause worth naming."""
    deadline = time.monotonic() + 1.0  # its exit may not be reaped yet
    while time.monotonic() < deadline:
        for other, p in enumerate(procs):
            if other != rank and other not in got and p.exitcode not in (None, 0):
                raise _vanished(other, p) from error
        time.sleep(0.05)
    raise error


def launch(
    fn: Callable[..., Any],
    nproc: int,
    *,
    args: Sequence[Any] = (),
    backend: str = "gloo",
    threads: int = 1,
    timeout_s: float = 3600.0,
) -> list[Any]:
    """``fn(*args)`` in ``nproc`` processes, each a rank of one group; their results, by rank.

    ``fn`` must be importable by name (a module-level function): the processes are spawned, not forked.
    ``threads``: torch's intra-op threads per process (1: the ranks share this machine's cores).
    Raises :class:`RankError` when a rank raises, ``TimeoutError`` after ``timeout_s``; no process outlives the call.
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, nproc, port, backend, threads, tuple(args), results))
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < nproc:
            try:
                rank, ok, value = results.get(timeout=min(max(deadline - time.monotonic(), 0.01), 0.5))
            except queue.Empty:
                _check_alive(procs, got, results)
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{nproc - len(got)} of {nproc} ranks gave no answer within {timeout_s:g} s "
                        "(a hang, or too slow)"
                    ) from None
                continue
            if not ok:
                _raise_first_cause(procs, got, rank, RankError(rank, *value))
            got[rank] = value
    finally:
        for p in procs:
            if len(got) < nproc:  # a failure or a timeout: the others may wait forever on the rank that is gone
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(nproc)]


def join_from_environment() -> bool:
    """Join the process group ``torchrun`` describes in the environment (nccl with GPUs, gloo without).

    True when this call started it; False outside torchrun (``WORLD_SIZE`` unset or 1) or when already joined.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl")
    else:
        dist.init_process_group(backend="gloo")
    return True
