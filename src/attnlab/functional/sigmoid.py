"""Sigmoid attention without normalisation (Gu et al. 2024, arXiv 2410.10781, section 7): each weight is the
sigmoid of its own scaled score, and a row is not divided by its sum.

    softmax:  A[i, j] = exp(s_ij) / sum_l exp(s_il)        a row sums to 1: the keys compete for one unit
    sigmoid:  A[i, j] = sigmoid(s_ij), 0 where i may not see j   each key's weight is its own

with s_ij = q_i . k_j * scale (scale 1 / sqrt(D) unless given), after the call's score_mod and float mask, as the
other backends take them. The form is the authors' (their code, ``lit_gpt/model_attn_sim.py``: sigmoid of the
scaled scores times the causal 0/1 mask, no bias term, no normalisation). A hidden key's score is -inf, whose
sigmoid is 0 with a gradient of 0, so masking needs no special row: a row that may see nothing gives 0.

A sigmoid row gives as much in all as its keys earn, between 0 and the number of keys; its share on token 0,
A[i, 0] / sum_j A[i, j], is what Gu et al.'s code reads as the "proxy" weight of such a head
(``attnlab.explain.sinks.row_shares(of_row=True)``).

:func:`sigmoid_kernel` is the fast form (the kernel contract: batched, every step told to the Recorder, so
``GPT.attention_weights`` and ``explain`` read its weights); :func:`sigmoid_attention_loop` the readable one, one
query and one key at a time (tests/test_sigmoid_attention.py holds them equal); :func:`sigmoid_attention` the call
with the checks of :func:`attnlab.functional.attention`.

Shapes: B = batch, H = query heads, Hkv = key/value heads, Tq / Tk = query / key lengths, D = head_dim (Dv for
values).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from attnlab.functional.attention import _prepare
from attnlab.functional.eager import _masked_scores, accumulation_dtype, repeat_kv
from attnlab.functional.visibility import Visibility
from attnlab.observe import record

NORMALIZATIONS: tuple[str, ...] = ("softmax", "sigmoid")
Normalization = Literal["softmax", "sigmoid"]


def check_normalize(normalize: object) -> None:
    """Refuse a normalisation attnlab does not have."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(
            f"normalize must be one of {list(NORMALIZATIONS)} ('sigmoid': each weight sigmoid(score), rows not "
            f"normalised), got {normalize!r}"
        )


def sigmoid_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, *, scale: float, dropout_p: float = 0.0
) -> tuple[torch.Tensor, None]:
    """The kernel contract on checked arguments and a bound Visibility: (context (B, H, Tq, Dv) in q's dtype,
    None: there is no row log-sum-exp). The weights go to the Recorder as "attn_weights", as eager's do."""
    compute = accumulation_dtype(q.dtype)
    scores = _masked_scores(q, k, vis, scale=scale, note=record)  # (B, H, Tq, Tk), -inf where hidden
    weights = torch.sigmoid(scores)  # (B, H, Tq, Tk): sigmoid(-inf) = 0, its gradient 0
    record("attn_weights", weights, source="attention")
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
        record("dropped_weights", weights, source="attention")
    context = weights @ repeat_kv(v, q.shape[1] // v.shape[1]).to(compute)  # (B, H, Tq, Dv)
    record("context_vec", context, source="attention")
    return context.to(q.dtype), None


def sigmoid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    visibility: Visibility | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Sigmoid attention without normalisation, sigmoid(q k^T * scale) v, over q (B, H, Tq, D) and k, v
    (B, Hkv, Tk, D): the context (B, H, Tq, Dv). ``visibility`` (or ``is_causal``), ``scale`` and ``dropout_p``
    as :func:`attnlab.functional.attention` takes them, checked the same way."""
    sugar = {"mask": None, "is_causal": is_causal, "window": None, "mask_mod": None, "score_mod": None}
    vis, scale_ = _prepare(q, k, v, visibility, sugar, dropout_p, scale)
    return sigmoid_kernel(q, k, v, vis, scale=scale_, dropout_p=dropout_p)[0]


def sigmoid_attention_loop(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """The readable form: for each query i and key j it may see (``allowed`` (Tq, Tk), True = may attend), the
    weight sigmoid(q_i . k_j * scale), and the context sum_j weight * v_j; no division by the row's sum."""
    b, h, tq, _ = q.shape
    groups = h // k.shape[1]
    out = q.new_zeros(b, h, tq, v.shape[-1])  # (B, H, Tq, Dv)
    for head in range(h):
        kv = head // groups  # the key/value head this query head reads
        for i in range(tq):
            for j in range(k.shape[2]):
                if allowed[i, j]:
                    score = (q[:, head, i] * k[:, kv, j]).sum(dim=-1) * scale  # (B,)
                    out[:, head, i] += torch.sigmoid(score)[:, None] * v[:, kv, j]
    return out
