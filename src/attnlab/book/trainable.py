"""Section 3.4: self-attention with trainable weights (scaled dot-product attention).

First the step-by-step walkthrough for the second token, x(2) "journey", then
the two classes of the chapter. Names, shapes and creation order are the
book's, so ``torch.manual_seed(123)`` gives the book's weights.

Shapes: T = tokens, d_in = embedding size, d_out = projection size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int, check_tokens
from attnlab.observe import is_recording, record


@dataclass(frozen=True)
class Walkthrough:
    """Every tensor of section 3.4.1, computed for the query token x(2)."""

    W_query: torch.Tensor  # (d_in, d_out)
    W_key: torch.Tensor  # (d_in, d_out)
    W_value: torch.Tensor  # (d_in, d_out)
    query_2: torch.Tensor  # (d_out,)
    key_2: torch.Tensor  # (d_out,)
    value_2: torch.Tensor  # (d_out,)
    keys: torch.Tensor  # (T, d_out)
    values: torch.Tensor  # (T, d_out)
    attn_score_22: torch.Tensor  # ()
    attn_scores_2: torch.Tensor  # (T,)
    d_k: int
    attn_weights_2: torch.Tensor  # (T,)
    context_vec_2: torch.Tensor  # (d_out,)


def trainable_walkthrough(inputs: torch.Tensor, *, d_out: int = 2, seed: int = 123) -> Walkthrough:
    """Run section 3.4.1 on ``inputs`` (T, d_in) for the query x(2).

    The weights come from ``torch.rand(d_in, d_out)`` after
    ``torch.manual_seed(seed)``, drawn in the book's order: query, key, value.
    This resets the global RNG, as the book does.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.shape[0] < 2:
        got = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise ValueError(
            f"inputs must be a (num_tokens, d_in) tensor with at least 2 tokens "
            f"(the walkthrough's query is x(2)), got {got}"
        )
    x_2 = inputs[1]
    d_in = inputs.shape[1]
    torch.manual_seed(seed)
    W_query = torch.rand(d_in, d_out)
    W_key = torch.rand(d_in, d_out)
    W_value = torch.rand(d_in, d_out)

    query_2 = x_2 @ W_query
    key_2 = x_2 @ W_key
    value_2 = x_2 @ W_value
    keys = inputs @ W_key
    values = inputs @ W_value

    attn_score_22 = query_2.dot(key_2)
    attn_scores_2 = query_2 @ keys.T
    d_k = keys.shape[-1]
    attn_weights_2 = torch.softmax(attn_scores_2 / d_k**0.5, dim=-1)  # Vaswani et al. 2017, eq. 1
    context_vec_2 = attn_weights_2 @ values
    return Walkthrough(
        W_query,
        W_key,
        W_value,
        query_2,
        key_2,
        value_2,
        keys,
        values,
        attn_score_22,
        attn_scores_2,
        d_k,
        attn_weights_2,
        context_vec_2,
    )


class SelfAttentionV1(nn.Module):
    """Listing 3.1: Q, K, V as raw ``nn.Parameter(torch.rand(d_in, d_out))``.

    Takes one sequence (num_tokens, d_in) and returns (num_tokens, d_out).
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        self.d_in = d_in
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, d_in=self.d_in, rank=2)
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.T  # omega
        record("attn_scores", attn_scores, source="SelfAttentionV1")
        if is_recording():
            record("scaled_scores", attn_scores / keys.shape[-1] ** 0.5, source="SelfAttentionV1")
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        record("attn_weights", attn_weights, source="SelfAttentionV1")
        context_vec = attn_weights @ values
        record("context_vec", context_vec, source="SelfAttentionV1")
        return context_vec


class SelfAttentionV2(nn.Module):
    """Listing 3.2: Q, K, V as ``nn.Linear`` layers (better initialisation, optional bias).

    Takes one sequence (num_tokens, d_in) and returns (num_tokens, d_out).
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        self.d_in = d_in
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, d_in=self.d_in, rank=2)
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.T
        record("attn_scores", attn_scores, source="SelfAttentionV2")
        if is_recording():
            record("scaled_scores", attn_scores / keys.shape[-1] ** 0.5, source="SelfAttentionV2")
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        record("attn_weights", attn_weights, source="SelfAttentionV2")
        context_vec = attn_weights @ values
        record("context_vec", context_vec, source="SelfAttentionV2")
        return context_vec


def transfer_v2_to_v1(sa_v2: SelfAttentionV2, sa_v1: SelfAttentionV1) -> None:
    """Exercise 3.1: copy V2's weights into V1 so both compute the same output.

    ``nn.Linear`` stores its weight as (d_out, d_in) and computes x @ W.T, so
    V1's (d_in, d_out) parameters take the transpose. V2 must have no bias:
    V1 has nowhere to put one.
    """
    bias: torch.Tensor | None = sa_v2.W_query.bias  # nn.Linear types it as a Tensor; it is None without qkv_bias
    if bias is not None:
        raise ValueError(
            "sa_v2 has qkv biases, which SelfAttentionV1 cannot hold; build SelfAttentionV2 with qkv_bias=False"
        )
    if sa_v2.W_query.weight.T.shape != sa_v1.W_query.shape:
        raise ValueError(
            f"shape mismatch: SelfAttentionV2 weight transposed is "
            f"{tuple(sa_v2.W_query.weight.T.shape)}, SelfAttentionV1 expects "
            f"{tuple(sa_v1.W_query.shape)}; build both with the same d_in and d_out"
        )
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
