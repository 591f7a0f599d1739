"""The ``attnlab`` command: the guided tour, explain a sentence, and their HTML reports.

All printing lives here; the library returns values.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

if TYPE_CHECKING:
    from attnlab.explain.render.html import Report


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


def _write_report(console: Console, report: Report, path: str) -> int:
    out = report.save(path)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained: open it in any browser, offline)")
    return 0


def _explain(console: Console, args: argparse.Namespace) -> int:
    from attnlab.explain.report import explain_report

    try:
        report = explain_report(
            args.sentence,
            heads=args.heads,
            causal=args.causal,
            dropout=args.dropout,
            seed=args.seed,
            d_model=args.d_model,
            lang=args.lang,
        )
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


def _bench(console: Console, args: argparse.Namespace) -> int:
    import json

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from attnlab.bench.runner import QUICK, BenchConfig, longest, run, with_overrides

    base = QUICK if args.quick else BenchConfig()
    config = with_overrides(
        base,
        seq_lens=tuple(args.seq_lens) if args.seq_lens else None,
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        dtype=args.dtype,
        mode="backward" if args.backward else None,
        repeats=args.repeats,
        impls=tuple(args.impls) if args.impls else None,
        threads=args.threads,
        decode=False if args.no_decode else None,
    )
    longest_impls = (
        None if args.longest is None else tuple(args.longest or ("book-mha", "attnlab-auto", "attnlab-flash"))
    )
    try:
        config.validate()
        if longest_impls:
            BenchConfig(impls=longest_impls).validate()
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("planning", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = run(config, progress=progress)
        rows = longest(longest_impls, progress=progress) if longest_impls else []
    data = result.to_json()
    if rows:
        data["longest"] = rows
    machine = data["machine"]
    rate = f"{machine['matmul_gflops']:.1f} GFLOP/s" if machine.get("matmul_gflops") else "not measured"
    console.print(
        f"torch {machine['torch']}, {machine['threads']} threads, matmul {rate} (the practical roofline), "
        f"{machine['available_bytes'] / 2**30:.1f} GiB available"
    )
    for mode in dict.fromkeys(c["mode"] for c in data["cases"]):
        table = Table(title=f"{mode}: batch {config.batch}, d={config.d_model}, {config.heads} heads, {config.dtype}")
        table.add_column("implementation", no_wrap=True)
        for col in ("T", "median ms", "x fastest", "peak alloc MiB", "peak RSS MiB", "GFLOP/s", "of matmul"):
            table.add_column(col, justify="right")
        for c in (c for c in data["cases"] if c["mode"] == mode):
            if c.get("status") != "ok":
                table.add_row(c["impl"], str(c["seq"]), f"[yellow]{c.get('status')}[/yellow]", "", "", "", "", "")
                continue
            table.add_row(
                c["impl"],
                str(c["seq"]),
                f"{c['median_ms']:.2f}",
                f"{c['ratio_to_fastest']:.2f}",
                f"{c['peak_allocated_bytes'] / 2**20:.1f}",
                f"{c['peak_rss_bytes'] / 2**20:.0f}",
                f"{c['gflops']:.1f}",
                f"{c['roofline_fraction']:.2f}" if c.get("roofline_fraction") else "",
            )
        console.print(table)
    if data["fits"]:
        fits = Table(title="scaling exponents (log-log slope against T)")
        for col in ("implementation", "time", "memory"):
            fits.add_column(col)
        for key, f in data["fits"].items():
            fits.add_row(
                key, *(f"{v:.2f}" if v is not None else "" for v in (f["time_exponent"], f["memory_exponent"]))
            )
        console.print(fits)
    for r in rows:
        console.print(f"longest {r['impl']}: T={r['longest_seq']} ({r['stopped']})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        from attnlab.bench.plot import plot

        console.print(f"wrote {plot(data, args.plot)}")
    refused = [c for c in data["cases"] if str(c.get("status", "")).startswith("refused")]
    return 1 if refused else 0


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
    explain.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=True, help="hide the future (default on)"
    )
    explain.add_argument("--dropout", type=float, default=0.0, help="dropout on the weights, in [0, 1) (default 0)")
    explain.add_argument("--seed", type=int, default=123, help="seed of the embeddings and weights (default 123)")
    explain.add_argument("--d-model", type=int, default=16, help="embedding size (default 16)")
    explain.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the explanations")

    bench = sub.add_parser("bench", help="time and measure every attention implementation, side by side")
    bench.add_argument(
        "--seq-lens", type=int, nargs="+", metavar="T", help="sequence lengths (default 512 1024 2048 4096)"
    )
    bench.add_argument("--batch", type=int, help="batch size (default 1)")
    bench.add_argument("--d-model", type=int, help="model width (default 768)")
    bench.add_argument("--heads", type=int, help="heads (default 12)")
    bench.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "float64"], help="default float32")
    bench.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    bench.add_argument("--repeats", type=int, help="timed runs per case; the median is reported (default 5)")
    bench.add_argument("--impls", nargs="+", metavar="NAME", help="implementations to run (default: all)")
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    bench.add_argument("--no-decode", action="store_true", help="skip the decode-step cases")
    bench.add_argument(
        "--longest",
        nargs="*",
        metavar="NAME",
        help="also find the longest sequence these run at batch 1, 768 dims, 12 heads "
        "(default: book-mha attnlab-auto attnlab-flash); takes minutes",
    )
    bench.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds: a smoke run")
    bench.add_argument("--json", metavar="PATH", help="write every case to a JSON file")
    bench.add_argument("--plot", metavar="PATH", help="write a log-log plot of time and memory against T")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # font fallback chatter
    console = Console(highlight=False)
    if args.command == "tour":
        if args.html:
            from attnlab.explain.report import tour_report

            code = _render_tour(console, args.lang, args.check) if args.check else 0
            return code or _write_report(console, tour_report(args.lang), args.html)
        return _render_tour(console, args.lang, args.check)
    if args.command == "explain":
        return _explain(console, args)
    if args.command == "bench":
        return _bench(Console(highlight=False, width=max(console.width, 118)), args)  # tables need the width
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown ones


if __name__ == "__main__":
    sys.exit(main())
