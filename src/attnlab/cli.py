"""The ``attnlab`` command: the guided tour (and, as they land, explain and bench).

All printing lives here; the library returns values.
"""

from __future__ import annotations

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description="Learn, verify and use attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="walk through chapter 3, step by step, with the book's numbers")
    tour.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")
    tour.add_argument("--check", action="store_true", help="compare every step with the book; exit 1 on a mismatch")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(highlight=False)
    if args.command == "tour":
        return _render_tour(console, args.lang, args.check)
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown ones


if __name__ == "__main__":
    sys.exit(main())
