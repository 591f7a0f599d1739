"""Section 3.6: multi-head attention, first as stacked heads, then as one module.

``MultiHeadAttentionWrapper`` runs ``num_heads`` independent CausalAttention
heads and concatenates them: output width d_out * num_heads.
``MultiHeadAttention`` projects once to d_out, splits that into heads of
head_dim = d_out // num_heads, and mixes them with ``out_proj``.

Shapes: b = batch, T = num_tokens, H = num_heads, D = head_dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_dropout, check_heads, check_positive_int, check_tokens
from attnlab.book.causal import CausalAttention
from attnlab.observe import is_recording, record


class MultiHeadAttentionWrapper(nn.Module):
    """Listing 3.4: ``num_heads`` CausalAttention heads side by side.

    Input (b, T, d_in); output (b, T, d_out * num_heads).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("num_heads", num_heads)
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (b, T, d_out * H)


class MultiHeadAttention(nn.Module):
    """Listing 3.5: one Q, K, V projection split into heads, then ``out_proj``.

    Args:
        d_in: size of each input embedding.
        d_out: total output size, split across heads; must divide by num_heads.
        context_length: the longest sequence supported; sizes the mask buffer.
        dropout: probability of zeroing an attention weight in training, in [0, 1).
        num_heads: number of heads H; head_dim = d_out // H.
        qkv_bias: add a bias to the Q, K, V projections.

    Input (b, T, d_in) with T <= context_length; output (b, T, d_out).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length)):
            check_positive_int(name, value)
        check_heads(d_out, num_heads)
        check_dropout(dropout)
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.mask: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, d_in=self.d_in, rank=3, context_length=self.context_length)
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, H, D)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, H, D)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, H, D)
        keys = keys.transpose(1, 2)  # (b, H, T, D)
        queries = queries.transpose(1, 2)  # (b, H, T, D)
        values = values.transpose(1, 2)  # (b, H, T, D)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, H, T, T)
        record("attn_scores", attn_scores, source="MultiHeadAttention")
        if is_recording():  # the book scales inside the softmax; shown separately for the trace
            record("scaled_scores", attn_scores / keys.shape[-1] ** 0.5, source="MultiHeadAttention")
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)  # in place, as the book does
        record("masked_scores", attn_scores, source="MultiHeadAttention")
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        record("attn_weights", attn_weights, source="MultiHeadAttention")
        attn_weights = self.dropout(attn_weights)
        record("dropped_weights", attn_weights, source="MultiHeadAttention")

        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, D)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (b, T, d_out)
        record("context_vec", context_vec, source="MultiHeadAttention")
        context_vec = self.out_proj(context_vec)
        return context_vec
