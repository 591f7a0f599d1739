"""``KimiDeltaAttention``: Kimi Linear's recurrent layer (Kimi Delta Attention, KDA; Moonshot AI, 2025).

It is Gated DeltaNet (``attnlab.nn.recurrent``) with a finer forget gate and a few parts of its own:

- q, k and v (H heads of D each) through a short causal convolution of ``conv_kernel`` taps and silu, q and k
  then unit length (q scaled by 1/sqrt(D)), as Qwen3.5's Gated DeltaNet has them;
- a decay per channel, not per head: g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias), (B, H, T, D), from
  its own low-rank projection (``f_a_proj`` E -> D, ``f_b_proj`` D -> H * D), so each of a head's D key channels
  forgets at its own rate (``attnlab.functional.kda``);
- beta = sigmoid(b(x)), one write strength a head and token;
- the output RMS-normed per head (weight ``norm``) and gated by sigmoid, not silu, of another low-rank projection
  (``g_a_proj`` E -> D, ``g_b_proj`` D -> H * D), then ``out_proj``.

Its state is a recurrent layer's: per head a (D, D) matrix in float32 at least, and the convolution's last K - 1
inputs of each of the 3 H D channels (``layer_state``: kind "recurrent" with its conv); a padded token writes
nothing (its beta and g are 0) and outputs 0 before the gate, as ``GatedDeltaNet``'s.

Shapes: B = batch, T = tokens, E = d_in, H = heads, D = head_dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.cache import Cache
from attnlab.cache.state import StateCache
from attnlab.functional.kda import kimi_delta_rule, kimi_delta_weights
from attnlab.functional.visibility import Visibility
from attnlab.nn.recurrent import _unit
from attnlab.nn.recurrent_layer import RecurrentLayer
from attnlab.observe import is_recording


class KimiDeltaAttention(RecurrentLayer):
    """Kimi Delta Attention: S_t = diag(exp(g_t)) S_{t-1} + k_t (beta_t (v_t - (diag(exp(g_t)) S_{t-1})^T k_t))^T,
    out_t = norm(S_t^T q_t) * sigmoid(gate_t).

    Args:
        d_in: E; num_heads: H; head_dim: D (default E // H), the size of q, k and v alike.
        out_bias: bias on out_proj (Kimi Linear has none).
        form: "chunked" (default) or "recurrent": the same numbers; a one-token call runs the recurrence.
        chunk_size: tokens per chunk of the chunked form.
        norm_eps: the output RMSNorm's epsilon (Kimi Linear's rms_norm_eps).
        conv_kernel: K, the short convolution's taps over q, k and v (Kimi Linear: 4); None: none.
    """

    forms = ("recurrent", "chunked")

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        head_dim: int | None = None,
        out_bias: bool = False,
        form: str = "chunked",
        chunk_size: int = 64,
        norm_eps: float = 1e-5,
        conv_kernel: int | None = 4,
    ) -> None:
        super().__init__(
            d_in=d_in, num_heads=num_heads, head_dim=head_dim, out_bias=out_bias, form=form, chunk_size=chunk_size
        )
        h, d = self.num_heads, self.head_dim
        self.f_a_proj = nn.Linear(d_in, d, bias=False)  # the forget gate's low rank
        self.f_b_proj = nn.Linear(d, h * d, bias=False)  # a log decay's input per channel
        # Mamba 2's decay, as Gated DeltaNet's: A in [1, 16] as its log, one a head; softplus(dt_bias) in [1e-3, 1e-1]
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        dt = torch.empty(h * d).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt), one a channel
        self.b_proj = nn.Linear(d_in, h, bias=False)  # beta's, per head
        self.g_a_proj = nn.Linear(d_in, d, bias=False)  # the output gate's low rank
        self.g_b_proj = nn.Linear(d, h * d, bias=False)
        self.norm = nn.RMSNorm(d, eps=norm_eps)  # over each head's output, shared by the heads
        self.add_convolution(conv_kernel)

    def gates(self, x: torch.Tensor, visibility: Visibility | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """g (B, H, T, D), a log decay per channel (<= 0), and beta (B, H, T), in the state's dtype; a padded
        token's are 0 (no decay, nothing written)."""
        b, t, _ = x.shape
        wide = self.state_dtype  # float32 at least, as transformers and FLA compute them
        raw = self.f_b_proj(self.f_a_proj(x)).to(wide) + self.dt_bias.to(wide)  # (B, T, H * D)
        rate = self.A_log.to(wide).exp()[:, None]  # (H, 1): one rate a head, for its D channels
        g = -rate * F.softplus(raw.view(b, t, self.num_heads, self.head_dim))  # (B, T, H, D)
        beta = torch.sigmoid(self.b_proj(x).to(wide))  # (B, T, H)
        real = self._real(visibility, b, t)
        if real is not None:
            g, beta = g.where(real[..., None, None], 0.0), beta.where(real[..., None], 0.0)
        return g.transpose(1, 2), beta.transpose(1, 2)  # (B, H, T, D), (B, H, T)

    def forward(
        self,
        x: torch.Tensor,
        *,
        visibility: Visibility | None = None,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """(B, T, E) -> (B, T, E), after the tokens in ``cache`` (a StateCache, updated in place)."""
        self._check(x, cache)
        qkv, conv_after = self.convolved(x, visibility, cache)
        queries, keys, values = (t.to(self.state_dtype) for t in self.heads(qkv))  # (B, H, T, D) each
        queries, keys = _unit(queries) / math.sqrt(self.head_dim), _unit(keys)
        g, beta = self.gates(x, visibility)
        if is_recording():
            self._record(lambda: kimi_delta_weights(queries, keys, g, beta), cache)
        state = cache.state() if isinstance(cache, StateCache) else None
        if isinstance(state, tuple):
            raise TypeError("this state cache has a normalizer; build it from KimiDeltaAttention's layer_state()")
        out, new_state = self.recur(kimi_delta_rule, (queries, keys, values, g, beta), state, cache)
        self.keep(cache, new_state, x.shape[1], conv_after)
        b, t = x.shape[0], x.shape[1]
        gate = self.g_b_proj(self.g_a_proj(x)).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        return self.merge_heads(self.norm(out.to(x.dtype)) * torch.sigmoid(gate))
