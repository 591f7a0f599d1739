"""The GB/s figures in docs/benchmarks.md: how fast one vector streams each weight of a gpt2-small decode step here.

    .venv/bin/python benchmarks/stream_rates.py [--rounds 3] [--repeats 5] [--smoke] [--json rates.json]
    .venv/bin/python benchmarks/stream_rates.py --render rates.json   # the block of a saved run, no run

For every weight shape of gpt2-small (d_in x d_out: the fused QKV, the
attention output, the two feed-forward layers, the vocabulary projection), a
batch-1 product through copies of the weight that together exceed the caches,
as a decode step meets them:

- float32, bfloat16 and float16 in both layouts (``attnlab.linear.layout.stream_rates``,
  what ``GPT.set_layout("auto")`` chooses by);
- int8 through each kernel this PyTorch build has
  (``attnlab.linear.int8_choice.int8_stream_rates``, what ``GPT.quantize("int8")``
  chooses by);
- the "prefetch" layout's loop asking for nothing ahead (``ahead=0``) beside
  the same loop as the layout runs it, their passes taking turns: what the
  prefetch itself gains, the loop's numbers being the same.

GB/s counts the weight's own bytes (2 a number in half precision, 1 in int8).
Each probe is the median of ``--repeats`` passes; the probes run ``--rounds``
times, interleaved, and each figure is their median with the spread between
rounds, over 25% marked as not a finding.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from _runs import exit_with, finish, render_saved
from _timing import NOISY
from attnlab.linear import prefetch
from attnlab.linear.int8_choice import int8_stream_rates
from attnlab.linear.layout import stream_rates
from attnlab.linear.probe import interleaved_seconds, last_level_cache_bytes, stream_bytes, stream_copies

GPT2_SMALL = ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257))  # (d_in, d_out)
FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def prefetch_effect(d_in: int, d_out: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """GB/s of the prefetch loop with ``ahead`` blocks asked for ahead and with none, on the same copies of the
    weight (as many as ``stream_rates`` cycles through: ``stream_copies``), the two taking turns; {} where the
    loop cannot run."""
    if prefetch.why_no_prefetch():
        return {}
    size, copies = stream_copies(d_in, d_out, dtype)
    x = torch.randn(1, d_in, dtype=dtype)
    first = torch.randn(d_out, d_in, dtype=dtype)
    weights = [first, *(first.clone() for _ in range(copies - 1))]  # each its own memory, as stream_rates' are
    calls: dict[str, list[Callable[[], object]]] = {
        f"prefetch, {ahead} ahead": [partial(prefetch.gemv, x, w, ahead=ahead) for w in weights]
        for ahead in (prefetch.AHEAD, 0)
    }
    with torch.no_grad():
        seconds = interleaved_seconds(calls, repeats)
    return {name: copies * size / spent / 1e9 for name, spent in seconds.items()}


def probe(d_in: int, d_out: int, repeats: int) -> dict[str, float]:
    """One round for one shape: GB/s by "dtype layout", "int8 kernel" and "dtype prefetch, N ahead"."""
    rates = {}
    for name, dtype in FLOATS.items():
        for layout, rate in stream_rates(d_in, d_out, dtype=dtype, repeats=repeats).items():
            rates[f"{name} {layout}"] = rate
    for kernel, rate in int8_stream_rates(d_in, d_out, repeats=repeats).items():
        rates[f"int8 {kernel}"] = rate
    for name in ("float32", "bfloat16"):
        for which, rate in prefetch_effect(d_in, d_out, FLOATS[name], repeats).items():
            rates[f"{name} {which}"] = rate
    return rates


SCHEMA = "attnlab.stream_rates/1"


def run(shapes: Sequence[tuple[int, int]], rounds: int, repeats: int) -> dict[str, Any]:
    """Every probe of every shape, ``rounds`` times interleaved: the rates of each round, kept for the file."""
    seen: dict[tuple[int, int], dict[str, list[float]]] = {shape: {} for shape in shapes}
    for _ in range(rounds):  # interleaved: a busy moment touches every shape and kind
        for shape in shapes:
            for name, rate in probe(*shape, repeats).items():
                seen[shape].setdefault(name, []).append(rate)
    return {
        "schema": SCHEMA,
        "command": " ".join(["benchmarks/stream_rates.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "repeats": repeats,
        "last_level_cache_bytes": last_level_cache_bytes(),
        "stream_bytes": stream_bytes(),
        "shapes": [{"d_in": d_in, "d_out": d_out, "rates": rates} for (d_in, d_out), rates in seen.items()],
    }


def render(result: dict[str, Any]) -> str:
    """The block docs/benchmarks.md quotes: per shape, each kind's median GB/s over the rounds and its spread."""
    lines = [
        f"torch {result['torch']}, {result['threads']} threads; GB/s of one vector through each weight shape of "
        f"gpt2-small, streamed from memory; median of {result['rounds']} rounds of {result['repeats']} passes"
    ]
    for shape in result["shapes"]:
        lines.append(f"{shape['d_in']} x {shape['d_out']}:")
        for name, values in shape["rates"].items():
            median = statistics.median(values)
            spread = (max(values) - min(values)) / median
            flag = "" if spread <= NOISY else "  (too noisy to trust)"
            lines.append(f"  {name:<28} {median:7.2f} GB/s  spread {spread:4.0%}{flag}")
    cache = result["last_level_cache_bytes"]
    lines.append(
        f"`{result['command']}` ({result['date']}, {result['machine']}): each probe cycles through copies of the "
        f"weight up to {result['stream_bytes'] / 2**20:,.0f} MiB, against a last-level cache the OS reports as "
        f"{cache / 2**20:,.0f} MiB" + ("" if cache else " (none reported)")
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one small shape, one round: that it runs")
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--render", metavar="PATH", help="print the block of a saved result, no run")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    for flag in ("rounds", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"cannot write --json {args.json!r}: its folder does not exist")
    shapes, rounds, repeats = (((64, 256),), 1, 1) if args.smoke else (GPT2_SMALL, args.rounds, args.repeats)
    return finish(args.json, run(shapes, rounds, repeats), render, [], "stream")


if __name__ == "__main__":
    exit_with(main)  # Ctrl-C: one line and 130 (the figures print only when every round has run)
