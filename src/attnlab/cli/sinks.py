"""``attnlab sinks EXPERIMENT [--seeds N] [--contexts N] [--steps N] [--out DIR] [--from FILE] [--lang zh]``: the
attention-sink experiments set against their papers' claims (``attnlab.bench.sinks_*``): each run writes a JSON
file and a plot to --out and prints its report, a verdict a claim; --from FILE prints the report of a saved run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from attnlab.cli._common import check_folder, error

EXPERIMENTS = ("streaming", "backcopy", "variants", "massive", "sigmoid")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sinks = sub.add_parser(
        "sinks",
        help="why models stare at their first token: StreamingLLM past the context, Bigram-Backcopy with softmax, "
        "ReLU, sigmoid, Adam and SGD; a verdict for each paper's claim",
        description="Run one attention-sink experiment and print its report: 'streaming' reads held-out text past "
        "the shipped text model's context with a window recomputed each step, a plain cache, a window cache, and "
        "windows with 1, 2 and 4 sinks; 'backcopy' trains small transformers on Bigram-Backcopy with softmax, "
        "ReLU and sigmoid attention, Adam and SGD, measuring the weight on BOS, its value norm and its residual norm over "
        "training; 'variants' trains the zoo's mha, gated and sinks on Bigram-Backcopy and compares the first-token "
        "share and the largest activation; 'massive' sets the first token's largest activations to their mean and to "
        "zero; 'sigmoid' trains the zoo's mha on the zoo's text with softmax and with sigmoid attention without "
        "normalisation and compares their first-token shares. Each verdict uses the spread over seeds and the zoo's "
        "noise rule.",
    )
    sinks.add_argument("experiment", choices=EXPERIMENTS, help="which experiment")
    sinks.add_argument("--seeds", type=int, default=3, help="texts (streaming) or training seeds (default 3)")
    sinks.add_argument("--contexts", type=int, default=4, help="streaming: text length in contexts (default 4)")
    sinks.add_argument(
        "--model",
        choices=["text", "backcopy"],
        default="text",
        help="streaming: the shipped text model, or a GPT trained here on Bigram-Backcopy (the zoo's mha; it grows "
        "a first-token sink)",
    )
    sinks.add_argument(
        "--steps",
        type=int,
        default=None,
        help="backcopy, variants, massive: training steps (default 1000); sigmoid (default 300)",
    )
    sinks.add_argument("--out", default="runs/sinks", help="folder for the JSON file and the plot (default runs/sinks)")
    sinks.add_argument("--from", dest="source", default=None, metavar="FILE", help="print the report of a saved run")
    sinks.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the report")


def run(args: argparse.Namespace, console: Console) -> int:
    from attnlab.bench.sinks_report import REPORTS, backcopy_plot, streaming_plot
    from attnlab.bench.sinks_result import BackcopyResult, MassiveResult, StreamingResult, VariantsResult
    from attnlab.bench.sinks_sigmoid import SigmoidResult

    readers = {
        "streaming": StreamingResult.read,
        "backcopy": BackcopyResult.read,
        "variants": VariantsResult.read,
        "massive": MassiveResult.read,
        "sigmoid": SigmoidResult.read,
    }
    say = lambda line: console.print(line, markup=False)
    try:
        if not 1 <= args.seeds <= 10:
            raise ValueError(f"--seeds must be in [1, 10], got {args.seeds}")
        if not 2 <= args.contexts <= 16:
            raise ValueError(
                f"--contexts must be in [2, 16] (the ways differ only past the first), got {args.contexts}"
            )
        if args.model != "text" and args.experiment != "streaming":
            raise ValueError(f"--model chooses the streaming run's model; '{args.experiment}' trains its own")
        if args.steps is not None and not 10 <= args.steps <= 100_000:
            raise ValueError(f"--steps must be in [10, 100000], got {args.steps}")
        if args.source is not None:
            source = Path(args.source)
            if not source.is_file():
                raise ValueError(f"--from {args.source!r} is not a file; give a JSON file an earlier run wrote")
        else:
            out = check_folder(args.out)
    except ValueError as err:
        return error(console, err)
    if args.source is not None:
        try:
            say(REPORTS[args.experiment](readers[args.experiment](source), args.lang))
        except (ValueError, KeyError, TypeError) as err:
            return error(console, f"--from {args.source!r}: {err}")
        return 0
    try:  # the loops keep what they finished; an interrupt before them (a model loading, training) keeps nothing
        result, name = _run(args, say)
    except KeyboardInterrupt:
        error(console, f"interrupted before the first {_unit(args)} finished; nothing written")
        return 130
    finished = len(result.arms) if isinstance(result, StreamingResult) else len(result.seeds)
    if finished == 0:
        error(console, f"interrupted before the first {_unit(args)} finished; nothing written")
        return 130
    out.mkdir(parents=True, exist_ok=True)
    written = [result.write(out / f"{name}.json")]
    if isinstance(result, StreamingResult):
        written.append(streaming_plot(result, out / f"{name}.png"))
    elif isinstance(result, BackcopyResult):
        written.append(backcopy_plot(result, out / f"{name}.png"))
    where = " and ".join(str(path) for path in written)
    if result.interrupted:  # one line: what was kept, where, and how to read it
        kept = (
            f"the arms finished ({', '.join(result.arms)})"
            if isinstance(result, StreamingResult)
            else f"the {finished} {_unit(args)}(s) finished"
        )
        error(
            console,
            f"interrupted; saved {kept} to {where}, marked interrupted; "
            f"attnlab sinks {args.experiment} --from {written[0]} prints its report",
        )
        return 130
    say(REPORTS[args.experiment](result, args.lang))
    say(f"wrote {where}")
    return 0


def _unit(args: argparse.Namespace) -> str:
    return "arm" if args.experiment == "streaming" else "seed"


def _run(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[Any, str]:
    """Run the experiment ``args`` name: (its result, the name of its files)."""
    if args.experiment == "streaming":
        from attnlab.bench.sinks_streaming import run_streaming
        from attnlab.models.gpt import GPT

        name = "streaming" if args.model == "text" else f"streaming-{args.model}"
        if args.model == "text":
            model = GPT.from_pretrained("text")
            return run_streaming(model, contexts=args.contexts, texts=args.seeds, report=say), name
        from attnlab.bench.sinks_variants import backcopy_stream

        model, text = backcopy_stream(contexts=args.contexts, texts=args.seeds)
        say("trained the zoo's mha on Bigram-Backcopy")
        streamed = run_streaming(
            model, contexts=args.contexts, texts=args.seeds, text=text, name="backcopy", report=say
        )
        return streamed, name
    if args.experiment == "massive":
        from attnlab.bench.sinks_massive import run_massive
        from attnlab.bench.sinks_variants import VariantSettings

        settings = VariantSettings() if args.steps is None else VariantSettings(steps=args.steps)
        return run_massive(seeds=args.seeds, settings=settings, report=say), "massive"
    if args.experiment == "sigmoid":
        from attnlab.bench.sinks_sigmoid import SigmoidSettings, run_sigmoid

        schedule = SigmoidSettings() if args.steps is None else SigmoidSettings(steps=args.steps)
        return run_sigmoid(seeds=args.seeds, settings=schedule, report=say), "sigmoid"
    if args.experiment == "variants":
        from attnlab.bench.sinks_variants import VariantSettings, run_variants

        plan = VariantSettings() if args.steps is None else VariantSettings(steps=args.steps)
        return run_variants(seeds=args.seeds, settings=plan, report=say), "variants"
    from attnlab.bench.sinks_backcopy import BackcopySettings, run_backcopy

    trained = BackcopySettings() if args.steps is None else BackcopySettings(steps=args.steps)
    return run_backcopy(seeds=args.seeds, settings=trained, report=say), "backcopy"
