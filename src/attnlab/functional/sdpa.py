"""The sdpa backend: torch.nn.functional.scaled_dot_product_attention.

PyTorch picks its kernel (on CPU, a fused flash kernel where it applies).
What it is handed comes from the call's :class:`Visibility`: nothing when
nothing is hidden, ``is_causal=True`` when that is exactly the mask (queries
and keys starting at one position), and otherwise one dense mask, built once
per Visibility and kept, so the layers of a model that share it build it once.
A row with nothing to attend to gives NaN in SDPA: such rows attend everywhere
and their output is zeroed, which also zeroes their gradient.

A score_mod reaches SDPA only as an additive float mask, so only a score_mod
declared a bias (``mods.alibi``, ``mods.relative_bias``, ``mods.bias(fn)``) is
taken; any other is refused with the way out, never guessed at.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.functional.eager import dead_rows
from attnlab.functional.mods import is_bias, mod_name
from attnlab.functional.visibility import Visibility


def check_sdpa(vis: Visibility) -> None:
    """Refuse a score_mod that is not declared an additive bias: SDPA can add a bias, nothing else."""
    if vis.score_mod is not None and not is_bias(vis.score_mod):
        raise ValueError(
            f"score_mod {mod_name(vis.score_mod)} is not declared an additive bias, and sdpa can only add a bias "
            "to the scores; use backend='flash' (tiled, with gradients) or 'eager', or, if it only adds a term, "
            "write it as mods.bias(fn) with fn(b, h, q_idx, kv_idx) -> bias"
        )


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """The kernel contract: (context (B, H, Tq, Dv), None); SDPA does not expose its log-sum-exp."""
    check_sdpa(vis)
    enable_gqa = q.shape[1] != k.shape[1]
    if vis.hides_nothing():  # e.g. one decoding query that sees the whole cache
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        return out, None
    if vis.is_plain_causal():
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=enable_gqa
        )
        return out, None
    attn_mask, dead = vis.keep(("sdpa", q.dtype), lambda: _mask(vis, q))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
    )
    return out.masked_fill(dead, 0.0), None


def _mask(vis: Visibility, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's attn_mask (bool, or float in q's dtype with the score bias in it) and the dead rows (.., Tq, 1)."""
    allowed, bias = vis.dense()
    if vis.score_mod is not None:  # a declared bias: the mod on zero scores is the bias, its graph kept
        shape = (vis.batch or 1, vis.heads or 1, vis.tq, vis.tk)
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        zeros = torch.zeros(shape, dtype=compute, device=q.device)
        added = vis.modify(zeros, 0, vis.tq, 0, vis.tk, scratch=True)
        bias = added if bias is None else added + bias.to(added.dtype)
    dead = dead_rows(allowed, bias)  # (.., Tq, 1): rows where no key may be attended
    assert dead is not None  # something restricts the call, or hides_nothing() would have said so
    if bias is None:
        assert allowed is not None
        return allowed | dead, dead
    attn_mask = bias.to(q.dtype)
    if allowed is not None:
        attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
    return attn_mask.masked_fill(dead, 0.0), dead
