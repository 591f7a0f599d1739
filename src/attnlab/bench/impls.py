"""The implementations ``attnlab bench`` compares, all built from one set of weights.

Every implementation computes the same function: causal multi-head
self-attention with W_query, W_key, W_value and out_proj, taken from one
seeded ``attnlab.book.MultiHeadAttention``. So outputs can be compared before
anything is timed. ``memory_model`` predicts peak bytes, so a case that would
not fit in free memory is skipped, never run into the OOM killer.

Shapes: B = batch, T = tokens, d = d_model, H = heads, D = head_dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab import book
from attnlab.bench.catalog import IMPLEMENTATIONS, Impl, memory_model
from attnlab.models.loaders import from_book_mha


class PlainSDPA(nn.Module):
    """The smallest honest module around SDPA: fused QKV, is_causal, out_proj."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))  # (B, T, d)


class TorchMHA(nn.Module):
    """torch.nn.MultiheadAttention, batch_first, causal, need_weights=False."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, h, bias=True, batch_first=True)  # in_proj_bias is zeroed in build()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)  # its convention: True = masked out
        out, _ = self.mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        return out


class WrapperThenProject(nn.Module):
    """The book's MultiHeadAttentionWrapper (H heads of width D, concatenated), then out_proj.

    The wrapper has no output projection; adding the MHA's makes it the same function.
    """

    def __init__(self, wrapper: book.MultiHeadAttentionWrapper, out_proj: nn.Linear) -> None:
        super().__init__()
        self.wrapper, self.out_proj = wrapper, out_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.wrapper(x))


def reference_weights(d: int, h: int, context_length: int, seed: int = 0) -> book.MultiHeadAttention:
    torch.manual_seed(seed)
    return book.MultiHeadAttention(d, d, context_length, 0.0, num_heads=h)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def build(name: str, ref: book.MultiHeadAttention) -> nn.Module:
    """Implementation ``name`` with the weights of ``ref``."""
    d, h = ref.d_out, ref.num_heads
    qkv = torch.cat([ref.W_query.weight, ref.W_key.weight, ref.W_value.weight], dim=0)  # (3d, d)
    if name == "book-mha":
        return ref
    if name == "book-wrapper":
        head_dim = d // h
        wrapper = book.MultiHeadAttentionWrapper(d, head_dim, ref.context_length, 0.0, num_heads=h)
        for i, head in enumerate(wrapper.heads):
            rows = slice(i * head_dim, (i + 1) * head_dim)
            for w in ("W_query", "W_key", "W_value"):
                _copy(getattr(head, w).weight, getattr(ref, w).weight[rows])
        return WrapperThenProject(wrapper, ref.out_proj)
    if name == "torch-mha":
        m = TorchMHA(d, h)
        _copy(m.mha.in_proj_weight, qkv)
        _copy(m.mha.in_proj_bias, torch.zeros(3 * d))  # the book's W_query/W_key/W_value have no bias
        _copy(m.mha.out_proj.weight, ref.out_proj.weight)
        _copy(m.mha.out_proj.bias, ref.out_proj.bias)
        return m
    if name == "plain-sdpa":
        p = PlainSDPA(d, h)
        _copy(p.qkv.weight, qkv)
        _copy(p.out_proj.weight, ref.out_proj.weight)
        _copy(p.out_proj.bias, ref.out_proj.bias)
        return p
    if name.startswith("attnlab-"):
        backend = name.removeprefix("attnlab-").removesuffix("+kvcache")
        return from_book_mha(ref, backend=backend)
    raise ValueError(f"unknown implementation {name!r}; known: {list(IMPLEMENTATIONS)}")


__all__ = ["IMPLEMENTATIONS", "Impl", "PlainSDPA", "build", "memory_model", "reference_weights"]
