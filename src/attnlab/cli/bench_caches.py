"""``attnlab bench --caches``: the KV-cache lab's table, one per model (``attnlab.bench.caches`` measures)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import check_output, error


def run_caches(args: argparse.Namespace, console: Console) -> int:
    from attnlab._checks import check_positive_int
    from attnlab.bench.caches import CACHE_MODELS, QUICK_CACHES, CacheBenchConfig, load, measure, to_json, verdicts
    from attnlab.cache import CACHES
    from attnlab.models.config import PRESETS

    config = QUICK_CACHES if args.quick else CacheBenchConfig()
    try:
        unknown = [n for n in args.caches if n not in CACHES]
        if unknown:
            raise ValueError(f"--caches: unknown {unknown}; the caches are {list(CACHES)}")
        if args.caches:
            config = replace(config, caches=tuple(dict.fromkeys(["plain", *args.caches])))  # plain: for bytes
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
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    tables = []
    for name, model, prompts, held_out in loaded:
        with console.status(f"{name}") as status:

            def progress(label: str) -> None:
                status.update(label)
                if not console.is_terminal:
                    console.print(label, markup=False, soft_wrap=True)

            tables.append(
                measure(model, label=name, prompts=prompts, held_out=held_out, config=config, progress=progress)
            )
    failed = False
    for table in tables:
        console.print(_table(table, config))
        for row in table.rows:
            if row.status != "ok":
                failed = True
                console.print(f"[red]{row.cache}: {row.status}[/red]", soft_wrap=True)
        if table.sink:
            s = table.sink
            console.print(
                f"sink cache, {s['tokens']:.0f} tokens (4 x context {table.context_length}): peak "
                f"{s['peak_mib_4x']:.1f} MiB, against {s['peak_mib_1x']:.1f} MiB for one context; KV "
                f"{s['kv_mib_4x']:.2f} MiB at the end, {s['kv_mib_1x']:.2f} after one context",
                markup=False,
            )
        for line in verdicts(table):
            console.print(line, markup=False, soft_wrap=True)
        spread = [
            r.cache
            for r in table.rows
            if len(r.tokens_per_s) > 1
            and (max(r.tokens_per_s) - min(r.tokens_per_s)) / statistics.median(r.tokens_per_s) > 0.25
        ]
        if spread:
            console.print(
                f"[yellow]tokens/s varied by more than 25% between rounds for {spread}: rerun before quoting[/yellow]"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(to_json(tables, config), out, indent=1)
        console.print(f"wrote {args.json}")
    return 1 if failed else 0


def _table(table: object, config: object) -> Table:
    from attnlab.bench.caches import CacheBenchConfig, CacheTable

    assert isinstance(table, CacheTable) and isinstance(config, CacheBenchConfig)
    out = Table(
        title=f"{table.model} (context {table.context_length}{', RoPE' if table.rope else ''}): {config.prompts} "
        f"prompts of {config.prompt_len} + {config.new_tokens} greedy tokens; perplexity over {table.held_out} "
        f"held-out tokens; {config.rounds} rounds, medians"
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
