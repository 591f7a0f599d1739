"""The decoder's parts: its norms, its MLPs and the block that holds them, each chosen by ``GPTConfig``.

A block is the book's ``TransformerBlock`` in its names (``norm1``, ``att``, ``drop_resid``, ``norm2``, ``ff``),
whatever the family:

- GPT-2 (chapter 4): LayerNorm before each sublayer, a 4x GELU MLP (``ff.0``, ``ff.2``) with biases;
- Llama 3, Mistral, Qwen2 and Qwen3 (the book's Llama 3 and Qwen3 chapters): RMSNorm before each sublayer and
  the gated ``FeedForward`` (``fc1`` the gate, ``fc2`` up, ``fc3`` down), no biases;
- ``norm_placement="post"`` (OLMo 2): each sublayer's output is normed before it is added back.

The attention is ``attnlab.Attention`` with the layer's own window from the config's pattern, so every backend,
cache and the Recorder work in every family.

Shapes: B = batch, T = tokens, E = emb_dim, F = the MLP's hidden width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.cache import Cache
from attnlab.functional.visibility import Visibility
from attnlab.models.config import GPTConfig
from attnlab.nn.attention import Attention


def make_norm(config: GPTConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` (emb_dim): LayerNorm (GPT-2's, with a shift) or RMSNorm (scale only)."""
    size = config.emb_dim if size is None else size
    if config.norm == "rmsnorm":
        return nn.RMSNorm(size, eps=config.layer_norm_eps)
    return nn.LayerNorm(size, eps=config.layer_norm_eps)


class FeedForward(nn.Module):
    """The book's Llama 3 FeedForward, SwiGLU (Shazeer, 2020): fc3(silu(fc1(x)) * fc2(x)), (B, T, E) -> (B, T, E)."""

    def __init__(self, *, emb_dim: int, hidden_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(emb_dim, hidden_dim, bias=bias)  # the gate (Hugging Face's gate_proj)
        self.fc2 = nn.Linear(emb_dim, hidden_dim, bias=bias)  # up_proj
        self.fc3 = nn.Linear(hidden_dim, emb_dim, bias=bias)  # down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(nn.functional.silu(self.fc1(x)) * self.fc2(x))  # (B, T, F) -> (B, T, E)


def make_mlp(config: GPTConfig) -> nn.Module:
    """GPT-2's GELU MLP (``ff.0``, ``ff.2``: the names its checkpoints keep) or the gated FeedForward."""
    e, f = config.emb_dim, config.ff_dim
    if config.mlp == "swiglu":
        return FeedForward(emb_dim=e, hidden_dim=f, bias=config.bias)
    return nn.Sequential(
        nn.Linear(e, f, bias=config.bias), nn.GELU(approximate="tanh"), nn.Linear(f, e, bias=config.bias)
    )


class TransformerBlock(nn.Module):
    """Pre-norm: x + drop(att(norm1(x))), then x + drop(ff(norm2(x))); post-norm: x + drop(norm1(att(x))), then
    x + drop(norm2(ff(x))). Layer ``layer`` of the config's pattern: full attention, or its sliding window."""

    def __init__(self, config: GPTConfig, *, layer: int = 0) -> None:
        super().__init__()
        e = config.emb_dim
        self.post_norm = config.norm_placement == "post"
        self.norm1 = make_norm(config)
        self.att = Attention(
            d_in=e,
            num_heads=config.n_heads,
            num_kv_heads=config.n_kv_heads,
            head_dim=config.d_head,
            qkv_bias=config.qkv_bias,
            out_bias=config.bias,
            dropout=config.drop_rate,
            is_causal=True,
            window=config.layer_window(layer),
            rope=config.rope,
            rope_base=float(config.rope_base),
            rope_scaling=config.rope_scaling,
            rotary_dim=config.rotary_dim,
            qk_norm=config.qk_norm,
            norm_eps=config.layer_norm_eps,
            backend=config.backend,
        )
        self.drop_resid = nn.Dropout(config.drop_rate)
        self.norm2 = make_norm(config)
        self.ff = make_mlp(config)

    def forward(
        self, x: torch.Tensor, *, visibility: Visibility, positions: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor:
        if self.post_norm:
            x = x + self.drop_resid(self.norm1(self.att(x, visibility=visibility, positions=positions, cache=cache)))
            return x + self.drop_resid(self.norm2(self.ff(x)))
        x = x + self.drop_resid(self.att(self.norm1(x), visibility=visibility, positions=positions, cache=cache))
        return x + self.drop_resid(self.ff(self.norm2(x)))
