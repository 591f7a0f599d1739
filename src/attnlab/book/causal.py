"""Section 3.5: causal attention, which hides the future.

Token t may attend to tokens 0..t only. Two ways to get there, both from the
chapter: (1) softmax, zero the upper triangle, renormalize each row; (2) fill
the scores above the diagonal with -inf before the softmax, which the class
uses. Both give the same weights, because the renormalization in (1) divides
by exactly the mass that (2) never gives to the future.

Shapes: b = batch, T = num_tokens, d_in / d_out = embedding / projection size.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_dropout, check_positive_int, check_tokens
from attnlab.observe import is_recording, record


def causal_weights_renormalized(attn_weights: torch.Tensor) -> torch.Tensor:
    """Method (1): zero the weights above the diagonal of a softmax, renormalize rows."""
    context_length = attn_weights.shape[-1]
    mask_simple = torch.tril(torch.ones(context_length, context_length))  # 1 = keep
    masked_simple = attn_weights * mask_simple
    row_sums = masked_simple.sum(dim=-1, keepdim=True)
    return masked_simple / row_sums


def causal_weights_masked(attn_scores: torch.Tensor, d_k: int) -> torch.Tensor:
    """Method (2): scores above the diagonal become -inf, then the scaled softmax."""
    context_length = attn_scores.shape[-1]
    mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)  # 1 = hide
    masked = attn_scores.masked_fill(mask.bool(), -torch.inf)
    return torch.softmax(masked / d_k**0.5, dim=-1)


class CausalAttention(nn.Module):
    """Listing 3.3: batched, causal, with dropout on the attention weights.

    Args:
        d_in: size of each input embedding.
        d_out: size of each output context vector.
        context_length: the longest sequence supported; sizes the mask buffer.
        dropout: probability of zeroing an attention weight in training, in [0, 1).
        qkv_bias: add a bias to the Q, K, V projections.

    Input (b, T, d_in) with T <= context_length; output (b, T, d_out).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length)):
            check_positive_int(name, value)
        check_dropout(dropout)
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # 1 above the diagonal marks the future; a buffer moves with .to() and is saved.
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.mask: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, d_in=self.d_in, rank=3, context_length=self.context_length)
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)  # (b, T, T)
        record("attn_scores", attn_scores, source="CausalAttention")
        if is_recording():  # the book scales inside the softmax; shown separately for the trace
            record("scaled_scores", attn_scores / keys.shape[-1] ** 0.5, source="CausalAttention")
        attn_scores.masked_fill_(  # in place, as the book does: no second (b, T, T) tensor
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )
        record("masked_scores", attn_scores, source="CausalAttention")
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        record("attn_weights", attn_weights, source="CausalAttention")
        attn_weights = self.dropout(attn_weights)
        record("dropped_weights", attn_weights, source="CausalAttention")

        context_vec = attn_weights @ values  # (b, T, d_out)
        record("context_vec", context_vec, source="CausalAttention")
        return context_vec
