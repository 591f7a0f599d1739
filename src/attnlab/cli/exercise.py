"""``attnlab exercise [ID] [--check ANSWER.py | --template PATH | --solution] [--lang zh]``: the book's exercises
3.1 to 3.3 and attnlab's own 3.A to 3.C, a reader's answer run in a subprocess and checked against the book."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnlab.cli._common import error


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser(
        "exercise",
        help="the chapter's exercises (3.1-3.3) and attnlab's (3.A-3.C): your answer checked against the book",
        description="Without an ID, list the exercises. With one, show its task; --template writes a file to start "
        "from, --check runs your file in a separate process (with a time limit), on the book's input and on inputs "
        "drawn afresh, and says what differs from the book, with a hint for the mistake (a file that imports the "
        "reference solution, the book's printed numbers or the book's own function for the exercise is refused); "
        "--solution prints a reference solution.",
    )
    ex.add_argument("id", nargs="?", help="an exercise: 3.1, 3.2, 3.3, 3.A, 3.B or 3.C")
    what = ex.add_mutually_exclusive_group()
    what.add_argument("--check", metavar="ANSWER.py", help="check your answer file")
    what.add_argument("--template", metavar="PATH", help="write a file to start from (never over an existing one)")
    what.add_argument("--solution", action="store_true", help="print a reference solution")
    ex.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the task and the hints")
    ex.add_argument("--timeout", type=float, default=60.0, help="seconds your code may run (default 60)")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.exercises import EXERCISES, check, exercise
    from attnlab.exercises.text import WORDS

    words = WORDS[args.lang]
    if args.id is None:
        if args.check or args.template or args.solution:
            return error(console, ValueError("name the exercise first: attnlab exercise 3.1 --check answer.py"))
        table = Table(header_style="bold")
        for heading in ("id", "section", "exercise", words["function"]):
            table.add_column(heading, overflow="fold")
        for e in EXERCISES.values():
            table.add_row(e.id, e.section, e.title(args.lang), f"{e.signature}")
        console.print(table)
        return 0
    try:
        chosen = exercise(args.id)
        if args.check:
            result = check(chosen.id, args.check, timeout=args.timeout)
        elif args.template:
            path = Path(args.template)
            if path.exists():
                raise ValueError(f"{path} exists already; pick a new file name (the template never overwrites)")
            if path.suffix != ".py":
                raise ValueError(f"the template is Python: give a .py path, got {str(path)!r}")
    except ValueError as err:
        return error(console, err)
    if args.solution:
        console.print(chosen.solution_text(), markup=False, highlight=False, soft_wrap=True)  # code: never wrapped
        return 0
    if args.template:
        path.write_text(chosen.template(), encoding="utf-8")
        console.print(f"wrote {path}: fill in {chosen.signature}, then attnlab exercise {chosen.id} --check {path}")
        return 0
    if not args.check:
        console.print(Text(chosen.title(args.lang), style="bold"))
        console.print(chosen.task(args.lang), markup=False)
        console.print(f"\n{chosen.template()}", markup=False, highlight=False, soft_wrap=True)
        return 0
    mark = {True: "[green]✓[/green]", False: "[red]✗[/red]"}
    console.print(Text(chosen.title(args.lang), style="bold"))
    for finding, line in zip(result.findings, result.lines(args.lang), strict=True):
        console.print(f"{mark[finding.ok]} ", end="")
        console.print(line, markup=False, highlight=False)
    verdict = words["passed"] if result.passed else words["failed"]
    console.print(f"[{'green' if result.passed else 'red'} bold]{verdict}[/]")
    return 0 if result.passed else 1
