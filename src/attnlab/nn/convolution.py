"""``GatedShortConvolution``: LFM's layers that do not attend at all (Liquid AI's LFM2 and LFM3).

A token mixes with its K - 1 predecessors only, channel by channel, through a short causal convolution between two
gates, all three read off the token by one projection (``in_proj``: E -> 3E, as B, C and x):

    h_t = B_t * x_t,    y_t = C_t * sum_j w_j * h_{t - (K - 1) + j},    out_t = out_proj(y_t)

No key is kept: the state is the convolution's last K - 1 inputs h (``attnlab.cache.state.ConvolutionCache``),
the same after ten tokens as after a million. Seen as attention, token t reads tokens t - K + 1 .. t with weights
C_t w B_s, a different weight per channel: :meth:`implicit_weights` draws their mean over the channels.

Shapes: B = batch, T = tokens, E = d_in (the channels), K = kernel size.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.state import ConvolutionCache
from attnlab.functional.convolution import short_convolution
from attnlab.functional.visibility import Visibility
from attnlab.nn.recurrent_layer import StateLayer
from attnlab.observe import is_recording, note_unobserved, record


class GatedShortConvolution(StateLayer):
    """LFM's convolution layer: ``in_proj`` (E -> 3E: the gates B and C, and x), a depthwise causal ``conv`` of
    ``kernel`` taps per channel, ``out_proj``; ``bias`` on all three (LFM's ``conv_bias``).

    Input (B, T, E); output (B, T, E). A padded token's input is zeroed before the projection, as transformers'
    LFM does."""

    def __init__(self, *, d_in: int, kernel: int, bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_in", d_in, limit=2**20)
        check_positive_int("kernel", kernel, limit=64)
        self.d_in = d_in
        self.in_proj = nn.Linear(d_in, 3 * d_in, bias=bias)
        self.conv = nn.Conv1d(d_in, d_in, kernel, groups=d_in, bias=bias)  # weight (E, 1, K): one filter a channel
        self.out_proj = nn.Linear(d_in, d_in, bias=bias)

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(self.in_proj, "dtype", None) or self.in_proj.weight.dtype
        return dtype

    @property
    def device(self) -> torch.device:
        return self.conv.weight.device

    @property
    def state_values(self) -> int:
        """The numbers its state holds for one sequence: E channels x (K - 1) inputs."""
        return self.d_in * (self.conv.kernel_size[0] - 1)

    def layer_state(self) -> LayerState:
        """Its last K - 1 inputs per channel: a ConvolutionCache whichever of attnlab's caches a model names."""
        held = self.conv.kernel_size[0] - 1
        return LayerState(
            kind="convolution",
            kv_heads=1,
            head_dim=self.d_in,
            conv=(self.d_in, held),
            dtype=self.dtype,
            device=self.device,
        )

    def gates(self, x: torch.Tensor, visibility: Visibility | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """B, C and x (B, T, E) each, a padded token's input zeroed first."""
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            x = x * real[..., None].to(x.dtype)  # (B, T, E): transformers' apply_mask_to_padding_states
        b_gate, c_gate, values = self.in_proj(x).chunk(3, dim=-1)  # (B, T, E) each: B, C, x in the file's order
        return b_gate, c_gate, values

    def forward(
        self,
        x: torch.Tensor,
        *,
        visibility: Visibility | None = None,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """(B, T, E) -> (B, T, E), after the inputs ``cache`` (a ConvolutionCache, updated in place) holds."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_in:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"expected input (batch, tokens, d_in={self.d_in}), got {shape}")
        if cache is not None and not isinstance(cache, ConvolutionCache):
            raise TypeError(
                f"a GatedShortConvolution layer reads a ConvolutionCache (built from its layer_state()), got "
                f"{type(cache).__name__}"
            )
        b_gate, c_gate, values = self.gates(x, visibility)
        if is_recording():
            self._record(b_gate, c_gate, cache)
        before = cache.conv_state() if cache is not None else None
        each = cache is not None and cache.each  # a pass of guesses: every input kept, whose slices are each state
        mixed, after = short_convolution(b_gate * values, self.conv.weight[:, 0], state=before, each=each)  # (B, T, E)
        if self.conv.bias is not None:
            mixed = mixed + self.conv.bias
        if cache is not None and each:
            cache.write_each(after, x.shape[1])
        elif cache is not None:
            cache.write(after, x.shape[1])
        return self.out_proj(c_gate * mixed)

    def implicit_weights(self, b_gate: torch.Tensor, c_gate: torch.Tensor) -> torch.Tensor:
        """What token t gives token s (B, 1, T, T), as attention weights: C_t w_{s - t + K - 1} B_s averaged over the
        channels (each channel has its own; zero outside the last K tokens)."""
        b, t, _ = b_gate.shape
        k = self.conv.kernel_size[0]
        taps = self.conv.weight[:, 0]  # (E, K)
        weights = b_gate.new_zeros(b, t, t)
        for j in range(k):  # token t reads token s = t - (K - 1) + j through tap j
            back = k - 1 - j
            if back >= t:
                continue
            row = (c_gate[:, back:] * taps[:, j] * b_gate[:, : t - back]).mean(-1)  # (B, T - back)
            weights += torch.diag_embed(row, offset=-back)  # (B, T, T): the diagonal `back` below the main
        return weights[:, None]  # (B, 1, T, T)

    def _record(self, b_gate: torch.Tensor, c_gate: torch.Tensor, cache: Cache | None) -> None:
        if isinstance(cache, ConvolutionCache) and cache.length:
            note_unobserved(
                "GatedShortConvolution keeps its last inputs, not its weights, for the tokens before this call"
            )
            return
        record("attn_weights", self.implicit_weights(b_gate, c_gate).detach(), source=type(self).__name__)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, kernel={self.conv.kernel_size[0]}, bias={self.conv.bias is not None}"
