"""``attention()``: one call, three verified backends, every mask.

>>> import torch
>>> q = k = v = torch.randn(1, 2, 5, 8)
>>> out, w = attention(q, k, v, is_causal=True, backend="eager", return_weights=True)
>>> out.shape, bool(w[0, 0, 0, 1:].eq(0).all())
(torch.Size([1, 2, 5, 8]), True)

Shapes: B = batch, H = query heads, Hkv = key/value heads, Tq / Tk = query /
key lengths, D = head_dim (Dv for values).
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch

from attnlab.functional.eager import eager_attention, repeat_kv
from attnlab.functional.flash import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention_core
from attnlab.functional.masks import CausalAlign, MaskSpec, _check_window
from attnlab.functional.sdpa import sdpa_attention

Backend = Literal["auto", "eager", "sdpa", "flash"]
BACKENDS: tuple[str, ...] = ("auto", "eager", "sdpa", "flash")


def _check_qkv(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, heads, seq, head_dim), got {t.dim()}-D shape {tuple(t.shape)}; "
                "from (batch, seq, heads * head_dim) use x.view(b, t, h, d).transpose(1, 2)"
            )
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} must be floating point, got dtype {t.dtype}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them with .to()")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[1]} and {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length, got {k.shape[2]} and {v.shape[2]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]}) for grouped-query "
            f"attention; choose kv heads among {[h for h in range(1, q.shape[1] + 1) if q.shape[1] % h == 0]}"
        )


def _check_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"mask must be a torch.Tensor (bool: True = may attend, or float: added), got {type(mask).__name__}"
        )
    if not (mask.dtype == torch.bool or torch.is_floating_point(mask)):
        raise TypeError(
            f"mask must be bool (True = may attend) or floating point (added to the scores), got dtype {mask.dtype}; "
            "for 0/1 integer masks use mask.bool()"
        )
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    ok = mask.dim() <= 4 and all(m in (1, t) for m, t in zip(reversed(mask.shape), reversed(target), strict=False))
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, Tq, Tk) = {target}; "
            "a key padding mask is (batch, 1, 1, Tk), a shared mask (Tq, Tk)"
        )
    if mask.device != q.device:
        raise ValueError(f"mask is on {mask.device} but q is on {q.device}; move it with mask.to(q.device)")


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    window: int | None,
    dropout_p: float,
    scale: float | None,
    causal_align: CausalAlign,
    block_q: int,
    block_k: int,
) -> tuple[MaskSpec, float]:
    """Check every argument, then gather the masks into one MaskSpec and resolve the scale."""
    _check_qkv(q, k, v)
    if mask is not None:
        _check_mask(mask, q, k)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if window is not None:
        _check_window(window)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be a positive finite number or None (1/sqrt(head_dim)), got {scale!r}")
    if causal_align not in ("bottom_right", "top_left"):
        raise ValueError(f"causal_align must be 'bottom_right' or 'top_left', got {causal_align!r}")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")

    spec = MaskSpec(
        tq=q.shape[2],
        tk=k.shape[2],
        causal=is_causal or window is not None,
        align=causal_align,
        window=window,
        allowed=mask if mask is not None and mask.dtype == torch.bool else None,
        bias=mask if mask is not None and mask.dtype != torch.bool else None,
    )
    return spec, 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = ...,
    is_causal: bool = ...,
    window: int | None = ...,
    dropout_p: float = ...,
    scale: float | None = ...,
    backend: Backend = ...,
    return_weights: Literal[False] = ...,
    causal_align: CausalAlign = ...,
    block_q: int = ...,
    block_k: int = ...,
) -> torch.Tensor: ...
@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = ...,
    is_causal: bool = ...,
    window: int | None = ...,
    dropout_p: float = ...,
    scale: float | None = ...,
    backend: Backend = ...,
    return_weights: Literal[True],
    causal_align: CausalAlign = ...,
    block_q: int = ...,
    block_k: int = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: Backend = "auto",
    return_weights: bool = False,
    causal_align: CausalAlign = "bottom_right",
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, softmax(q k^T * scale + mask) v, over (B, H, T, D).

    Args:
        q: queries (B, H, Tq, D).
        k, v: keys (B, Hkv, Tk, D) and values (B, Hkv, Tk, Dv); H must be a
            multiple of Hkv (grouped-query or multi-query attention).
        mask: bool, True = may attend, or float, added to the scaled scores;
            broadcastable to (B, H, Tq, Tk). Float masks are treated as
            constants by the flash backend.
        is_causal: hide the future; aligned bottom-right when Tq < Tk.
        window: sliding window: each query sees at most its last ``window``
            keys, itself included. Implies causal.
        dropout_p: dropout on the attention weights, in [0, 1). Applied
            whenever > 0: pass 0.0 in evaluation.
        scale: defaults to 1 / sqrt(D).
        backend: "eager" (explicit math, returns weights), "sdpa" (PyTorch's
            fused kernel), "flash" (tiled, O(T) memory), or "auto".
        return_weights: also return the (B, H, Tq, Tk) weights; eager only.
        causal_align: "bottom_right" (default) or "top_left" (SDPA's convention).
        block_q, block_k: tile sizes of the flash backend.

    Returns:
        The context (B, H, Tq, Dv), and the weights if ``return_weights``.
        A query with nothing to attend to gets a zero context vector.

    Raises:
        ValueError, TypeError: naming the bad value and the fix.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if return_weights and backend in ("sdpa", "flash"):
        raise ValueError(
            f"return_weights=True needs the eager backend; backend={backend!r} never forms the weights. "
            "Use backend='eager' (or 'auto')"
        )
    spec, scale_ = _prepare(q, k, v, mask, is_causal, window, dropout_p, scale, causal_align, block_q, block_k)

    chosen = backend
    if backend == "auto":
        chosen = "eager" if return_weights else "sdpa"  # SDPA's fused kernels are the fastest on every device
    if chosen == "eager":
        out, weights = eager_attention(q, k, v, spec, scale=scale_, dropout_p=dropout_p)
        return (out, weights) if return_weights else out
    if chosen == "sdpa":
        return sdpa_attention(q, k, v, spec, scale=scale_, dropout_p=dropout_p)
    out, _ = _flash(q, k, v, spec, scale_, dropout_p, block_q, block_k)
    return out


def _flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    scale: float,
    dropout_p: float,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash backend on checked arguments: kv heads repeated for GQA, (out, lse)."""
    if spec.bias is not None and spec.bias.requires_grad:
        raise ValueError(
            "the flash backend treats float masks as constants; for a mask that needs gradients use backend='eager' or 'sdpa'"
        )
    groups = q.shape[1] // k.shape[1]
    return flash_attention_core(
        q,
        repeat_kv(k, groups),
        repeat_kv(v, groups),
        spec,
        scale=scale,
        dropout_p=dropout_p,
        block_q=block_q,
        block_k=block_k,
    )


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    causal_align: CausalAlign = "bottom_right",
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash backend with its row log-sum-exp: (out (B, H, Tq, Dv), lse (B, H, Tq), float32 for half inputs).

    lse is log(sum_j exp(score_ij)) over the keys row i may see; +inf on rows
    that see none. Same arguments and checks as :func:`attention`.
    """
    spec, scale_ = _prepare(q, k, v, mask, is_causal, window, dropout_p, scale, causal_align, block_q, block_k)
    return _flash(q, k, v, spec, scale_, dropout_p, block_q, block_k)
