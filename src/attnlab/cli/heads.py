"""``attnlab heads --model PATH``: every head of a model named by its pattern, in a layer x head table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import check_output, error, model_path

if TYPE_CHECKING:
    from attnlab.explain.heads import HeadScores

SHORT = {"previous_token": "prev", "duplicate_token": "dup", "induction": "ind", "first_token": "first"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    heads = sub.add_parser(
        "heads",
        help="name every head of a model: previous-token, duplicate-token, induction, first-token",
        description="Score every head of a GPT checkpoint on a seeded probe of repeated random tokens and name "
        "each by the pattern it follows (the formulas are in docs/heads.md).",
    )
    heads.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help="a checkpoint folder or .pth, or a shipped model: 'induction', 'text'",
    )
    heads.add_argument("--json", metavar="PATH", help="also write the scores as JSON")
    heads.add_argument("--half", type=int, help="probe tokens before the repeat (default: 24, or context / 4)")
    heads.add_argument("--seed", type=int, default=0, help="seed of the probe (default 0)")


def table(scores: HeadScores, *, title: str) -> Table:
    """Layer x head: each cell the pattern the head follows most and its score, bold when it names the head."""
    from attnlab.explain.heads import NAME_THRESHOLD, SCORES

    legend = (
        f"each head's highest score: prev = previous-token, dup = duplicate-token, ind = induction, "
        f"first = first-token (attention sink); bold = named (score >= {NAME_THRESHOLD}); "
        f"(in brackets) = unnamed: no score reaches {NAME_THRESHOLD}, its highest shown"
    )
    n_heads = len(scores.induction[0])
    grid = Table(title=title, caption=legend)
    grid.add_column("layer", justify="right")
    for head in range(n_heads):
        grid.add_column(f"head {head}", justify="right")
    for layer in range(len(scores.induction)):
        cells = []
        for head in range(n_heads):
            best = max(SCORES, key=lambda s: getattr(scores, s)[layer][head])
            cell = f"{SHORT[best]} {getattr(scores, best)[layer][head]:.2f}"
            cells.append(f"[bold]{cell}[/bold]" if scores.label(layer, head) else f"[dim]({cell})[/dim]")
        grid.add_row(str(layer), *cells)
    return grid


def summary(scores: HeadScores) -> str:
    return (
        f"probe: {scores.half} random tokens twice; loss {scores.loss_first_half:.2f} on the first copy, "
        f"{scores.loss_second_half:.2f} on the repeat: in-context learning score {scores.in_context_learning:+.2f}"
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab._checks import check_seed
    from attnlab.explain.heads import check_probe, default_half, head_scores
    from attnlab.models import GPT

    try:
        check_output(args.json, suffixes=(".json",))
        check_seed(args.seed, name="--seed")
        model = GPT.from_pretrained(model_path(args.model), backend="auto")
        half = default_half(model) if args.half is None else args.half
        check_probe(model, half, 8, args.seed)
    except (ValueError, TypeError) as err:
        return error(console, err)
    scores = head_scores(model, half=half, seed=args.seed)
    console.print(table(scores, title=f"heads of {args.model}"))
    console.print(summary(scores), markup=False)
    if args.json:
        Path(args.json).write_text(json.dumps(scores.to_dict(), indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}", markup=False)
    return 0
