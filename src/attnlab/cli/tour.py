"""``attnlab tour``: chapter 3 step by step, then what came after it, in English or Chinese; --check; --html."""

from __future__ import annotations

import argparse

from rich.cells import cell_len
from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from attnlab.cli._common import check_output, error
from attnlab.cli._wrap import wrap
from attnlab.explain.render.html import Report


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tour = sub.add_parser(
        "tour",
        help="walk through chapter 3, step by step, with the book's numbers, then what came after it",
        description="Walk through chapter 3, step by step, with the book's numbers; then what came after it (GQA, "
        "MLA, sliding windows, learned sinks, QK-norm, the output gate, linear attention, Gated DeltaNet), each "
        "variant checked against what it claims.",
    )
    tour.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")
    tour.add_argument(
        "--check",
        action="store_true",
        help="check every step (the chapter against the book, each variant against its claim); exit 1 on a mismatch",
    )
    tour.add_argument("--html", metavar="PATH", help="write the tour as a self-contained HTML report with heatmaps")


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        check_output(args.html, suffixes=(".html", ".htm"))
    except ValueError as err:
        return error(console, err)
    code = render_tour(console, args.lang, args.check) if args.check or not args.html else 0
    if code or not args.html:
        return code
    from attnlab.explain.report import tour_report

    return write_report(console, tour_report(args.lang), args.html)


def render_tour(console: Console, lang: str, check: bool) -> int:
    from attnlab.explain.glossary import first_uses, term_line
    from attnlab.explain.tour import build_tour, mismatches
    from attnlab.explain.tour.text import text_for

    words = text_for(lang).words
    steps = build_tour(lang)
    uses = first_uses(lang, [(step.key, step.text) for step in steps])  # each term glossed where first written
    inner = max(console.width - 4, 20)  # a panel's border and padding take 4 cells
    console.rule(f"[bold]attnlab tour — {words['heading']}")
    for n, step in enumerate(steps, start=1):
        parts: list[Text | Syntax] = [Text("\n".join(wrap(step.text, inner)))]
        title = f"{n}. {step.title}"
        if cell_len(title) > inner - 2:  # the border holds "─ title ─": a longer one wraps inside instead of being cut
            parts.insert(0, Text("\n".join(wrap(title, inner)) + "\n", style="bold"))
            title = f"{n}."
        if step.key in uses:  # the terms this step is the first to use, as `attnlab glossary` gives them
            lines = [f"{words['terms']}: {term_line(t, lang)}" for t in uses[step.key]]
            parts.append(Text("\n" + "\n".join(x for line in lines for x in wrap(line, inner)), style="dim"))
        if step.code:
            parts.append(Text(""))
            parts.append(Syntax(step.code, "python", theme="ansi_dark", background_color="default", word_wrap=True))
        if step.value:
            parts.append(Text("\n" + "\n".join(wrap_value(step.value, inner)), overflow="fold"))
        if check:
            for c in step.checks:
                mark = "[green]✓[/green]" if c.ok else "[red]✗[/red]"
                line = Text.from_markup(f"{mark} {words['check']}: ")
                line.append(c.label)
                line.append(f"  {c.detail}", style="dim")
                parts.append(line)
        console.print(Panel(Group(*parts), title=Text(title, style="bold"), title_align="left"))
    if not check:
        return 0
    bad = mismatches(steps)
    if bad:
        console.print(f"[red bold]{words['mismatch'].format(n=len(bad))}:[/red bold]")
        for key, c in bad:
            console.print(f"  [red]{key}: {c.label} ({c.detail})[/red]", markup=True)
        return 1
    console.print(f"[green bold]{words['passed'].format(n=sum(len(s.checks) for s in steps))}.[/green bold]")
    return 0


def wrap_value(value: str, width: int) -> list[str]:
    """Numbers keep their columns: a line that fits stays as it is; a longer one wraps between its words."""
    return [out for line in value.split("\n") for out in ([line] if cell_len(line) <= width else wrap(line, width))]


def write_report(console: Console, report: Report, path: str) -> int:
    out = report.save(path)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained: open it in any browser, offline)")
    return 0
