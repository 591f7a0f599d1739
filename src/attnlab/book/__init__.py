"""Chapter 3 of "Build a Large Language Model (From Scratch)", faithfully.

The book's classes with the book's names, parameter order and seeds, plus the
step-by-step functions of the simplified and trainable walkthroughs. Inputs
that the book's code meets with a deep shape error raise a clear error here.
"""

from attnlab.book.causal import CausalAttention, causal_weights_masked, causal_weights_renormalized
from attnlab.book.data import WORDS, batched_inputs, embedded_inputs
from attnlab.book.multihead import MultiHeadAttention, MultiHeadAttentionWrapper
from attnlab.book.simplified import (
    all_context_vectors,
    attn_scores_for_query,
    attn_scores_loop,
    attn_scores_matmul,
    context_vector_loop,
    softmax_naive,
    softmax_stable,
    sum_normalize,
)
from attnlab.book.trainable import (
    SelfAttentionV1,
    SelfAttentionV2,
    Walkthrough,
    trainable_walkthrough,
    transfer_v2_to_v1,
)

__all__ = [
    "WORDS",
    "CausalAttention",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "Walkthrough",
    "all_context_vectors",
    "attn_scores_for_query",
    "attn_scores_loop",
    "attn_scores_matmul",
    "batched_inputs",
    "causal_weights_masked",
    "causal_weights_renormalized",
    "context_vector_loop",
    "embedded_inputs",
    "softmax_naive",
    "softmax_stable",
    "sum_normalize",
    "trainable_walkthrough",
    "transfer_v2_to_v1",
]
