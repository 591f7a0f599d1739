"""``attnlab sinks EXPERIMENT [--seeds N] [--contexts N] [--steps N] [--out DIR] [--from FILE] [--lang zh]``: the
attention-sink experiments set against their papers' claims (``attnlab.bench.sinks_*``): each run writes a JSON
file and a plot to --out and prints its report, a verdict a claim; --from FILE prints the report of a saved run."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    from attnlab.bench.sinks_report import (
        backcopy_plot,
        backcopy_report,
        massive_report,
        sigmoid_report,
        streaming_plot,
        streaming_report,
        variants_report,
    )
    from attnlab.bench.sinks_result import BackcopyResult, MassiveResult, StreamingResult, VariantsResult
    from attnlab.bench.sinks_sigmoid import SigmoidResult

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
            if args.experiment == "streaming":
                say(streaming_report(StreamingResult.read(source), args.lang))
            elif args.experiment == "variants":
                say(variants_report(VariantsResult.read(source), args.lang))
            elif args.experiment == "massive":
                say(massive_report(MassiveResult.read(source), args.lang))
            elif args.experiment == "sigmoid":
                say(sigmoid_report(SigmoidResult.read(source), args.lang))
            else:
                say(backcopy_report(BackcopyResult.read(source), args.lang))
        except (ValueError, KeyError, TypeError) as err:
            return error(console, f"--from {args.source!r}: {err}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if args.experiment == "streaming":
        from attnlab.bench.sinks_streaming import run_streaming
        from attnlab.models.gpt import GPT

        name = "streaming" if args.model == "text" else f"streaming-{args.model}"
        if args.model == "text":
            streamed = run_streaming(GPT.from_pretrained("text"), contexts=args.contexts, texts=args.seeds, report=say)
        else:
            from attnlab.bench.sinks_variants import backcopy_stream

            model, text = backcopy_stream(contexts=args.contexts, texts=args.seeds)
            say("trained the zoo's mha on Bigram-Backcopy")
            streamed = run_streaming(
                model, contexts=args.contexts, texts=args.seeds, text=text, name="backcopy", report=say
            )
        streamed.write(out / f"{name}.json")
        streaming_plot(streamed, out / f"{name}.png")
        say(streaming_report(streamed, args.lang))
        say(f"wrote {out / f'{name}.json'} and {out / f'{name}.png'}")
        return 0
    if args.experiment == "massive":
        from attnlab.bench.sinks_massive import run_massive
        from attnlab.bench.sinks_variants import VariantSettings

        massive = run_massive(
            seeds=args.seeds,
            settings=VariantSettings() if args.steps is None else VariantSettings(steps=args.steps),
            report=say,
        )
        massive.write(out / "massive.json")
        say(massive_report(massive, args.lang))
        say(f"wrote {out / 'massive.json'}")
        return 0
    if args.experiment == "sigmoid":
        from attnlab.bench.sinks_sigmoid import SigmoidSettings, run_sigmoid

        schedule = SigmoidSettings() if args.steps is None else SigmoidSettings(steps=args.steps)
        compared_arms = run_sigmoid(seeds=args.seeds, settings=schedule, report=say)
        compared_arms.write(out / "sigmoid.json")
        say(sigmoid_report(compared_arms, args.lang))
        say(f"wrote {out / 'sigmoid.json'}")
        return 0
    if args.experiment == "variants":
        from attnlab.bench.sinks_variants import VariantSettings, run_variants

        plan = VariantSettings() if args.steps is None else VariantSettings(steps=args.steps)
        compared = run_variants(seeds=args.seeds, settings=plan, report=say)
        compared.write(out / "variants.json")
        say(variants_report(compared, args.lang))
        say(f"wrote {out / 'variants.json'}")
        return 0
    from attnlab.bench.sinks_backcopy import BackcopySettings, run_backcopy

    settings = BackcopySettings() if args.steps is None else BackcopySettings(steps=args.steps)
    trained = run_backcopy(seeds=args.seeds, settings=settings, report=say)
    trained.write(out / "backcopy.json")
    backcopy_plot(trained, out / "backcopy.png")
    say(backcopy_report(trained, args.lang))
    say(f"wrote {out / 'backcopy.json'} and {out / 'backcopy.png'}")
    return 0
