"""The flex backend: PyTorch's FlexAttention, handed the same mask and score functions as every other backend.

attnlab's masks become one ``mask_mod`` (causal and window at their offsets,
the boolean mask, the user's ``mask_mod`` at absolute positions) and one
``score_mod`` (the user's, then the float mask as a bias), so the call means
what it means on eager, sdpa and flash. ``flex_attention`` is compiled with
``torch.compile`` (the first call of a new shape or mod compiles, seconds on
a CPU; later calls reuse it): uncompiled, it materializes the whole score
matrix. Float64 on a CPU, which the compiled kernel does not take, runs
uncompiled. It has no dropout, and on CPU no backward (PyTorch 2.13): both are
refused with the way out, before anything runs.

Shapes: B = batch, H = query heads, Hkv = key/value heads, Tq / Tk = query / key lengths.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from attnlab.functional.masks import MaskSpec
from attnlab.functional.mods import evaluate_mask, learnable_tensors


@functools.cache
def _compiled() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Compiled flex_attention; uncompiled where the compiled kernel cannot take the input (float64 on CPU)."""
    if q.device.type == "cpu" and q.dtype == torch.float64:
        from torch.nn.attention.flex_attention import flex_attention

        with warnings.catch_warnings():
            # the uncompiled path is chosen here on purpose (the exact reference): its advice to compile is moot
            warnings.filterwarnings(
                "ignore", message="flex_attention called without torch.compile", category=UserWarning
            )
            return flex_attention(q, *args, **kwargs)
    return _compiled()(q, *args, **kwargs)


def _mask_mod(spec: MaskSpec, batch: int, heads: int) -> Callable[..., torch.Tensor]:
    """Everything that hides a key, as one mask_mod over the call's own indices (0..Tq-1, 0..Tk-1).

    Keys at ``tk`` and past it are padding (see ``flex_attention_kernel``) and always hidden.
    """
    tq, tk = spec.tq, spec.tk
    off, q0, k0, window, user = spec.offset(), spec.q_start(), spec.kv_offset, spec.window, spec.mask_mod
    allowed = spec.allowed.expand(batch, heads, spec.tq, spec.tk) if spec.allowed is not None else None
    causal = spec.causal

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        ok = kv_idx < tk  # the padding is never seen
        q_idx, kv_idx = q_idx.clamp(max=tq - 1), kv_idx.clamp(max=tk - 1)  # padding asks as the last real position
        if causal:
            ok = ok & (q_idx + off >= kv_idx)
        if window is not None:
            ok = ok & (q_idx + off - kv_idx < window)
        if allowed is not None:
            ok = ok & allowed[b, h, q_idx, kv_idx]
        if user is not None:
            ok = ok & user(b, h, q_idx + q0, kv_idx + k0)
        return ok

    return mask_mod


def _score_mod(spec: MaskSpec, batch: int, heads: int) -> Callable[..., torch.Tensor] | None:
    if spec.score_mod is None and spec.bias is None:
        return None
    q0, k0, user, tq, tk = spec.q_start(), spec.kv_offset, spec.score_mod, spec.tq, spec.tk
    bias = spec.bias.expand(batch, heads, tq, tk) if spec.bias is not None else None

    def score_mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        q_idx, kv_idx = q_idx.clamp(max=tq - 1), kv_idx.clamp(max=tk - 1)  # padding: hidden by the mask
        if user is not None:
            score = user(score, b, h, q_idx + q0, kv_idx + k0)
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return score_mod


def check_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, dropout_p: float) -> None:
    """What FlexAttention cannot do here, refused before it runs."""
    if dropout_p > 0.0:
        raise ValueError("backend='flex' has no dropout (FlexAttention has none): pass dropout_p=0.0 or use 'flash'")
    wants_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v))
        or bool(learnable_tensors(spec.score_mod))
        or (spec.bias is not None and spec.bias.requires_grad)
    )
    if wants_grad and q.device.type == "cpu":
        raise ValueError(
            f"PyTorch {torch.__version__}'s flex_attention has no backward on CPU: run it under torch.no_grad() for "
            "inference, or use backend='flash', which takes the same mask_mod and score_mod with gradients"
        )


def flex_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """The kernel contract: (out (B, H, Tq, Dv), None): compiled FlexAttention on CPU cannot return its lse."""
    from torch.nn.attention.flex_attention import create_block_mask

    check_flex(q, k, v, spec, dropout_p)
    b, h = q.shape[0], q.shape[1]
    # Compiled on CPU, flex_attention gave NaN or wrong rows for lengths that are not a multiple of its
    # 128 block (PyTorch 2.13, seen here): pad queries and keys up to one, hide the padded keys, drop the rows.
    tq, tk = _round_up(spec.tq), _round_up(spec.tk)
    q, k, v = _pad(q, tq), _pad(k, tk), _pad(v, tk)  # (B, H, Tq', D), (B, Hkv, Tk', D)
    by_batch, by_head = _depends(spec, b, h, q.device)  # a mask shared by every head is built once, not once per head
    block_mask = create_block_mask(
        _mask_mod(spec, b, h), b if by_batch else None, h if by_head else None, tq, tk, device=q.device
    )
    out = _flex(
        q,
        k,
        v,
        score_mod=_score_mod(spec, b, h),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[:, :, : spec.tq], None  # a row that sees nothing: FlexAttention gives 0, as the contract says


BLOCK = 128  # FlexAttention's default block


def _depends(spec: MaskSpec, batch: int, heads: int, device: torch.device) -> tuple[bool, bool]:
    """Whether the masks differ across the batch and across heads: read off their broadcast shapes."""
    by_batch = by_head = False
    if spec.allowed is not None:
        shape = (1,) * (4 - spec.allowed.dim()) + tuple(spec.allowed.shape)  # (B|1, H|1, Tq|1, Tk|1)
        by_batch, by_head = shape[0] > 1, shape[1] > 1
    if spec.mask_mod is not None:  # one query and one key are enough to see which indices the mod broadcasts over
        one = evaluate_mask(
            spec.mask_mod,
            batch=batch,
            heads=heads,
            q_idx=torch.tensor([spec.q_start()], device=device),
            kv_idx=torch.tensor([spec.kv_offset], device=device),
        )
        shape = (1,) * (4 - one.dim()) + tuple(one.shape)
        by_batch, by_head = by_batch or shape[0] > 1, by_head or shape[1] > 1
    return by_batch, by_head


def _round_up(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _pad(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, T, D) -> (B, H, length, D) with zeros after the last position."""
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))
