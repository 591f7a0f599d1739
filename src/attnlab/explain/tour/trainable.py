"""Tour, part 2 (section 3.4): self-attention with trainable weights W_q, W_k, W_v, then as a class."""

from __future__ import annotations

import torch

from attnlab import book
from attnlab.book import golden
from attnlab.explain.tour.core import Add, Checker, fmt


def trainable(add: Add, c: Checker) -> None:
    inputs = book.embedded_inputs()  # (6, 3)
    w = book.trainable_walkthrough(inputs, d_out=2, seed=123)
    add(
        "weights_init",
        "x_2 = inputs[1]; d_in = inputs.shape[1]; d_out = 2\ntorch.manual_seed(123)\n"
        "W_query = torch.nn.Parameter(torch.rand(d_in, d_out), requires_grad=True)\n"
        "W_key = torch.nn.Parameter(torch.rand(d_in, d_out), requires_grad=True)\n"
        "W_value = torch.nn.Parameter(torch.rand(d_in, d_out), requires_grad=True)",
        f"W_query={fmt(w.W_query)}\nW_key={fmt(w.W_key)}\nW_value={fmt(w.W_value)}",
        c.book("W_query", w.W_query, golden.W_QUERY),
        c.book("W_key", w.W_key, golden.W_KEY),
        c.book("W_value", w.W_value, golden.W_VALUE),
    )

    x_2 = inputs[1]
    with torch.enable_grad():  # the tour runs under no_grad; this step shows what autograd records
        W_query = torch.nn.Parameter(w.W_query.clone(), requires_grad=True)
        query_2 = x_2 @ W_query
        grad_fn = type(query_2.grad_fn).__name__ if query_2.grad_fn is not None else "None"
        query_2.sum().backward()
        frozen = x_2 @ torch.nn.Parameter(w.W_query.clone(), requires_grad=False)
    grad = W_query.grad
    assert grad is not None
    add(
        "requires_grad",
        f"query_2 = x_2 @ W_query  # {c.say('cm_records')}\n"
        f"query_2.sum().backward()  # {c.say('cm_backward')}\n"
        f"x_2 @ torch.nn.Parameter(..., requires_grad=False)  # {c.say('cm_frozen')}",
        f"W_query.requires_grad = {W_query.requires_grad}\nquery_2.grad_fn = <{grad_fn}>\n"
        f"W_query.grad =\n{fmt(grad)}\n{c.say('frozen_value')}: grad_fn = {frozen.grad_fn}",
        c.holds("grad_fn", grad_fn != "None"),
        # d/dW of sum_j (x_2 @ W)_j is x_2 in every column: worked out by hand, not by autograd.
        c.holds("grad_value", torch.allclose(grad, x_2[:, None].expand(3, 2))),
        c.holds("frozen", frozen.grad_fn is None),
    )
    add(
        "qkv_2",
        "query_2 = x_2 @ W_query  # [3] @ [3, 2] -> [2]\nkey_2 = x_2 @ W_key\nvalue_2 = x_2 @ W_value",
        f"query_2={fmt(w.query_2)}\nkey_2={fmt(w.key_2)}\nvalue_2={fmt(w.value_2)}",
        c.book("query_2", w.query_2, golden.QUERY_2),
        c.book("key_2", w.key_2, golden.KEY_2),
        c.book("value_2", w.value_2, golden.VALUE_2),
    )
    add(
        "keys_values",
        "keys = inputs @ W_key\nvalues = inputs @ W_value",
        f"keys.shape={w.keys.shape}, values.shape={w.values.shape}",
        c.holds("keys_shape", tuple(w.keys.shape) == golden.KEYS_SHAPE),
        c.holds("values_shape", tuple(w.values.shape) == golden.VALUES_SHAPE),
    )
    add(
        "score_22",
        "keys_2 = keys[1]\nattn_score_22 = query_2.dot(keys_2)",
        fmt(w.attn_score_22),
        c.book("attn_score_22", w.attn_score_22, golden.ATTN_SCORE_22),
    )
    add(
        "scores_2_trainable",
        "attn_scores_2 = query_2 @ keys.T",
        fmt(w.attn_scores_2),
        c.book("attn_scores_2", w.attn_scores_2, golden.ATTN_SCORES_2_TRAINABLE),
    )
    add(
        "weights_2_scaled",
        "d_k = keys.shape[-1]\nattn_weights_2 = torch.softmax(attn_scores_2 / d_k**0.5, dim=-1)",
        fmt(w.attn_weights_2),
        c.book("attn_weights_2", w.attn_weights_2, golden.ATTN_WEIGHTS_2_SCALED),
    )
    add(
        "context_2_trainable",
        "context_vec_2 = attn_weights_2 @ values",
        fmt(w.context_vec_2),
        c.book("context_vec_2", w.context_vec_2, golden.CONTEXT_VECTOR_2),
    )

    keys, values = inputs @ w.W_key, inputs @ w.W_value  # 1. k, v for every token (6, 2) ...
    queries = inputs @ w.W_query  # ... and q for each current token
    attn_scores = queries @ keys.T  # 2. (6, 6) scores
    attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # 3. weights
    context_vecs = attn_weights @ values  # 4. (6, 2) context vectors
    add(
        "recap_trainable",
        "keys, values = inputs @ W_key, inputs @ W_value  # 1\nqueries = inputs @ W_query\n"
        "attn_scores = queries @ keys.T  # 2\n"
        "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)  # 3\n"
        "context_vecs = attn_weights @ values  # 4",
        fmt(context_vecs),
        c.book("context_vecs", context_vecs, golden.SA_V1_OUTPUT),
        c.book("context_vecs[1] = z(2)", context_vecs[1], golden.CONTEXT_VECTOR_2),
        heat=attn_weights,
    )

    torch.manual_seed(123)
    sa_v1 = book.SelfAttentionV1(3, 2)
    out_v1 = sa_v1(inputs)
    add(
        "sa_v1",
        "class SelfAttentionV1(nn.Module):\n    def __init__(self, d_in, d_out): ...\n    def forward(self, x): ...\n"
        f"torch.manual_seed(123)\nsa_v1 = SelfAttentionV1(3, 2)\nprint(sa_v1(inputs))  # {c.say('cm_forward')}",
        fmt(out_v1),
        c.book("sa_v1(inputs)", out_v1, golden.SA_V1_OUTPUT),
        c.book("sa_v1(inputs)[1] = z(2)", out_v1[1], golden.CONTEXT_VECTOR_2),
        c.holds("call_forward", torch.equal(sa_v1.forward(inputs), out_v1)),
    )

    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    out_v2 = sa_v2(inputs)
    book.transfer_v2_to_v1(sa_v2, sa_v1)
    add(
        "sa_v2",
        f"class SelfAttentionV2(nn.Module):  # {c.say('cm_linear')}\n"
        "torch.manual_seed(789)\nsa_v2 = SelfAttentionV2(3, 2)\nprint(sa_v2(inputs))",
        fmt(out_v2),
        c.book("sa_v2(inputs)", out_v2, golden.SA_V2_OUTPUT),
        c.holds("negative", bool((out_v2 < 0).any())),
        c.holds("v1_with_v2", torch.allclose(sa_v1(inputs), out_v2, atol=1e-6)),
    )
