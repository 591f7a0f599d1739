"""Issue 58: the first generate of a new process, as a user gets it, against a process that tuned itself.

    .venv/bin/python benchmarks/first_generate.py [--rounds 3] [--threads 2] [--json PATH] [--smoke]
    .venv/bin/python benchmarks/first_generate.py --render PATH

One seeded GPT-2 (gpt2-small's shape, random weights; ``--smoke``: 2 layers of 64) is saved once as a Hugging Face
folder. Every figure is a fresh process that loads it and generates greedily from a 128-token prompt, timed from
the end of the load to the last token (so any measurement, layout change and compile is inside the time):

- **default**: ``GPT.from_pretrained(folder).generate(idx, n)``, nothing else (attnlab.models.generation.tuned);
- **tuned**: the same, having called the tuning methods itself: ``set_layout("measured")`` (the layouts this
  machine measured, read from what is kept: what a user who knew them would name) and ``generate(..., compile=True)``.

First one process on a machine with nothing measured (its own measurement folder, made empty for the run): what
the first process ever pays. Then ``--rounds`` rounds, each running both sides once per length (64 and 512 new
tokens), in an order rotated each round; a side's figure is its median, the ratio default / tuned the median of
the per-round ratios, with their spread. The target (issue 58): default at most 1.10x tuned, judged by the
project's noise rule (benchmarks/_verdicts.py). Both sides' tokens are compared: the default must give eager's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _runs import add_run_arguments, check_run, exit_with, finish, render_saved
from _verdicts import judged

SCHEMA = "attnlab.first_generate/1"
SIDES = ("default", "tuned")
TARGET = 1.10  # default's time to the last token, at most this times tuned's
PROMPT = 128


def one(side: str, folder: str, n: int) -> dict[str, Any]:
    """In this process: load, then time one side's first generate to its last token."""
    import torch

    from attnlab.models import GPT

    model = GPT.from_pretrained(folder)
    idx = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    if side == "tuned":
        model.set_layout("measured")
        out = model.generate(idx, n, compile=True)
    else:
        out = model.generate(idx, n)
    seconds = time.perf_counter() - start
    tuning = model.tuning
    return {"seconds": seconds, "tokens": out[0, PROMPT:].tolist(), "why": tuning.why if tuning else ""}


def spawn(side: str, folder: str, n: int, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--row", side, "--folder", folder, "--new-tokens", str(n)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} at {n} tokens failed: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run, in a temporary folder (the model, the measurements) removed when it ends, however it ends."""
    with tempfile.TemporaryDirectory(prefix="first-generate-") as work:
        return _run_in(Path(work), args)


def _run_in(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from attnlab.models import GPT, GPTConfig

    lengths = (8,) if args.smoke else (64, 512)
    rounds = 1 if args.smoke else args.rounds
    torch.manual_seed(0)
    base = GPTConfig.preset("gpt2-small")
    config = base.with_(n_layers=2, emb_dim=64, n_heads=4) if args.smoke else base
    GPT(config).save_pretrained(work / "model")
    env = {**os.environ, "ATTNLAB_CACHE": str(work / "cache"), "ATTNLAB_MEASURE": "1"}
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    folder = str(work / "model")
    first = spawn("default", folder, lengths[0], env)  # nothing measured yet: this process measures
    print(f"first process ever: {first['seconds']:.1f} s ({first['why']})", file=sys.stderr)
    times: dict[int, dict[str, list[float]]] = {n: {side: [] for side in SIDES} for n in lengths}
    tokens: dict[int, dict[str, list[int]]] = {n: {} for n in lengths}
    whys: dict[int, dict[str, str]] = {n: {} for n in lengths}
    order = [(n, side) for n in lengths for side in SIDES]
    for r in range(rounds):
        for n, side in order[r % len(order) :] + order[: r % len(order)]:
            print(f"round {r + 1}/{rounds}: {side} {n}", file=sys.stderr)
            got = spawn(side, folder, n, env)
            times[n][side].append(got["seconds"])
            tokens[n][side], whys[n][side] = got["tokens"], got["why"]
    rows = []
    for n in lengths:
        per_round = [d / t for d, t in zip(times[n]["default"], times[n]["tuned"], strict=True)]
        ratio = statistics.median(per_round)
        wide = (max(per_round) - min(per_round)) / ratio if len(per_round) > 1 else 0.0
        rows.append(
            {
                "new_tokens": n,
                "default_s": statistics.median(times[n]["default"]),
                "tuned_s": statistics.median(times[n]["tuned"]),
                "ratio": ratio,
                "spread": wide,
                "verdict": judged(ratio, TARGET, wide, at_most=True, whose="the rounds"),
                "same_tokens": tokens[n]["default"] == tokens[n]["tuned"],
                "default_why": whys[n]["default"],
                "tuned_why": whys[n]["tuned"],
            }
        )
    return {
        "schema": SCHEMA,
        "command": " ".join(["benchmarks/first_generate.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": platform.machine(),
        "cpu": _cpu(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": rounds,
        "model": {"n_layers": config.n_layers, "emb_dim": config.emb_dim, "vocab_size": config.vocab_size},
        "prompt_tokens": PROMPT,
        "first_process_s": first["seconds"],
        "first_process_why": first["why"],
        "rows": rows,
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def render(result: dict[str, Any]) -> str:
    lines = [
        f"`{result['command']}` on {result['date']}: {result['cpu']}, torch {result['torch']}, "
        f"{result['threads']} threads, {result['rounds']} rounds; a {result['prompt_tokens']}-token prompt, "
        f"{result['model']['n_layers']} layers of {result['model']['emb_dim']}.",
        "",
        f"The first process on a machine with nothing measured took {result['first_process_s']:.1f} s to its last "
        f"token ({result['first_process_why']}).",
        "",
        "| new tokens | default (s) | tuned (s) | default / tuned | spread | target: at most 1.10x | same tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['new_tokens']} | {row['default_s']:.2f} | {row['tuned_s']:.2f} | {row['ratio']:.2f}x | "
            f"{row['spread']:.0%} | {row['verdict']} | {'yes' if row['same_tokens'] else 'no'} |"
        )
    lines.append("")
    for row in result["rows"]:
        lines.append(f"- {row['new_tokens']} tokens, default: {row['default_why']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, rounds=3)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model, 1 round, 8 tokens")
    parser.add_argument("--row", choices=SIDES, help=argparse.SUPPRESS)  # one side, in this process
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    if args.row:
        print(json.dumps(one(args.row, args.folder, args.new_tokens)))
        return 0
    check_run(parser, args)
    result = run(args)
    problems = [f"{r['new_tokens']} tokens: the default's tokens differ from the tuned" for r in result["rows"]]
    problems = [p for p, r in zip(problems, result["rows"], strict=True) if not r["same_tokens"]]
    return finish(args.json, result, render, problems, "first_generate")


if __name__ == "__main__":
    exit_with(main)
