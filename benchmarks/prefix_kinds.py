"""Issue 57: prefix reuse on every kind of layer, measured as ratios in one run, the tokens checked first.

    .venv/bin/python benchmarks/prefix_kinds.py [--shared 512] [--rounds 5] [--json PATH] [--smoke]

The decoders of ``speculative_kinds.py`` (6 layers of 256 dimensions, random weights, seeded), and a third of
full layers alone, batch 1, greedy:

- **full**: 6 full softmax layers (what prefix caches were made for);
- **hybrid**: Qwen3.5's pattern, 4 Gated DeltaNet layers with a short convolution, 2 full layers;
- **sliding**: Gemma 3's, 5 sliding layers of window 64, 1 full layer.

A prompt is a shared beginning of ``--shared`` tokens (a system prompt) and 32 tokens of its own; 16 new tokens.
Three ways to run it, interleaved:

- **plain**: the plain cache (a ring, a state carried along): the whole prompt in one call;
- **cold**: a fresh prefix cache, nothing in it: the whole prompt, in calls that end at each block's end where
  the model has recurrent layers (their states are kept only where a call ends);
- **warm**: a prefix cache holding the shared beginning: only the prompt's own tokens run.

Warm's tokens must equal plain's and cold's (else an error, not a row). Reported: the tokens the first layer ran
(counted by a hook), warm and cold time as ratios to plain (medians of per-round ratios), and the bytes the prefix
cache holds after the first prompt (its full blocks): the states kept at their ends against the keys and values
in them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import speculative_kinds
from _timing import NOISY, interleaved, report, save
from attnlab.bench.timing import ratios, spread
from attnlab.cache import PagedKVCache, PrefixCache
from attnlab.models import GPT

SCHEMA = "attnlab.prefix_kinds/1"
OWN, NEW = 32, 16
MODELS: dict[str, dict[str, Any]] = {"full": {}, **speculative_kinds.MODELS}  # full layers, then its two


def model(kind: str) -> GPT:
    return speculative_kinds.decoder(MODELS[kind])


def store(m: GPT, tokens: int) -> PrefixCache:
    return PrefixCache.for_model(m, batch_size=1, max_len=tokens + NEW)


def first_layer_runs(m: GPT, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int]:
    """What ``run`` returns, and the tokens the model's first layer was given meanwhile (a hook)."""
    seen: list[int] = []
    hook = m.blocks[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].shape[1]))
    try:
        return run(), sum(seen)
    finally:
        hook.remove()


def kv_bytes(cache: PrefixCache, blocks: int) -> int:
    """Bytes of keys and values ``blocks`` blocks hold in every paged layer."""
    per_block = sum(
        (c.k_pool[:, 0].nbytes + c.v_pool[:, 0].nbytes) if c.v_pool.numel() else c.k_pool[:, 0].nbytes
        for c in cache
        if isinstance(c, PagedKVCache)
    )
    return per_block * blocks


def measure(kind: str, shared: int, rounds: int) -> dict[str, Any]:
    m = model(kind)
    g = torch.Generator().manual_seed(1)
    beginning = torch.randint(0, 256, (1, shared), generator=g)
    first, second = (torch.cat([beginning, torch.randint(0, 256, (1, OWN), generator=g)], dim=1) for _ in range(2))
    tokens = shared + OWN
    warm_store = store(m, tokens)
    m.generate(first, NEW, cache=warm_store)  # the beginning's blocks (and states at their ends) now in the tree
    plain, plain_ran = first_layer_runs(m, lambda: m.generate(second, NEW))
    cold, cold_ran = first_layer_runs(m, lambda: m.generate(second, NEW, cache=store(m, tokens)))
    kept_before, blocks = warm_store.kept_nbytes(), warm_store.cached_tokens() // warm_store.block_size
    warm, warm_ran = first_layer_runs(m, lambda: m.generate(second, NEW, cache=warm_store))
    if not (torch.equal(warm, plain) and torch.equal(cold, plain)):
        raise SystemExit(f"{kind}: the prefix cache gave other tokens than the plain cache")
    started = time.perf_counter()
    m.generate(second, NEW)
    reps = max(1, math.ceil(0.3 / (time.perf_counter() - started)))

    def warm_run() -> None:
        for _ in range(reps):
            m.generate(second, NEW, cache=warm_store)

    cases = {
        "plain": lambda: [m.generate(second, NEW) for _ in range(reps)],
        "cold": lambda: [m.generate(second, NEW, cache=store(m, tokens)) for _ in range(reps)],
        "warm": warm_run,
    }
    times = interleaved(cases, rounds)
    print(f"{kind}: first layer ran {plain_ran} (plain), {cold_ran} (cold), {warm_ran} (warm) tokens")
    report(times, "plain")
    warm_ratios, cold_ratios = ratios(times, "warm", "plain"), ratios(times, "cold", "plain")
    return {
        "model": kind,
        "shared": shared,
        "own": OWN,
        "new_tokens": NEW,
        "ran": {"plain": plain_ran, "cold": cold_ran, "warm": warm_ran},
        "warm_ratio": statistics.median(warm_ratios),
        "warm_spread": spread(warm_ratios),
        "cold_ratio": statistics.median(cold_ratios),
        "cold_spread": spread(cold_ratios),
        "bytes": {"states_kept": kept_before, "kv": kv_bytes(warm_store, blocks), "blocks": blocks},
    }


def _ratio(value: float, width: float) -> str:
    return f"{value:.2f}x, spread {width:.0%}" + (" (too noisy to trust)" if width > NOISY else "")


def render(result: dict[str, Any]) -> str:
    """The docs' table and sentence, from a results file."""
    lines = [
        "| model | first layer ran (plain, cold, warm) | cold's time / plain | warm's time / plain | "
        "states kept at block ends | keys and values in the blocks |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        ran, b = r["ran"], r["bytes"]
        lines.append(
            f"| {r['model']} | {ran['plain']}, {ran['cold']}, {ran['warm']} | {_ratio(r['cold_ratio'], r['cold_spread'])} "
            f"| {_ratio(r['warm_ratio'], r['warm_spread'])} | {b['states_kept']:,} B | {b['kv']:,} B |"
        )
    hybrid = next(r for r in result["rows"] if r["model"] == "hybrid")["bytes"]
    lines += [
        "",
        f"The hybrid's states kept at the ends of the tree's {hybrid['blocks']} blocks weigh "
        f"{hybrid['states_kept'] / hybrid['kv']:.1f}x the keys and values its full layers keep in them.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=int, default=512, help="tokens of the shared beginning, a multiple of 16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks/results/...)")
    parser.add_argument("--smoke", action="store_true", help="a short beginning, one round: that it runs")
    args = parser.parse_args(argv)
    if args.shared < 16 or args.shared % 16 or args.shared + OWN + NEW > 1024 or args.rounds < 1:
        parser.error(
            f"--shared must be a multiple of 16 in [16, {1024 - OWN - NEW}] and --rounds >= 1, got {args.shared} "
            f"and {args.rounds}"
        )
    shared, rounds = (32, 1) if args.smoke else (args.shared, args.rounds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, greedy, {shared} + {OWN} tokens, {NEW} new")
    rows = [measure(kind, shared, rounds) for kind in MODELS]
    result = {"schema": SCHEMA, "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}
    print(render(result))
    save(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
