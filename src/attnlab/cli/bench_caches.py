"""``attnlab bench --caches``: the KV-cache lab's table, one per model (``attnlab.bench.caches`` measures).

It forecasts its length before it starts, says each step as a line when its output is not a terminal, and on
Ctrl-C prints the rows it finished (and writes them to --json), names what was left, and exits 130.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import check_output, error


def run_caches(args: argparse.Namespace, console: Console) -> int:
    from attnlab._checks import check_positive_int
    from attnlab.bench.cache_table import CACHE_MODELS, DEFAULT_CACHES, FULL_CACHES, QUICK_CACHES, load
    from attnlab.bench.caches import forecast_seconds
    from attnlab.cache import CACHES
    from attnlab.models.config import PRESETS

    try:
        if args.quick and args.full:
            raise ValueError(
                "--quick and --full ask for two sizes: give one (--quick: a smoke run; --full: the long run)"
            )
        config = QUICK_CACHES if args.quick else FULL_CACHES if args.full else DEFAULT_CACHES
        unknown = [n for n in args.caches if n not in CACHES]
        if unknown:
            raise ValueError(f"--caches: unknown {unknown}; the caches are {list(CACHES)}")
        if args.caches:  # plain: for bytes; named caches run on every model
            config = replace(config, caches=tuple(dict.fromkeys(["plain", *args.caches])), prefix_only=())
        models = CACHE_MODELS if args.model is None else (args.model,)
        for name in models:
            if name != "text" and name not in PRESETS:
                raise ValueError(f"--model with --caches takes 'text' or a preset {list(PRESETS)}, got {name!r}")
        for flag, field in (("--prompt-len", "prompt_len"), ("--new-tokens", "new_tokens"), ("--repeats", "rounds")):
            value = getattr(args, flag[2:].replace("-", "_"))
            if value is not None:
                check_positive_int(flag, value, limit=1 << 16)
                config = replace(config, **{field: value})
        for flag in ("seq_lens", "batch", "d_model", "heads", "dtype", "impls", "longest", "plot"):
            if getattr(args, flag) not in (None, False):
                raise ValueError(f"--{flag.replace('_', '-')} is for the attention sweep, not --caches")
        check_output(args.json, suffixes=(".json",))
        loaded = []
        for name in models:  # every model loads (and every size is checked) before the first measurement
            model, prompts, held_out = load(name, config, quick=args.quick)
            if 2 * config.prompt_len > model.config.context_length or model.config.context_length < 64:
                raise ValueError(
                    f"--prompt-len {config.prompt_len} leaves no room in {name}'s context of "
                    f"{model.config.context_length} (it needs 64 tokens and twice the prompt): use at most "
                    f"{model.config.context_length // 2}"
                )
            loaded.append((name, model, prompts, held_out))
    except ValueError as err:
        return error(console, err)
    threads = args.threads or config.threads
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    with console.status("forecasting (a few decode steps of each model)"):
        forecast = {
            name: forecast_seconds(model, config, rows=name not in config.prefix_only) for name, model, *_ in loaded
        }
    console.print(
        f"about {_duration(sum(forecast.values()))} by a rough forecast ("
        + ", ".join(f"{name} {_duration(s)}" for name, s in forecast.items())
        + "); Ctrl-C stops it and keeps the rows finished",
        markup=False,
        soft_wrap=True,
    )
    tables, left = _measure_all(loaded, config, console)
    return _report(tables, left, config, args, console)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _measure_all(loaded: list[Any], config: Any, console: Console) -> tuple[list[Any], list[str]]:
    """Each model's table, in turn; on Ctrl-C the tables finished and the one interrupted, and what was left."""
    from attnlab.bench.caches import measure, measure_prefix

    started = time.perf_counter()
    tables: list[Any] = []
    for n, (name, model, prompts, held_out) in enumerate(loaded):
        try:
            with console.status(name) as status:

                def progress(done: int, total: int, label: str) -> None:
                    status.update(label)
                    if not console.is_terminal:  # piped: no spinner is drawn, so each step is a line
                        elapsed = time.perf_counter() - started
                        console.print(f"[{done}/{total}] {label} ({elapsed:.0f} s)", markup=False, soft_wrap=True)

                if name in config.prefix_only:
                    progress(0, 1, f"{name}: shared prefix")
                    table = measure_prefix(model, label=name, config=config)
                else:
                    table = measure(
                        model, label=name, prompts=prompts, held_out=held_out, config=config, progress=progress
                    )
        except KeyboardInterrupt:  # between the steps measure keeps: the whole model is left
            return tables, [f"{later}: all" for later, *_ in loaded[n:]]
        tables.append(table)
        if table.left:
            return tables, [f"{name}: {', '.join(table.left)}"] + [f"{later}: all" for later, *_ in loaded[n + 1 :]]
    return tables, []


def _report(tables: list[Any], left: list[str], config: Any, args: argparse.Namespace, console: Console) -> int:
    """Print every table, its failures, sink line and verdicts; write --json; the exit code."""
    from attnlab.bench.cache_table import to_json
    from attnlab.bench.cache_verdicts import verdicts
    from attnlab.bench.timing import NOISY, spread

    failed = False
    for table in tables:
        if table.rows:
            console.print(_table(table, config))
        elif table.prefix:
            console.print(
                f"{table.model} (context {table.context_length}): the shared prefix only (every cache on it: --full); "
                f"{table.threads} thread{'s' if table.threads > 1 else ''}",
                markup=False,
            )
        for row in table.rows:
            if row.status != "ok":
                failed = True
                console.print(f"[red]{row.cache}: {row.status}[/red]", soft_wrap=True)
        if table.sink:
            s = table.sink
            console.print(
                f"sink cache, {s['tokens']:.0f} tokens ({s['contexts']:.0f} x context {table.context_length}): peak "
                f"{s['peak_mib_end']:.1f} MiB, against {s['peak_mib_1x']:.1f} MiB for one context; KV "
                f"{s['kv_mib_end']:.2f} MiB at the end, {s['kv_mib_1x']:.2f} after one context",
                markup=False,
            )
        for line in verdicts(table):
            console.print(line, markup=False, soft_wrap=True)
        noisy = [r.cache for r in table.rows if len(r.tokens_per_s) > 1 and spread(r.tokens_per_s) > NOISY]
        if noisy:
            console.print(
                f"[yellow]tokens/s varied by more than {NOISY:.0%} between rounds for {noisy}: rerun before "
                "quoting[/yellow]"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({**to_json(tables, config), "left": left}, out, indent=1)
        console.print(f"wrote {args.json}" + (" (what was finished)" if left else ""))
    if left:
        error(console, f"interrupted; left unmeasured: {'; '.join(left)}")
        return 130
    return 1 if failed else 0


def _table(table: object, config: object) -> Table:
    from attnlab.bench.cache_table import CacheBenchConfig, CacheTable

    assert isinstance(table, CacheTable) and isinstance(config, CacheBenchConfig)
    rounds = max((len(r.tokens_per_s) for r in table.rows), default=0)
    out = Table(
        title=f"{table.model} (context {table.context_length}{', RoPE' if table.rope else ''}): {config.prompts} "
        f"prompts of {config.prompt_len} + {config.new_tokens} greedy tokens; perplexity over {table.held_out} "
        f"held-out tokens; {rounds} rounds, medians; {table.threads} thread{'s' if table.threads > 1 else ''}"
    )
    columns = ("cache", "bytes/token", "KV MiB", "peak MiB", "tokens/s", f"longest in {config.cap_mib:.0f} MiB")
    for col in (*columns, "agreement", "perplexity", "vs recompute"):
        out.add_column(col, justify="left" if col == "cache" else "right")
    for r in table.rows:
        if r.status != "ok":
            out.add_row(r.cache, "[red]failed[/red]", *[""] * 7)
            continue
        longest = "no limit" if math.isinf(r.longest) else f"{r.longest:,.0f}"
        out.add_row(
            r.cache,
            f"{r.bytes_per_token:,.0f}",
            f"{r.kv_mib:.2f}",
            f"{r.peak_mib:.1f}",
            f"{statistics.median(r.tokens_per_s):.1f}" if r.tokens_per_s else "",
            longest,
            f"{r.agreement:.1%}",
            f"{r.perplexity:.3f}",
            f"{r.perplexity_increase:+.2%}",
        )
    return out
