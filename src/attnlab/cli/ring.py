"""``attnlab ring --nproc 4 --seq-len 65536``: ring attention across processes it starts itself (gloo, this machine).

Each process first checks the ring against one-process ``attention()`` on a
short sequence (output and the gradients of q, k, v), then runs the long
sequence forward from its own shard and reports its time, its peak memory
(RSS growth) and the bytes it sent. For several machines, run
``torchrun --nnodes ... -m attnlab.cli ring ...`` instead (docs/ring.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import time
import traceback
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


def _check(args: argparse.Namespace) -> None:
    from attnlab._checks import check_positive_int

    check_positive_int("--nproc", args.nproc, limit=64)
    check_positive_int("--seq-len", args.seq_len, limit=1 << 24)
    check_positive_int("--heads", args.heads, limit=256)
    check_positive_int("--head-dim", args.head_dim, limit=1024)
    check_positive_int("--check-len", args.check_len, limit=1 << 16)
    need = args.seq_len * args.heads * args.head_dim * 4 * 4 * 3  # q, k, v, out and a received block, float32
    if need > 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
        raise ValueError(
            f"--seq-len {args.seq_len} needs about {need / 2**30:.1f} GiB of shards: more than half this machine's memory"
        )


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _rank(rank: int, size: int, port: int, args: dict[str, Any], results: Any) -> None:
    import torch
    import torch.distributed as dist

    from attnlab import attention
    from attnlab.distributed import RingStats, gather_sequence, ring_attention, shard_sequence
    from attnlab.distributed.ring import padded_length

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=size)
        h, d, layout, causal = args["heads"], args["head_dim"], args["layout"], args["causal"]
        g = torch.Generator().manual_seed(0)  # the same short sequence on every rank: checked against one process
        t = args["check_len"]
        q, k, v = (torch.randn(1, h, t, d, generator=g, requires_grad=True) for _ in range(3))
        expected = attention(q, k, v, is_causal=causal, backend="flash")
        expected.sum().backward()
        local = [shard_sequence(x.detach(), 2, layout=layout).requires_grad_() for x in (q, k, v)]
        out = ring_attention(*local, is_causal=causal, layout=layout, seq_len=t)
        out.sum().backward()
        errors = [(gather_sequence(out.detach(), 2, length=t, layout=layout) - expected).abs().max().item()]
        for x, y in zip(local, (q, k, v), strict=True):
            assert x.grad is not None and y.grad is not None
            errors.append((gather_sequence(x.grad, 2, length=t, layout=layout) - y.grad).abs().max().item())
        n = args["seq_len"]
        per_rank = padded_length(n, size, layout) // size
        g = torch.Generator().manual_seed(rank + 1)  # the long run: each rank makes its own shard
        q, k, v = (torch.randn(1, h, per_rank, d, generator=g) for _ in range(3))
        stats = RingStats()
        dist.barrier()
        before = _rss()
        began = time.perf_counter()
        with torch.no_grad():
            ring_attention(q, k, v, is_causal=causal, layout=layout, seq_len=n, stats=stats)
        seconds = time.perf_counter() - began
        answer = {"seconds": seconds, "rss": _rss() - before, "sent": stats.forward_bytes, "errors": errors}
        answer["local"] = per_rank
        if args["memory"]:  # a second run under the counter (it slows every op): tensors made during the call
            from attnlab.bench.memory import PeakMemory

            with torch.no_grad(), PeakMemory() as mem:
                ring_attention(q, k, v, is_causal=causal, layout=layout, seq_len=n)
            answer["peak"] = mem.peak_bytes
        results.put((rank, answer))
        dist.destroy_process_group()
    except Exception:
        results.put((rank, traceback.format_exc()))


def run(args: argparse.Namespace, console: Console) -> int:
    import torch.multiprocessing as mp

    try:
        _check(args)
    except (ValueError, TypeError) as err:
        return error(console, err)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    options = {k: getattr(args, k) for k in ("heads", "head_dim", "layout", "causal", "check_len", "seq_len", "memory")}
    procs = [ctx.Process(target=_rank, args=(r, args.nproc, port, options, results)) for r in range(args.nproc)]
    console.print(
        f"{args.nproc} processes (gloo), {args.layout}, {'causal' if args.causal else 'full'}, {args.heads} heads x "
        f"{args.head_dim}: check at {args.check_len} tokens, then {args.seq_len} tokens forward",
        markup=False,
    )
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        with console.status("running the ring"):
            for _ in procs:
                rank, answer = results.get(timeout=3600)
                got[rank] = answer
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failed = {r: a for r, a in got.items() if not isinstance(a, dict)}
    if failed:
        rank, trace = next(iter(failed.items()))
        return error(console, f"rank {rank} failed: {trace.strip().splitlines()[-1]}")
    table = Table(title=f"ring attention, {args.seq_len} tokens over {args.nproc} processes")
    columns = ["rank", "local tokens", "time s", "peak RSS growth MiB", "sent MiB", "max |error| at check"]
    if args.memory:
        columns.insert(4, "peak tensors MiB")
    for column in columns:
        table.add_column(column, justify="right")
    for rank in sorted(got):
        a = got[rank]
        row = [str(rank), str(a["local"]), f"{a['seconds']:.2f}", f"{a['rss'] / 2**20:.0f}"]
        row += [f"{a['peak'] / 2**20:.1f}"] if args.memory else []
        row += [f"{a['sent'] / 2**20:.1f}", f"{max(a['errors']):.1e}"]
        table.add_row(*row)
    console.print(table)
    kv = 2 * got[0]["local"] * args.heads * args.head_dim * 4  # one rank's K and V, float32
    console.print(
        f"theory: each rank sends (P - 1) blocks of its K and V = 2 (P-1)/P of the whole K and V: "
        f"{(args.nproc - 1) * kv / 2**20:.1f} MiB (plus the blocks' positions)",
        markup=False,
    )
    worst = max(max(a["errors"]) for a in got.values())
    console.print(
        f"agreement with one process at {args.check_len} tokens, output and gradients: max |error| {worst:.1e}",
        markup=False,
    )
    return 0 if worst < 1e-4 else 1
