"""The sdpa backend: torch.nn.functional.scaled_dot_product_attention.

PyTorch picks its kernel (on CPU, a fused flash kernel where it applies). Two
things differ from attnlab's contract and are fixed here: SDPA aligns a
causal mask top-left when Tq != Tk (we pass an explicit bottom-right mask
then), and a row with nothing to attend to gives NaN (we let such rows attend
everywhere, then zero their output, which also zeroes their gradient).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.functional.eager import dead_rows
from attnlab.functional.masks import MaskSpec
from attnlab.functional.mods import mod_name


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """The kernel contract: (context (B, H, Tq, Dv), None); SDPA does not expose its log-sum-exp."""
    return _sdpa(q, k, v, spec, scale=scale, dropout_p=dropout_p), None


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, *, scale: float, dropout_p: float
) -> torch.Tensor:
    enable_gqa = q.shape[1] != k.shape[1]
    if spec.empty:  # nothing hidden, e.g. one decoding query that sees the whole cache
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
    if (
        spec.causal
        and not spec.has_mods
        and spec.window is None
        and spec.allowed is None
        and spec.bias is None
        and (spec.tq == spec.tk or spec.align == "top_left")
    ):
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=enable_gqa
        )

    allowed, bias = spec.dense(q.device)  # a mask_mod is materialized here, on the whole grid
    if spec.score_mod is not None:
        modified = score_mod_bias(spec, q)
        bias = modified if bias is None else modified + bias.to(modified.dtype)
    dead = dead_rows(allowed, bias)  # (.., Tq, 1): rows where no key may be attended
    assert dead is not None  # spec.empty is False, so there is a mask

    if bias is None:
        assert allowed is not None
        attn_mask = allowed | dead
    else:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
        attn_mask = attn_mask.masked_fill(dead, 0.0)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
    )
    return out.masked_fill(dead, 0.0)


def score_mod_bias(spec: MaskSpec, q: torch.Tensor) -> torch.Tensor:
    """The score_mod as the additive bias SDPA can take, (B, H, Tq, Tk); refused when the mod is not a bias.

    A mod is a bias when score_mod(s) - s does not depend on s: checked at s = 0
    and at seeded random scores. The bias keeps the graph to the mod's
    learnable tensors, so they train through SDPA's float mask.
    """
    assert spec.score_mod is not None
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    shape = (spec.batch, spec.heads, spec.tq, spec.tk)
    zeros = torch.zeros(shape, dtype=compute, device=q.device)
    bias = spec.modify(zeros, 0, spec.tq, 0, spec.tk)
    probe = torch.randn(
        shape, generator=torch.Generator(device=q.device).manual_seed(0), dtype=compute, device=q.device
    )
    again = spec.modify(probe, 0, spec.tq, 0, spec.tk) - probe
    finite = torch.isfinite(bias)
    if not torch.allclose(bias.detach()[finite], again.detach()[finite], atol=1e-4, rtol=1e-4):
        raise ValueError(
            f"score_mod {mod_name(spec.score_mod)} is not an additive bias (score_mod(s) - s changes with s), and "
            "sdpa can only add a bias to the scores; use backend='flash' (tiled, with gradients) or 'eager'"
        )
    return bias.to(q.dtype)
