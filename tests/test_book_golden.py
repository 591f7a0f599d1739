"""Every number the chapter prints, reproduced to its printed 4 decimals.

Expected values are attnlab.book.golden: typed in from the notes and the book,
never produced by attnlab.
"""

from __future__ import annotations

import re

import pytest
import torch

from attnlab import book
from attnlab.book import golden


def close(actual: torch.Tensor | float, expected: object) -> None:
    actual_t = torch.as_tensor(actual, dtype=torch.float64).detach()
    expected_t = torch.tensor(expected, dtype=torch.float64)
    assert actual_t.shape == expected_t.shape
    torch.testing.assert_close(actual_t, expected_t, atol=golden.ATOL, rtol=0)


@pytest.fixture
def inputs() -> torch.Tensor:
    return book.embedded_inputs()


def test_inputs_and_words(inputs: torch.Tensor) -> None:
    assert book.WORDS == ("Your", "journey", "starts", "with", "one", "step")
    assert inputs.shape == (6, 3) and inputs.dtype == torch.float32
    close(inputs[1], [0.55, 0.87, 0.66])
    inputs[0, 0] = 99.0
    assert book.embedded_inputs()[0, 0].item() == pytest.approx(0.43)


def test_dot_product_and_scores_of_query_2(inputs: torch.Tensor) -> None:
    close(torch.dot(inputs[0], inputs[1]), golden.DOT_X1_X2)
    close(book.attn_scores_for_query(inputs, 1), golden.ATTN_SCORES_2)


def test_sum_normalization(inputs: torch.Tensor) -> None:
    tmp = book.sum_normalize(book.attn_scores_for_query(inputs, 1))
    close(tmp, golden.ATTN_WEIGHTS_2_SUM_NORMALIZED)
    close(tmp.sum(), golden.ATTN_WEIGHTS_2_SUM_NORMALIZED_SUM)


def test_softmax_three_ways(inputs: torch.Tensor) -> None:
    scores = book.attn_scores_for_query(inputs, 1)
    for weights in (torch.softmax(scores, dim=0), book.softmax_naive(scores), book.softmax_stable(scores)):
        close(weights, golden.ATTN_WEIGHTS_2_SOFTMAX)
        close(weights.sum(), golden.ATTN_WEIGHTS_2_SOFTMAX_SUM)


def test_context_vector_2_by_loop(inputs: torch.Tensor) -> None:
    weights = torch.softmax(book.attn_scores_for_query(inputs, 1), dim=0)
    close(book.context_vector_loop(inputs, weights), golden.CONTEXT_VEC_2)


def test_all_scores_weights_and_context_vectors(inputs: torch.Tensor) -> None:
    close(book.attn_scores_loop(inputs), golden.ATTN_SCORES)
    close(book.attn_scores_matmul(inputs), golden.ATTN_SCORES)
    attn_scores, attn_weights, all_context_vecs = book.all_context_vectors(inputs)
    close(attn_scores, golden.ATTN_SCORES)
    close(attn_weights, golden.ATTN_WEIGHTS)
    close(all_context_vecs, golden.ALL_CONTEXT_VECS)


def test_trainable_walkthrough(inputs: torch.Tensor) -> None:
    w = book.trainable_walkthrough(inputs, d_out=2, seed=123)
    close(w.W_query, golden.W_QUERY)
    close(w.W_key, golden.W_KEY)
    close(w.W_value, golden.W_VALUE)
    close(w.query_2, golden.QUERY_2)
    close(w.key_2, golden.KEY_2)
    close(w.value_2, golden.VALUE_2)
    assert tuple(w.keys.shape) == golden.KEYS_SHAPE
    assert tuple(w.values.shape) == golden.VALUES_SHAPE
    close(w.attn_score_22, golden.ATTN_SCORE_22)
    close(w.attn_scores_2, golden.ATTN_SCORES_2_TRAINABLE)
    assert w.d_k == 2
    close(w.attn_weights_2, golden.ATTN_WEIGHTS_2_SCALED)
    close(w.context_vec_2, golden.CONTEXT_VECTOR_2)


def test_self_attention_v1_output(inputs: torch.Tensor) -> None:
    torch.manual_seed(123)
    sa_v1 = book.SelfAttentionV1(3, 2)
    close(sa_v1.W_query, golden.W_QUERY)  # same seed, same creation order as the walkthrough
    close(sa_v1(inputs), golden.SA_V1_OUTPUT)


def test_self_attention_v2_output(inputs: torch.Tensor) -> None:
    torch.manual_seed(789)
    close(book.SelfAttentionV2(3, 2)(inputs), golden.SA_V2_OUTPUT)


def test_causal_weights_both_methods(inputs: torch.Tensor) -> None:
    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    with torch.no_grad():
        queries, keys = sa_v2.W_query(inputs), sa_v2.W_key(inputs)
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / 2**0.5, dim=-1)
    close(attn_weights, golden.CAUSAL_UNMASKED_WEIGHTS)
    close(book.causal_weights_renormalized(attn_weights), golden.CAUSAL_WEIGHTS)
    close(book.causal_weights_masked(attn_scores, 2), golden.CAUSAL_WEIGHTS)
    masked = attn_scores.masked_fill(torch.triu(torch.ones(6, 6), 1).bool(), -torch.inf)
    lower = torch.tensor([[v if v is not None else 0.0 for v in row] for row in golden.CAUSAL_MASKED_SCORES])
    is_inf = torch.tensor([[v is None for v in row] for row in golden.CAUSAL_MASKED_SCORES])
    assert torch.equal(torch.isneginf(masked), is_inf)
    close(masked.masked_fill(is_inf, 0.0), lower.tolist())


def test_causal_attention_and_multihead_outputs() -> None:
    batch = book.batched_inputs()
    torch.manual_seed(123)
    ca = book.CausalAttention(3, 2, 6, 0.0)
    out = ca(batch)
    close(out[0], golden.CAUSAL_ATTENTION_OUTPUT)
    close(out[1], golden.CAUSAL_ATTENTION_OUTPUT)

    torch.manual_seed(123)
    wrapped = book.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch)
    assert wrapped.shape == (2, 6, 4)
    close(wrapped[0], golden.MHA_WRAPPER_OUTPUT)

    torch.manual_seed(123)
    mha_out = book.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch)
    assert mha_out.shape == (2, 6, 2)
    close(mha_out[1], golden.MHA_OUTPUT)


def test_gpt2_size_parameter_count() -> None:
    mha = book.MultiHeadAttention(768, 768, 1024, 0.0, 12)
    assert sum(p.numel() for p in mha.parameters()) == golden.GPT2_MHA_PARAMETERS == 2_360_064


def _golden_numbers() -> set[str]:
    found: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, float):
            found.add(f"{x:.4f}")

    for name in dir(golden):
        if name.isupper():
            walk(getattr(golden, name))
    return found


def test_every_number_printed_in_the_notes_is_transcribed(seed_text: str) -> None:
    printed = set(re.findall(r"-?\d+\.\d{4}\b", seed_text))
    assert len(printed) > 80  # the notes print well over 80 distinct 4-decimal numbers
    missing = printed - _golden_numbers()
    assert not missing, f"numbers in the notes but not in attnlab.book.golden: {sorted(missing)}"
