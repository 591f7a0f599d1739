"""The flex backend: PyTorch's FlexAttention, handed the same Visibility as every other backend.

The call's :class:`Visibility` gives one ``mask_mod`` (its one predicate on
positions: causal, window, empty slots, the bool mask, the user's
``mask_mod``) and one ``score_mod`` (the user's, then the float mask as a
bias), so the call means what it means on eager, sdpa and flash. The block
mask is built once per Visibility and kept on it: a model's layers, which
share one, share it too, as FlexAttention intends. ``flex_attention`` is
compiled with ``torch.compile`` (the first call of a new shape or mod
compiles, seconds on a CPU; later calls reuse it): uncompiled, it
materializes the whole score matrix. Float64 on a CPU, which the compiled
kernel does not take, runs uncompiled. It has no dropout, and on CPU no
backward (PyTorch 2.13): both are refused with the way out, before anything runs.

Shapes: B = batch, H = query heads, Hkv = key/value heads, Tq / Tk = query / key lengths.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from attnlab.functional.visibility import Visibility


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


def check_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, dropout_p: float) -> None:
    """What FlexAttention cannot do here, refused before it runs."""
    if dropout_p > 0.0:
        raise ValueError("backend='flex' has no dropout (FlexAttention has none): pass dropout_p=0.0 or use 'flash'")
    wants_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v))
        or bool(vis.trained_tensors())
        or (vis.bias is not None and vis.bias.requires_grad)
    )
    if wants_grad and q.device.type == "cpu":
        raise ValueError(
            f"PyTorch {torch.__version__}'s flex_attention has no backward on CPU: run it under torch.no_grad() for "
            "inference, or use backend='flash', which takes the same mask_mod and score_mod with gradients"
        )


BLOCK = 128  # FlexAttention's default block


def _round_up(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _round_keys(n: int) -> int:
    """A key count padded to a power of two of blocks: a cache's filled slots grow by one a step, and this keeps
    the compiled kernel's shapes to a handful (128, 256, 512, ...) instead of a new one every 128 tokens."""
    blocks = -(-n // BLOCK)
    return BLOCK * (1 << (blocks - 1).bit_length()) if blocks else 0


def block_mask(vis: Visibility, batch: int, heads: int) -> tuple[Any, Callable[..., torch.Tensor] | None]:
    """(FlexAttention's BlockMask, the score_mod) for ``vis``, built once and kept on it."""

    def build() -> tuple[Any, Callable[..., torch.Tensor] | None]:
        from torch.nn.attention.flex_attention import create_block_mask

        tq, tk = _round_up(vis.tq), _round_keys(vis.tk)
        mask_mod, modded = vis.flex_mods(tq, tk)
        score_mod = None if modded is None else _in_scores_dtype(modded)
        by_batch, by_head = vis.depends_on_batch_and_head()  # a mask shared by every head is built once
        made = create_block_mask(
            mask_mod, batch if by_batch else None, heads if by_head else None, tq, tk, device=vis.q_pos.device
        )
        return made, score_mod

    built: tuple[Any, Callable[..., torch.Tensor] | None] = vis.keep("flex", build)
    return built


def _in_scores_dtype(mod: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``mod`` with its result cast to the scores' dtype, as on every other backend (``mods.apply_score_mod``):
    compiled on CPU, a float64 result on float32 scores came out wrong with no error (PyTorch 2.13, seen here)."""

    def score_mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return mod(score, b, h, q_idx, kv_idx).to(score.dtype)

    return score_mod


def flex_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """The kernel contract: (out (B, H, Tq, Dv), None): compiled FlexAttention on CPU cannot return its lse."""
    check_flex(q, k, v, vis, dropout_p)
    # Compiled on CPU, flex_attention gave NaN or wrong rows for lengths that are not a multiple of its
    # 128 block (PyTorch 2.13, seen here): pad queries up to one and keys up to a power of two of them
    # (_round_keys), hide the padded keys, drop the rows.
    tq, tk = _round_up(vis.tq), _round_keys(vis.tk)
    q, k, v = _pad(q, tq), _pad(k, tk), _pad(v, tk)  # (B, H, Tq', D), (B, Hkv, Tk', D)
    mask, score_mod = block_mask(vis, q.shape[0], q.shape[1])
    out = _flex(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, : vis.tq], None  # a row that sees nothing: FlexAttention gives 0, as the contract says


def _pad(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, T, D) -> (B, H, length, D) with zeros after the last position."""
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))
