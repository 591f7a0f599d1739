"""attnlab bench --caches: every cache measured through itself, the lossless ones held to recomputing (no cache)
in tokens and perplexity, and the verdicts read from the numbers (issue 30); a target the sizes cannot judge is
not established, and an interrupted run keeps the rows it finished (issue 31)."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attnlab.bench.cache_metrics import _sink_run, quantized_reads
from attnlab.bench.cache_table import DEFAULT_CACHES, FULL_CACHES, PPL_TOLERANCE, QUICK_CACHES, CacheRow, CacheTable
from attnlab.bench.cache_verdicts import MIN_QUANTIZED, MIN_ROUNDS, PREFIX_TOKENS, SINK_CONTEXTS, verdicts
from attnlab.bench.caches import measure
from attnlab.cache import CACHES, KVCache
from attnlab.models import GPT, GPTConfig

PROMPT, TEXT = 20, 32  # a prompt of one full block and 4 tokens (so a warm prefix cache shares a block), 12 scored
CONFIG = replace(QUICK_CACHES, prompt_len=PROMPT, held_out=TEXT - PROMPT, new_tokens=4, long_tokens=6, shared=16)


def model() -> GPT:
    """Learned positions: no sink run to four contexts (a minute here, and flat by construction); a context of 64, the
    tokens the bytes per token are counted over."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


def ids(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


def small_int4(monkeypatch: pytest.MonkeyPatch) -> None:
    """int4 with groups of 4 and 4 exact tokens, so that 32 tokens of text are mostly quantized."""
    monkeypatch.setitem(CACHES, "int4", functools.partial(CACHES["int4"], group_size=4, residual=4))


@torch.no_grad()
def nll_perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return math.exp(float(F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten())))


@torch.no_grad()
def through(m: GPT, cache: str, text: torch.Tensor) -> float:
    """The text's perplexity after PROMPT tokens, fed one token a step through caches by ``cache``'s name."""
    caches = m.make_caches(batch_size=text.shape[0], max_len=text.shape[1], cache=cache)
    logits = [m(text[:, :PROMPT], caches=caches, last_only=True)]  # as the benchmark: the last position alone
    logits += [m(text[:, p : p + 1], caches=caches) for p in range(PROMPT, text.shape[1] - 1)]
    return nll_perplexity(torch.cat(logits, dim=1), text[:, PROMPT:])


def test_every_cache_is_measured_through_itself_and_the_lossless_ones_equal_recomputing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small_int4(monkeypatch)
    m, prompts, text = model(), ids(2, PROMPT, seed=1), ids(2, TEXT, seed=2)
    table = measure(m, label="tiny", prompts=prompts, held_out=text, config=CONFIG)
    rows = {r.cache: r for r in table.rows}
    assert all(r.status == "ok" for r in table.rows), [r.status for r in table.rows]
    with torch.no_grad():  # the reference, computed here: no cache, one causal forward over the text
        recomputed = nll_perplexity(m(text)[:, PROMPT - 1 : -1], text[:, PROMPT:])
    assert table.recompute_perplexity == pytest.approx(recomputed, rel=1e-12)
    for name in ("plain", "paged", "prefix"):
        assert rows[name].agreement == 1.0
        assert rows[name].perplexity == pytest.approx(recomputed, rel=PPL_TOLERANCE)
    # each lossy cache through its own cache: int4 as fed here, and a quarter budget is not the whole text
    assert rows["int4"].perplexity == pytest.approx(through(m, "int4", text), rel=1e-9)
    for name in ("int4", "h2o 25%", "snapkv 25% of prompt"):
        assert abs(rows[name].perplexity / recomputed - 1) > 10 * PPL_TOLERANCE, name
        assert rows[name].perplexity_increase == pytest.approx(rows[name].perplexity / recomputed - 1)
    per_token = 2 * 2 * 4 * 8 * 4  # layers x (k, v) x kv heads x head_dim x float32 bytes
    assert rows["plain"].bytes_per_token == per_token
    assert rows["sink"].bytes_per_token == 0 and rows["paged"].waste < 16
    lines = verdicts(table)
    for name in ("plain", "paged", "prefix"):
        assert any(
            line.startswith(f"met: {name} gives recomputing's tokens and perplexity (100% of 8 tokens")
            for line in lines
        )
    assert any(line.startswith("by construction: sink holds 64 tokens") for line in lines)
    # int8 keeps its latest 32 tokens exact: over these 32 it read no codes, so its perplexity judges nothing;
    # int4 here keeps 4, so most of what it read was codes
    assert rows["int8"].quantized_reads == 0.0 and rows["int4"].quantized_reads is not None
    assert rows["int4"].quantized_reads > MIN_QUANTIZED and rows["plain"].quantized_reads is None
    assert any(line.startswith("not established: int8") and "read 0% of their keys quantized" in line for line in lines)
    assert not any(line.startswith("not established: int4") for line in lines)


class _Nudged(KVCache):
    """A plain cache that returns its values 1% too large: the tokens may survive, the perplexity does not."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, positions = super().update(k, v)
        return keys, values * 1.01, positions


def test_a_broken_plain_cache_is_a_failed_row_not_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    def nudged(*, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int, **rest: object) -> KVCache:
        return _Nudged(batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, max_len=max_len)

    monkeypatch.setitem(CACHES, "plain", nudged)
    config = replace(CONFIG, caches=("plain", "paged"))
    table = measure(model(), label="tiny", prompts=ids(2, PROMPT, seed=1), held_out=ids(2, TEXT, seed=2), config=config)
    rows = {r.cache: r for r in table.rows}
    assert rows["plain"].status.startswith("failed: a lossless cache ")
    assert "recomputing" in rows["plain"].status
    assert rows["paged"].status == "ok"
    lines = verdicts(table)
    assert any(line.startswith("failed: plain is lossless but ") for line in lines), lines
    assert any(line.startswith("met: paged gives recomputing's tokens") for line in lines)


def row(cache: str, **numbers: float) -> CacheRow:
    return CacheRow(cache=cache, **{"agreement": 1.0, "perplexity": 10.0, "bytes_per_token": 4096.0, **numbers})


def table(*rows: CacheRow, cold_ms: float = 800.0, spread: float = 0.1, peak_4x: float = 1.3) -> CacheTable:
    """Typed-in figures: a recomputed perplexity of 10, a 512-token prefix warm in 100 ms (3 rounds), a sink run
    of 4 contexts."""
    return CacheTable(
        model="typed",
        context_length=256,
        rope=True,
        rows=list(rows),
        held_out=192,
        recompute_perplexity=10.0,
        prefix={
            "shared": 512,
            "cold_ms": cold_ms,
            "warm_ms": 100.0,
            "ratio": cold_ms / 100,
            "spread": spread,
            "rounds": 3,
        },
        sink={
            "tokens": 1024,
            "contexts": 4,
            "peak_mib_1x": 1.3,
            "peak_mib_end": peak_4x,
            "kv_mib_1x": 1.0,
            "kv_mib_end": 1.0,
        },
        threads=2,
    )


def test_the_verdicts_are_read_from_the_numbers() -> None:
    good = table(
        row("plain"),
        row("paged", perplexity=10.00005, waste=3),  # 5e-6: float rounding
        row("prefix"),
        row("int8", perplexity_increase=0.004, bytes_per_token=1152),  # 3.56x less
        row("int4", perplexity_increase=0.015, bytes_per_token=640),  # 6.4x less
    )
    said = verdicts(good)
    assert not [line for line in said if line.startswith(("NOT met", "failed", "not established"))], said
    for target in ("plain gives", "paged gives", "prefix gives", "paged waste", "a shared 512-token", "int8", "int4"):
        assert any(line.startswith(f"met: {target}") for line in said), target
    assert any(line.startswith("met: a sink cache generates 4x") for line in said)

    bad = table(
        row("plain", perplexity=10.0002),  # 2e-5: beyond float rounding
        row("paged", agreement=0.98, waste=16),
        row("prefix", status="failed: RuntimeError: the pool is full"),
        row("int8", perplexity_increase=0.004, bytes_per_token=1500),  # 2.73x less only
        row("int4", perplexity_increase=0.03, bytes_per_token=640),  # +3% over its +2%
        cold_ms=400.0,  # 4x
        peak_4x=2.0,
    )
    said = verdicts(bad)
    assert "failed: plain is lossless but perplexity 10.0002 against recomputing's 10 (+0.0020%, " in "\n".join(said)
    assert any(
        line.startswith("failed: paged is lossless but gave other tokens than recomputing (98.0%") for line in said
    )
    assert "failed: prefix is lossless but failed: RuntimeError: the pool is full" in said
    # the int caches are judged against plain's bytes: a failed plain row leaves them not established
    assert any(line.startswith("not established: int8") for line in verdicts(replace(bad, rows=bad.rows[1:])))
    bad.rows[0] = row("plain")
    said = verdicts(bad)
    for target in ("a shared 512-token prefix", "int8", "int4", "a sink cache generates 4x"):
        assert any(line.startswith(f"NOT met: {target}") for line in said), (target, said)
    noisy = verdicts(table(row("plain"), cold_ms=400.0, spread=0.4))
    assert any(line.startswith("not established: a shared 512-token") and "spread 40%" in line for line in noisy)


def test_a_target_the_figures_cannot_judge_is_not_established_never_met() -> None:
    """Each target with figures that would pass, but measured at a size that cannot judge it: a prefix shorter
    than 512 tokens, one timing round, a quantized cache that read mostly exact keys, a sink run of 2 contexts, a
    sink run or prefix that did not happen (not run at this size; interrupted)."""
    good = table(
        row("plain"),
        row("sink"),
        row("int8", perplexity_increase=0.001, bytes_per_token=1152, quantized_reads=0.2),
        row("int4", perplexity_increase=0.001, bytes_per_token=640, quantized_reads=0.7),
        cold_ms=2000.0,
    )
    assert any(line.startswith("met: int4") and "read 70% of their keys quantized" in line for line in verdicts(good))

    def said(t: CacheTable, target: str) -> str:
        (line,) = [line for line in verdicts(t) if target in line]
        return line

    assert said(good, "int8").startswith("not established: int8") and "too short a text" in said(good, "int8")
    short = replace(good, prefix={**good.prefix, "shared": 239})
    assert said(short, "prefix").startswith(f"not established: a shared {PREFIX_TOKENS}-token prefix")
    assert "239 shared tokens" in said(short, "prefix") and "20.0x" in said(short, "prefix")
    one = replace(good, prefix={**good.prefix, "rounds": MIN_ROUNDS - 1})
    assert said(one, "prefix").startswith("not established") and "no spread to judge the noise by" in said(
        one, "prefix"
    )
    assert said(good, "prefix") == (  # the threads too: the ratio depends on them
        "met: a shared 512-token prefix answers at least 5x faster (512 shared tokens: 2000 ms computed, 100 ms "
        "shared, 20.0x, 2 threads; per-round ratios spread 10%)"
    )
    half = replace(good, sink={**good.sink, "contexts": SINK_CONTEXTS // 2, "tokens": 512})
    assert said(half, "sink cache generates").startswith("not established: a sink cache") and "2 contexts only" in said(
        half, "sink cache generates"
    )
    assert said(replace(good, sink={}), "sink cache generates").endswith("(not run at this size)")
    stopped = replace(good, sink={}, prefix={}, left=["shared prefix", "sink cache to 4 x context"])
    assert (
        said(stopped, "prefix")
        == f"not established: a shared {PREFIX_TOKENS}-token prefix answers at least 5x faster (interrupted before it)"
    )
    assert said(stopped, "sink cache generates").endswith("(peak within 10%) (interrupted before it)")
    learned = replace(good, rope=False, sink={})
    assert not [line for line in verdicts(learned) if "sink cache generates" in line]  # not a target there


def test_the_default_sizes_judge_every_target_and_the_quick_ones_do_not() -> None:
    """The 3-minute default keeps every target judgeable (on models of the text model's and gpt2-small's
    contexts): the quantized caches' perplexity steps read mostly codes, the sink runs 4 contexts, the prefix is
    512 tokens over 3 rounds. The smoke run is too small for any of these, so its verdicts say not established."""
    from attnlab.bench.cache_table import CACHE_MODELS

    torch.manual_seed(0)
    text_shaped = GPT(GPTConfig(vocab_size=64, context_length=256, emb_dim=32, n_heads=4, n_layers=1, rope=True))
    for config, judged in ((DEFAULT_CACHES, True), (FULL_CACHES, True), (QUICK_CACHES, False)):
        n = min(256, config.prompt_len + config.held_out)
        for name in ("int8", "int4"):
            reads = quantized_reads(text_shaped, name, n, config.prompt_len)
            assert reads is not None and (reads >= MIN_QUANTIZED) is judged, (config, name, reads)
        assert (config.sink_contexts >= SINK_CONTEXTS) is judged
        assert (config.shared >= PREFIX_TOKENS and config.rounds >= MIN_ROUNDS) is judged
    assert DEFAULT_CACHES.prefix_only == ("gpt2-small",) and set(DEFAULT_CACHES.caches) == set(CACHES)
    assert "text" in CACHE_MODELS and "text" not in DEFAULT_CACHES.prefix_only  # every cache's row on the text model


def test_one_sink_run_reads_its_peak_after_one_context_and_at_the_end() -> None:
    """The sink target's run: one run of 4 contexts, the peak read after the first (what a run of one context
    peaks at) and at the end; flat on a RoPE model. Context 16: 64 steps under the memory counter."""
    torch.manual_seed(0)
    rope = GPT(GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=4, n_layers=2, rope=True)).eval()
    four, one = _sink_run(rope, 4), _sink_run(rope, 1)
    assert four["tokens"] == 64 and four["contexts"] == 4 and one["tokens"] == 16
    assert four["peak_mib_1x"] == one["peak_mib_end"] > 0  # the first context of the long run is the short run
    assert four["peak_mib_end"] <= 1.1 * four["peak_mib_1x"] and four["kv_mib_end"] == four["kv_mib_1x"]


def test_an_interrupted_measurement_keeps_the_rows_it_finished_and_names_the_rest() -> None:
    """Ctrl-C (KeyboardInterrupt) while the third cache is measured: the first two are whole rows, the third is
    not a row, and everything after it is named as left, in order; each step was announced before it ran."""
    said: list[tuple[int, int, str]] = []

    def progress(done: int, total: int, what: str) -> None:
        said.append((done, total, what))
        if what == "tiny: prefix":
            raise KeyboardInterrupt

    config = replace(CONFIG, caches=("plain", "paged", "prefix", "int8"))
    table = measure(
        model(),
        label="tiny",
        prompts=ids(2, PROMPT, seed=1),
        held_out=ids(2, TEXT, seed=2),
        config=config,
        progress=progress,
    )
    assert [r.cache for r in table.rows] == ["plain", "paged"] and all(r.status == "ok" for r in table.rows)
    assert table.rows[1].agreement == 1.0 and table.rows[1].bytes_per_token > 0
    assert table.left == ["prefix", "int8", "timing round 1 of 1", "shared prefix"]
    assert said == [
        (0, 6, "tiny: recomputing, the reference"),
        (0, 6, "tiny: plain"),
        (1, 6, "tiny: paged"),
        (2, 6, "tiny: prefix"),
    ]
    lines = verdicts(table)
    assert any(line.startswith("met: paged gives recomputing's tokens") for line in lines)
    assert any(line.startswith("not established: a shared 512-token prefix") for line in lines)
