"""``attnlab bench --model``: a whole GPT generating, against Hugging Face and the book's cached GPT.

Method: the parent builds one seeded GPT (gpt2-small shape by default) and
writes its weights once, as a Hugging Face directory and as the book's state
dict. Each implementation then runs in its own process (so its peak RSS is
its own), loads those weights with its own loader, and times, after a warm-up:

- prefill: one forward pass over the prompt, filling the cache, as each one's
  generate does it (logits of the last position only, where it can) (median of 3);
- decode: generating ``new_tokens`` greedily with its own generate, minus the
  prefill; reported as tokens per second.

Before any number is kept, each implementation's greedy tokens are compared
with attnlab's: one that differs is refused. Rounds run the implementations
in turn (rotated each round), so a busy moment touches them all.

Peers: ``transformers.GPT2LMHeadModel.generate``; the book's cached
``llms_from_scratch.kv_cache.gpt2.GPTModel`` driven by the loop of its
``generate_text_simple`` (that package's version of the function calls a
``reset_kv_cache`` its model lacks, so the loop is written out here); and the
book's chapter 5 ``generate`` on chapter 4's ``GPTModel``, with no cache.
"""

from __future__ import annotations

import json
import resource
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families.book import book_state_dict
from attnlab.models.gpt import GPT

MODEL_IMPLS = ("attnlab", "hf-generate", "book-kv-cache", "book-ch05")
ONE_ROUND = ("book-ch05",)  # recomputes the whole context every step: minutes per run, so it runs once


@dataclass(frozen=True, kw_only=True)
class ModelBenchConfig:
    preset: str = "gpt2-small"
    prompt_len: int = 128
    new_tokens: int = 256
    rounds: int = 3
    slow_tokens: int = 32  # the uncached chapter 5 run generates this many (its rate is per token): minutes saved
    threads: int | None = None
    overrides: dict[str, int] = field(default_factory=dict)  # GPTConfig fields (the quick run shrinks the model)

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.preset(self.preset, drop_rate=0.0, qkv_bias=True, **self.overrides)


QUICK_MODEL = ModelBenchConfig(
    preset="gpt2-small",
    prompt_len=16,
    new_tokens=24,
    rounds=1,
    overrides={"vocab_size": 512, "context_length": 64, "emb_dim": 64, "n_heads": 4, "n_layers": 2},
)


@dataclass
class ModelCase:
    impl: str
    status: str = "ok"
    prefill_ms: list[float] = field(default_factory=list)  # one median per round
    decode_tokens_per_s: list[float] = field(default_factory=list)
    peak_rss_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.prefill_ms)

    def median(self, values: list[float]) -> float | None:
        return statistics.median(values) if values else None


def write_weights(config: ModelBenchConfig, folder: Path) -> None:
    """One seeded GPT, saved as a Hugging Face directory and as the book's state dict (book.pth)."""
    torch.manual_seed(0)
    model = GPT(config.gpt_config()).eval()
    model.save_pretrained(folder)
    torch.save(book_state_dict(model), folder / "book.pth")


def _prompt(config: GPTConfig, length: int) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))


def model_case(spec: dict[str, Any]) -> dict[str, Any]:
    """In a worker process: load one implementation, check its tokens, time prefill and decode."""
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    folder, impl, new = Path(spec["folder"]), spec["impl"], spec["new_tokens"]
    config = GPTConfig.from_dict(spec["config"])
    idx = _prompt(config, spec["prompt_len"])
    if impl == "attnlab":
        ours = GPT.from_pretrained(folder)

        def prefill() -> object:  # as generate() does it: the cache filled, logits of the last position
            return ours(idx, caches=ours.make_caches(batch_size=1, max_len=idx.shape[1] + new), last_only=True)

        def generate(n: int) -> torch.Tensor:
            return ours.generate(idx, n)

    elif impl == "hf-generate":
        from transformers import GPT2LMHeadModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf = GPT2LMHeadModel.from_pretrained(folder).eval()
        ones = torch.ones_like(idx)

        def prefill() -> object:  # as its generate() does it: logits_to_keep=1
            return hf(idx, attention_mask=ones, use_cache=True, logits_to_keep=1)

        def generate(n: int) -> torch.Tensor:
            out = hf.generate(
                idx, attention_mask=ones, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
            return out

    elif impl == "book-kv-cache":
        from llms_from_scratch.kv_cache.gpt2 import GPTModel
        from llms_from_scratch.kv_cache.utils import KVCache

        cfg = {k: v for k, v in config.to_dict().items() if k in ("vocab_size", "context_length", "emb_dim")}
        cfg |= {"n_heads": config.n_heads, "n_layers": config.n_layers, "drop_rate": 0.0, "qkv_bias": True}
        book = GPTModel(cfg).eval()
        state = torch.load(folder / "book.pth", weights_only=True)
        book.load_state_dict({k: v for k, v in state.items() if not k.endswith(".att.mask")})  # it keeps no mask

        def prefill() -> object:
            book.current_pos = 0
            return book(idx, use_cache=True, cache=KVCache(n_layers=config.n_layers))

        def generate(n: int) -> torch.Tensor:  # generate_text_simple's cached loop
            book.current_pos = 0
            cache = KVCache(n_layers=config.n_layers)
            out = idx
            logits = book(idx, use_cache=True, cache=cache)
            for _ in range(n):
                next_idx = logits[:, -1].argmax(dim=-1, keepdim=True)
                out = torch.cat([out, next_idx], dim=1)
                logits = book(next_idx, use_cache=True, cache=cache)
            return out

    elif impl == "book-ch05":
        from llms_from_scratch.ch04 import GPTModel as BookGPT
        from llms_from_scratch.ch05 import generate as book_generate

        cfg = {k: v for k, v in config.to_dict().items() if k in ("vocab_size", "context_length", "emb_dim")}
        cfg |= {"n_heads": config.n_heads, "n_layers": config.n_layers, "drop_rate": 0.0, "qkv_bias": True}
        plain = BookGPT(cfg).eval()
        plain.load_state_dict(torch.load(folder / "book.pth", weights_only=True))

        def prefill() -> object:
            return plain(idx)

        def generate(n: int) -> torch.Tensor:  # chapter 5's generate: no cache, the whole context every step
            out: torch.Tensor = book_generate(plain, idx, n, context_size=config.context_length)
            return out

    else:
        raise ValueError(f"unknown model implementation {impl!r}; known: {list(MODEL_IMPLS)}")
    with torch.no_grad():
        generate(min(new, 8))  # warm-up
        prefill_times = []
        for _ in range(3):
            start = time.perf_counter()
            prefill()
            prefill_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        tokens = generate(new)
        total = time.perf_counter() - start
    prefill_s = statistics.median(prefill_times)
    return {
        "impl": impl,
        "tokens": tokens[0].tolist(),
        "prefill_ms": prefill_s * 1e3,
        "decode_tokens_per_s": new / max(total - prefill_s, 1e-9),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def forecast_seconds(config: ModelBenchConfig) -> float:
    """A rough forecast of the whole run, to say "about 3 minutes" before it starts (good to a factor of two).

    A cached decode step reads every weight once (float32 at about 10 GB/s here); an uncached one recomputes
    the whole context (about 50 GFLOP/s); each run starts a process that imports torch and transformers.
    """
    c = config.gpt_config()
    params = c.vocab_size * c.emb_dim * 2 + c.n_layers * 12 * c.emb_dim**2
    cached = config.new_tokens * 4 * params / 10e9 + 2 * config.prompt_len * params / 50e9
    n = min(config.new_tokens, config.slow_tokens)
    uncached = n * 2 * params * (config.prompt_len + n / 2) / 50e9
    runs = config.rounds * (len(MODEL_IMPLS) - len(ONE_ROUND)) + len(ONE_ROUND)
    return runs * 6.0 + config.rounds * (len(MODEL_IMPLS) - len(ONE_ROUND)) * cached + uncached


def run_models(config: ModelBenchConfig, *, spawn: Any, progress: Any = None) -> list[ModelCase]:
    """Every implementation, ``rounds`` times in turn; tokens checked against attnlab's before anything is kept."""
    cases = {impl: ModelCase(impl) for impl in MODEL_IMPLS}
    gpt = config.gpt_config()
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-model-") as tmp:
        folder = Path(tmp)
        write_weights(config, folder)
        reference: list[int] | None = None
        total = config.rounds * len(MODEL_IMPLS)
        for r in range(config.rounds):
            order = MODEL_IMPLS[r % len(MODEL_IMPLS) :] + MODEL_IMPLS[: r % len(MODEL_IMPLS)]
            for n, impl in enumerate(order):
                case = cases[impl]
                if case.status != "ok" or (impl in ONE_ROUND and r > 0):
                    continue  # failed or refused already, or a run that is made once
                if progress:
                    progress(r * len(MODEL_IMPLS) + n, total, f"{impl}, round {r + 1}")
                spec = {
                    "mode": "model",
                    "impl": impl,
                    "folder": str(folder),
                    "config": gpt.to_dict(),
                    "prompt_len": config.prompt_len,
                    "new_tokens": min(config.new_tokens, config.slow_tokens)
                    if impl in ONE_ROUND
                    else config.new_tokens,
                    "threads": config.threads,
                }
                answer = spawn(spec, 1800.0)
                if "tokens" not in answer:
                    case.status = answer.get("status", "failed: no answer")
                    continue
                if impl == "attnlab":
                    reference = answer["tokens"]
                elif reference is None:
                    case.status = "not checked: attnlab's own run failed, so there are no tokens to compare with"
                    continue
                elif answer["tokens"] != reference[: len(answer["tokens"])]:  # a shorter run: its prefix
                    case.status = "refused: its greedy tokens differ from attnlab's on the same weights"
                    continue
                case.prefill_ms.append(answer["prefill_ms"])
                case.decode_tokens_per_s.append(answer["decode_tokens_per_s"])
                case.peak_rss_bytes = max(case.peak_rss_bytes or 0, answer["peak_rss_bytes"])
        if progress:
            progress(total, total, "done")
    return list(cases.values())


def to_json(
    config: ModelBenchConfig, cases: list[ModelCase], *, roofline: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "schema": "attnlab.bench-model/1",
        "config": {**asdict(config), "gpt": config.gpt_config().to_dict()},
        "cases": [asdict(c) for c in cases],
        "roofline": roofline,
    }


def dumps(config: ModelBenchConfig, cases: list[ModelCase], *, roofline: dict[str, Any] | None = None) -> str:
    return json.dumps(to_json(config, cases, roofline=roofline), indent=1)
