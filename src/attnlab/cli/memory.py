"""``attnlab memory --model qwen3-0.6b llama-3.2-1b``: each model's KV cache, from its config alone.

Per model: bytes per token for each layer kind (2 x KV heads x head_dim x bytes per element), the whole cache
at each ``--tokens`` count (a sliding layer holds only its window; a count past the model's context is marked),
and the parameter count. Nothing is loaded but config.json: no weights, no tensors (``attnlab.bench.kv_bytes``).
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnlab.cli._common import CHECKPOINT_FILES, check_output, error

if TYPE_CHECKING:
    from attnlab.bench.kv_bytes import KVReport
    from attnlab.models.config import GPTConfig

TOKENS = (1024, 32768, 131072)
DTYPE_NAMES = ("bfloat16", "float32", "float16")  # the first is the default: what these models are published in


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    memory = sub.add_parser(
        "memory",
        help="a model's KV cache per token, per layer and at 1k/32k/128k tokens, and its parameters, from its config",
        description="Print each model's KV-cache bytes per token for each kind of layer, the whole cache at each "
        "token count (sliding layers hold only their window; counts past the model's context are marked) and its "
        "parameter count, from the config alone: nothing but config.json is read.",
    )
    memory.add_argument(
        "--model",
        nargs="+",
        required=True,
        metavar="NAME",
        help="presets (qwen3-0.6b, llama-3.2-1b, mistral-7b, ...) or checkpoint folders with a config.json "
        "(Hugging Face Llama, Mistral, Qwen2, Qwen3, GPT-2, or attnlab's)",
    )
    memory.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default="bfloat16",
        help="bytes per element of keys and values (default bfloat16, what these models are published in)",
    )
    memory.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=list(TOKENS),
        metavar="N",
        help=f"token counts to size the cache at (default {' '.join(map(str, TOKENS))})",
    )
    memory.add_argument("--json", metavar="PATH", help="also write every figure, in bytes, as JSON")


def config_for(name: str) -> GPTConfig:
    """The config ``--model NAME`` means: a preset, or a folder's config.json (a shipped model's name too)."""
    from attnlab.bench.kv_bytes import read_config
    from attnlab.models.config import PRESETS, GPTConfig
    from attnlab.models.families.shapes import SHAPES, shape
    from attnlab.models.locate import ZOO, locate
    from attnlab.models.zoo import zoo_model

    if name in PRESETS:
        return GPTConfig.preset(name)
    if name in SHAPES:
        return shape(name)
    try:
        where, hub = zoo_model(name[len(ZOO) :]) if name.startswith(ZOO) else locate(name), ""
    except ValueError as err:  # a hub name that cannot be had: said after what the name is not
        where, hub = Path(name), f" (as a Hugging Face Hub name: {err})"
    if where.is_dir():
        try:
            return read_config(where)
        except (ValueError, TypeError) as err:
            raise ValueError(f"--model {name!r}: {err}") from None
    if where.is_file() and where.suffix.lower() in (*CHECKPOINT_FILES, ".safetensors"):
        raise ValueError(
            f"--model {name!r} is a state-dict file, which has no config.json; give its folder, or a preset"
        )
    known = [*PRESETS, *SHAPES]
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ValueError(
        f"--model {name!r} is neither a preset nor a folder with a config.json; {hint}presets: {', '.join(known)}" + hub
    )


def _print(report: KVReport, console: Console) -> None:
    from attnlab.bench.kv_bytes import readable_bytes

    kinds = ", ".join(f"{k.layers} {k.kind}" + (f" (window {k.window:,})" if k.window else "") for k in report.kinds)
    console.print(
        Text.assemble(
            (report.name, "bold"),
            f": {report.parameters:,} parameters ({readable_bytes(report.weight_bytes)} in {report.dtype}); "
            f"{report.n_layers} layers: {kinds}; "
            + (
                f"a latent of {report.latent} values a token for all {report.n_kv_heads} heads; "
                if report.latent is not None
                else f"{report.n_kv_heads} KV heads x {report.head_dim} dims; "
            )
            + f"context {report.context_length:,} tokens",
        )
    )
    per_token = Table(title=f"KV bytes per token, {report.dtype} ({report.formula})")
    for column in ("layer kind", "layers", "one layer", "all of them"):
        per_token.add_column(column, justify="left" if column == "layer kind" else "right")
    for k in report.kinds:
        label = k.kind if k.window is None else f"sliding, window {k.window:,}"
        if k.state_bytes:  # a recurrent layer adds nothing a token: its state is the same size from the first
            label += f" (a state of {k.state_bytes:,} B a layer)"
        per_token.add_row(label, str(k.layers), f"{k.bytes_per_token:,} B", f"{k.layers * k.bytes_per_token:,} B")
    total = Text(f"{report.per_token:,} B", style="bold")
    per_token.add_row(Text("every layer", style="bold"), str(report.n_layers), "", total)
    console.print(per_token)
    cache = Table(title="the whole cache, batch 1")
    cache.add_column("tokens", justify="right")
    for k in report.kinds:
        cache.add_column(f"one {k.kind} layer", justify="right")
    cache.add_column("whole cache", justify="right")
    past = any(at.past_context for at in report.at)
    if past:
        cache.add_column("note")
    for at in report.at:
        cells = []
        for label, held in at.held.items():
            capped = f" ({held:,} tokens)" if 0 < held < at.tokens else ""
            cells.append(readable_bytes(at.layer_bytes[label]) + capped)
        note = ["past the context" if at.past_context else ""] if past else []
        cache.add_row(f"{at.tokens:,}", *cells, Text(readable_bytes(at.total), style="bold"), *note)
    console.print(cache)
    if report.instead is not None:  # what the design saves: against every layer full, or the expanded heads
        label, instead = report.instead
        last = report.at[-1]
        each = f"{instead:,} B a token, {instead / report.per_token:.1f}x; " if report.latent is not None else ""
        console.print(
            f"against {label} ({each}at {last.tokens:,} tokens {readable_bytes(instead * last.tokens)}): "
            f"{readable_bytes(last.total)} here, {instead * last.tokens / last.total:.1f}x less",
            markup=False,
        )


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab._checks import check_positive_int

    try:
        check_output(args.json, suffixes=(".json",))
        for n in args.tokens:
            check_positive_int("--tokens", n, limit=1 << 30)
        configs = {name: config_for(name) for name in dict.fromkeys(args.model)}
    except (ValueError, TypeError) as err:
        return error(console, err)
    from attnlab.bench.kv_bytes import kv_report

    tokens = tuple(args.tokens)
    reports = [kv_report(config, name=name, tokens=tokens, dtype=args.dtype) for name, config in configs.items()]
    for n, report in enumerate(reports):
        if n:
            console.print()
        _print(report, console)
    if args.json:
        payload = {"schema": "attnlab.memory/1", "models": [r.to_dict() for r in reports]}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}", markup=False)
    return 0
