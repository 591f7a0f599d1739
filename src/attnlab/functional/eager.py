"""The eager backend: the chapter's explicit math, batched, masked and grouped.

matmul -> scale -> mask -> softmax -> dropout -> @ V, each step a line, each
reported to the trace recorder. The only backend that returns per-head
weights, and the reference every fast path is tested against. Supports double
backward (it is plain autograd).

Shapes: B = batch, H = query heads, Hkv = key/value heads, G = H // Hkv,
Tq / Tk = query / key lengths, D = head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.explain.trace import record
from attnlab.functional.masks import MaskSpec


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D): each kv head serves ``groups`` query heads."""
    if groups == 1:
        return x
    b, h_kv, t, d = x.shape
    x = x[:, :, None].expand(b, h_kv, groups, t, d)  # (B, Hkv, G, T, D)
    return x.reshape(b, h_kv * groups, t, d)  # (B, H, T, D)


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim; a row that is all -inf gives all zeros, not NaN.

    Subtracting the row max keeps exp from overflowing (the chapter's stable
    softmax); a row with no finite score uses 0 as its max so nothing is NaN,
    forward or backward.
    """
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    exp = torch.exp(scores - row_max)
    denom = exp.sum(dim=-1, keepdim=True)
    return exp / torch.where(denom == 0, torch.ones_like(denom), denom)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (context (B, H, Tq, Dv), weights (B, H, Tq, Tk)) in q's dtype."""
    groups = q.shape[1] // k.shape[1]
    k = repeat_kv(k, groups)  # (B, H, Tk, D)
    v = repeat_kv(v, groups)  # (B, H, Tk, Dv)
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype

    attn_scores = q.to(compute) @ k.to(compute).transpose(-2, -1)  # (B, H, Tq, Tk)
    record("attn_scores", attn_scores, source="attention")
    scaled = attn_scores * scale  # Vaswani et al. 2017, eq. 1: QK^T / sqrt(d_k)
    record("scaled_scores", scaled, source="attention")
    allowed, bias = spec.dense(q.device)
    if bias is not None:
        scaled = scaled + bias.to(compute)
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed, float("-inf"))
    record("masked_scores", scaled, source="attention")
    attn_weights = safe_softmax(scaled)
    record("attn_weights", attn_weights, source="attention")
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)
        record("dropped_weights", attn_weights, source="attention")
    context_vec = attn_weights @ v.to(compute)  # (B, H, Tq, Dv)
    record("context_vec", context_vec, source="attention")
    return context_vec.to(q.dtype), attn_weights.to(q.dtype)
