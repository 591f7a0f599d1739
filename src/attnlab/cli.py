"""The ``attnlab`` command: the guided tour, explain a sentence, and their HTML reports.

All printing lives here; the library returns values.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text


def _render_tour(console: Console, lang: str, check: bool) -> int:
    from attnlab.explain.tour import build_tour, mismatches
    from attnlab.explain.tour_text import LABELS

    labels = LABELS[lang]
    steps = build_tour(lang)
    console.rule(f"[bold]attnlab tour — {labels['heading']}")
    for n, step in enumerate(steps, start=1):
        body = Text(step.text + "\n")
        code = Syntax(step.code, "python", theme="ansi_dark", background_color="default")
        parts: list[Text | Syntax] = [body, code, Text("\n" + step.value)]
        if check:
            for c in step.checks:
                mark = "[green]✓[/green]" if c.ok else "[red]✗[/red]"
                parts.append(Text.from_markup(f"\n{mark} {labels['check']}: {c.label}  [dim]{c.detail}[/dim]"))
        console.print(Panel(Group(*parts), title=f"[bold]{n}. {step.title}", title_align="left"))
    if not check:
        return 0
    bad = mismatches(steps)
    if bad:
        console.print(f"[red bold]{len(bad)} {labels['mismatch']}:[/red bold]")
        for key, c in bad:
            console.print(f"  [red]{key}: {c.label} ({c.detail})[/red]")
        return 1
    total = sum(len(s.checks) for s in steps)
    console.print(f"[green bold]{total} checks, {labels['all_ok']}.[/green bold]")
    return 0


def _write_report(console: Console, report: object, path: str) -> int:
    from attnlab.explain.report import Report

    assert isinstance(report, Report)
    out = report.save(path)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained: open it in any browser, offline)")
    return 0


def _explain(console: Console, args: argparse.Namespace) -> int:
    from attnlab.explain.reports import explain_report

    try:
        report = explain_report(args.sentence, heads=args.heads, causal=args.causal, dropout=args.dropout,
                                seed=args.seed, d_model=args.d_model, lang=args.lang)  # fmt: skip
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    if args.html:
        return _write_report(console, report, args.html)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description="Learn, verify and use attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="walk through chapter 3, step by step, with the book's numbers")
    tour.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")
    tour.add_argument("--check", action="store_true", help="compare every step with the book; exit 1 on a mismatch")
    tour.add_argument("--html", metavar="PATH", help="write the tour as a self-contained HTML report with heatmaps")

    explain = sub.add_parser("explain", help="run any sentence through attention and show every step")
    explain.add_argument("sentence", help="the text to explain (split into words and punctuation)")
    explain.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with heatmaps")
    explain.add_argument("--heads", type=int, default=2, help="attention heads (default 2)")
    explain.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="hide the future (default on)")
    explain.add_argument("--dropout", type=float, default=0.0, help="dropout on the weights, in [0, 1) (default 0)")
    explain.add_argument("--seed", type=int, default=123, help="seed of the embeddings and weights (default 123)")
    explain.add_argument("--d-model", type=int, default=16, help="embedding size (default 16)")
    explain.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # font fallback chatter
    console = Console(highlight=False)
    if args.command == "tour":
        if args.html:
            from attnlab.explain.reports import tour_report

            code = _render_tour(console, args.lang, args.check) if args.check else 0
            return code or _write_report(console, tour_report(args.lang), args.html)
        return _render_tour(console, args.lang, args.check)
    if args.command == "explain":
        return _explain(console, args)
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown ones


if __name__ == "__main__":
    sys.exit(main())
