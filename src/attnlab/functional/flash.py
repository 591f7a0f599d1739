"""The flash backend: the tiled passes of ``flash_passes.py`` behind autograd, with their own tile sizes.

Every tile is classified once per Visibility (``Visibility.tile_kinds``, kept on it): EMPTY
tiles, which the causal or window structure or a ``mask_mod`` hides entirely,
are skipped (half the work of causal attention; most of it for packed
documents); FULL tiles get no mask work; PARTIAL ones are masked. The backward
recomputes each tile, so memory stays O(T * D) both ways.

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths, D / Dv = head dims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.functional.eager import repeat_kv
from attnlab.functional.flash_passes import DEFAULT_BLOCK, flash_backward, flash_forward
from attnlab.functional.visibility import Visibility


class _FlashFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        vis: Visibility,
        scale: float,
        dropout_p: float,
        seed: int,
        blocks: tuple[int, int],
        fused: bool,
        *params: torch.Tensor,  # the score_mod's learnable tensors: inputs, so they get gradients
    ) -> tuple[torch.Tensor, torch.Tensor]:
        block_q, block_k = blocks
        kernel: dict[str, Any] = dict(scale=scale, dropout_p=dropout_p, seed=seed, block_q=block_q, block_k=block_k)
        # kept on the Visibility: the backward and the next layer walk the same tiles
        kernel["kinds"] = vis.tile_kinds(*blocks)
        out, lse = flash_forward(q, k, v, vis, fused=fused, **kernel)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.vis, ctx.kernel = vis, kernel  # the backward recomputes the same tiles with the same settings
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
        if torch.is_grad_enabled():  # create_graph=True: a gradient of this gradient is asked for
            raise RuntimeError(
                "the flash backend has no double backward (its backward recomputes tiles outside autograd); "
                "for gradients of gradients use backend='eager'"
            )
        return _flash_backward(ctx, grad_out, grad_lse)


def _flash_backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None = None) -> tuple[Any, ...]:
    """dq, dk, dv and the score_mod tensors' gradients, recomputed tile by tile (grad mode is off here)."""
    q, k, v, out, lse, *params = ctx.saved_tensors
    dq, dk, dv, dparams = flash_backward(
        grad_out, q, k, v, out, lse, ctx.vis, params=tuple(params), grad_lse=grad_lse, **ctx.kernel
    )
    return dq, dk, dv, None, None, None, None, None, None, *dparams


def flash_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float = 0.0,
    block_q: int = DEFAULT_BLOCK,
    block_k: int = DEFAULT_BLOCK,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel contract: (out (B, H, Tq, Dv), lse (B, H, Tq)), tiled by block_q x block_k; ``fused``: see
    :func:`flash_forward`.

    Float masks are constants here: one that requires grad is refused by ``attention()`` before this runs.
    Every tensor the score_mod declares or reads (``Visibility.trained_tensors``) gets its gradient.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, Tk, D): each query head reads its kv head
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout_p > 0.0 else 0
    params = vis.trained_tensors()
    out, lse = _FlashFunction.apply(q, k, v, vis, scale, dropout_p, seed, (block_q, block_k), fused, *params)
    return out, lse


@dataclass(frozen=True)
class Flash:
    """The flash backend with its own tile sizes: ``attention(..., backend=Flash(block_q=16, block_k=16))``.

    Tile sizes belong to this backend alone; ``backend="flash"`` uses 256 x 256. ``fused=False`` walks
    every tile in PyTorch here (the readable path); by default, on the CPU, runs of FULL tiles and causal
    diagonal tiles go to PyTorch's fused flash kernel, which returns the log-sum-exp that the merge needs.
    """

    block_q: int = DEFAULT_BLOCK
    block_k: int = DEFAULT_BLOCK
    fused: bool = True

    def __post_init__(self) -> None:
        check_positive_int("block_q", self.block_q)
        check_positive_int("block_k", self.block_k)
        if not isinstance(self.fused, bool):
            raise TypeError(f"fused must be True or False, got {self.fused!r}")

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, *, scale: float, dropout_p: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return flash_attention_kernel(
            q, k, v, vis, scale=scale, dropout_p=dropout_p, block_q=self.block_q, block_k=self.block_k, fused=self.fused
        )
