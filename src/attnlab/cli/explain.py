"""``attnlab explain "..."``: any sentence through attention, every step shown; --html for the heatmaps."""

from __future__ import annotations

import argparse

from rich.console import Console

from attnlab.cli._common import check_output, error, load_checkpoint, model_path
from attnlab.cli._wrap import wrap
from attnlab.cli.tour import write_report


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="run any sentence through attention and show every step",
        description="Run any sentence through attention and show every step.",
    )
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
    explain.add_argument(
        "--model",
        metavar="PATH",
        help="a GPT checkpoint (Hugging Face or attnlab directory, the book's .pth, or 'induction' or 'text', which "
        "ship with attnlab): every head named, every layer on the text",
    )
    explain.add_argument("--tokenizer", metavar="DIR", help="with --model: where its tokenizer files are")
    explain.add_argument(
        "--characters",
        action="store_true",
        help="with --model: one row and column per character, its tokens merged (a Chinese character is 3 byte "
        "tokens): a key's weight summed over its tokens, a query's row their mean",
    )
    explain.add_argument(
        "--transformers",
        action="store_true",
        help="with --model DIR and --html: run the checkpoint in transformers (any causal LM it reads) with "
        "attnlab's flash kernel as its attention, and show every head, each recovered exactly from the kernel: "
        "no eager pass",
    )
    explain.add_argument(
        "--cache",
        metavar="NAME",
        help="with --model: show the KV cache NAME (plain, paged, prefix, sink, int8, int4, h2o, snapkv) as the "
        "model reads the text and generates",
    )


def run(args: argparse.Namespace, console: Console) -> int:
    if args.transformers:
        return run_transformers(args, console)
    if args.model:
        return run_model(args, console)
    if args.cache:
        return error(console, "--cache shows a model's KV cache: give --model too (for example --model text)")
    if args.characters:
        return error(console, "--characters merges a model's tokens by character: give --model too (--model text)")
    from attnlab.explain.report import check_explain_args, explain_report

    options = {"heads": args.heads, "dropout": args.dropout, "seed": args.seed, "d_model": args.d_model}
    try:
        check_output(args.html, suffixes=(".html", ".htm"))
        check_explain_args(args.sentence, figures=bool(args.html), **options)
    except (ValueError, TypeError) as err:
        return error(console, err)
    report = explain_report(args.sentence, causal=args.causal, lang=args.lang, figures=bool(args.html), **options)
    if args.html:
        return write_report(console, report, args.html)
    for section in report.sections:  # a terminal summary: titles, checks and the weights
        heading(console, section.title)
        if section.text:
            console.print("\n".join(wrap(section.text, max(console.width, 20))), markup=False)
        if section.key in ("tokens", "weights", "sinks", "kv-cache") and section.value:
            console.print(section.value, markup=False)
        for c in section.checks:
            console.print(("✓ " if c.ok else "✗ ") + c.label, markup=False)
    hint = "加 --html report.html 可得到热力图" if args.lang == "zh" else "add --html report.html for the heatmaps"
    console.print(f"\n[dim]{hint}[/dim]")
    return 0


def run_model(args: argparse.Namespace, console: Console) -> int:
    """Every layer and head of a real checkpoint on the text, labelled with its tokenizer's tokens."""
    from pathlib import Path

    from attnlab.explain.model_report import model_report
    from attnlab.models.train import read_log

    try:
        check_output(args.html, suffixes=(".html", ".htm"))
        model, tokenizer = load_checkpoint(args.model, args.tokenizer)
        log = read_log(model_path(args.model))  # the training curves, when attnlab trained it
        name = Path(args.model).name
        figures = bool(args.html)
        if args.cache:
            from attnlab.explain.cache_view import check_cache_args

            check_cache_args(args.cache, model, tokenizer, args.sentence)  # before the heads are scored
        report = model_report(
            model,
            tokenizer,
            args.sentence,
            name=name,
            lang=args.lang,
            log=log,
            figures=figures,
            cache=args.cache,
            characters=args.characters,
        )
        if args.cache:
            from attnlab.explain.cache_view import cache_sections

            report.sections.extend(
                cache_sections(model, tokenizer, args.sentence, args.cache, lang=args.lang, figures=figures)
            )
    except (ValueError, TypeError) as err:
        if "attnlab reads model_type" in str(err):  # a family attnlab does not load: transformers may
            err = ValueError(f"{err}; or run it in transformers, attnlab's attention inside: add --transformers")
        return error(console, err)
    if args.html:
        return write_report(console, report, args.html)
    console.print(report.intro, markup=False)
    for section in report.sections:
        heading(console, section.title)
        console.print(section.value, markup=False)
        for c in section.checks:
            console.print(("✓ " if c.ok else "✗ ") + c.label, markup=False)
    return 0


def run_transformers(args: argparse.Namespace, console: Console) -> int:
    """``--transformers``: a transformers checkpoint run in transformers, attnlab's attention inside it."""
    from pathlib import Path

    try:
        folder = check_transformers_args(args)
        check_output(args.html, suffixes=(".html", ".htm"))
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise ValueError("--transformers needs transformers: pip install 'attnlab[hf]'") from None
        from transformers.utils import logging as hf_logging

        from attnlab.explain.hf_view import transformers_report

        where = args.tokenizer or args.model
        shown, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()  # its loading bar and notes are not this command's output
        hf_logging.set_verbosity_error()
        try:
            try:
                tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ValueError(
                    f"transformers found no tokenizer in {where!r} ({_one_line(err)}); pass --tokenizer DIR"
                ) from None
            try:
                model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
                raise ValueError(
                    f"transformers could not load --model {args.model!r} as a causal LM: {_one_line(err)}"
                ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
            if shown:
                hf_logging.enable_progress_bar()
        report = transformers_report(model, tokenizer, args.sentence, name=Path(args.model).name, lang=args.lang)
    except (ValueError, TypeError) as err:
        return error(console, err)
    return write_report(console, report, args.html)


def _one_line(err: BaseException, most: int = 300) -> str:
    """transformers' message on one line, cut at ``most`` characters (some list every config they know)."""
    text = " ".join(str(err).split())
    return text if len(text) <= most else text[: most - 1] + "…"


def check_transformers_args(args: argparse.Namespace) -> str:
    """What ``--transformers`` needs, checked before anything loads: the checkpoint's folder."""
    from pathlib import Path

    if not args.model:
        raise ValueError("--transformers runs a transformers checkpoint: give --model DIR, the folder it was saved to")
    if args.cache or args.characters:
        used = "--cache" if args.cache else "--characters"
        raise ValueError(f"{used} works on a model attnlab loads itself: drop --transformers, or drop {used}")
    if not args.html:
        raise ValueError("--transformers shows every head in an interactive page: give --html PATH")
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"--model {args.model!r} is no transformers checkpoint (no config.json in a folder of that name): give "
            "the folder save_pretrained wrote"
        )
    if args.tokenizer is not None and not Path(args.tokenizer).is_dir():
        raise ValueError(f"--tokenizer {args.tokenizer!r} is not a folder; give the folder with tokenizer.json")
    return str(folder)


def heading(console: Console, title: str) -> None:
    """A section's rule with its title, or a plain rule and the title wrapped below it when the title would not
    fit in the rule whole (a layer's kind can be long): never cut."""
    from rich.cells import cell_len

    if cell_len(title) + 6 <= console.width:  # "── title ──"
        console.rule(title)
        return
    console.rule()
    console.print("\n".join(wrap(title, max(console.width, 20))), markup=False)
