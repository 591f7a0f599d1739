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

import math
from collections.abc import Callable
from typing import Any

import torch

from attnlab.bench.cache_metrics import (
    SINK,
    _caches,
    _decode,
    _generate,
    _held_bytes,
    _prefix_speed,
    _probe,
    _sink_run,
    perplexity,
    quantized_reads,
    recomputed_perplexity,
)
from attnlab.bench.cache_table import CacheBenchConfig, CacheRow, CacheTable, lossless_mismatch, variants
from attnlab.bench.memory import PeakMemory
from attnlab.bench.timing import Call, timed_rounds
from attnlab.cache import LOSSLESS, capabilities_of, stored_bytes
from attnlab.models.gpt import GPT

Progress = Callable[[int, int, str], None]  # (steps done, steps in all, what runs now)


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
    factories = dict(variants(config.caches, config.prompt_len))
    past = {name: _runs_past(model, cache) for name, cache in factories.items()}
    held_out = held_out[
        :, : model.config.context_length
    ]  # within the context: past it only a sink cache is meant to go
    table = CacheTable.empty(model, label, held_out=held_out.shape[1] - config.prompt_len)
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


def measure_prefix(model: GPT, *, label: str, config: CacheBenchConfig) -> CacheTable:
    """A table of the shared prefix alone (no rows): what the default asks of a model whose rows take long."""
    table = CacheTable.empty(model, label)
    try:
        table.prefix = _prefix_speed(model, config)
    except KeyboardInterrupt:
        table.left = ["shared prefix"]
    return table


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
