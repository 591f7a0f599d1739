"""``attnlab glossary [WORD] [--lang zh] [--json PATH]``: every term of the tour in both Chinese renderings,
English and the code's names (``attnlab.explain.glossary``, the one table the tour links to)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import check_output, error


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    glossary = sub.add_parser(
        "glossary",
        help="the tour's terms: the notes' Chinese, the other Chinese, English and the code's names",
        description="Every term the tour, the reports and the CLI use: its Chinese as the reading notes write it, "
        "the other Chinese in use, the English word, its names in the book's code and attnlab's, and the tour step "
        "where it first appears. Give a WORD (English, Chinese or a name in the code) to see only its terms.",
    )
    glossary.add_argument("word", nargs="?", help="look up one word: 注意力得分, attn_scores, mask, ...")
    glossary.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the headings and steps")
    glossary.add_argument("--json", metavar="PATH", help="also write the terms as JSON")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.explain.glossary import HEADINGS, TERMS, lookup, rows
    from attnlab.explain.tour.text import text_for

    try:
        check_output(args.json, suffixes=(".json",))
        terms = lookup(args.word) if args.word is not None else list(TERMS)
    except ValueError as err:
        return error(console, err)
    if not terms:
        hint = "注意力分数, attention weights, attn_scores" if args.lang == "zh" else "attention weights, 遮蔽, mask"
        return error(console, ValueError(f"no term matches {args.word!r}; try a word such as {hint}, or no word"))
    titles = {key: title for key, (title, _) in text_for(args.lang).steps.items()}
    table = Table(show_lines=False, header_style="bold")
    for heading in HEADINGS[args.lang]:
        table.add_column(heading, overflow="fold")
    for row in rows(args.lang, terms, steps=titles):
        table.add_row(*row)
    console.print(table)
    if args.json:
        from pathlib import Path

        from attnlab.models.checkpoints import write_atomic

        text = json.dumps([t.to_dict() for t in terms], ensure_ascii=False, indent=1) + "\n"
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(text, encoding="utf-8"))
        console.print(f"wrote {args.json} ({len(terms)} terms)", markup=False)
    return 0
