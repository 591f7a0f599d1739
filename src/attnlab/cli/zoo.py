"""``attnlab zoo [VARIANT ...] [--minutes M] [--seeds N] [--out DIR] [--smoke] [--show] [--lang zh]``: every kind
of attention after chapter 3 trained side by side on the shipped text, measured, and saved as one JSON file and
a plot (``attnlab.bench.zoo``, ``zoo_result``); ``--show`` prints the run that ships with attnlab, without training."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from attnlab.cli._common import check_output, error

HEADINGS_ZH = {
    "variant": "变体",
    "held-out loss": "留出损失",
    "against mha": "相对 mha",
    "parameters": "参数量",
    "KV bytes a token": "每词元 KV 字节",
    "cache at 32k": "32k 词元时缓存",
    "cache at 128k": "128k 词元时缓存",
    "decode tok/s at 1024": "1024 上下文解码 词元/秒",
    "cache held (measured)": "实测缓存占用",
    "keys read a token at 1024": "1024 上下文每词元读的键",
    "state bytes a token (measured)": "实测每词元状态字节",
    "prev-token": "前一词元头",
    "induction": "归纳头",
    "in-context gain": "上下文增益",
    "sink": "汇点",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from attnlab.models.locate import ZOO_RUN
    from attnlab.models.zoo import VARIANTS

    zoo = sub.add_parser(
        "zoo",
        help="every kind of attention after chapter 3 (GQA, MLA, windows, sinks, gates, linear, DeltaNet) trained "
        "side by side in minutes, measured",
        description="Train every variant of attention (or those named) on the shipped text with the same parameters "
        "(within 5%%), tokens, schedule and seeds, within --minutes on this CPU; print one table (held-out loss, "
        "parameters, KV or state bytes per token and at 32k and 128k tokens, decode speed and the cache held at a "
        "1024-token context, the heads each grew) and write zoo.json and zoo.png to --out. --show prints the run "
        "that ships with attnlab instead. Variants: " + ", ".join(VARIANTS) + ".",
    )
    zoo.add_argument("variants", nargs="*", metavar="VARIANT", help="variants to train (default: every one)")
    zoo.add_argument("--minutes", type=float, default=15.0, help="the time budget, shared out (default 15)")
    zoo.add_argument("--seeds", type=int, default=1, help="seeds per variant: the spread tells a finding (default 1)")
    zoo.add_argument(
        "--out",
        default=ZOO_RUN,
        help=f"folder for zoo.json, zoo.png and models/NAME, each variant's model (default {ZOO_RUN}, where "
        "explain --model zoo:NAME looks)",
    )
    zoo.add_argument("--smoke", action="store_true", help="a few steps of each variant: checks the run, not the zoo")
    zoo.add_argument("--show", action="store_true", help="print the shipped run (no training)")
    zoo.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the table's headings")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.bench.zoo import check_names, run_zoo
    from attnlab.bench.zoo_result import SHIPPED_RUN, ZooResult, findings, plot
    from attnlab.models.locate import ZOO_RUN

    try:
        chosen = check_names(args.variants)
        if not 1 <= args.seeds <= 10:
            raise ValueError(f"--seeds must be in [1, 10], got {args.seeds}")
        if not 0 < args.minutes <= 24 * 60:
            raise ValueError(f"--minutes must be in (0, 1440], got {args.minutes:g}")
        out = Path(args.out)
        if not args.show:
            _check_folder(out)
    except ValueError as err:
        return error(console, err)
    if args.show:
        result = ZooResult.read(SHIPPED_RUN)
        result.variants = [v for v in result.variants if v.name in chosen]
        if not result.variants:
            return error(console, f"the shipped run has none of {args.variants}; it has every variant of the zoo")
        _print(result, console, args.lang)
        console.print(f"plot: {SHIPPED_RUN.with_suffix('.png')}", markup=False)
        return 0
    try:
        result = run_zoo(
            chosen,
            minutes=args.minutes,
            seeds=args.seeds,
            smoke=args.smoke,
            report=lambda line: console.print(line, markup=False),
            models=out / "models",
        )
    except ValueError as err:  # a budget too small for the curves, found by timing a few steps
        return error(console, err)
    out.mkdir(parents=True, exist_ok=True)
    result.write(out / "zoo.json")
    plot(result, out / "zoo.png")
    if result.interrupted:
        console.print(
            f"interrupted: saved {len(result.variants)} variant(s) to {out / 'zoo.json'} and {out / 'zoo.png'}",
            markup=False,
        )
        return 130
    _print(result, console, args.lang)
    for line in findings(result):
        console.print(line, markup=False)
    console.print(f"wrote {out / 'zoo.json'} and {out / 'zoo.png'}", markup=False)
    console.print(
        f"each variant's model (seed 0): {out / 'models'}/NAME; see one with attnlab explain --model zoo:NAME "
        f'"some text"'
        + ("" if out == Path(ZOO_RUN) else f" (with ATTNLAB_ZOO={out}) or --model {out / 'models'}/NAME"),
        markup=False,
        soft_wrap=True,
    )
    return 0


def _check_folder(out: Path) -> None:
    """Refuse an --out that could not hold zoo.json, before minutes of training (nothing is created here)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder for zoo.json and zoo.png")
    if out.is_dir():
        check_output(str(out / "zoo.json"), suffixes=(".json",))
        return
    parent = next(p for p in (out, *out.parents) if p.exists())
    try:  # the one honest test of a folder: make something in it (and take it away)
        tempfile.TemporaryDirectory(dir=parent).cleanup()
    except OSError as err:
        raise ValueError(
            f"cannot create --out {str(out)!r}: {str(parent)!r} is not a writable folder ({err.strerror})"
        ) from None


WIDE = 200  # columns the table needs to be read whole; narrower, or through a pipe, it prints as Markdown rows


def _print(result: object, console: Console, lang: str) -> None:
    from attnlab.bench.zoo_result import ZooResult, markdown, rows

    assert isinstance(result, ZooResult)
    table_rows = rows(result)
    headings = [HEADINGS_ZH.get(h, h) if lang == "zh" else h for h in table_rows[0]]
    if console.is_terminal and console.width >= WIDE:
        table = Table(header_style="bold", title="attnlab zoo" if lang == "en" else "注意力动物园")
        for heading in headings:
            table.add_column(heading, overflow="fold")
        for row in table_rows:
            table.add_row(*row.values())
        console.print(table)
    else:  # one line a row, never folded: readable in a narrow terminal and by the next program in a pipe
        for cells in (headings, *(list(row.values()) for row in table_rows)):
            console.print("| " + " | ".join(cells) + " |", markup=False, soft_wrap=True)
    for v in result.variants:
        console.print(f"{v.name}: {v.what_zh if lang == 'zh' else v.what} ({v.models})", markup=False, soft_wrap=True)
    console.print(markdown(result).rsplit("\n", 1)[-1], markup=False)  # the run's settings and its noise rule
