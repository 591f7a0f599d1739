"""``attnlab bench --caches``: every KV cache of the lab on one model, side by side, one metric each.

For each model (the shipped text model, and a gpt2-small-shaped GPT with
seeded random weights) and each cache of ``attnlab.cache.CACHES`` (the
eviction policies at two budgets, a fraction of the tokens they will see):

- **bytes per token**: what one more token held costs, from the bytes the
  caches' tensors hold after 32 and after 64 tokens (codes, scales,
  positions; the constant part, such as an exact ring, cancels); 0 for a
  cache whose memory is fixed when it is made (sinks) or by its budget
  (SnapKV's prompt);
- **KV MiB**: what the caches hold at the end of the long generation;
- **peak MiB**: every tensor allocated during the long generation
  (``PeakMemory``), activations included;
- **tokens/s**: the long generation's decode rate, median of ``rounds``
  rounds that run the caches in turn;
- **longest in cap**: the tokens whose KV fits ``cap_mib``, or no limit for a
  cache that stops growing; the model's context still bounds every cache but
  a sink cache on a RoPE model;
- **agreement**: greedy tokens equal to recomputing's (no cache: every step a
  full forward over the text so far), position by position, over a set of
  prompts;
- **perplexity**: on held-out text (within the model's context), the text
  fed one token at a time after a prefill through the cache (so every step
  reads what the cache kept), and its increase over recomputing's: one causal
  forward over the same text.

Budgets: H2O's is a share of every token it will see, as it evicts as it
goes; SnapKV's a share of the prompt, which is all it compresses.

The lossless caches (``LOSSLESS``: plain, paged, prefix) must give
recomputing's tokens, every one, and its perplexity within ``PPL_TOLERANCE``:
one that does not is a failed row. The prefix cache is measured warm: its
prompts were computed once before, so what it is judged on went through
blocks taken from its tree.

Prefix sharing is measured as time to first token for a prompt whose first
``shared`` tokens an earlier prompt already put in the tree, against the
same prompt in a fresh tree (median of ``rounds``).

Three sizes (``DEFAULT_CACHES``, ``FULL_CACHES``, ``QUICK_CACHES``): the
default measures every cache on the text model at sizes that still judge
each target (``attnlab.bench.cache_verdicts``), and the gpt2-small shape for
the shared prefix alone (``measure_prefix``), the target only its context
holds; the full run, every cache on both at the long sizes; the quick one, a
smoke run. ``measure`` reports each step through ``progress``, and on Ctrl-C
returns the rows it finished, naming the rest in the table's ``left``.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.bench.memory import PeakMemory
from attnlab.bench.timing import Call, spread, timed_rounds
from attnlab.cache import (
    CACHES,
    LOSSLESS,
    ModelCache,
    PrefixCache,
    QuantizedKVCache,
    capabilities_of,
    stored_bytes,
)
from attnlab.models.generation import Request, Stop, decode, prefill
from attnlab.models.gpt import GPT

BUDGETS = (0.25, 0.5)
SINK = "sink"  # the cache whose memory past the context the sink run measures
# A lossless cache's perplexity may differ from recomputing's by float32 rounding only (other kernels, sums in
# another order): 2.2e-8 (text model) and 1.5e-8 (gpt2-small) relative in docs/benchmarks.md's runs, room left for
# other backends; int8, the smallest real change seen, moves the text model's by 3.1e-5. So 1e-5, relative.
PPL_TOLERANCE = 1e-5

Progress = Callable[[int, int, str], None]  # (steps done, steps in all, what runs now)


@dataclass(frozen=True, kw_only=True)
class CacheBenchConfig:
    prompts: int = 8  # prompts for greedy agreement, run as one batch
    prompt_len: int = 64
    new_tokens: int = 32  # per prompt, for agreement
    long_tokens: int = 256  # the long generation: memory and speed
    held_out: int = 256  # perplexity tokens, after a prefill of prompt_len
    shared: int = 512  # the shared prefix (capped to fit the model's context)
    rounds: int = 3
    cap_mib: float = 64.0
    sink_contexts: int = 4  # the sink cache's run, in contexts (RoPE models); 0: none
    caches: tuple[str, ...] = tuple(CACHES)
    prefix_only: tuple[str, ...] = ()  # models measured for the shared prefix alone (no rows)
    threads: int | None = None  # torch threads; None: torch's own choice


# Every cache on both models at the long sizes, on torch's threads: the figures of docs/benchmarks.md.
FULL_CACHES = CacheBenchConfig()
# Every target still judged, in minutes: the text model's rows at smaller sizes (its perplexity steps still read
# mostly quantized keys, and its sink run is 4 contexts), and the gpt2-small shape for the 512-token prefix only.
# One thread: on a shared 2-core machine a second thread makes the text model's small steps wait for it
# (`bench --caches --quick --model text`: 80 s on 2 threads, 10 s on 1, at a load of 5; docs/benchmarks.md).
DEFAULT_CACHES = CacheBenchConfig(
    prompts=4, new_tokens=32, long_tokens=128, held_out=128, prefix_only=("gpt2-small",), threads=1
)
# A smoke run: every path once, too small to judge the quantized caches, the 512-token prefix or the sink.
QUICK_CACHES = CacheBenchConfig(
    prompts=2, prompt_len=16, new_tokens=6, long_tokens=24, held_out=24, shared=32, rounds=1, sink_contexts=0, threads=1
)


@dataclass
class CacheRow:
    cache: str
    status: str = "ok"
    bytes_per_token: float = 0.0
    kv_mib: float = 0.0
    peak_mib: float = 0.0
    tokens_per_s: list[float] = field(default_factory=list)
    longest: float = 0.0  # tokens; math.inf: no limit
    agreement: float = 0.0  # greedy tokens equal to recomputing's (no cache)
    agreement_tokens: int = 0  # how many were compared
    perplexity: float = 0.0
    perplexity_increase: float = 0.0  # relative to recomputing's
    quantized_reads: float | None = None  # a quantized cache: the share of keys its perplexity steps read quantized
    waste: int = 0  # a paged cache: the most slots held but unused by one sequence, after the long generation


@dataclass
class CacheTable:
    model: str
    context_length: int
    rope: bool
    rows: list[CacheRow]  # the rows measured (an interrupted run: the ones finished)
    held_out: int  # tokens whose perplexity is measured (after the prompt, within the context)
    recompute_perplexity: float  # the same tokens' perplexity from one causal forward, no cache
    prefix: dict[str, float]  # shared tokens, cold ms, warm ms, spread, rounds; empty: not measured
    sink: dict[str, float]  # a sink cache to sink_contexts x context_length: peak and KV MiB at 1x and at the end
    left: list[str] = field(default_factory=list)  # what an interruption left unmeasured, in order
    threads: int = 0  # torch's threads while it was measured


def variants(names: tuple[str, ...], prompt_len: int) -> list[tuple[str, Any]]:
    """(label, factory) for each cache: the eviction policies at every budget of BUDGETS. H2O's budget is a share
    of every token it will see (it evicts as it goes); SnapKV's, of the prompt (it compresses the prompt only)."""
    out: list[tuple[str, Any]] = []
    for name in names:
        out += BUDGETED[name](prompt_len) if name in BUDGETED else [(name, name)]
    return out


BUDGETED: dict[str, Callable[[int], list[tuple[str, Any]]]] = {  # the caches measured at every budget of BUDGETS
    "h2o": lambda prompt_len: [(f"h2o {b:.0%}", functools.partial(CACHES["h2o"], budget=b)) for b in BUDGETS],
    "snapkv": lambda prompt_len: [
        (f"snapkv {b:.0%} of prompt", functools.partial(CACHES["snapkv"], budget=max(2, round(b * prompt_len))))
        for b in BUDGETS
    ],
}


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


def lossless_mismatch(row: CacheRow, recomputed: float) -> str | None:
    """What a lossless cache's row got wrong against recomputing (tokens, perplexity), or None."""
    if row.agreement != 1.0:
        return f"gave other tokens than recomputing ({row.agreement:.1%} agree)"
    off = row.perplexity / recomputed - 1
    if not abs(off) <= PPL_TOLERANCE:  # NaN fails too
        return (
            f"perplexity {row.perplexity:.6g} against recomputing's {recomputed:.6g} ({off:+.4%}, beyond float "
            f"rounding, {PPL_TOLERANCE:.0e})"
        )
    return None


def steps_of(model: GPT, config: CacheBenchConfig) -> list[str]:
    """What ``measure`` does, step by step, in order: each row, each timing round, the prefix, the sink run."""
    rows = [name for name, _ in variants(config.caches, config.prompt_len)]
    rounds = [f"timing round {r + 1} of {config.rounds}" for r in range(config.rounds)]
    sink = [f"sink cache to {config.sink_contexts} x context"] if _runs_sink(model, config) else []
    return [*rows, *rounds, "shared prefix", *sink]


def _runs_sink(model: GPT, config: CacheBenchConfig) -> bool:
    return model.config.rope and SINK in config.caches and config.sink_contexts > 0


def measure(
    model: GPT,
    *,
    label: str,
    prompts: torch.Tensor,
    held_out: torch.Tensor,
    config: CacheBenchConfig,
    progress: Progress = lambda done, total, what: None,
) -> CacheTable:
    """One table: every cache of ``config`` on ``model``. Ctrl-C (KeyboardInterrupt) ends it early: the table
    holds the rows and timing rounds finished, and ``left`` names the rest."""
    c = model.config
    factories = dict(variants(config.caches, config.prompt_len))
    past = {name: _runs_past(model, cache) for name, cache in factories.items()}
    held_out = held_out[:, : c.context_length]  # within the context: past it only a sink cache is meant to go
    table = CacheTable(
        model=label,
        context_length=c.context_length,
        rope=c.rope,
        rows=[],
        held_out=held_out.shape[1] - config.prompt_len,
        recompute_perplexity=math.nan,
        prefix={},
        sink={},
        threads=torch.get_num_threads(),
    )
    plan = steps_of(model, config)
    done = 0

    def step(what: str) -> None:
        progress(done, len(plan), f"{label}: {what}")

    try:
        step("recomputing, the reference")
        reference = _generate(model, prompts, config.new_tokens, None)
        table.recompute_perplexity = recomputed_perplexity(model, held_out, config.prompt_len)
        for name, cache in factories.items():
            step(name)
            table.rows.append(_row(model, name, cache, prompts, held_out, reference, table, config))
            done += 1
        timed = {r.cache: r for r in table.rows if r.status == "ok"}
        step(plan[done])
        for took in timed_rounds(
            {name: _long_run(model, factories[name], prompts, config, past[name]) for name in timed}, config.rounds
        ):
            for name, seconds in took.items():
                timed[name].tokens_per_s.append(_steps(model, config, past[name]) / seconds)
            done += 1
            step(plan[done])
        table.prefix = _prefix_speed(model, config)
        done += 1
        if _runs_sink(model, config):
            step(plan[done])
            table.sink = _sink_run(model, config.sink_contexts)
            done += 1
    except KeyboardInterrupt:
        table.left = plan[done:]
    return table


def _row(
    model: GPT,
    name: str,
    cache: Any,
    prompts: torch.Tensor,
    held_out: torch.Tensor,
    reference: torch.Tensor,
    table: CacheTable,
    config: CacheBenchConfig,
) -> CacheRow:
    """One cache's row: agreement and perplexity against recomputing, bytes per token, the long generation's
    memory; a failed row for a lossless cache that is not lossless, or a cache that raises."""
    row = CacheRow(cache=name)
    past = _runs_past(model, cache)  # the long generation may go past the context
    try:
        out = _generate(model, prompts, config.new_tokens, cache)
        row.agreement, row.agreement_tokens = float((out == reference).float().mean()), reference.numel()
        row.perplexity = perplexity(model, cache, held_out, config.prompt_len)
        row.perplexity_increase = row.perplexity / table.recompute_perplexity - 1
        row.quantized_reads = quantized_reads(model, cache, held_out.shape[1], config.prompt_len)
        wrong = lossless_mismatch(row, table.recompute_perplexity) if name in LOSSLESS else None
        if wrong is not None:
            row.status = f"failed: a lossless cache {wrong}"
            return row
        n = 32  # and 64: whole groups of a quantized cache's keys, whole blocks of a paged one
        row.bytes_per_token = (_held_bytes(model, cache, 2 * n) - _held_bytes(model, cache, n)) / n
        steps = _steps(model, config, past)
        one = prompts[:1]
        wasted: list[int] = []  # a paged row's unused slots at its last step, before it is given back

        def waste(made: int) -> None:
            if made == steps and held.table is not None:
                wasted.append(held.table.waste())

        with PeakMemory() as mem:
            held = _caches(model, cache, 1, one.shape[1] + steps)
            _decode(model, held, one, steps, each=waste)
        row.peak_mib = mem.peak_bytes / 2**20
        row.kv_mib = stored_bytes(held) / 2**20
        row.waste = max(wasted, default=0)
        cap = config.cap_mib * 2**20
        limit = math.inf if past else table.context_length
        row.longest = min(limit, cap / row.bytes_per_token) if row.bytes_per_token > 0 else limit
    except (ValueError, RuntimeError) as err:
        row.status = f"failed: {err}"
    return row


def _long_run(
    model: GPT, cache: Any, prompts: torch.Tensor, config: CacheBenchConfig, past: bool
) -> Callable[[], Call]:
    """The timed long generation: its caches made fresh, untimed; then the decode that is timed."""
    steps, one = _steps(model, config, past), prompts[:1]

    def prepared() -> Call:
        held = _caches(model, cache, 1, one.shape[1] + steps)
        return lambda: _decode(model, held, one, steps)

    return prepared


def _runs_past(model: GPT, cache: Any) -> bool:
    """Whether this cache may generate past the model's context (a sink cache, with RoPE)."""
    return model.config.rope and capabilities_of(cache).past_context


def _steps(model: GPT, config: CacheBenchConfig, past: bool) -> int:
    """Tokens of the long generation: ``long_tokens``, within the context unless the cache runs past it."""
    return config.long_tokens if past else min(config.long_tokens, model.config.context_length - config.prompt_len)


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


def measure_prefix(model: GPT, *, label: str, config: CacheBenchConfig) -> CacheTable:
    """A table of the shared prefix alone (no rows): what the default asks of a model whose rows take long."""
    table = CacheTable(
        model=label,
        context_length=model.config.context_length,
        rope=model.config.rope,
        rows=[],
        held_out=0,
        recompute_perplexity=math.nan,
        prefix={},
        sink={},
        threads=torch.get_num_threads(),
    )
    try:
        table.prefix = _prefix_speed(model, config)
    except KeyboardInterrupt:
        table.left = ["shared prefix"]
    return table


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


def forecast_seconds(model: GPT, config: CacheBenchConfig, *, rows: bool = True) -> float:
    """A rough forecast of one table (``rows``: ``measure``; else ``measure_prefix``), from a probe of this
    model's decode step and prefill here, now (a second or two): enough to say "about 3 minutes" before a run.

    It counts the decode steps each part takes at the probed step time (a step under the memory counter timed
    under it), and the recomputed reference and the shared prefix's runs as prefills at the probed rate; the
    eviction and quantized caches' own work is a flat 1.5x. Good to a factor of two or so: docs/benchmarks.md
    sets it beside measured runs."""
    step, tracked, prefill_s = _probe(model, config.prompt_len)
    prefix = (3 * config.rounds + 1) * prefill_s * min(config.shared, model.config.context_length) / config.prompt_len
    if not rows:
        return prefix
    c = model.config
    n = len(variants(config.caches, config.prompt_len))
    within = min(config.long_tokens, c.context_length - config.prompt_len)
    held = min(config.held_out, c.context_length - config.prompt_len)
    batch = 1 + 0.1 * max(config.prompts, 4)  # a step of a few rows costs a little more than one
    per_row = (config.new_tokens + held) * step * batch + within * (tracked + config.rounds * step) + 4 * prefill_s
    recompute = (
        config.new_tokens * prefill_s * config.prompts * (config.prompt_len + config.new_tokens / 2) / config.prompt_len
    )
    sink = config.sink_contexts * c.context_length * tracked if _runs_sink(model, config) else 0.0
    return 1.5 * n * per_row + recompute + sink + prefix


@torch.no_grad()
def _probe(model: GPT, prompt_len: int) -> tuple[float, float, float]:
    """Seconds of one decode step (plain cache), of one under the memory counter, and of a prefill of
    ``prompt_len`` tokens: the medians of a few, after one of each untimed."""
    ids = torch.zeros(1, prompt_len, dtype=torch.long)
    held = _caches(model, "plain", 1, prompt_len + 16)
    _feed(model, held, ids)
    token = ids[:, :1]

    def timed(call: Call, n: int) -> float:
        seconds = []
        for _ in range(n):
            began = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - began)
        return statistics.median(seconds)

    step = timed(lambda: _feed(model, held, token), 5)
    with PeakMemory():
        tracked = timed(lambda: _feed(model, held, token), 3)
    prefill_s = timed(lambda: _feed(model, _caches(model, "plain", 1, prompt_len), ids), 3)
    return step, tracked, prefill_s


def to_json(tables: list[CacheTable], config: CacheBenchConfig) -> dict[str, Any]:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return str(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean({"config": asdict(config), "tables": [asdict(t) for t in tables]})


CACHE_MODELS = ("text", "gpt2-small")


def load(name: str, config: CacheBenchConfig, *, quick: bool = False) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    """The model, prompts (prompts, prompt_len) and held-out text (4, prompt_len + held_out) for one table.

    "text": the shipped text model, with windows of its held-out split (text it was not trained on).
    "gpt2-small" (or another preset): seeded random weights and random token ids (smaller under ``quick``).
    """
    from attnlab.models.config import GPTConfig
    from attnlab.models.locate import locate
    from attnlab.models.tasks import TextTask, stdlib_text

    generator = torch.Generator().manual_seed(0)
    length = config.prompt_len + config.held_out
    if name == "text":
        model = GPT.from_pretrained(locate("text")).eval()
        task = TextTask(stdlib_text(), seq_len=length)
        held_out = task.batch(4, generator, split="eval")[0]  # (4, length)
        prompts = task.batch(config.prompts, generator, split="eval")[0][:, : config.prompt_len]
        return model, prompts, held_out
    shrink = {"vocab_size": 512, "context_length": 128, "emb_dim": 64, "n_heads": 4, "n_layers": 2} if quick else {}
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(name, drop_rate=0.0, qkv_bias=True, **shrink)).eval()
    vocab = model.config.vocab_size
    held_out = torch.randint(0, vocab, (4, length), generator=generator)
    prompts = torch.randint(0, vocab, (config.prompts, config.prompt_len), generator=generator)
    return model, prompts, held_out
