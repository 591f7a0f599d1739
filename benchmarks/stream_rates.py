"""The GB/s figures in docs/benchmarks.md: how fast one vector streams each weight of a gpt2-small decode step here.

    .venv/bin/python benchmarks/stream_rates.py [--rounds 3] [--repeats 5] [--smoke]

For every weight shape of gpt2-small (d_in x d_out: the fused QKV, the
attention output, the two feed-forward layers, the vocabulary projection), a
batch-1 product through copies of the weight that together exceed the caches,
as a decode step meets them:

- float32, bfloat16 and float16 in both layouts (``attnlab.nn.layout.stream_rates``,
  what ``GPT.set_layout("auto")`` chooses by);
- int8 through each kernel this PyTorch build has
  (``attnlab.nn.quantized.int8_stream_rates``, what ``GPT.quantize("int8")``
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
import statistics
from collections.abc import Callable, Sequence
from functools import partial

import torch

from _runs import exit_with
from _timing import NOISY
from attnlab.nn import prefetch
from attnlab.nn.layout import interleaved_seconds, stream_copies, stream_rates
from attnlab.nn.quantized import int8_stream_rates

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
    weights = [torch.randn(d_out, d_in, dtype=dtype) for _ in range(copies)]
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one small shape, one round: that it runs")
    args = parser.parse_args(argv)
    for flag in ("rounds", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    shapes, rounds, repeats = (((64, 256),), 1, 1) if args.smoke else (GPT2_SMALL, args.rounds, args.repeats)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; GB/s of one vector through each weight "
        f"shape of gpt2-small, streamed from memory; median of {rounds} rounds of {repeats} passes"
    )
    seen: dict[tuple[int, int], dict[str, list[float]]] = {shape: {} for shape in shapes}
    for _ in range(rounds):  # interleaved: a busy moment touches every shape and kind
        for shape in shapes:
            for name, rate in probe(*shape, repeats).items():
                seen[shape].setdefault(name, []).append(rate)
    for (d_in, d_out), rates in seen.items():
        print(f"{d_in} x {d_out}:")
        for name, values in rates.items():
            median = statistics.median(values)
            spread = (max(values) - min(values)) / median
            flag = "" if spread <= NOISY else "  (too noisy to trust)"
            print(f"  {name:<28} {median:7.2f} GB/s  spread {spread:4.0%}{flag}")
    return 0


if __name__ == "__main__":
    exit_with(main)  # Ctrl-C: one line and 130 (the figures print only when every round has run)
