"""``attnlab bench``: every implementation checked against float64, then timed side by side, in one command."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnlab.cli._common import check_output, error


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="time and measure every attention implementation, side by side")
    bench.add_argument(
        "--seq-lens", type=int, nargs="+", metavar="T", help="sequence lengths (default 512 1024 2048 4096)"
    )
    bench.add_argument("--batch", type=int, help="batch size (default 1)")
    bench.add_argument("--d-model", type=int, help="model width (default 768)")
    bench.add_argument("--heads", type=int, help="heads (default 12)")
    bench.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "float64"], help="default float32")
    bench.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    bench.add_argument("--repeats", type=int, help="timed runs per case; the median is reported (default 5)")
    bench.add_argument("--impls", nargs="+", metavar="NAME", help="implementations to run (default: all)")
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    bench.add_argument("--no-decode", action="store_true", help="skip the decode-step cases")
    bench.add_argument(
        "--longest",
        nargs="*",
        metavar="NAME",
        help="also find the longest sequence these run at batch 1, 768 dims, 12 heads "
        "(default: book-mha attnlab-auto attnlab-flash); takes minutes",
    )
    bench.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds: a smoke run")
    bench.add_argument("--json", metavar="PATH", help="write every case to a JSON file")
    bench.add_argument("--plot", metavar="PATH", help="write a log-log plot of time and memory against T")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.bench.runner import QUICK, BenchConfig, longest, run, with_overrides

    console = Console(highlight=False, width=max(console.width, 118))  # the tables need the width
    base = QUICK if args.quick else BenchConfig()
    config = with_overrides(
        base,
        seq_lens=tuple(args.seq_lens) if args.seq_lens else None,
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        dtype=args.dtype,
        mode="backward" if args.backward else None,
        repeats=args.repeats,
        impls=tuple(args.impls) if args.impls else None,
        threads=args.threads,
        decode=False if args.no_decode else None,
    )
    default_longest = ("book-mha", "attnlab-auto", "attnlab-flash")
    longest_impls = None if args.longest is None else tuple(args.longest or default_longest)
    try:  # everything a long run could trip over, before it starts
        config.validate()
        if longest_impls:
            BenchConfig(impls=longest_impls).validate()
        check_output(args.json, suffixes=(".json",))
        check_output(args.plot, suffixes=(".png", ".svg", ".pdf"))
    except ValueError as err:
        return error(console, err)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("planning", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = run(config, progress=progress)
        if longest_impls:
            result.longest = longest(longest_impls, progress=progress)
    machine = result.machine
    rate = f"{machine.matmul_gflops:.1f} GFLOP/s" if machine.matmul_gflops else "not measured"
    console.print(
        f"torch {machine.torch}, {machine.threads} threads, matmul {rate} (the practical roofline), "
        f"{machine.available_bytes / 2**30:.1f} GiB available"
    )
    for mode in dict.fromkeys(c.mode for c in result.cases):
        table = Table(title=f"{mode}: batch {config.batch}, d={config.d_model}, {config.heads} heads, {config.dtype}")
        table.add_column("implementation", no_wrap=True)
        for col in ("T", "median ms", "spread", "x fastest", "peak alloc MiB", "peak RSS MiB", "GFLOP/s", "of matmul"):
            table.add_column(col, justify="right")
        for c in (c for c in result.cases if c.mode == mode):
            if not c.ok:
                table.add_row(c.impl, str(c.seq), f"[yellow]{c.status}[/yellow]", "", "", "", "", "", "")
                continue
            spread = f"{c.spread:.0%}" if c.spread is not None else ""
            table.add_row(
                c.impl,
                str(c.seq),
                f"{c.median_ms:.2f}",
                f"[yellow]{spread}[/yellow]" if c.noisy else spread,
                f"{c.ratio_to_fastest:.2f}" if c.ratio_to_fastest else "",
                f"{(c.peak_allocated_bytes or 0) / 2**20:.1f}",
                f"{(c.peak_rss_bytes or 0) / 2**20:.0f}",
                f"{c.gflops:.1f}" if c.gflops else "",
                f"{c.roofline_fraction:.2f}" if c.roofline_fraction else "",
            )
        console.print(table)
    noisy = [c for c in result.cases if c.noisy]
    if noisy:
        console.print(
            f"[yellow]{len(noisy)} case(s) varied by more than 25% between runs: the machine was busy; "
            "their ratios are too wide to trust; rerun with more --repeats[/yellow]"
        )
    if result.fits:
        fits = Table(title="scaling exponents (log-log slope against T)")
        for col in ("implementation", "time", "memory"):
            fits.add_column(col)
        for key, fit in result.fits.items():
            exponents = (fit.time_exponent, fit.memory_exponent)
            fits.add_row(key, *(f"{v:.2f}" if v is not None else "" for v in exponents))
        console.print(fits)
    for r in result.longest:
        console.print(f"longest {r.impl}: T={r.longest_seq} ({r.stopped})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        from attnlab.bench.plot import plot

        console.print(f"wrote {plot(result, args.plot)}")
    refused = [c for c in result.cases if c.status.startswith("refused")]
    return 1 if refused else 0
