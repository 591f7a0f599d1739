"""The measurements of one cache on one model for ``attnlab bench --caches``: perplexity through the cache
and recomputed, greedy tokens, bytes held, the decode loop under the memory counter, the sink cache's run, the
shared prefix's time to first token, and the probe the forecast reads."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.bench.cache_table import CacheBenchConfig
from attnlab.bench.memory import PeakMemory
from attnlab.bench.timing import Call, interleaved, spread
from attnlab.cache import ModelCache, PrefixCache, QuantizedKVCache, capabilities_of, stored_bytes
from attnlab.models.generation import Request, Stop, decode, prefill
from attnlab.models.gpt import GPT

SINK = "sink"  # the cache whose memory past the context the sink run measures


def _caches(model: GPT, cache: Any, batch: int, max_len: int) -> ModelCache:
    if capabilities_of(cache).shares_prefixes:  # the blocks its rows need, as paged has: the tree keeps the rest
        return PrefixCache.for_model(model, batch_size=batch, max_len=max_len, num_blocks=batch * -(-max_len // 16))
    return model.make_caches(batch_size=batch, max_len=max_len, cache=cache)


@torch.no_grad()
def _feed(model: GPT, held: Any, ids: torch.Tensor) -> torch.Tensor:
    """The last position's logits (B, 1, V) of ``ids`` run through caches ``held`` (a PrefixCache: its rows in
    order); in pieces where a cache takes only so many tokens a call (a sink cache)."""
    if isinstance(held, PrefixCache):
        return model(ids, caches=held.views(list(range(ids.shape[0]))), last_only=True)
    return prefill(model, ids, held)[:, None]


@torch.no_grad()
def perplexity(model: GPT, cache: Any, text: torch.Tensor, prompt: int) -> float:
    """exp(mean NLL) of text[:, prompt:] (B, N), each token predicted after the cache took the ones before:
    a prefill of ``prompt`` tokens, then one token a step. A prefix cache takes its prompts' blocks from its tree."""
    b, n = text.shape
    if capabilities_of(cache).shares_prefixes:
        held: Any = PrefixCache.for_model(model, batch_size=b, max_len=n)
        logits = [_warm_prefill(model, held, text[:, :prompt], n)]
    else:
        held = _caches(model, cache, b, n)  # an eviction budget is a fraction of these n tokens
        logits = [_feed(model, held, text[:, :prompt])]
    for p in range(prompt, n - 1):
        logits.append(_feed(model, held, text[:, p : p + 1]))
    return _perplexity(torch.cat(logits, dim=1), text[:, prompt:])  # (B, N - prompt, V): tokens prompt .. N - 1


def quantized_reads(model: GPT, cache: Any, n: int, prompt: int) -> float | None:
    """The share of the keys that ``perplexity``'s predictions read from quantized codes, over a text of ``n``
    tokens after a prefill of ``prompt``; None for a cache that is not quantized. A quantized cache reads its
    latest ``residual`` positions exact, and a prefill exact: a text shorter than that judges nothing."""
    layer = _caches(model, cache, 1, n)[0]
    if not isinstance(layer, QuantizedKVCache):
        return None
    # the prediction of token p + 1 reads p + 1 keys, the latest residual of them exact; the prefill's, all exact
    shares = [0.0] + [max(0, p + 1 - layer.residual) / (p + 1) for p in range(prompt, n - 1)]
    return sum(shares) / len(shares)


@torch.no_grad()
def recomputed_perplexity(model: GPT, text: torch.Tensor, prompt: int) -> float:
    """The same tokens' perplexity with no cache: one causal forward over the whole text (B, N)."""
    logits = model(text)[:, prompt - 1 : -1]  # (B, N - prompt, V): position p predicts token p + 1
    return _perplexity(logits, text[:, prompt:])


def _perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """exp(mean NLL) of targets (B, N) under logits (B, N, V), in float64 (so the sum adds no rounding of its own)."""
    return math.exp(float(F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten())))


def _warm_prefill(model: GPT, store: PrefixCache, prompts: torch.Tensor, total: int) -> torch.Tensor:
    """Each prompt (B, T) computed once and put in the tree, then started again from the tree: the row takes
    the prompt's full blocks (not its last token's) and runs the rest. The last position's logits (B, 1, V)."""
    for row, ids in enumerate(prompts.tolist()):  # cold: computed and remembered
        store.admit(row, ids)
        model(prompts[row : row + 1], caches=store.views([row]), last_only=True)
        store.remember(row, ids)
        store.release(row)
    logits = []
    for row, ids in enumerate(prompts.tolist()):  # warm: what was shared is not computed again
        done = store.admit(row, ids, total=total)
        rest = prompts[row : row + 1, done:]  # (1, T - done)
        logits.append(model(rest, caches=store.views([row]), last_only=True))
    return torch.cat(logits)


def _generate(model: GPT, prompts: torch.Tensor, n: int, cache: Any) -> torch.Tensor:
    """n greedy tokens (B, n) after each prompt; None: no cache, the whole text again each step. A prefix cache
    is warm: the prompts went through its tree once before."""
    if cache is None:
        return model.generate(prompts, n, use_cache=False)[:, prompts.shape[1] :]
    if capabilities_of(cache).shares_prefixes:
        cache = PrefixCache.for_model(model, batch_size=prompts.shape[0], max_len=prompts.shape[1] + n - 1)
        model.generate(prompts, 1, cache=cache)
    return model.generate(prompts, n, cache=cache)[:, prompts.shape[1] :]


def _sink_run(model: GPT, contexts: int) -> dict[str, float]:
    """Peak memory of a sink cache generating ``contexts`` x context_length tokens in one run, read after the
    first context and at the end (the peak after one context is the peak of a run of one context)."""
    context = model.config.context_length
    prompt = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(3))
    first: dict[str, float] = {}

    def after_one(made: int) -> None:  # the peak of a run of one context, read inside the long run
        if made == context:
            first.update(peak_mib_1x=mem.peak_bytes / 2**20, kv_mib_1x=stored_bytes(held) / 2**20)

    with PeakMemory() as mem:
        held = _caches(model, SINK, 1, 8 + contexts * context)
        _decode(model, held, prompt, contexts * context, each=after_one)
    return {
        "tokens": contexts * context,
        "contexts": contexts,
        **first,
        "peak_mib_end": mem.peak_bytes / 2**20,
        "kv_mib_end": stored_bytes(held) / 2**20,
    }


def _held_bytes(model: GPT, cache: Any, n: int) -> int:
    """Bytes the caches hold after ``n`` tokens (built for exactly n)."""
    held = _caches(model, cache, 1, n)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    if isinstance(held, PrefixCache):
        held.admit(0, ids[0].tolist())
    with torch.no_grad():
        _feed(model, held, ids)
    return stored_bytes(held)


def _decode(
    model: GPT, held: ModelCache, prompt: torch.Tensor, steps: int, *, each: Callable[[int], None] | None = None
) -> None:
    """A prompt (1, T), then ``steps`` greedy tokens through ``held``, by the one decode loop; ``each(made)`` is
    called after every pass, while the cache still holds what the pass left (the loop gives a row back after)."""
    made = 0
    for drawn in decode(
        model, Request(prompts=tuple(map(tuple, prompt.tolist())), stop=Stop(max_new_tokens=steps), cache=held)
    ):
        made += len(drawn)
        if each is not None:
            each(made)


def _prefix_speed(model: GPT, config: CacheBenchConfig) -> dict[str, float]:
    """Time to first token of a prompt whose first ``shared`` tokens are in the tree (warm) or not (cold), each
    round a pair; the ratio is the median of the rounds' ratios, its spread theirs (a busy moment slows both of a
    pair, so the ratio holds where each time alone wobbles)."""
    shared = min(config.shared, model.config.context_length - 17)  # then 16 tokens of its own, and one new
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, vocab, (shared,), generator=generator).tolist()
    tails = [torch.randint(0, vocab, (16,), generator=generator).tolist() for _ in range(config.rounds + 1)]
    cold: list[float] = []
    warm: list[float] = []
    for tail in tails[1:]:
        fresh = PrefixCache.for_model(model, batch_size=1, max_len=shared + 17)
        start = time.perf_counter()
        model.generate(torch.tensor([prefix + tail]), 1, cache=fresh)
        cold.append(time.perf_counter() - start)
        model.generate(torch.tensor([prefix + tails[0]]), 1, cache=fresh)  # another prompt, the same prefix
        start = time.perf_counter()
        model.generate(torch.tensor([prefix + tail]), 1, cache=fresh)
        warm.append(time.perf_counter() - start)
    ratios = [c / w for c, w in zip(cold, warm, strict=True)]  # each round's pair, from the same moments
    return {
        "shared": shared,
        "cold_ms": statistics.median(cold) * 1e3,
        "warm_ms": statistics.median(warm) * 1e3,
        "ratio": statistics.median(ratios),
        "spread": spread(ratios),
        "rounds": len(cold),
    }


@torch.no_grad()
def _probe(model: GPT, prompt_len: int) -> tuple[float, float, float]:
    """Seconds of one decode step (plain cache), of one under the memory counter, and of a prefill of
    ``prompt_len`` tokens: the medians of a few, after one of each untimed."""
    ids = torch.zeros(1, prompt_len, dtype=torch.long)
    held = _caches(model, "plain", 1, prompt_len + 16)
    _feed(model, held, ids)
    token = ids[:, :1]

    def timed(call: Call, n: int) -> float:  # the median of n calls, timed one by one (as timing.interleaved does)
        return statistics.median(interleaved({"call": call}, n, warmup=0)["call"])

    step = timed(lambda: _feed(model, held, token), 5)
    with PeakMemory():
        tracked = timed(lambda: _feed(model, held, token), 3)
    prefill_s = timed(lambda: _feed(model, _caches(model, "plain", 1, prompt_len), ids), 3)
    return step, tracked, prefill_s
