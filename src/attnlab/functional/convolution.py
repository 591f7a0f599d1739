"""The short causal convolution that hybrid decoders run before their recurrent layers (Qwen3.5's and Qwen3-Next's
Gated DeltaNet, Kimi Delta Attention, LFM's convolution layers).

Each channel c has its own K weights w[c, 0..K-1]; token t's output is sum_j w[c, j] * x[t - (K - 1) + j, c], the
last K inputs of that channel with the newest last. Before the first token the inputs are zeros, as a padded
convolution has them, so a prompt read whole and the same prompt read in pieces give the same outputs once the
last K - 1 inputs are carried from one piece to the next: that is the whole state of this layer, (B, C, K - 1),
whatever the length.

:func:`short_convolution` is the fast form (one depthwise ``conv1d``); :func:`short_convolution_reference` the
readable one (the sum above, tap by tap); the tests hold them equal. With ``each=True`` either returns all K - 1 + T
inputs, the carried ones and the new: the state after the call's t-th token is their slice [t : t + K - 1], so a
cache that must go back to any token of a pass of guesses keeps them and copies nothing (``attnlab.cache.state``).

Shapes: B = batch, T = tokens, C = channels, K = kernel size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be (batch, tokens, channels), got {getattr(x, 'shape', type(x).__name__)}")
    c = x.shape[-1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 1:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be (channels={c}, kernel size), got {shape}")
    want = (x.shape[0], c, weight.shape[1] - 1)
    if state is not None and tuple(state.shape) != want:
        raise ValueError(
            f"the convolution's state must be (batch, channels, kernel - 1) = {want}, got {tuple(state.shape)}"
        )


def short_convolution(
    x: torch.Tensor, weight: torch.Tensor, *, state: torch.Tensor | None = None, each: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, T, C) convolved causally with ``weight`` (C, K), after the inputs ``state`` (B, C, K - 1) holds (None:
    zeros). Returns the outputs (B, T, C) and the state after x: its last K - 1 inputs (with the earlier ones where
    x is shorter); ``each``: all K - 1 + T inputs (B, C, K - 1 + T), the state after token t their [t : t + K - 1]."""
    _check(x, weight, state)
    b, t, c = x.shape
    k = weight.shape[1]
    before = x.new_zeros(b, c, k - 1) if state is None else state.to(x.dtype)
    inputs = torch.cat([before, x.transpose(1, 2)], dim=2)  # (B, C, K - 1 + T)
    out = F.conv1d(inputs, weight[:, None, :].to(x.dtype), groups=c)  # (B, C, T)
    return out.transpose(1, 2), inputs if each else inputs[:, :, inputs.shape[2] - (k - 1) :]


def short_convolution_reference(
    x: torch.Tensor, weight: torch.Tensor, *, state: torch.Tensor | None = None, each: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`short_convolution` tap by tap: out[t, c] = sum_j weight[c, j] * inputs[t + j, c], where inputs are
    the state's K - 1 inputs and then x's."""
    _check(x, weight, state)
    b, t, c = x.shape
    k = weight.shape[1]
    before = x.new_zeros(b, k - 1, c) if state is None else state.transpose(1, 2).to(x.dtype)
    inputs = torch.cat([before, x], dim=1)  # (B, K - 1 + T, C)
    out = sum(weight[:, j] * inputs[:, j : j + t] for j in range(k))
    assert isinstance(out, torch.Tensor)
    return out, (inputs if each else inputs[:, inputs.shape[1] - (k - 1) :]).transpose(1, 2)
