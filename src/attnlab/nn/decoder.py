"""A small decoder-only language model for tests and demos, with generate().

Embeddings, a stack of pre-norm blocks (attnlab.Attention, then an MLP), a
final norm and a head. Random weights: it speaks no language, but it makes
the KV cache's promise testable: the same tokens with and without the cache.

Shapes: B = batch, T = tokens, V = vocabulary, d = d_model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache
from attnlab.functional.registry import Backend
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
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T).

        attention_mask: (B, Tk) with 1 on real tokens and 0 on (left) padding,
        covering cached and new tokens. Positions count real tokens only, so a
        left-padded sequence gets the positions it would have alone.
        """
        self._check_idx(idx)
        if int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got [{int(idx.min())}, {int(idx.max())}]"
            )
        b, t = idx.shape
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} caches (one per layer), got {len(caches)}")
        start = int(caches[0].next_positions(1)[0]) if caches else 0
        mask = None
        if attention_mask is None:
            positions = torch.arange(start, start + t, device=idx.device)
        else:
            if attention_mask.shape != (b, start + t):
                raise ValueError(
                    f"attention_mask must be (batch, cached + new tokens) = {(b, start + t)}, got {tuple(attention_mask.shape)}"
                )
            real = attention_mask.bool()
            positions = (real.long().cumsum(dim=-1) - 1).clamp(min=0)[:, start:]  # (B, T)
            mask = real[:, None, None, :]  # (B, 1, 1, Tk): key padding
        x = self.tok_emb(idx)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask=mask, positions=positions, cache=caches[layer] if caches else None)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to idx (B, T); returns (B, T + max_new_tokens).

        temperature 0 is greedy; otherwise sample from softmax(logits / temperature),
        restricted to the ``top_k`` most likely tokens if given. Pass a seeded
        ``generator`` for reproducible sampling.
        """
        self._check_idx(idx)
        check_positive_int("max_new_tokens", max_new_tokens)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise TypeError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        b, t = idx.shape
        caches = self.make_caches(batch_size=b, max_len=t + max_new_tokens) if use_cache else None
        mask = attention_mask
        logits = self(idx, attention_mask=mask, caches=caches)[:, -1]
        out = idx
        for step in range(max_new_tokens):
            next_token = self._pick(logits, temperature, top_k, generator)  # (B, 1)
            out = torch.cat([out, next_token], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if step == max_new_tokens - 1:
                break
            if caches is not None:
                logits = self(next_token, attention_mask=mask, caches=caches)[:, -1]
            else:
                logits = self(out, attention_mask=mask)[:, -1]
        return out

    @staticmethod
    def _check_idx(idx: object) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"token ids must be a torch.Tensor (batch, tokens), got {type(idx).__name__}")
        if idx.dim() != 2 or idx.dtype != torch.long:
            hint = "; for one sequence use idx.unsqueeze(0)" if idx.dim() == 1 else ""
            raise ValueError(
                f"token ids must be (batch, tokens) of dtype torch.long, got {idx.dtype} {tuple(idx.shape)}{hint}"
            )
        if idx.shape[1] == 0:
            raise ValueError(f"the prompt is empty (shape {tuple(idx.shape)}); give at least one token to start from")

    @staticmethod
    def _pick(
        logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
    ) -> torch.Tensor:
        if temperature == 0.0:
            return logits.argmax(dim=-1, keepdim=True)
        # Subtract the max before dividing: a tiny temperature then gives -inf (never NaN) to all but the best.
        logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)
