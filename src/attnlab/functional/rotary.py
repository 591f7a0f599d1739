"""Rotary position embedding (RoPE), in the rotate-half layout of Llama.

RoFormer (Su et al., 2021), eq. 34: rotate each pair of dimensions of q and k
by an angle proportional to the token's position, so that q_m . k_n depends
only on m - n. The rotate-half layout pairs dimension i with i + D/2 (not
2i with 2i+1), which is what Llama checkpoints and Hugging Face expect.

A function of positions, so it sits on the floor below both ``nn`` (the Attention module rotates its
queries and keys) and ``cache`` (a sink cache rotates its sinks on); ``attnlab.nn`` exports it too.

Two things today's checkpoints add. Llama 3's frequency scaling (``RopeScaling(kind="llama3")``) stretches the
wavelengths longer than the original context by ``factor``, keeps the short ones and blends those between, so a
model trained on 8k positions reads 128k. Linear scaling (``kind="linear"``) divides every position by
``factor``. Partial rotation (``rotary_dim`` < D) rotates the first ``rotary_dim`` dimensions of each head and
passes the rest through. Proportional RoPE (Gemma 4's full layers, ``proportion``) keeps the whole head's
frequencies, base^(-2i / D), and sets all but the first int(proportion * D / 2) of them to zero: those pairs
(i, i + D/2) do not turn.

Shapes: B = batch, H = heads, T = tokens, D = head_dim, R = rotary_dim.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn as nn

SCALINGS = ("llama3", "linear", "yarn")
logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """How a checkpoint stretches RoPE past the length it was first trained on (Hugging Face's ``rope_scaling``).

    kind: "llama3" (Llama 3.1's wavelength-dependent scaling), "linear" (positions divided by ``factor``) or
    "yarn". factor: how many times longer; low_freq_factor, high_freq_factor, original_context_length: Llama 3's
    band edges, as its config.json names them (8192 positions, factors 1 and 4 in Llama 3.1; equal factors
    leave no band to blend, which is logged as transformers does).
    """

    kind: Literal["llama3", "linear", "yarn"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192
    # YaRN (Peng et al., 2023; gpt-oss): the ramp between beta_fast and beta_slow rotations over the original
    # context, whether its edges are rounded, and the factor on cos and sin (None: 0.1 ln(factor) + 1)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCALINGS:
            raise ValueError(f"rope scaling kind must be one of {list(SCALINGS)}, got {self.kind!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"rope scaling {name} must be a number > 0, got {value!r}")
        if self.kind == "llama3" and self.high_freq_factor < self.low_freq_factor:
            raise ValueError(
                f"rope scaling high_freq_factor ({self.high_freq_factor}) must not be below low_freq_factor "
                f"({self.low_freq_factor}): they bound the band of wavelengths that is blended"
            )
        if self.kind == "llama3" and self.high_freq_factor == self.low_freq_factor:  # transformers warns, loads it
            logger.warning(
                "rope scaling high_freq_factor equals low_freq_factor (%s): Llama 3's blended band is empty, so "
                "every wavelength is either kept or divided by factor",
                self.low_freq_factor,
            )
        o = self.original_context_length
        if isinstance(o, bool) or not isinstance(o, int) or o < 1:
            raise ValueError(f"rope scaling original_context_length must be a positive int, got {o!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RopeScaling:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown rope scaling fields {unknown}; known: {sorted(known)}")
        return cls(**values)

    @property
    def mscale(self) -> float:
        """What YaRN multiplies cos and sin by (1 for the other kinds)."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def inv_freq(self, inv_freq: torch.Tensor, base: float) -> torch.Tensor:
        """The scaled inverse frequencies for the unscaled ones (D/2,) of theta ``base``."""
        if self.kind == "linear":
            return inv_freq / self.factor  # every position divided by factor
        if self.kind == "yarn":
            return self._yarn(inv_freq, base)
        wavelen = 2 * math.pi / inv_freq
        low_wavelen = self.original_context_length / self.low_freq_factor  # longer than this: divided by factor
        high_wavelen = self.original_context_length / self.high_freq_factor  # shorter than this: kept
        if high_wavelen == low_wavelen:  # no band: one on the edge is divided, as at low_wavelen (smooth 0) when
            # there is a band; transformers computes 0 / 0 there (NaN)
            return torch.where(wavelen >= low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_context_length / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )  # 0 at low_wavelen, 1 at high_wavelen
        blended = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(between, blended, scaled)

    def _yarn(self, inv_freq: torch.Tensor, base: float) -> torch.Tensor:
        """Fast-turning dimensions kept (extrapolated), slow ones divided by factor (interpolated), a linear ramp
        between the dimensions that turn beta_fast and beta_slow times over the original context."""
        half = inv_freq.shape[0]
        dim = 2 * half
        low = _yarn_dims(self.beta_fast, dim, base, self.original_context_length)
        high = _yarn_dims(self.beta_slow, dim, base, self.original_context_length)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(half, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0: keep, 1: divide
        return inv_freq / self.factor * ramp + inv_freq * (1 - ramp)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _yarn_dims(rotations: float, dim: int, base: float, original: int) -> float:
    """The dimension whose wavelength turns ``rotations`` times over the original context (YaRN, eq. 20)."""
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by angles whose cos/sin are (T, R) or (B, 1, T, R); with R < D (partial rotation)
    the first R dimensions turn and the other D - R pass through."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turned, kept = x[..., :r], x[..., r:]  # (B, H, T, R), (B, H, T, D - R)
    return torch.cat((turned * cos + rotate_half(turned) * sin, kept), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos and sin tables for given positions; no parameters.

    Args:
        head_dim: D, even.
        base: theta in inv_freq_i = base^(-2i / R); 10000 in RoFormer and Llama 2, 500000 in Llama 3.
        scaling: a :class:`RopeScaling`, or None.
        rotary_dim: R, the dimensions that turn (even, <= D); None is all of them.
        proportion: proportional RoPE (Gemma 4): the fraction of the D/2 frequencies that turn, the rest zero;
            None turns them all. Not with ``rotary_dim``.
    """

    def __init__(
        self,
        *,
        head_dim: int,
        base: float = 10000.0,
        scaling: RopeScaling | None = None,
        rotary_dim: int | None = None,
        proportion: float | None = None,
    ) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim >= 2, got {head_dim!r}")
        if not base > 1.0:
            raise ValueError(f"rotary base must be > 1, got {base!r}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        r = head_dim if rotary_dim is None else rotary_dim
        if isinstance(r, bool) or not isinstance(r, int) or r < 2 or r % 2 or r > head_dim:
            raise ValueError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got {rotary_dim!r}")
        if proportion is not None and (
            isinstance(proportion, bool) or not isinstance(proportion, (int, float)) or not 0 <= proportion <= 1
        ):
            raise ValueError(f"proportion must be None or a fraction in [0, 1] of the frequencies, got {proportion!r}")
        if proportion is not None and r != head_dim:
            raise ValueError(
                f"proportional RoPE keeps the whole head's frequencies: give proportion or rotary_dim={rotary_dim}"
            )
        self.head_dim, self.rotary_dim, self.proportion = head_dim, r, proportion
        self.base = float(base)
        self.scaling = scaling
        inv_freq = 1.0 / (self.base ** (torch.arange(0, r, 2, dtype=torch.float32) / r))  # (R/2,)
        if proportion is not None:  # Gemma 4's full layers: the slow frequencies are set to zero, not turned
            inv_freq[int(proportion * head_dim // 2) :] = 0.0
        if scaling is not None:
            inv_freq = scaling.inv_freq(inv_freq, self.base)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.inv_freq: torch.Tensor
        self.mscale = 1.0 if scaling is None else scaling.mscale  # YaRN's factor on cos and sin

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32, *, scaled: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, R) for positions (T,), or (B, 1, T, R) for positions (B, T); times YaRN's mscale
        when ``scaled`` (a pure rotation otherwise)."""
        if positions.dtype.is_floating_point or positions.dim() not in (1, 2):
            raise ValueError(
                f"positions must be an integer tensor of shape (T,) or (B, T), got {positions.dtype} {tuple(positions.shape)}"
            )
        if (
            not torch.compiler.is_compiling() and positions.numel() and int(positions.min()) < 0
        ):  # no sync when compiled
            raise ValueError(f"positions must be >= 0, got a minimum of {int(positions.min())}")
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # (.., T, R/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (.., T, R): rotate-half layout
        if positions.dim() == 2:
            emb = emb[:, None]  # (B, 1, T, R): broadcast over heads
        if scaled and self.mscale != 1.0:
            return (emb.cos() * self.mscale).to(dtype), (emb.sin() * self.mscale).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) rotated by ``positions`` (T,): RoPE's rotations add up, so rotating a key already at
        position p by d puts it at p + d (what a sink cache does to move its sinks)."""
        cos, sin = self(positions, dtype=x.dtype, scaled=False)  # turned, not scaled again
        return apply_rotary(x, cos, sin)
