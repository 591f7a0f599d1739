"""``attnlab ring --nproc 4 --seq-len 65536``: ring attention across processes it starts itself (gloo, this machine).

Each process first checks the ring against one-process ``attention()`` on a
short sequence (output and the gradients of q, k, v), then runs the long
sequence forward from its own shard and reports its time, its peak memory
growth and the bytes it sent (``attnlab.bench.ring`` measures). Under
``torchrun`` (``WORLD_SIZE`` set) it starts nothing: each process is one rank
of torchrun's group, on any number of machines, with nccl where there are GPUs,
and rank 0 prints the table (docs/ring.md).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import error


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ring = sub.add_parser(
        "ring",
        help="ring attention across processes on this machine: time, memory and bytes sent per rank",
        description="Start --nproc processes (gloo), check ring attention against one process on --check-len "
        "tokens, then run --seq-len tokens forward, sharded, and print each rank's time, peak memory and bytes sent.",
    )
    ring.add_argument("--nproc", type=int, default=4, help="processes (default 4)")
    ring.add_argument("--seq-len", type=int, default=65536, help="tokens of the long run (default 65536)")
    ring.add_argument("--heads", type=int, default=4, help="heads (default 4)")
    ring.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    ring.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag", help="default zigzag")
    ring.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="causal (default on)")
    ring.add_argument("--check-len", type=int, default=512, help="tokens of the check against one process (512)")
    ring.add_argument(
        "--memory", action="store_true", help="run the long sequence again to count its peak tensor bytes (slower)"
    )
    ring.add_argument(
        "--memory-limit",
        type=int,
        default=None,
        metavar="MIB",
        help="cap each process's memory at its warm-up size + MIB (CPU): a length that does not fit fails for real",
    )


def _check(args: argparse.Namespace) -> None:
    from attnlab._checks import check_positive_int

    check_positive_int("--nproc", args.nproc, limit=64)
    check_positive_int("--seq-len", args.seq_len, limit=1 << 24)
    check_positive_int("--heads", args.heads, limit=256)
    check_positive_int("--head-dim", args.head_dim, limit=1024)
    check_positive_int("--check-len", args.check_len, limit=1 << 16)
    if args.seq_len < max(args.check_len, 2 * args.nproc):  # then the "long" run measures nothing past the check
        raise ValueError(
            f"--seq-len {args.seq_len} is shorter than the check (--check-len {args.check_len}) or than two chunks "
            f"per process ({2 * args.nproc}): the long run is what is timed; give --seq-len >= "
            f"{max(args.check_len, 2 * args.nproc)}, or a smaller --check-len"
        )
    if args.memory_limit is not None:
        check_positive_int("--memory-limit", args.memory_limit, limit=1 << 20)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and _has_cuda():
            raise ValueError("--memory-limit caps host memory (CPU, gloo); under torchrun with GPUs, leave it out")
    here = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) / int(os.environ.get("WORLD_SIZE", "1"))  # torchrun: a share
    need = here * args.seq_len * args.heads * args.head_dim * 4 * 4 * 3  # q, k, v, out, a received block; float32
    if need > 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
        raise ValueError(
            f"--seq-len {args.seq_len} needs about {need / 2**30:.1f} GiB of shards here: "
            "more than half this machine's memory"
        )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _run(args: argparse.Namespace) -> Any:
    from attnlab.bench.ring import RingRun

    return RingRun(
        seq_len=args.seq_len,
        heads=args.heads,
        head_dim=args.head_dim,
        layout=args.layout,
        causal=args.causal,
        check_len=args.check_len,
        count_tensors=args.memory,
        memory_limit_mib=args.memory_limit,
    )


def _under_torchrun(args: argparse.Namespace, console: Console) -> int:
    """One rank of a group torchrun started (any number of machines): rank 0 prints every rank's report."""
    import torch.distributed as dist

    from attnlab.bench.ring import rank_report
    from attnlab.distributed.launch import join_from_environment

    started = join_from_environment()
    try:
        report = rank_report(_run(args))
        reports: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        dist.barrier()  # every rank done with the group before any tears it down
        if dist.get_rank() == 0:
            return _print(args, reports, dist.get_world_size(), console)
        return 0
    except Exception as err:  # one line per rank that fails (torchrun ends the others), never a traceback
        rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
        return error(console, f"rank {rank} failed: {type(err).__name__}: {err}")
    finally:
        if started:
            dist.destroy_process_group()


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        _check(args)
    except (ValueError, TypeError) as err:
        return error(console, err)
    from attnlab.bench.ring import measure
    from attnlab.distributed.launch import RankError

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _under_torchrun(args, console)
    console.print(
        f"{args.nproc} processes (gloo), {args.layout}, {'causal' if args.causal else 'full'}, {args.heads} heads x "
        f"{args.head_dim}: check at {args.check_len} tokens, then {args.seq_len} tokens forward",
        markup=False,
    )
    try:
        with console.status("running the ring"):
            reports = measure(_run(args), args.nproc)
    except RankError as err:
        return error(console, f"rank {err.rank} failed: {err.kind}: {err.message}")
    return _print(args, reports, args.nproc, console)


def _print(args: argparse.Namespace, reports: list[Any], size: int, console: Console) -> int:
    table = Table(title=f"ring attention, {args.seq_len} tokens over {size} processes")
    columns = ["rank", "local tokens", "time s", "peak memory growth MiB", "sent MiB", "max |error| at check"]
    if args.memory:
        columns.insert(4, "peak tensors MiB")
    for column in columns:
        table.add_column(column, justify="right")
    for r in reports:
        row = [str(r.rank), str(r.local_tokens), f"{r.seconds:.2f}", f"{r.peak_growth_bytes / 2**20:.0f}"]
        row += [f"{r.peak_tensor_bytes / 2**20:.1f}"] if args.memory else []
        row += [f"{r.sent_bytes / 2**20:.1f}", f"{r.check_error:.1e}"]
        table.add_row(*row)
    console.print(table)
    kv = 2 * reports[0].local_tokens * args.heads * args.head_dim * 4  # one rank's K and V, float32
    console.print(
        f"theory: each rank sends (P - 1) blocks of its K and V = 2 (P-1)/P of the whole K and V: "
        f"{(size - 1) * kv / 2**20:.1f} MiB (plus the blocks' positions)",
        markup=False,
    )
    worst = max(r.check_error for r in reports)
    console.print(
        f"agreement with one process at {args.check_len} tokens, output and gradients: max |error| {worst:.1e}",
        markup=False,
    )
    return 0 if worst < 1e-4 else 1
