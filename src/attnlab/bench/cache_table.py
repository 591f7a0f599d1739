"""What ``attnlab bench --caches`` measures with and reports: its sizes (``CacheBenchConfig`` and the three
presets), a cache's row and a model's table, the caches and budgets measured, the lossless check, the JSON and
the models' loading (``attnlab.bench.caches`` runs it)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from attnlab.cache import CACHES
from attnlab.models.gpt import GPT

BUDGETS = (0.25, 0.5)
# A lossless cache's perplexity may differ from recomputing's by float32 rounding only (other kernels, sums in
# another order): 2.2e-8 (text model) and 1.5e-8 (gpt2-small) relative in docs/benchmarks.md's runs, room left for
# other backends; int8, the smallest real change seen, moves the text model's by 3.1e-5. So 1e-5, relative.
PPL_TOLERANCE = 1e-5


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

    @classmethod
    def empty(cls, model: GPT, label: str, *, held_out: int = 0) -> CacheTable:
        """``model``'s table before anything is measured, on torch's threads now."""
        c = model.config
        return cls(label, c.context_length, c.rope, [], held_out, math.nan, {}, {}, threads=torch.get_num_threads())


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
