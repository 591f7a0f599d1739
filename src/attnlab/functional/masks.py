"""Mask tensors, one convention everywhere: True = may attend.

Helpers that make the masks users pass around: causal and sliding-window
pictures, key padding from lengths, and ``torch.nn.MultiheadAttention``'s
masks turned into attnlab's convention. What a mask means inside a call
(causal, window, positions, mods) is answered in one place,
:class:`attnlab.functional.visibility.Visibility`; these helpers ask it.

Causal alignment: with Tq queries and Tk keys, the queries end where the
keys end (bottom-right): the last query sees every key, as in cached decoding
and chunked prefill. For Tq == Tk this is the usual lower triangle, SDPA's
``is_causal=True``. Queries elsewhere: ``Visibility.from_lengths(tq, tk, q_start=...)``.

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_window
from attnlab.functional.visibility import Visibility


def causal_mask(tq: int, tk: int, *, device: torch.device | None = None) -> torch.Tensor:
    """(Tq, Tk) bool, True where query i may see key j (queries aligned bottom-right)."""
    allowed, _ = Visibility.from_lengths(tq, tk, causal=True, device=device).tile(0, tq, 0, tk)
    assert allowed is not None
    return allowed[0, 0]


def sliding_window_mask(tq: int, tk: int, window: int, *, device: torch.device | None = None) -> torch.Tensor:
    """(Tq, Tk) bool: causal, and at most the last ``window`` keys (the query's own included)."""
    check_window(window)
    vis = Visibility.from_lengths(tq, tk, window=window, device=device)
    allowed, _ = vis.tile(0, tq, 0, tk)
    assert allowed is not None
    return allowed[0, 0]


def padding_mask(lengths: torch.Tensor, max_len: int, *, left: bool = False) -> torch.Tensor:
    """(B, 1, 1, Tk) bool from sequence lengths: True on real tokens, False on padding.

    ``left=True`` for left-padded batches (padding first, as in batched generation).
    """
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {tuple(lengths.shape)}")
    if (lengths < 0).any() or (lengths > max_len).any():
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    pos = torch.arange(max_len, device=lengths.device)
    keep = pos >= (max_len - lengths)[:, None] if left else pos < lengths[:, None]
    return keep[:, None, None, :]


def from_torch_mha_masks(
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    *,
    num_heads: int | None = None,
) -> torch.Tensor | None:
    """Convert ``torch.nn.MultiheadAttention`` masks to attnlab's convention.

    nn.MultiheadAttention's boolean masks say True = *masked out*; attnlab's say
    True = *may attend*, so booleans are inverted. Float masks are additive in
    both and pass through. ``key_padding_mask`` (B, Tk) becomes (B, 1, 1, Tk);
    a 3-D ``attn_mask`` (B * num_heads, Tq, Tk), one mask per head, becomes
    (B, num_heads, Tq, Tk) and needs ``num_heads``.
    Returns one mask for ``attention(mask=...)``, or None when given none.
    """
    parts: list[torch.Tensor] = []
    if attn_mask is not None:
        if attn_mask.dim() == 3:
            if num_heads is None or attn_mask.shape[0] % num_heads:
                raise ValueError(
                    f"a 3-D attn_mask is (batch * num_heads, Tq, Tk), got shape {tuple(attn_mask.shape)} "
                    f"with num_heads={num_heads}; pass the module's num_heads"
                )
            b = attn_mask.shape[0] // num_heads
            attn_mask = attn_mask.view(b, num_heads, *attn_mask.shape[1:])  # (B*H, Tq, Tk) -> (B, H, Tq, Tk)
        elif attn_mask.dim() != 2:
            raise ValueError(
                f"attn_mask must be (Tq, Tk) or (batch * num_heads, Tq, Tk), got shape {tuple(attn_mask.shape)}"
            )
        parts.append(~attn_mask if attn_mask.dtype == torch.bool else attn_mask)
    if key_padding_mask is not None:
        if key_padding_mask.dim() != 2:
            raise ValueError(f"key_padding_mask must be (batch, Tk), got shape {tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
        parts.append(~kpm if kpm.dtype == torch.bool else kpm)
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        return parts[0] if len(parts) == 1 else parts[0] & parts[1]
    float_dtype = next(p.dtype for p in parts if p.dtype != torch.bool)
    total: torch.Tensor | None = None
    for p in parts:
        if p.dtype == torch.bool:  # may attend -> 0, masked -> -inf
            p = torch.zeros(p.shape, dtype=float_dtype, device=p.device).masked_fill(~p, float("-inf"))
        total = p if total is None else total + p
    return total
