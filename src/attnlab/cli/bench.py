"""``attnlab bench``: every implementation checked against float64, then timed side by side, in one command."""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from attnlab.bench.catalog import IMPLEMENTATIONS
from attnlab.cli._common import check_output, error

MODE_TITLES = {"forward": "forward", "backward": "forward + backward", "decode": "decode: one new token"}
QUICK_SEARCH_S = 8.0  # --quick --longest: stop before a length forecast to take longer than this


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench",
        help="time and measure every attention implementation, side by side",
        description="Time and measure every attention implementation, side by side.",
    )
    bench.add_argument(
        "--seq-lens", type=int, nargs="+", metavar="T", help="sequence lengths (default 512 1024 2048 4096)"
    )
    bench.add_argument("--batch", type=int, help="batch size (default 1)")
    bench.add_argument("--d-model", type=int, help="model width (default 768)")
    bench.add_argument("--heads", type=int, help="heads (default 12)")
    bench.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "float64"], help="default float32")
    bench.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    bench.add_argument("--repeats", type=int, help="timed runs per case; the median is reported (default 5)")
    bench.add_argument(
        "--impls",
        nargs="+",
        metavar="NAME",
        help=f"implementations to run (default: all): {', '.join(IMPLEMENTATIONS)}",
    )
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    bench.add_argument("--no-decode", action="store_true", help="skip the decode-step cases")
    bench.add_argument(
        "--longest",
        nargs="*",
        metavar="NAME",
        help="find the longest sequence these run at batch 1, 768 dims, 12 heads "
        "(default: book-mha attnlab-auto attnlab-flash); takes minutes; runs only this search unless "
        "--seq-lens or --quick asks for the sweep too",
    )
    bench.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run")
    bench.add_argument(
        "--full",
        action="store_true",
        help="with --caches: every cache on both models at the long sizes, on torch's threads (an hour or more on "
        "2 cores); the default judges every target in about a minute: the text model's every cache, and the "
        "gpt2-small shape's shared prefix, on one thread",
    )
    bench.add_argument(
        "--model",
        nargs="?",
        const="gpt2-small",
        metavar="PRESET",
        help="instead: a whole GPT (default gpt2-small shape, random weights) generating, prefill time and decode "
        "tokens/s against Hugging Face's generate and the book's cached GPT",
    )
    bench.add_argument(
        "--caches",
        nargs="*",
        metavar="NAME",
        help="instead: the KV-cache lab, every cache (or those named) on the shipped text model and a gpt2-small-"
        "shaped GPT (--model text or a preset for one): bytes per token, memory, tokens/s, agreement, perplexity",
    )
    bench.add_argument("--prompt-len", type=int, help="with --model: prompt tokens (default 128)")
    bench.add_argument("--new-tokens", type=int, help="with --model: tokens to generate (default 256)")
    bench.add_argument("--json", metavar="PATH", help="write every case to a JSON file")
    bench.add_argument("--plot", metavar="PATH", help="write a log-log plot of time and memory against T")


# Every sized flag, with the most it takes; checked before any mode starts work or loads a model.
SIZED_FLAGS = {
    "--seq-lens": 1 << 24,
    "--batch": 1 << 16,
    "--d-model": 1 << 16,
    "--heads": 1 << 16,
    "--repeats": 10_000,
    "--threads": 4096,
    "--prompt-len": 1 << 20,
    "--new-tokens": 1 << 20,
}


def check_flags(args: argparse.Namespace) -> None:
    """Each sized flag given is a whole number in [1, its limit], the error naming the flag."""
    from attnlab._checks import check_positive_int

    for flag, limit in SIZED_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        for one in value if isinstance(value, list) else [] if value is None else [value]:
            check_positive_int(flag, one, limit=limit)


def run(args: argparse.Namespace, console: Console) -> int:
    console = Console(highlight=False, width=max(console.width, 118))  # the tables need the width
    try:
        check_flags(args)
    except (ValueError, TypeError) as err:
        return error(console, err)
    if args.full and args.caches is None:
        return error(console, "--full goes with --caches (the cache lab's long run); the sweep's sizes are flags")
    if args.caches is not None:
        from attnlab.cli.bench_caches import run_caches

        return run_caches(args, console)
    if args.model is not None:
        from attnlab.cli.bench_model import run_model

        return run_model(args, console)
    if args.prompt_len is not None or args.new_tokens is not None:
        return error(console, "--prompt-len and --new-tokens go with --model")
    from attnlab.bench.longest import INTERRUPTED_AT, LongestPlan, longest, longest_forecast
    from attnlab.bench.results import BenchResult
    from attnlab.bench.runner import (
        INTERRUPTED,
        QUICK,
        BenchConfig,
        estimate_seconds,
        measure_machine,
        plan,
        run,
        with_overrides,
    )

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
    sweep = longest_impls is None or bool(args.seq_lens) or args.quick  # --longest alone runs only the search
    try:  # everything a long run could trip over, before it starts
        config.validate()
        if longest_impls:
            BenchConfig(impls=longest_impls).validate()
        check_output(args.json, suffixes=(".json",))
        check_output(args.plot, suffixes=(".png", ".svg", ".pdf"))
        if args.plot and not sweep:
            raise ValueError("--plot draws the sweep against T; --longest alone has none (add --seq-lens)")
    except ValueError as err:
        return error(console, err)
    with console.status("measuring this machine (matmul rate, free memory)"):
        machine, spawn_s = measure_machine(config)
    limit = QUICK_SEARCH_S if args.quick else LongestPlan.time_limit_s  # a smoke run: seconds, not minutes
    search = LongestPlan(impls=longest_impls, time_limit_s=limit) if longest_impls else None
    forecast = sum(estimate_seconds(config, machine, spawn_s)) if sweep else 0.0
    search_forecast = longest_forecast(search, machine, spawn_s) if search else 0.0
    if forecast > 60 or search:
        parts = [f"{len(plan(config))} cases, about {_minutes(forecast)}"] if sweep else []
        if search:
            parts.append(f"the longest search about {_minutes(search_forecast)}")
        console.print(
            f"{'; '.join(parts)} by a rough forecast (nominal FLOPs at a quarter of the matmul rate); Ctrl-C stops "
            "it and keeps what finished" + ("" if args.quick else "; --quick is a smoke run of seconds"),
            markup=False,
            soft_wrap=True,
        )
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("planning", total=None)

        def progress(done: float, total: float, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)
            if not console.is_terminal:  # piped: the bar is not drawn, so say each step as a line
                elapsed = time.perf_counter() - started
                console.print(f"{label} ({done / max(total, 1e-9):.0%} of the forecast, {elapsed:.0f} s)", markup=False)

        def searching(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)
            if not console.is_terminal:
                console.print(f"[{done}/{total}] {label} ({time.perf_counter() - started:.0f} s)", markup=False)

        result = run(config, progress=progress, machine=(machine, spawn_s)) if sweep else BenchResult(machine, {})
        if search and result.left:
            result.left.append("the longest search")
        elif search:
            result.longest = longest(search, progress=searching)
            if result.longest and result.longest[-1].stopped.startswith(INTERRUPTED_AT):  # that one and the rest
                result.left += [f"longest {impl}" for impl in search.impls[len(result.longest) - 1 :]]
    machine = result.machine
    rate = f"{machine.matmul_gflops:.1f} GFLOP/s" if machine.matmul_gflops else "not measured"
    console.print(
        f"torch {machine.torch}, {machine.threads} threads, matmul {rate} (the practical roofline), "
        f"{machine.available_bytes / 2**30:.1f} GiB available"
    )
    shown = [c for c in result.cases if c.status != INTERRUPTED]  # an interrupted case is in the last line
    for mode in dict.fromkeys(c.mode for c in shown):
        what = MODE_TITLES.get(mode, mode)
        table = Table(title=f"{what}: batch {config.batch}, d={config.d_model}, {config.heads} heads, {config.dtype}")
        table.add_column("implementation", no_wrap=True)
        for col in ("T", "median ms", "spread", "x fastest", "peak alloc MiB", "peak RSS MiB", "GFLOP/s", "of matmul"):
            table.add_column(col, justify="right")
        for c in (c for c in shown if c.mode == mode):
            if not c.ok:
                table.add_row(c.impl, str(c.seq), f"[yellow]{c.status}[/yellow]", "", "", "", "", "", "")
                continue
            spread = f"{c.spread:.0%}" if c.spread is not None else ""
            ratio = f"{c.ratio_to_fastest:.2f}" if c.ratio_to_fastest else ""
            table.add_row(
                c.impl,
                str(c.seq),
                f"{c.median_ms:.2f}",
                f"[yellow]{spread}[/yellow]" if c.noisy else spread,
                f"[yellow]~{ratio}?[/yellow]" if c.ratio_noisy else ratio,
                f"{(c.peak_allocated_bytes or 0) / 2**20:.1f}",
                f"{(c.peak_rss_bytes or 0) / 2**20:.0f}",
                f"{c.gflops:.1f}" if c.gflops else "",
                f"{c.roofline_fraction:.2f}" if c.roofline_fraction else "",
            )
        console.print(table)
    noisy = [c for c in result.cases if c.noisy or c.ratio_noisy]
    if noisy:
        console.print(
            f"[yellow]{len(noisy)} case(s) varied by more than 25% between interleaved rounds (marked ~x?): "
            "the machine was busy; those ratios are not findings; rerun with more --repeats[/yellow]"
        )
    if result.fits:
        fits = Table(title="scaling exponents (log-log slope against T; fixed costs flatten it at small T)")
        for col in ("implementation", "time", "time, per round", "memory"):
            fits.add_column(col)
        for key, fit in result.fits.items():
            low, high = fit.time_exponent_range or (None, None)
            rounds = f"{low:.2f} .. {high:.2f}" if low is not None and high is not None else ""
            time_text = "" if fit.time_exponent is None else f"{fit.time_exponent:.2f}"
            if fit.time_noisy:
                time_text = "[yellow]too noisy[/yellow]"  # rounds disagree: the slope is not a finding
            memory = "" if fit.memory_exponent is None else f"{fit.memory_exponent:.2f}"
            fits.add_row(key, time_text, rounds, memory)
        console.print(fits)
    for r in result.longest:
        console.print(f"longest {r.impl}: T={r.longest_seq} ({r.stopped})", markup=False)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        from attnlab.bench.plot import plot

        console.print(f"wrote {plot(result, args.plot)}")
    if result.left:
        error(console, f"interrupted; left unmeasured: {', '.join(result.left)}")
        return 130
    refused = [c for c in result.cases if c.status.startswith("refused")]
    return 1 if refused else 0


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
