"""Issue 4: what the KV cache buys, measured as ratios in one run.

    .venv/bin/python benchmarks/kv_cache.py [--new-tokens 512] [--repeats 25] [--rounds 3] [--smoke]

1. Tokens/s generating ``--new-tokens`` tokens with a RoPE GPT (greedy),
   with attnlab's KVCache, with a concatenating cache like the book's
   reference code (torch.cat every step), and with no cache at all.
2. The attention layer's time for one decode step at growing positions
   (Attention(d_in=768, num_heads=12), 12 and 4 kv heads, batch 1), median
   of ``--repeats``, beside a raw-torch floor doing the same work.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attnlab import Attention
from attnlab.bench.timing import interleaved, timed_rounds
from attnlab.cache import Capabilities, KVCache
from attnlab.models import GPT, GPTConfig


class ConcatCache:
    """The naive cache, through the same protocol (attnlab.cache.Cache): torch.cat onto the whole past, every step."""

    capabilities = Capabilities(crop=True)

    def __init__(self) -> None:
        self.k_all: torch.Tensor | None = None
        self.v_all: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k_all is None else self.k_all.shape[2]

    def next_positions(self, t: int) -> torch.Tensor:
        return torch.arange(self.length, self.length + t)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.k_all = k if self.k_all is None else torch.cat([self.k_all, k], dim=2)  # copies the whole past
        self.v_all = v if self.v_all is None else torch.cat([self.v_all, v], dim=2)
        return self.k_all, self.v_all, torch.arange(self.length)

    def crop(self, n: int) -> None:
        assert self.k_all is not None and self.v_all is not None
        self.k_all, self.v_all = self.k_all[:, :, :n], self.v_all[:, :, :n]

    def room(self) -> int | None:
        return None  # any number of tokens a call

    def observe(self, *args: object, **kwargs: object) -> None:
        """It weighs nothing (capabilities.observes is False)."""


def generation(new_tokens: int, d_model: int, layers: int, heads: int, rounds: int) -> None:
    """Each way generates once to check its tokens against no cache (and to warm up), then ``rounds`` interleaved
    timed runs; medians."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=512, context_length=16 + new_tokens, emb_dim=d_model, n_layers=layers, n_heads=heads, rope=True
    )
    model = GPT(config).eval()
    prompt = torch.randint(0, 512, (1, 16))

    def concatenating() -> torch.Tensor:
        caches = [ConcatCache() for _ in range(layers)]
        logits = model(prompt, caches=caches)[:, -1]
        out = prompt
        for _ in range(new_tokens):
            token = logits.argmax(-1, keepdim=True)
            out = torch.cat([out, token], dim=1)
            logits = model(token, caches=caches)[:, -1]
        return out

    ways: dict[str, Callable[[], torch.Tensor]] = {
        "KVCache": lambda: model.generate(prompt, new_tokens, use_cache=True),
        "concatenating cache": concatenating,
        "no cache": lambda: model.generate(prompt, new_tokens, use_cache=False),
    }
    with torch.no_grad():
        reference = ways["no cache"]()
        for name, way in ways.items():  # checked first: the same tokens, or it is not timed
            assert torch.equal(way(), reference), f"{name} generates other tokens than no cache"
        times = interleaved(ways, rounds, warmup=0)  # the check above was each one's warm-up
    rates = {name: new_tokens / statistics.median(ts) for name, ts in times.items()}
    print(
        f"\ngenerate {new_tokens} new tokens, GPT (RoPE) d={d_model}, {layers} layers, {heads} heads, prompt 16, greedy; "
        f"tokens checked equal, median of {rounds} interleaved rounds"
    )
    for name, rate in rates.items():
        print(f"  {name:22s} {rate:8.1f} tokens/s   {rate / rates['no cache']:6.1f}x no cache")


def _median_step(step: Callable[[], object], reset: Callable[[], None], repeats: int) -> float:
    """The median of ``repeats`` timed steps (3 warm-up steps first), ``reset`` untimed before each."""

    def prepared() -> Callable[[], object]:
        reset()
        return step

    return statistics.median(took["step"] for took in timed_rounds({"step": prepared}, repeats, warmup=3))


def step_latency(repeats: int, positions: tuple[int, ...]) -> None:
    """One decode step at growing positions, three ways, for MHA (12 kv heads) and GQA (4 kv heads).

    "raw floor" does the same work with bare torch calls on a preallocated
    cache (QKV linear, SDPA over the cache, out linear) and no attnlab at all:
    the cost any implementation that reads the cache pays.
    """
    for kv_heads in (12, 4):
        torch.manual_seed(0)
        attn = Attention(d_in=768, num_heads=12, num_kv_heads=kv_heads).eval()
        print(
            f"\none decode step of Attention(d_in=768, num_heads=12, num_kv_heads={kv_heads}), batch 1, "
            f"median of {repeats}"
        )
        times: dict[str, dict[int, float]] = {"KVCache": {}, "concatenating cache": {}, "raw floor": {}}
        x = torch.randn(1, 1, 768)
        with torch.no_grad():
            for pos in positions:
                for name in times:
                    if name == "raw floor":
                        k_buf, v_buf = torch.randn(1, kv_heads, pos + 1, 64), torch.randn(1, kv_heads, pos + 1, 64)
                        q = torch.randn(1, 12, 1, 64)

                        def raw() -> object:
                            attn.qkv(x)
                            o = F.scaled_dot_product_attention(q, k_buf, v_buf, enable_gqa=kv_heads != 12)
                            return attn.out_proj(o.transpose(1, 2).reshape(1, 1, 768))

                        times[name][pos] = _median_step(raw, lambda: None, repeats)
                        continue
                    cache: KVCache | ConcatCache = (
                        KVCache(batch_size=1, num_kv_heads=kv_heads, head_dim=64, max_len=pos + 1)
                        if name == "KVCache"
                        else ConcatCache()
                    )
                    past = torch.randn(1, pos, 768, generator=torch.Generator().manual_seed(pos))
                    attn(past, cache=cache)
                    step = attn(x, cache=cache)
                    whole = attn(torch.cat([past, x], dim=1))[:, -1:]  # checked: the step equals no cache
                    assert torch.allclose(step, whole, atol=1e-5), f"{name} step at {pos} differs from no cache"
                    cache.crop(pos)
                    times[name][pos] = _median_step(lambda: attn(x, cache=cache), lambda: cache.crop(pos), repeats)
        for name, row in times.items():
            cells = "  ".join(f"{p}: {t * 1e6:6.0f} us" for p, t in row.items())
            ratio = row[positions[-1]] / row[positions[0]]
            print(f"  {name:20s} {cells}   {positions[-1]}/{positions[0]} = {ratio:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed generations per way (default 3)")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: that every step runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.new_tokens, args.repeats, args.rounds, args.d_model, args.layers, args.heads = 8, 1, 1, 48, 1, 12
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.new_tokens:
        generation(args.new_tokens, args.d_model, args.layers, args.heads, args.rounds)
    step_latency(args.repeats, positions=(8, 16) if args.smoke else (128, 512, 1024, 2048))


if __name__ == "__main__":
    main()
