"""``attnlab bench --model``: a whole GPT generating, prefill and decode, against Hugging Face's generate and the
book's cached GPT (``attnlab.bench.models`` measures), and the decode step against this machine's memory floor."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnlab.cli._common import check_output, error


def run_model(args: argparse.Namespace, console: Console) -> int:
    """``--model``: prefill and decode of a whole GPT against Hugging Face and the book, side by side."""
    from dataclasses import replace

    from attnlab._checks import check_positive_int
    from attnlab.bench.models import QUICK_MODEL, ModelBenchConfig, dumps, forecast_seconds, run_models
    from attnlab.bench.spawn import _spawn
    from attnlab.models.config import PRESETS

    base = QUICK_MODEL if args.quick else ModelBenchConfig(preset=args.model)
    try:
        if args.model not in PRESETS:
            raise ValueError(f"--model takes a preset, one of {list(PRESETS)}; got {args.model!r}")
        if args.repeats is not None:  # bench's check_flags took the sized flags; a model's rounds take fewer
            check_positive_int("--repeats", args.repeats, limit=100)
        given = dict(prompt_len=args.prompt_len, new_tokens=args.new_tokens, rounds=args.repeats, threads=args.threads)
        base = replace(base, **{k: v for k, v in given.items() if v is not None})
        context = base.gpt_config().context_length
        if base.prompt_len + base.new_tokens > context:
            raise ValueError(
                f"--prompt-len {base.prompt_len} + --new-tokens {base.new_tokens} exceeds the context of {context}"
            )
        check_output(args.json, suffixes=(".json",))
        if args.plot:
            raise ValueError("--plot draws the sweep against T; --model has none")
    except ValueError as err:
        return error(console, err)
    forecast = forecast_seconds(base)
    if forecast > 60:
        console.print(f"about {forecast / 60:.0f} min by a rough forecast (Ctrl-C stops it cleanly)", markup=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("writing the weights", total=None)

        def progress(done: float, total: float, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)
            if not console.is_terminal:  # piped: the bar is not drawn, so say each step as a line
                console.print(f"[{done:.0f}/{total:.0f}] {label}", markup=False, soft_wrap=True)

        cases = run_models(base, spawn=_spawn, progress=progress)
    gpt = base.gpt_config()
    table = Table(
        title=f"GPT {gpt.emb_dim} dims x {gpt.n_layers} layers, batch 1, prompt {base.prompt_len}, "
        f"{base.new_tokens} new tokens, greedy, float32 ({base.rounds} rounds, medians)"
    )
    for col in ("implementation", "prefill ms", "decode tokens/s", "x HF decode", "x HF prefill", "peak RSS MiB"):
        table.add_column(col, justify="right" if col != "implementation" else "left")
    hf = next((c for c in cases if c.impl == "hf-generate" and c.ok), None)
    for c in cases:
        if not c.ok:
            table.add_row(c.impl, "[yellow]see below[/yellow]", "", "", "", "")
            continue
        prefill, decode = c.median(c.prefill_ms) or 0.0, c.median(c.decode_tokens_per_s) or 0.0
        hf_prefill = hf.median(hf.prefill_ms) if hf else None
        hf_decode = hf.median(hf.decode_tokens_per_s) if hf else None
        table.add_row(
            c.impl,
            f"{prefill:.1f}",
            f"{decode:.1f}",
            f"{decode / hf_decode:.2f}" if hf_decode else "",
            f"{prefill / hf_prefill:.2f}" if hf_prefill else "",
            f"{(c.peak_rss_bytes or 0) / 2**20:.0f}",
        )
    console.print(table)
    for c in cases:
        if not c.ok:
            console.print(f"[yellow]{c.impl}: {c.status}[/yellow]", markup=True, soft_wrap=True)
    timed = [(c.impl, c.decode_tokens_per_s) for c in cases if c.ok and len(c.decode_tokens_per_s) >= 2]
    wide = [impl for impl, v in timed if (max(v) - min(v)) / statistics.median(v) > 0.25]
    if wide:
        console.print(
            f"[yellow]decode varied by more than 25% between rounds for {wide}: rerun before quoting[/yellow]"
        )
    roofline = _roofline(base, cases, console)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(dumps(base, cases, roofline=roofline))
        console.print(f"wrote {args.json}")
    # a peer that failed on its side is a row that says so; attnlab failing, or a peer's tokens refused, is exit 1
    broken = [c for c in cases if not c.ok and (c.impl == "attnlab" or c.status.startswith("refused"))]
    return 1 if broken else 0


def _roofline(base: Any, cases: list[Any], console: Console) -> dict[str, Any]:
    """The bytes a decode step reads, this machine's rates for them (probed now, after the runs), and each
    generator's step as a fraction of the floor those give."""
    from attnlab.bench.roofline import decode_bytes, probe_rates

    gpt = base.gpt_config()
    position = base.prompt_len + base.new_tokens / 2  # the mean position of a decode step
    step = decode_bytes(gpt, position)
    rates = probe_rates(gpt.emb_dim, 4 * gpt.emb_dim)
    best = max(rates, key=rates.__getitem__)
    floor_ms = step.total / (rates[best] * 1e9) * 1e3
    console.print(
        f"a decode step reads {step.weights / 1e6:.0f} MB of weights and {step.kv / 1e6:.1f} MB of keys and values "
        f"(mean position {position:.0f}); this machine, probed now: "
        + ", ".join(f"{name} {rate:.1f} GB/s" for name, rate in rates.items())
        + f"; the floor at the best rate: {floor_ms:.1f} ms a token",
        markup=False,
        soft_wrap=True,
    )
    fractions = {c.impl: floor_ms / (1e3 / (c.median(c.decode_tokens_per_s) or 1.0)) for c in cases if c.ok}
    said = ", ".join(f"{impl} {f:.2f}" for impl, f in fractions.items())
    console.print(f"each decode step as a fraction of that floor: {said}", markup=False, soft_wrap=True)
    return {
        "weight_bytes": step.weights,
        "kv_bytes": step.kv,
        "mean_position": position,
        "rates_gb_s": rates,
        "floor_ms": floor_ms,
        "fraction_of_floor": fractions,
    }
