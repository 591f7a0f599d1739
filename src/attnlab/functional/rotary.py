"""Rotary position embedding (RoPE), in the rotate-half layout of Llama.

RoFormer (Su et al., 2021), eq. 34: rotate each pair of dimensions of q and k
by an angle proportional to the token's position, so that q_m . k_n depends
only on m - n. The rotate-half layout pairs dimension i with i + D/2 (not
2i with 2i+1), which is what Llama checkpoints and Hugging Face expect.

A function of positions, so it sits on the floor below both ``nn`` (the Attention module rotates its
queries and keys) and ``cache`` (a sink cache rotates its sinks on); ``attnlab.nn`` exports it too.

Shapes: B = batch, H = heads, T = tokens, D = head_dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by angles whose cos/sin are (T, D) or (B, 1, T, D)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """cos and sin tables for given positions; no parameters.

    Args:
        head_dim: D, even.
        base: theta in inv_freq_i = base^(-2i / D); 10000 in RoFormer and Llama 2.
    """

    def __init__(self, *, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim >= 2, got {head_dim!r}")
        if not base > 1.0:
            raise ValueError(f"rotary base must be > 1, got {base!r}")
        self.head_dim = head_dim
        self.base = float(base)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.inv_freq: torch.Tensor

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, D) for positions (T,), or (B, 1, T, D) for positions (B, T)."""
        if positions.dtype.is_floating_point or positions.dim() not in (1, 2):
            raise ValueError(
                f"positions must be an integer tensor of shape (T,) or (B, T), got {positions.dtype} {tuple(positions.shape)}"
            )
        if (
            not torch.compiler.is_compiling() and positions.numel() and int(positions.min()) < 0
        ):  # no sync when compiled
            raise ValueError(f"positions must be >= 0, got a minimum of {int(positions.min())}")
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # (.., T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (.., T, D): rotate-half layout
        if positions.dim() == 2:
            emb = emb[:, None]  # (B, 1, T, D): broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) rotated by ``positions`` (T,): RoPE's rotations add up, so rotating a key already at
        position p by d puts it at p + d (what a sink cache does to move its sinks)."""
        cos, sin = self(positions, dtype=x.dtype)
        return apply_rotary(x, cos, sin)
