"""Bad input to the chapter's classes gets a clear error naming the values."""

from __future__ import annotations

import pytest
import torch

from attnlab import book


def test_sequence_longer_than_context_length() -> None:
    mha = book.MultiHeadAttention(3, 4, 6, 0.0, num_heads=2)
    with pytest.raises(ValueError, match=r"7 tokens but context_length is 6.*context_length >= 7"):
        mha(torch.rand(1, 7, 3))
    ca = book.CausalAttention(3, 2, 5, 0.0)
    with pytest.raises(ValueError, match=r"6 tokens but context_length is 5"):
        ca(book.batched_inputs())


def test_d_out_not_divisible_by_num_heads() -> None:
    with pytest.raises(ValueError, match=r"d_out \(10\) must be divisible by num_heads \(3\).*\[1, 2, 5, 10\]"):
        book.MultiHeadAttention(3, 10, 6, 0.0, num_heads=3)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range(dropout: float) -> None:
    with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {dropout}"):
        book.MultiHeadAttention(3, 4, 6, dropout, num_heads=2)
    with pytest.raises(ValueError, match=rf"got {dropout}"):
        book.CausalAttention(3, 4, 6, dropout)


def test_wrong_rank_is_named_with_the_fix() -> None:
    mha = book.MultiHeadAttention(3, 4, 6, 0.0, num_heads=2)
    with pytest.raises(
        ValueError, match=r"\(batch, num_tokens, d_in\) with 3 dims, got 2 dims \(6, 3\).*unsqueeze\(0\)"
    ):
        mha(book.embedded_inputs())
    with pytest.raises(ValueError, match=r"\(num_tokens, d_in\) with 2 dims, got 3 dims.*CausalAttention"):
        book.SelfAttentionV2(3, 2)(book.batched_inputs())


def test_wrong_last_dimension() -> None:
    ca = book.CausalAttention(4, 2, 6, 0.0)
    with pytest.raises(ValueError, match=r"last dimension of the input must be d_in=4, got 3.*\(2, 6, 3\)"):
        ca(book.batched_inputs())
    with pytest.raises(ValueError, match=r"d_in=5, got 3"):
        book.SelfAttentionV1(5, 2)(book.embedded_inputs())


def test_integer_input_and_bad_sizes() -> None:
    with pytest.raises(TypeError, match=r"floating-point input, got dtype torch.int64"):
        book.SelfAttentionV1(3, 2)(torch.ones(6, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"num_heads must be >= 1, got 0"):
        book.MultiHeadAttention(3, 4, 6, 0.0, num_heads=0)
    with pytest.raises(TypeError, match=r"d_out must be an int, got 2.5"):
        book.SelfAttentionV2(3, 2.5)
    with pytest.raises(ValueError, match=r"at least 2 tokens.*\(1, 3\)"):
        book.trainable_walkthrough(torch.rand(1, 3))
