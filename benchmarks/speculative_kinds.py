"""Issue 57: speculation on every kind of layer, measured as ratios in one run, the tokens checked first.

    .venv/bin/python benchmarks/speculative_kinds.py [--new-tokens 96] [--rounds 5] [--json PATH] [--smoke]

Two decoders of one size (6 layers of 256 dimensions, 8 heads, RoPE; random weights, seeded), batch 1,
greedy:

- **hybrid**: Qwen3.5's pattern, 3 Gated DeltaNet layers with a short convolution to 1 full layer;
- **sliding**: Gemma 3's, 5 sliding layers of window 64 to 1 full layer.

Two texts each: **copies**, a prompt that is the model's own greedy continuation after 448 tokens (a random
model falls into a cycle, and the cycle continues, so lookup's guesses are kept as on text that repeats its
context, as far as the cycle is short), and **does not copy**, 64 random tokens continued (lookup's guesses
are refused until the model's text starts to repeat itself: what going back costs when speculation pays
little). The share of guesses kept is printed beside each: it, not the label, says how much each text copied.

Each case is decoded plainly and with ``lookup=4``; the tokens must be plain greedy's (else an error, not a
row). It reports the passes, the guesses kept, the tokens run again (a recurrent state goes back to its mark
before the guesses it kept), tokens/s as a ratio to plain (median of per-round ratios, interleaved), and the
bytes going back costs: a state's mark and the states after each token of a pass, at their most (each recurrent
and convolution layer goes back "each", the default: docs/caches.md), and a ring's spare slots, against what
those layers keep.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from _timing import NOISY, interleaved, report, save
from attnlab.bench.timing import ratios, spread
from attnlab.cache import KVCache, SlidingWindowCache
from attnlab.cache.state import ConvolutionCache, StateCache
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for

SCHEMA = "attnlab.speculative_kinds/1"
K = 4
MODELS: dict[str, dict[str, Any]] = {
    "hybrid": {"layer_types": ("delta", "delta", "delta", "full", "delta", "full"), "conv_kernel": 4},
    "sliding": {"layer_types": ("sliding",) * 5 + ("full",), "window": 64},
}


def decoder(changes: dict[str, Any]) -> GPT:
    """6 layers of 256 dimensions, 8 heads, RoPE, random weights of seed 0, with ``changes`` to its config."""
    torch.manual_seed(0)
    base = GPTConfig(vocab_size=256, context_length=1024, emb_dim=256, n_heads=8, n_layers=6, rope=True, drop_rate=0.0)
    return GPT(base.with_(**changes)).eval()


def model(kind: str) -> GPT:
    return decoder(MODELS[kind])


def texts(m: GPT, new: int) -> dict[str, torch.Tensor]:
    start = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(1))
    own = m.generate(start, 448)[:, -128:]  # (1, 128): the model's own continuation, in its cycle by now
    return {"copies": own, "does not copy": start}


def bytes_of(cache: Any) -> dict[str, int]:
    """What going back costs, against what the layers that pay it keep."""
    marks = sum(c.most_held_back for c in cache if isinstance(c, StateCache | ConvolutionCache))  # at its most
    states = sum(c.nbytes() for c in cache if isinstance(c, StateCache | ConvolutionCache))
    rings = [c for c in cache if isinstance(c, SlidingWindowCache)]
    per_slot = [(c.k_cache.nbytes + c.v_cache.nbytes) // c.slots for c in rings]
    spare = sum(p * c.spare for p, c in zip(per_slot, rings, strict=True))
    windows = sum(p * c.window for p, c in zip(per_slot, rings, strict=True))
    full = sum(c.k_cache.nbytes + c.v_cache.nbytes for c in cache if isinstance(c, KVCache))
    return {"marks": marks, "states": states, "spare": spare, "windows": windows, "full": full}


def measure(kind: str, new: int, rounds: int) -> list[dict[str, Any]]:
    m = model(kind)
    rows = []
    for label, prompt in texts(m, new).items():
        plain = m.generate(prompt, new)
        cache = m.make_caches(batch_size=1, max_len=prompt.shape[1] + new, spare=K + 1)  # as generate makes it
        decoding = decode(m, replace(request_for(m, prompt, new, {"lookup": K}), cache=cache))
        got = [t for drawn in decoding for _, t in drawn]
        if got != plain[0, prompt.shape[1] :].tolist():
            raise SystemExit(f"{kind}, {label}: lookup gave other tokens than plain greedy decoding")
        started = time.perf_counter()
        m.generate(prompt, new)
        reps = max(1, math.ceil(0.3 / (time.perf_counter() - started)))
        cases = {
            "plain": lambda: [m.generate(prompt, new) for _ in range(reps)],
            f"lookup={K}": lambda: [m.generate(prompt, new, lookup=K) for _ in range(reps)],
        }
        times = interleaved(cases, rounds)
        print(f"{kind}, {label}: {new} tokens, {decoding.counts}")
        report(times, "plain")
        per_round = ratios(times, f"lookup={K}", "plain")
        counts = decoding.counts
        rows.append(
            {
                "model": kind,
                "text": label,
                "new_tokens": new,
                "passes": counts.passes,
                "guessed": counts.guessed,
                "kept": counts.kept,
                "rerun": counts.rerun,
                "time_ratio": statistics.median(per_round),
                "spread": spread(per_round),
                "bytes": bytes_of(cache),
            }
        )
    return rows


def render(result: dict[str, Any]) -> str:
    """The docs' table and sentences, from a results file."""
    lines = [
        "| model | text | tokens | passes | guesses kept | run again | time with lookup=4 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        noisy = " (too noisy to trust)" if r["spread"] > NOISY else ""
        lines.append(
            f"| {r['model']} | {r['text']} | {r['new_tokens']} | {r['passes']} | {r['kept']} of {r['guessed']} | "
            f"{r['rerun']} | {r['time_ratio']:.2f}x plain, spread {r['spread']:.0%}{noisy} |"
        )
    hybrid = next(r["bytes"] for r in result["rows"] if r["model"] == "hybrid")
    sliding = next(r["bytes"] for r in result["rows"] if r["model"] == "sliding")
    lines += [
        "",
        f"Going back holds, at its most, {hybrid['marks']:,} B beside the hybrid's {hybrid['states']:,} B of state "
        f"({hybrid['marks'] / hybrid['states']:.0%}: the mark's copy and the states after each token of a pass, "
        "whatever the length), and "
        f"{hybrid['full']:,} B of full-layer KV at its capacity. The sliding model's rings keep {K + 1} spare slots "
        f"each: {sliding['spare']:,} B beside {sliding['windows']:,} B of windows "
        f"({sliding['spare'] / sliding['windows']:.0%}).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks/results/...)")
    parser.add_argument("--smoke", action="store_true", help="a few tokens, one round: that it runs")
    args = parser.parse_args(argv)
    if args.new_tokens < 8 or args.rounds < 1:
        parser.error(f"--new-tokens must be >= 8 and --rounds >= 1, got {args.new_tokens} and {args.rounds}")
    new, rounds = (8, 1) if args.smoke else (args.new_tokens, args.rounds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, greedy, {new} tokens, lookup={K}")
    rows = [row for kind in MODELS for row in measure(kind, new, rounds)]
    result = {"schema": SCHEMA, "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}
    print(render(result))
    save(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
