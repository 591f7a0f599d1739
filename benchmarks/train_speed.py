"""Issue 12: training throughput of attnlab's GPT against a plain PyTorch GPT of the same shape, same batch, same run.

    .venv/bin/python benchmarks/train_speed.py [--rounds 7] [--steps 10] [--threads 2]

The peer is written here the way nanoGPT writes one: a fused qkv Linear,
``F.scaled_dot_product_attention(is_causal=True)``, pre-LayerNorm blocks, a
GELU MLP; nothing of attnlab's. Both models get the same weights (copied),
the same batches and the same AdamW, and one step is forward, backward and
the optimizer. Rounds interleave the two (alternating which goes first); the
figure is the median over rounds of the per-round ratio of tokens/s, with
the spread of those ratios; a spread over 25% is called too noisy to trust.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from _verdicts import judged
from attnlab.bench.timing import NOISY, interleaved
from attnlab.models import GPT, GPTConfig
from attnlab.models.tasks import TASK_MODELS
from attnlab.nn.attention import Attention

SHAPES = {"induction": (TASK_MODELS["induction"], 32), "text": (TASK_MODELS["text"], 32)}
TARGET = 0.95  # issue 12: attnlab trains at least this fraction of the plain GPT's tokens/s


class PlainBlock(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c.emb_dim), nn.LayerNorm(c.emb_dim)
        self.c_attn = nn.Linear(c.emb_dim, 3 * c.emb_dim, bias=c.qkv_bias)
        self.c_proj = nn.Linear(c.emb_dim, c.emb_dim)
        self.mlp = nn.Sequential(
            nn.Linear(c.emb_dim, 4 * c.emb_dim), nn.GELU(approximate="tanh"), nn.Linear(4 * c.emb_dim, c.emb_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(e, dim=-1)  # (B, T, 3E) -> 3 x (B, T, E)
        q, k, v = (z.view(b, t, self.heads, e // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, e))  # (B, H, T, D) -> (B, T, E)
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.emb_dim), nn.Embedding(c.context_length, c.emb_dim)
        self.h = nn.ModuleList(PlainBlock(c) for _ in range(c.n_layers))
        self.blocks: list[PlainBlock] = [b for b in self.h if isinstance(b, PlainBlock)]  # typed ModuleList items
        self.ln_f = nn.LayerNorm(c.emb_dim)
        self.lm_head = nn.Linear(c.emb_dim, c.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))  # (B, T, E)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def copy_weights(ours: GPT, plain: PlainGPT) -> None:
    """The same numbers in both, so both do the same arithmetic (checked: equal logits)."""
    assert ours.pos_emb is not None, "the plain GPT has learned positions"
    with torch.no_grad():
        plain.wte.weight.copy_(ours.tok_emb.weight)
        plain.wpe.weight.copy_(ours.pos_emb.weight)
        for mine, theirs in zip(ours.blocks, plain.blocks, strict=True):
            assert isinstance(mine.att, Attention)  # GPT-2's block: softmax attention
            theirs.ln_1.load_state_dict(mine.norm1.state_dict())
            theirs.ln_2.load_state_dict(mine.norm2.state_dict())
            theirs.c_attn.load_state_dict(mine.att.qkv.state_dict())
            theirs.c_proj.load_state_dict(mine.att.out_proj.state_dict())
            theirs.mlp.load_state_dict(mine.ff.state_dict())
        plain.ln_f.load_state_dict(ours.final_norm.state_dict())
        plain.lm_head.load_state_dict(ours.out_head.state_dict())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="training steps per model per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, one round of one step: that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps = 1, 1
        SHAPES["smoke"] = (
            GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1, drop_rate=0.0),
            2,
        )
        args.shapes = ["smoke"]
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; {args.rounds} interleaved rounds of {args.steps} steps")
    for name in args.shapes:
        config, batch = SHAPES[name]
        torch.manual_seed(0)
        ours = GPT(config)
        plain = PlainGPT(config)
        copy_weights(ours, plain)
        idx = torch.randint(0, config.vocab_size, (batch, config.context_length))
        assert torch.allclose(ours(idx), plain(idx), atol=1e-4), "the two models must compute the same thing"
        ours.train(), plain.train()
        models = {"attnlab": ours, "plain": plain}
        optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
        batches = [torch.randint(0, config.vocab_size, (batch, config.context_length + 1)) for _ in range(args.steps)]

        def steps(key: str) -> None:
            model, opt = models[key], optims[key]
            for seq in batches:
                logits = model(seq[:, :-1])  # (B, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        # one warm-up each, then rounds alternating which goes first
        seconds = interleaved({key: functools.partial(steps, key) for key in models}, args.rounds)
        tokens = args.steps * batch * config.context_length
        rates = {key: [tokens / s for s in taken] for key, taken in seconds.items()}  # tokens/s
        ratios = [a / p for a, p in zip(rates["attnlab"], rates["plain"], strict=True)]
        ratio = statistics.median(ratios)
        spread = (max(ratios) - min(ratios)) / ratio
        verdict = "too noisy to trust" if spread > NOISY else "ok"
        c = config
        print(
            f"{name}: {c.n_layers} layers, {c.emb_dim} dims, {c.n_heads} heads, batch {batch} x {c.context_length}: "
            f"attnlab {statistics.median(rates['attnlab']):,.0f} tok/s, plain {statistics.median(rates['plain']):,.0f} "
            f"tok/s; ratio {ratio:.2f}x (per-round {min(ratios):.2f}..{max(ratios):.2f}, spread {spread:.0%}: {verdict})"
        )
        print(f"  target at least {TARGET}x plain: {judged(ratio, TARGET, spread, whose='the rounds')}")


if __name__ == "__main__":
    main()
