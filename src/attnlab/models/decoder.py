"""A small decoder-only language model for tests and demos, with generate().

Embeddings, a stack of pre-norm blocks (attnlab.Attention, then an MLP), a
final norm and a head. Random weights: it speaks no language, but it makes
the KV cache's promise testable: the same tokens with and without the cache.

Shapes: B = batch, T = tokens, V = vocabulary, d = d_model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache
from attnlab.functional.registry import Backend
from attnlab.models.generate import check_prompt, generate, positions_and_padding
from attnlab.nn.attention import Attention


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    window: int | None = None
    backend: Backend = "auto"


class Block(nn.Module):
    attn: Attention

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(
            d_in=config.d_model,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            window=config.window,
            rope=True,
            backend=config.backend,
        )
        self.norm_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(), nn.Linear(4 * config.d_model, config.d_model)
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Cache | None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), mask=mask, positions=positions, cache=cache)
        return x + self.mlp(self.norm_2(x))


class TinyDecoder(nn.Module):
    """A decoder-only transformer built from ``attnlab.Attention``."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        check_positive_int("vocab_size", config.vocab_size)
        check_positive_int("num_layers", config.num_layers)
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.num_layers)])
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def make_caches(self, *, batch_size: int, max_len: int) -> list[Cache]:
        blocks = [cast(Block, block) for block in self.blocks]  # nn.ModuleList yields plain Modules
        return [block.attn.make_cache(batch_size=batch_size, max_len=max_len) for block in blocks]

    def forward(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        caches: list[Cache] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T); (B, 1, V) with ``last_only``.

        attention_mask: (B, Tk) with 1 on real tokens and 0 on (left) padding,
        covering cached and new tokens. Positions count real tokens only, so a
        left-padded sequence gets the positions it would have alone.
        """
        check_prompt(idx, vocab_size=self.config.vocab_size)
        positions, mask = positions_and_padding(idx, attention_mask, caches, layers=len(self.blocks))
        x = self.tok_emb(idx)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask=mask, positions=positions, cache=caches[layer] if caches else None)
        if last_only:
            x = x[:, -1:]  # (B, 1, d)
        return self.head(self.norm(x))

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append up to ``max_new_tokens`` tokens to idx (B, T): see :func:`attnlab.models.generate.generate`."""
        return generate(
            self,
            idx,
            max_new_tokens,
            attention_mask=attention_mask,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            use_cache=use_cache,
            generator=generator,
        )
