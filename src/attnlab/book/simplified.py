"""Section 3.3: simplified self-attention, without trainable weights.

Every step of the chapter as a function, in the book's order: the scores of
one query by a loop of dot products, all scores by a double loop and by a
matrix product, sum normalization, the naive and the stable softmax, one
context vector by a loop, all context vectors by matrix products.

Shapes: T = number of tokens, d = embedding size. ``inputs`` is (T, d).
"""

from __future__ import annotations

import torch


def attn_scores_for_query(inputs: torch.Tensor, query_index: int) -> torch.Tensor:
    """omega_i = x(i) . x(q) for each token i, by a loop of dot products. Returns (T,)."""
    query = inputs[query_index]
    attn_scores_q = torch.empty(inputs.shape[0])
    for i, x_i in enumerate(inputs):
        attn_scores_q[i] = torch.dot(x_i, query)
    return attn_scores_q


def attn_scores_loop(inputs: torch.Tensor) -> torch.Tensor:
    """All pairwise scores by a double loop of dot products. Returns (T, T)."""
    attn_scores = torch.empty(inputs.shape[0], inputs.shape[0])
    for i, x_i in enumerate(inputs):
        for j, x_j in enumerate(inputs):
            attn_scores[i, j] = torch.dot(x_i, x_j)
    return attn_scores


def attn_scores_matmul(inputs: torch.Tensor) -> torch.Tensor:
    """All pairwise scores at once: inputs @ inputs.T. Returns (T, T)."""
    return inputs @ inputs.T


def sum_normalize(attn_scores: torch.Tensor) -> torch.Tensor:
    """Divide by the total so the weights sum to 1 (the book's first attempt)."""
    return attn_scores / attn_scores.sum()


def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)) over dim 0, as the book writes it.

    It overflows: exp(1000.) is inf in float32, and inf / inf is NaN. Kept on
    purpose to show why :func:`softmax_stable` subtracts the maximum.
    """
    return torch.exp(x) / torch.exp(x).sum(dim=0)


def softmax_stable(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """softmax(x) = softmax(x - max(x)): the same value, but exp never sees a positive number."""
    shifted = x - x.max(dim=dim, keepdim=True).values
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)


def context_vector_loop(inputs: torch.Tensor, attn_weights_q: torch.Tensor) -> torch.Tensor:
    """z = sum_i alpha_i x(i), by a loop over the tokens. Returns (d,)."""
    context_vec = torch.zeros(inputs.shape[1])
    for i, x_i in enumerate(inputs):
        context_vec += attn_weights_q[i] * x_i
    return context_vec


def all_context_vectors(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chapter's three lines: scores, softmax weights, context vectors.

    Returns ``(attn_scores, attn_weights, all_context_vecs)`` of shapes
    (T, T), (T, T), (T, d).
    """
    attn_scores = inputs @ inputs.T
    attn_weights = torch.softmax(attn_scores, dim=-1)
    all_context_vecs = attn_weights @ inputs
    return attn_scores, attn_weights, all_context_vecs
