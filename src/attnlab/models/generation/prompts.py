"""What a prompt's token ids and its ``attention_mask`` mean, checked: for generation each row's real tokens
(:func:`prompt_rows`, :func:`many_rows`), for a forward pass the positions and the key padding mask
(:func:`positions_and_padding`). Left padding: zeros first in ``attention_mask``; a row's positions count its
real tokens only, so it gets the positions it would have alone.

Shapes: B = batch, T = new tokens, Tk = cached + new tokens.
"""

from __future__ import annotations

import torch

from attnlab.cache import Cache, ModelCache


def check_prompt(idx: object, *, vocab_size: int | None = None) -> None:
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"token ids must be a torch.Tensor (batch, tokens), got {type(idx).__name__}")
    if idx.dim() != 2 or idx.dtype != torch.long:
        hint = "; for one sequence use idx.unsqueeze(0)" if idx.dim() == 1 else ""
        raise ValueError(
            f"token ids must be (batch, tokens) of dtype torch.long, got {idx.dtype} {tuple(idx.shape)}{hint}"
        )
    if idx.shape[1] == 0:
        raise ValueError(f"the prompt is empty (shape {tuple(idx.shape)}); give at least one token to start from")
    if vocab_size is not None and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got [{int(idx.min())}, {int(idx.max())}]")


def prompt_rows(idx: torch.Tensor, attention_mask: torch.Tensor | None, *, vocab_size: int) -> list[list[int]]:
    """Each row's real tokens: idx (B, T) without its left padding (``attention_mask`` (B, T), 0 on padding)."""
    check_prompt(idx, vocab_size=vocab_size)
    if attention_mask is None:
        return [row.tolist() for row in idx]
    b, t = idx.shape
    if tuple(attention_mask.shape) != (b, t):
        raise ValueError(f"attention_mask must match the prompt's shape {(b, t)}, got {tuple(attention_mask.shape)}")
    real = attention_mask.bool()
    if t > 1 and bool((real[:, 1:] < real[:, :-1]).any()):
        raise ValueError(
            "attention_mask must pad on the left (zeros first, then ones), as generation appends on the right; "
            "a row has a 0 after a 1: left-pad the batch"
        )
    if not bool(real[:, -1].all()):
        raise ValueError("a row of attention_mask is all padding: give every row at least one real token")
    return [row[keep].tolist() for row, keep in zip(idx, real, strict=True)]


def many_rows(prompts: object, *, vocab_size: int) -> list[list[int]]:
    """generate_many's prompts (a list of lists of token ids), each checked, the error naming which."""
    if not isinstance(prompts, list) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts, each a list of token ids")
    for n, prompt in enumerate(prompts):
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt {n} must be a non-empty list of int token ids, got {prompt!r:.60}")
        bad = [(i, t) for i, t in enumerate(prompt) if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompt {n} has token id {bad[0][1]} at position {bad[0][0]}: this model's ids are 0..{vocab_size - 1}"
            )
    return prompts


def positions_and_padding(
    idx: torch.Tensor, attention_mask: torch.Tensor | None, caches: ModelCache | list[Cache] | None, *, layers: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions of the new tokens (T,) or (B, T), and the key padding mask (B, 1, 1, Tk) or None.

    ``attention_mask`` (B, Tk) covers cached and new tokens, 1 on real tokens
    and 0 on left padding. Positions count real tokens only, so a left-padded
    row gets the positions it would have alone.
    """
    b, t = idx.shape
    if caches is not None and len(caches) != layers:
        raise ValueError(f"expected {layers} caches (one per layer), got {len(caches)}")
    if attention_mask is None:  # the cache's own positions: (T,), or (B, T) for a cache whose sequences differ
        return caches[0].next_positions(t) if caches else torch.arange(t, device=idx.device), None
    ahead = caches[0].next_positions(1) if caches else None
    if ahead is not None and ahead.dim() == 2:  # per sequence (a paged cache): padded, they hold one length
        if bool((ahead != ahead[:1]).any()):
            raise ValueError(
                "attention_mask pads sequences to one length; this cache's sequences hold different lengths "
                f"({ahead[:, 0].tolist()}) (a paged cache): give it the sequences as they are, without padding or "
                "attention_mask"
            )
        ahead = ahead[0]
    start = int(ahead[0]) if ahead is not None else 0
    if tuple(attention_mask.shape) != (b, start + t):
        raise ValueError(
            f"attention_mask must be (batch, cached + new tokens) = {(b, start + t)}, got {tuple(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    positions = (real.long().cumsum(dim=-1) - 1).clamp(min=0)[:, start:]  # (B, T)
    return positions, real[:, None, None, :]  # (B, 1, 1, Tk): key padding
