"""``attention()``: one call, every backend from the registry, every mask.

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
from typing import Any, Literal, overload

import torch

from attnlab._checks import check_dropout, check_scale
from attnlab.functional.eager import eager_attention
from attnlab.functional.finite import apply_rule, clean
from attnlab.functional.flash import DEFAULT_BLOCK, Flash
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.registry import KERNELS, Backend, Kernel, check_backend, resolve
from attnlab.functional.sinks import check_sinks, kept_share, sink_share
from attnlab.functional.visibility import Visibility
from attnlab.observe import Recorder, is_recording, note_unobserved, record


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
    for name, t in (("q", q), ("k", k), ("v", v)):
        for dim, what in ((1, "heads"), (3, "head_dim")):
            if t.shape[dim] == 0:
                raise ValueError(f"{name} has {what} = 0 (shape {tuple(t.shape)}); attention needs at least 1")
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


def check_mask(mask: object, target: tuple[int, int, int, int], device: torch.device) -> None:
    """Refuse a mask that is not bool/float, does not broadcast to ``target`` (B, H, Tq, Tk), or holds NaN/+inf."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"mask must be a torch.Tensor (bool: True = may attend, or float: added), got {type(mask).__name__}"
        )
    if not (mask.dtype == torch.bool or torch.is_floating_point(mask)):
        raise TypeError(
            f"mask must be bool (True = may attend) or floating point (added to the scores), got dtype {mask.dtype}; "
            "for 0/1 integer masks use mask.bool()"
        )
    if mask.dim() > 4:
        raise ValueError(f"mask must have at most 4 dims (batch, heads, Tq, Tk), got shape {tuple(mask.shape)}")
    if not all(m in (1, t) for m, t in zip(reversed(mask.shape), reversed(target), strict=False)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, Tq, Tk) = {target}; "
            "a key padding mask is (batch, 1, 1, Tk), a shared mask (Tq, Tk)"
        )
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but q is on {device}; move it with mask.to({str(device)!r})")
    if (
        mask.dtype != torch.bool
        and not torch.compiler.is_compiling()
        and bool((torch.isnan(mask) | torch.isposinf(mask)).any())
    ):
        raise ValueError(
            "a float mask must not hold NaN or +inf (a +inf score has no softmax); "
            "use -inf (or a bool mask with False) to hide a key, and finite values to bias it"
        )


def _normalize_mask(mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One form for every backend: a float mask in q's dtype.

    A float mask is cast once, up front, to q's dtype, as SDPA casts it: values
    beyond that dtype's range become -inf there, so every backend then sees the
    same mask, and a row left with only -inf attends to nothing and gives 0.
    """
    return mask if mask.dtype == torch.bool else mask.to(q.dtype)


_SUGAR = ("mask", "is_causal", "window", "mask_mod", "score_mod")


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visibility: Visibility | None,
    sugar: dict[str, Any],
    dropout_p: float,
    scale: float | None,
) -> tuple[Visibility, float]:
    """Check every argument, then the call's one Visibility (given, or built from the sugar) and the scale."""
    _check_qkv(q, k, v)
    check_dropout(dropout_p, name="dropout_p")
    check_scale(scale)
    b, h, tq, tk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if visibility is not None:
        given = [name for name in _SUGAR if sugar[name] not in (None, False)]
        if not isinstance(visibility, Visibility):
            raise TypeError(f"visibility must be an attnlab.functional.Visibility, got {type(visibility).__name__}")
        if given:
            raise ValueError(
                f"pass either visibility= or {', '.join(given)}, not both: add them to the Visibility with "
                "visibility.restrict(mask=..., mask_mod=..., score_mod=...)"
            )
        if visibility.k_pos is None or (visibility.tq, visibility.tk) != (tq, tk):
            keys = visibility.tk if visibility.k_pos is not None else "unbound"
            raise ValueError(
                f"the Visibility is for {visibility.tq} queries and {keys} keys, but q has {tq} and k has {tk}"
            )
        for part in (visibility.allowed, visibility.bias):
            if part is not None:
                check_mask(part, (b, h, tq, tk), part.device)
        return visibility.bound_to(b, h, q.device), _scale(q, scale)
    mask = sugar["mask"]
    if mask is not None:
        check_mask(mask, (b, h, tq, tk), q.device)
        mask = _normalize_mask(mask, q)
    if not isinstance(sugar["is_causal"], bool):
        raise TypeError(f"is_causal must be a bool, got {sugar['is_causal']!r}")
    vis = Visibility.from_lengths(
        tq,
        tk,
        device=q.device,
        causal=sugar["is_causal"],
        window=sugar["window"],
        mask=mask,
        mask_mod=sugar["mask_mod"],
        score_mod=sugar["score_mod"],
        batch=b,
        heads=h,
    )
    return vis, _scale(q, scale)


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    visibility: Visibility | None = ...,
    mask: torch.Tensor | None = ...,
    is_causal: bool = ...,
    window: int | None = ...,
    mask_mod: MaskMod | None = ...,
    score_mod: ScoreMod | None = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    backend: Backend = ...,
    return_weights: Literal[False] = ...,
    sinks: torch.Tensor | None = ...,
) -> torch.Tensor: ...
@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    visibility: Visibility | None = ...,
    mask: torch.Tensor | None = ...,
    is_causal: bool = ...,
    window: int | None = ...,
    mask_mod: MaskMod | None = ...,
    score_mod: ScoreMod | None = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    backend: Backend = ...,
    return_weights: Literal[True],
    sinks: torch.Tensor | None = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    visibility: Visibility | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: Backend = "auto",
    return_weights: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, softmax(score_mod(q k^T * scale) + mask) v, over (B, H, T, D).

    Args:
        q: queries (B, H, Tq, D).
        k, v: keys (B, Hkv, Tk, D) and values (B, Hkv, Tk, Dv); H must be a
            multiple of Hkv (grouped-query or multi-query attention).
        visibility: who may attend and what each score becomes, built once
            (:class:`attnlab.functional.Visibility`, from positions): what a
            model shares between its layers. Or say it with the sugar below,
            which builds one for this call (queries ending where the keys end).
        mask: bool, True = may attend, or float, added to the scaled scores;
            broadcastable to (B, H, Tq, Tk), as SDPA broadcasts (a (Tk,)
            mask too). A float mask is cast to q's dtype first (values beyond
            its range become -inf); NaN and +inf are refused. The flash
            backend treats float masks as constants.
        is_causal: hide the future; aligned bottom-right when Tq < Tk.
        window: sliding window: each query sees at most its last ``window``
            keys, itself included. Implies causal.
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's
            signature; built-ins in :mod:`attnlab.functional.mods`), True = may
            attend, at absolute positions; combined with the other masks.
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` on the scaled
            scores, before the mask. Every tensor it declares or reads gets its
            gradient (eager, flash, the ring); sdpa takes only a declared bias
            (``mods.alibi``, ``mods.relative_bias``, ``mods.bias(fn)``) and says so
            otherwise, and ``backend="auto"`` then picks flash.
        scale: defaults to 1 / sqrt(D).
        dropout_p: dropout on the attention weights, in [0, 1). Applied
            whenever > 0: pass 0.0 in evaluation.
        backend: "eager" (explicit math, returns weights), "sdpa" (PyTorch's
            fused kernel), "flash" (tiled, O(T) memory; ``Flash(block_q=,
            block_k=)`` sets its tiles), "flex" (PyTorch's flex_attention,
            compiled; inference on CPU), or "auto".
        return_weights: also return the (B, H, Tq, Tk) weights, detached, as a
            :class:`attnlab.observe.Recorder` takes them; eager (or auto) only.
        sinks: (H,) learned sink logits (gpt-oss): each row's softmax also counts exp(sink), a column with no
            value, so a row can give part of its attention to nothing (:mod:`attnlab.functional.sinks`). Read
            off the row log-sum-exp, on the backends that return it (eager, flash; "auto" picks one), with
            gradients for q, k, v and the sinks. The weights (``return_weights``, a Recorder's
            "attn_weights") are what the softmax gave the keys, as transformers' eager gpt-oss returns them:
            a row sums to 1 minus the sink's share, which a Recorder gets beside as "sink_weight" (B, H, Tq).

    Returns:
        The context (B, H, Tq, Dv), and the weights if ``return_weights``.
        A query with nothing to attend to (by a mask, or by a score_mod that
        makes its every score -inf) gets a zero context vector and zero
        gradients. A NaN or inf reaches exactly the outputs of the queries that
        may see it (``attnlab.functional.finite``).

    Raises:
        ValueError, TypeError: naming the bad value and the fix.
    """
    sugar = {"mask": mask, "is_causal": is_causal, "window": window, "mask_mod": mask_mod, "score_mod": score_mod}
    check_backend(backend)
    vis, scale_ = _prepare(q, k, v, visibility, sugar, dropout_p, scale)
    if sinks is not None and backend == "auto" and not (return_weights or is_recording()):
        backend = "flash"  # sinks are read off the row log-sum-exp, which sdpa does not return
    name, kernel = resolve(backend, need_weights=return_weights, vis=vis)
    if not return_weights:
        return run_kernel(name, kernel, q, k, v, vis, scale=scale_, dropout_p=dropout_p, sinks=sinks)[0]
    with Recorder(names=["attn_weights"]) as rec:  # the shortcut takes the weights the way any Recorder does
        out, _ = run_kernel(name, kernel, q, k, v, vis, scale=scale_, dropout_p=dropout_p, sinks=sinks)
    # no step when run_kernel answered an empty input without a kernel: its weights are all 0 too
    weights = rec.get("attn_weights") if rec.steps else q.new_zeros(*q.shape[:3], k.shape[2])
    return out, weights.to(q.dtype)


def run_kernel(
    name: str,
    kernel: Kernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``kernel`` (registered as ``name``) on checked arguments, with the rules every backend shares.

    Empty inputs (no batch, no query, no key) give zeros without a kernel call;
    non-finite inputs follow ``attnlab.functional.finite``; a float mask that
    requires grad is refused by a kernel that treats it as a constant.

    ``sinks`` (H,): learned sinks (gpt-oss), on a kernel that returns the row log-sum-exp. The eager backend
    counts them in its own softmax; a fused one's context is scaled by the share its keys kept. Either way the
    Recorder gets the sink's share as "sink_weight" (B, H, Tq) and weights that sum to the rest
    (:mod:`attnlab.functional.sinks`). The lse returned is the scores' own, without the sinks.
    """
    info = KERNELS[name]
    if sinks is not None:
        check_sinks(sinks, q.shape[1])
    if sinks is not None and not info.has_lse:
        raise ValueError(
            f"learned sinks are read off each row's log-sum-exp, which the {name} backend does not return: "
            "use backend='flash' or 'eager' (or 'auto')"
        )
    if vis.bias is not None and vis.bias.requires_grad and not info.float_mask_grad:
        raise ValueError(
            f"the {name} backend treats float masks as constants; for a mask that needs gradients "
            "use backend='eager' or 'sdpa'"
        )
    if is_recording() and not info.forms_weights:
        note_unobserved(f"backend {name!r} never forms the attention weights; use backend='eager' or 'auto'")
    b, h, tq, _ = q.shape
    if b == 0 or tq == 0 or vis.tk == 0:  # nothing to attend to (or nobody asking): zeros, as for a dead row
        empty_lse = torch.full((b, h, tq), float("inf"), dtype=torch.float32, device=q.device)
        if sinks is not None and is_recording():  # a row that sees no key gives its sink all of it
            record("sink_weight", sink_share(empty_lse, sinks).detach(), source="attention")
        return q.new_zeros(b, h, tq, v.shape[-1]), empty_lse if info.has_lse else None
    q, k, v, bad = clean(q, k, v)
    lse: torch.Tensor | None
    if sinks is not None and name == "eager":  # the readable path counts the sink in its softmax
        out, lse = eager_attention(q, k, v, vis, scale=scale, dropout_p=dropout_p, sinks=sinks)
    else:
        out, lse = kernel(q, k, v, vis, scale=scale, dropout_p=dropout_p)
        if sinks is not None:
            assert lse is not None  # has_lse, checked above
            if is_recording():
                record("sink_weight", sink_share(lse, sinks).detach(), source="attention")
            out = out * kept_share(lse, sinks)[..., None].to(out.dtype)  # (B, H, Tq, Dv): the keys' share
    if bad is not None:
        out = apply_rule(out, vis, bad)
    return out, lse


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    visibility: Visibility | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_q: int = DEFAULT_BLOCK,
    block_k: int = DEFAULT_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash backend with its row log-sum-exp: (out (B, H, Tq, Dv), lse (B, H, Tq)), +inf on a row that sees
    nothing. What the ring merges by. Same arguments and checks as :func:`attention`, and the tile sizes."""
    sugar = {"mask": mask, "is_causal": is_causal, "window": window, "mask_mod": mask_mod, "score_mod": score_mod}
    flash = Flash(block_q=block_q, block_k=block_k)
    vis, scale_ = _prepare(q, k, v, visibility, sugar, dropout_p, scale)
    out, lse = run_kernel("flash", flash, q, k, v, vis, scale=scale_, dropout_p=dropout_p)
    assert lse is not None  # the flash kernel always has it
    return out, lse
