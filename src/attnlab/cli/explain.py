"""``attnlab explain "..."``: any sentence through attention, every step shown; --html for the heatmaps."""

from __future__ import annotations

import argparse

from rich.console import Console

from attnlab.cli._common import check_output, error
from attnlab.cli.tour import write_report


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser("explain", help="run any sentence through attention and show every step")
    explain.add_argument("sentence", help="the text to explain (split into words and punctuation)")
    explain.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with heatmaps")
    explain.add_argument("--heads", type=int, default=2, help="attention heads (default 2)")
    explain.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=True, help="hide the future (default on)"
    )
    explain.add_argument("--dropout", type=float, default=0.0, help="dropout on the weights, in [0, 1) (default 0)")
    explain.add_argument("--seed", type=int, default=123, help="seed of the embeddings and weights (default 123)")
    explain.add_argument("--d-model", type=int, default=16, help="embedding size (default 16)")
    explain.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.explain.report import explain_report

    try:
        check_output(args.html, suffixes=(".html", ".htm"))
        report = explain_report(
            args.sentence,
            heads=args.heads,
            causal=args.causal,
            dropout=args.dropout,
            seed=args.seed,
            d_model=args.d_model,
            lang=args.lang,
        )
    except (ValueError, TypeError) as err:
        return error(console, err)
    if args.html:
        return write_report(console, report, args.html)
    for section in report.sections:  # a terminal summary: titles, checks and the weights
        console.rule(section.title)
        if section.text:
            console.print(section.text)
        if section.key in ("tokens", "weights") and section.value:
            console.print(section.value, markup=False)
        for c in section.checks:
            console.print(("✓ " if c.ok else "✗ ") + c.label)
    console.print("\n[dim]add --html report.html for the heatmaps[/dim]")
    return 0
