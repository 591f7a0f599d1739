"""Tour, part 1 (section 3.3): self-attention without trainable weights, as the notes walk through it."""

from __future__ import annotations

import torch

from attnlab import book
from attnlab.book import golden
from attnlab.explain.tour.core import Add, Checker, fmt


def simplified(add: Add, c: Checker) -> None:
    inputs = book.embedded_inputs()  # (6, 3): six tokens, three dimensions
    add("overview", "", "")
    add("inputs", "inputs = torch.tensor([[0.43, 0.15, 0.89], ...])", f"{', '.join(book.WORDS)}\n{fmt(inputs)}")

    x_1, x_2 = inputs[0], inputs[1]
    dot = torch.dot(x_1, x_2)
    len_1, len_2 = torch.linalg.norm(x_1), torch.linalg.norm(x_2)
    # The angle from the three side lengths (law of cosines), so the check does not reuse the dot product.
    cos = (len_1**2 + len_2**2 - torch.linalg.norm(x_1 - x_2) ** 2) / (2 * len_1 * len_2)
    add(
        "dot",
        "torch.dot(inputs[0], inputs[1])\ntorch.linalg.norm(x_1) * torch.linalg.norm(x_2) * cos_theta",
        f"{fmt(dot)}\n|x1| = {len_1:.4f}, |x2| = {len_2:.4f}, cos = {cos:.4f}\n"
        f"|x1| * |x2| * cos = {len_1 * len_2 * cos:.4f}",
        c.book("x(1) . x(2)", dot, golden.DOT_X1_X2),
        c.holds("length_cosine", abs((len_1 * len_2 * cos - dot).item()) < 1e-5),
    )

    attn_scores_2 = book.attn_scores_for_query(inputs, 1)
    add(
        "scores_2",
        "query = inputs[1]\nattn_scores_2 = torch.empty(inputs.shape[0])\n"
        "for i, x_i in enumerate(inputs):\n    attn_scores_2[i] = torch.dot(x_i, query)",
        fmt(attn_scores_2),
        c.book("attn_scores_2", attn_scores_2, golden.ATTN_SCORES_2),
        c.holds("max_self", attn_scores_2.argmax().item() == 1),
    )

    tmp = book.sum_normalize(attn_scores_2)
    apples = torch.tensor([6.0, 4.0])
    apple_weights = apples / apples.sum()
    add(
        "sum_norm",
        "apples = torch.tensor([6.0, 4.0]); apples / apples.sum()\n"
        "attn_weights_2_tmp = attn_scores_2 / attn_scores_2.sum()",
        f"{c.say('apples')}: {fmt(apple_weights)}\nAttention weights: {fmt(tmp)}\nSum: {fmt(tmp.sum())}",
        c.book("6/(6+4), 4/(6+4)", apple_weights, golden.APPLES_WEIGHTS),
        c.book("attn_weights_2_tmp", tmp, golden.ATTN_WEIGHTS_2_SUM_NORMALIZED),
        c.book("Sum", tmp.sum(), golden.ATTN_WEIGHTS_2_SUM_NORMALIZED_SUM),
    )

    attn_weights_2 = torch.softmax(attn_scores_2, dim=0)
    add(
        "softmax",
        "attn_weights_2 = torch.softmax(attn_scores_2, dim=0)",
        f"Attention weights: {fmt(attn_weights_2)}\nSum: {fmt(attn_weights_2.sum())}",
        c.book("attn_weights_2", attn_weights_2, golden.ATTN_WEIGHTS_2_SOFTMAX),
        c.book("Sum", attn_weights_2.sum(), golden.ATTN_WEIGHTS_2_SOFTMAX_SUM),
    )

    naive = book.softmax_naive(attn_scores_2)
    add(
        "softmax_naive",
        "def softmax_naive(x):\n    return torch.exp(x) / torch.exp(x).sum(dim=0)",
        f"Attention weights: {fmt(naive)}\nSum: {fmt(naive.sum())}",
        c.book("softmax_naive", naive, golden.ATTN_WEIGHTS_2_SOFTMAX),
    )

    big, small = attn_scores_2 * 1000, attn_scores_2 - 1000
    add(
        "softmax_overflow",
        f"softmax_naive(attn_scores_2 * 1000)  # {c.say('cm_overflow')}\n"
        f"softmax_naive(attn_scores_2 - 1000)  # {c.say('cm_underflow')}\n"
        f"softmax_stable(x)  # exp(x - x.max()): {c.say('cm_stable')}",
        f"{c.say('overflow_naive')}:   {fmt(book.softmax_naive(big))}\n"
        f"{c.say('underflow_naive')}:  {fmt(book.softmax_naive(small))}\n"
        f"{c.say('overflow_stable')}:  {fmt(book.softmax_stable(big))}\n"
        f"{c.say('underflow_stable')}: {fmt(book.softmax_stable(small))}",
        c.holds("overflow_nan", bool(torch.isnan(book.softmax_naive(big)).all())),
        c.holds("underflow_nan", bool(torch.isnan(book.softmax_naive(small)).all())),
        c.book("softmax_stable(attn_scores_2 - 1000)", book.softmax_stable(small), golden.ATTN_WEIGHTS_2_SOFTMAX),
        c.holds(
            "stable_finite",
            bool(torch.isfinite(book.softmax_stable(big)).all())
            and abs(book.softmax_stable(big).sum().item() - 1) < 1e-6,
        ),
    )

    context_vec_2 = book.context_vector_loop(inputs, attn_weights_2)
    add(
        "context_2",
        f"query = inputs[1]\ncontext_vec_2 = torch.zeros(query.shape)  # {c.say('cm_shape_only')}\n"
        "for i, x_i in enumerate(inputs):\n    context_vec_2 += attn_weights_2[i] * x_i",
        fmt(context_vec_2),
        c.book("context_vec_2", context_vec_2, golden.CONTEXT_VEC_2),
        c.holds("same_size", context_vec_2.shape == inputs[1].shape),
    )

    scores_loop = book.attn_scores_loop(inputs)
    add(
        "scores_loop",
        "attn_scores = torch.empty(6, 6)\nfor i, x_i in enumerate(inputs):\n"
        "    for j, x_j in enumerate(inputs):\n        attn_scores[i, j] = torch.dot(x_i, x_j)",
        fmt(scores_loop),
        c.book("attn_scores", scores_loop, golden.ATTN_SCORES),
    )

    attn_scores, attn_weights, all_context_vecs = book.all_context_vectors(inputs)
    try:
        inputs @ inputs  # (6, 3) @ (6, 3): the inner dimensions 3 and 6 differ
        mismatch = ""
    except RuntimeError as err:
        mismatch = str(err).splitlines()[0]
    add(
        "scores_all",
        "inputs.shape, inputs.T.shape\nattn_scores = inputs @ inputs.T  # [6 x 3] @ [3 x 6] -> [6 x 6]",
        f"{tuple(inputs.shape)}, {tuple(inputs.T.shape)}\ninputs @ inputs: {mismatch}\n{fmt(attn_scores)}",
        c.book("attn_scores", attn_scores, golden.ATTN_SCORES),
        c.holds("transpose", torch.equal(inputs.T[2, 4], inputs[4, 2]) and inputs.T.shape == (3, 6)),
        c.holds("inner_dims", bool(mismatch)),
        heat=attn_scores,
    )
    add(
        "weights_all",
        "attn_weights = torch.softmax(attn_scores, dim=-1)",
        fmt(attn_weights),
        c.book("attn_weights", attn_weights, golden.ATTN_WEIGHTS),
        c.holds("rows_sum_1", torch.allclose(attn_weights.sum(-1), torch.ones(6))),
        heat=attn_weights,
    )
    add(
        "context_all",
        "all_context_vecs = attn_weights @ inputs",
        fmt(all_context_vecs),
        c.book("all_context_vecs", all_context_vecs, golden.ALL_CONTEXT_VECS),
        c.holds("row_2_loop", torch.allclose(all_context_vecs[1], context_vec_2)),
        heat=all_context_vecs,
        heat_axes="features",
    )
