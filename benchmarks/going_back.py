"""Issue 57: the two ways a recurrent state goes back after a refused guess, measured in one run.

    .venv/bin/python benchmarks/going_back.py [--new-tokens 96] [--rounds 7] [--seconds 2] [--json PATH] [--smoke]

One decoder, the hybrid of ``benchmarks/speculative_kinds.py`` (6 layers of 256 dimensions, 8 heads, RoPE; 4 Gated
DeltaNet layers with a short convolution to 2 full layers; random weights, seeded), batch 1, greedy, ``lookup=4``,
its recurrent and convolution states going back (``attnlab.cache.going_back``):

- **mark**: a copy of the state at the start of a pass of guesses; a refused guess sends it back there, and the
  guesses kept run again (the decode loop first runs the tokens before the last certain one on their own);
- **each**: the state after each token of the pass kept (the recurrence run token by token for the pass), so a
  refused guess sends it back to the token itself and nothing runs again;

against decoding with no speculation. Two texts: **copies**, a prompt that is the model's own greedy continuation
after 448 tokens (its guesses are kept where its text has fallen into a cycle), and **does not copy**, 64 random
tokens continued (guesses are refused until the model's text repeats itself). The share of guesses kept is
printed beside each: it, not the label, says how much each text copied.

Each way is first checked to give plain greedy's tokens (else an error, not a row). Reported per way: forward
passes, guesses kept, tokens run again, tokens run in all (prompt included; counted at the model's step), the
most bytes held at once to go back against the states' own bytes, and the time as a ratio (median of per-round
ratios over interleaved rounds, each timed call decoding about ``--seconds`` on fresh caches made untimed, with
the rounds' spread): each way
against no speculation, and "each" against "mark", which picks the default (docs/caches.md, "Going back").
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from _timing import NOISY, report, save
from attnlab.bench.timing import ratios, spread, timed_rounds
from attnlab.cache import ModelCache
from attnlab.cache.going_back import WAYS
from attnlab.cache.state import ConvolutionCache, StateCache
from attnlab.cache.ways import going_back_as
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for

SCHEMA = "attnlab.going_back/1"
K = 4
TEXTS = ("copies", "does not copy")
HYBRID: dict[str, Any] = {"layer_types": ("delta", "delta", "delta", "full", "delta", "full"), "conv_kernel": 4}


def model() -> GPT:
    torch.manual_seed(0)
    base = GPTConfig(vocab_size=256, context_length=1024, emb_dim=256, n_heads=8, n_layers=6, rope=True, drop_rate=0.0)
    return GPT(base.with_(**HYBRID)).eval()


def texts(m: GPT) -> dict[str, torch.Tensor]:
    start = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(1))
    own = m.generate(start, 448)[:, -128:]  # (1, 128): the model's own continuation, in its cycle by now
    return dict(zip(TEXTS, (own, start), strict=True))


def cache_for(m: GPT, prompt: torch.Tensor, new: int, way: str) -> ModelCache:
    """A fresh cache as generate makes it, its states going back ``way``."""
    made = m.make_caches(batch_size=1, max_len=prompt.shape[1] + new, spare=K + 1)
    return ModelCache(going_back_as(made, way))


def run(m: GPT, prompt: torch.Tensor, new: int, way: str | None, cache: ModelCache) -> Any:
    """The decoding, lookup=K with ``way``, or with no speculation (``way`` None); a generator to drain."""
    return decode(m, replace(request_for(m, prompt, new, {} if way is None else {"lookup": K}), cache=cache))


def counted(m: GPT, prompt: torch.Tensor, new: int, way: str) -> dict[str, Any]:
    """One decoding with ``way``, its tokens checked against plain greedy, and what it did and held."""
    fed, step = [0], m.step

    def counting(ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        fed[0] += ids.shape[1]
        return step(ids, *args, **kwargs)

    m.step = counting  # type: ignore[method-assign]  # every forward pass of the decode loop goes through step
    try:
        cache = cache_for(m, prompt, new, way)
        decoding = run(m, prompt, new, way, cache)
        got = [t for drawn in decoding for _, t in drawn]
    finally:
        del m.step
    if got != m.generate(prompt, new)[0, prompt.shape[1] :].tolist():
        raise SystemExit(f"going_back={way!r}: lookup gave other tokens than plain greedy decoding")
    states = [c for c in cache if isinstance(c, StateCache | ConvolutionCache)]
    counts = decoding.counts
    return {
        "passes": counts.passes,
        "guessed": counts.guessed,
        "kept": counts.kept,
        "rerun": counts.rerun,
        "tokens_run": fed[0],
        "held_back": sum(c.most_held_back for c in states),  # the most each layer held at once, summed
        "states": sum(c.nbytes() for c in states),
    }


def measure(m: GPT, label: str, prompt: torch.Tensor, new: int, rounds: int, seconds: float) -> dict[str, Any]:
    ways = {way: counted(m, prompt, new, way) for way in WAYS}
    started = time.perf_counter()
    m.generate(prompt, new)
    reps = max(1, math.ceil(seconds / (time.perf_counter() - started)))  # a timed call of about `seconds`

    def case(way: str | None) -> Callable[[], Callable[[], object]]:
        def prepared() -> Callable[[], object]:
            caches = [cache_for(m, prompt, new, way or WAYS[0]) for _ in range(reps)]  # made untimed
            return lambda: [list(run(m, prompt, new, way, cache)) for cache in caches]

        return prepared

    cases = {"no speculation": case(None), **{f"lookup={K}, {way}": case(way) for way in WAYS}}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for took in timed_rounds(cases, rounds, warmup=1):
        for name, seconds in took.items():
            times[name].append(seconds)
    print(f"{label}: {new} tokens, " + ", ".join(f"{w}: {c['kept']} of {c['guessed']} kept" for w, c in ways.items()))
    report(times, "no speculation")
    for way in WAYS:
        per_round = ratios(times, f"lookup={K}, {way}", "no speculation")
        ways[way].update(time_ratio=statistics.median(per_round), spread=spread(per_round))
    each_vs_mark = ratios(times, f"lookup={K}, each", f"lookup={K}, mark")
    return {
        "text": label,
        "new_tokens": new,
        "ways": ways,
        "each_vs_mark": statistics.median(each_vs_mark),
        "each_vs_mark_spread": spread(each_vs_mark),
        "seconds": times,  # each case's rounds, in order
    }


def verdict(result: dict[str, Any]) -> tuple[str | None, str]:
    """The way the run picks, or None where it cannot (a ratio too noisy, no text past its spread, or the texts
    disagree), and why: the way faster on every text whose margin is past its spread (each against mark in the same
    rounds); a margin inside its spread is said to be no finding."""
    rows = result["rows"]
    noisy = [r["text"] for r in rows if r["each_vs_mark_spread"] > NOISY]
    if noisy:
        return None, f"too noisy to pick: each against mark spread past {NOISY:.0%} on {', '.join(noisy)}"
    found = [r for r in rows if abs(1 - r["each_vs_mark"]) >= r["each_vs_mark_spread"]]  # past its own spread
    if not found:
        return None, "no text tells the ways apart by more than its spread"
    faster = {"each" if r["each_vs_mark"] < 1 else "mark" for r in found}
    if len(faster) > 1:
        return None, "the texts disagree: each is faster on one and mark on the other"
    way = faster.pop()
    said = []
    for r in rows:
        margin, wide = abs(1 - r["each_vs_mark"]), r["each_vs_mark_spread"]
        inside = (
            f", by {margin:.0%}, inside its {wide:.0%} spread (not a finding)"
            if margin < wide
            else f", spread {wide:.0%}"
        )
        said.append(f"{r['each_vs_mark']:.2f}x mark's time on {r['text']}{inside}")
    return way, f"{way} is faster where the run tells the ways apart: each takes " + "; ".join(said)


def render(result: dict[str, Any]) -> str:
    """The docs' table and sentences, from a results file."""
    lines = [
        "| text | way | passes | guesses kept | run again | tokens run | time against no speculation |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        for way, c in r["ways"].items():
            noisy = " (too noisy to trust)" if c["spread"] > NOISY else ""
            lines.append(
                f"| {r['text']} | {way} | {c['passes']} | {c['kept']} of {c['guessed']} | {c['rerun']} | "
                f"{c['tokens_run']} | {c['time_ratio']:.2f}x, spread {c['spread']:.0%}{noisy} |"
            )
    first = result["rows"][0]["ways"]
    mark, each, states = first["mark"]["held_back"], first["each"]["held_back"], first["mark"]["states"]
    lines += [
        "",
        f"Held to go back, at most, beside {states:,} B of state: mark {mark:,} B ({mark / states:.0%}: one copy), "
        f"each {each:,} B ({each / states:.1f}x: the copy, and the state after each of a pass's up to {K + 1} "
        "tokens with the convolution's inputs, let go when the pass is cropped).",
        "",
        f"Picked: {verdict(result)[1]}.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="each timed call decodes this long, about")
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks/results/...)")
    parser.add_argument("--smoke", action="store_true", help="a few tokens, one round: that it runs")
    args = parser.parse_args(argv)
    if args.new_tokens < 8 or args.rounds < 1 or not args.seconds > 0:
        parser.error(
            f"--new-tokens must be >= 8, --rounds >= 1 and --seconds > 0, got {args.new_tokens}, {args.rounds} and "
            f"{args.seconds}"
        )
    new, rounds, seconds = (8, 1, 0.0) if args.smoke else (args.new_tokens, args.rounds, args.seconds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, greedy, {new} tokens, lookup={K}")
    m = model()
    with torch.no_grad():
        rows = [measure(m, label, prompt, new, rounds, seconds) for label, prompt in texts(m).items()]
    result = {
        "schema": SCHEMA,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "seconds": seconds,
        "rows": rows,
    }
    print(render(result))
    save(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
