"""Layers whose memory of the past is a state of fixed size: ``LinearAttention`` and ``GatedDeltaNet``.

They take the place of ``attnlab.Attention`` in a decoder block (``GPTConfig.layer_types`` names them
"linear" and "delta") and speak its call: ``forward(x, visibility=, positions=, cache=)``, with a
:class:`~attnlab.cache.state.StateCache` (``ModelCache.build`` from :meth:`layer_state`) instead of a KV cache. The chapter's
notation, grown: x is projected to queries, keys and values per head, as for ``MultiHeadAttention``; what
changes is how they are combined (``attnlab.functional.recurrent``):

- ``LinearAttention`` (Katharopoulos et al., 2020): phi(q) . phi(k) in place of exp(q . k / sqrt(D)),
  phi = elu + 1, so the past is a (D, D) state per head and a (D,) normalizer;
- ``GatedDeltaNet`` (Yang et al., 2024; Qwen3-Next's and Qwen3.5's linear layers): unit-length q and k, a
  decay exp(g) per token and head (g = -exp(A_log) * softplus(a(x) + dt_bias), as Mamba 2 decays), a write
  strength beta = sigmoid(b(x)), and the output normed per head and gated by silu(z(x)) (RMSNorm, then
  times the gate). Qwen3.5 also runs a short causal convolution over q, k and v first (``conv_kernel``;
  ``attnlab.functional.convolution``), whose last inputs the state keeps too, and has more value heads than
  query/key heads; the zoo's layer has neither (docs/zoo.md).

Neither uses positions (the order is in the recurrence), so RoPE does not apply to them. Left padding is
read as "nothing happened": a padded token writes nothing to the state (its phi(k) and v, or its beta and g,
are zeroed) and its own output is 0. The recurrence runs in float32 at least, and its state is kept so,
whatever the activations' dtype (a bfloat16 normalizer stops growing after a few hundred tokens); only the
output is cast back. A model's other settings (QK-norm, learned sinks, key/value heads) are its softmax
layers'; the recurrent layers of a hybrid have none of them.

Shapes: B = batch, T = tokens, E = d_in, H = heads, D = head_dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.cache import Cache
from attnlab.cache.state import StateCache
from attnlab.functional.recurrent import (
    feature_map,
    gated_delta_rule,
    gated_delta_weights,
    linear_attention,
    linear_attention_weights,
)
from attnlab.functional.visibility import Visibility
from attnlab.nn.recurrent_layer import RecurrentLayer
from attnlab.observe import is_recording


class LinearAttention(RecurrentLayer):
    """Causal linear attention (Katharopoulos et al., 2020): out_t = S_t^T phi(q_t) / (z_t . phi(q_t)).

    Args:
        d_in: E; num_heads: H; head_dim: D (default E // H).
        out_bias: bias on out_proj.
        form: "chunked" (default), "parallel" or "recurrent": the same numbers
            (``attnlab.functional.recurrent``); a one-token call always runs the recurrence.
        chunk_size: tokens per chunk of the chunked form.
    """

    normalizer = True

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        head_dim: int | None = None,
        out_bias: bool = True,
        form: str = "chunked",
        chunk_size: int = 64,
    ) -> None:
        super().__init__(
            d_in=d_in, num_heads=num_heads, head_dim=head_dim, out_bias=out_bias, form=form, chunk_size=chunk_size
        )

    def features(
        self, x: torch.Tensor, visibility: Visibility | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """phi(q), phi(k), v (B, H, T, D) in the state's dtype, a padded token's phi(k) and v zeroed so it writes
        nothing."""
        queries, keys, values = (t.to(self.state_dtype) for t in self.split_qkv(x))
        queries, keys = feature_map(queries), feature_map(keys)
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            keep = real[:, None, :, None]  # (B, 1, T, 1)
            keys, values = keys.where(keep, 0.0), values.where(keep, 0.0)  # its normalizer stays 0: output 0
        return queries, keys, values

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
        queries, keys, values = self.features(x, visibility)
        real = self._real(visibility, x.shape[0], x.shape[1])
        if is_recording():
            self._record(lambda: linear_attention_weights(queries, keys, real=real), cache)
        state = cache.state() if isinstance(cache, StateCache) else None
        if state is not None and not isinstance(state, tuple):
            raise TypeError("this state cache has no normalizer; build it from LinearAttention's layer_state()")
        out, new_state = self.recur(linear_attention, (queries, keys, values), state, cache)
        if real is not None:
            out = out.where(real[:, None, :, None], 0.0)  # a padded token's own output (nothing real before it)
        self.keep(cache, new_state, x.shape[1], None)
        return self.merge_heads(out.to(x.dtype))


class GatedDeltaNet(RecurrentLayer):
    """The gated delta rule (Yang et al., 2024) as a layer: Qwen3-Next's and Qwen3.5's linear layers.

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T, out_t = norm(S_t^T q_t) * silu(z_t).

    Args:
        d_in: E; num_heads: H, the query/key heads; head_dim: D (default E // H).
        out_bias: bias on out_proj.
        form: "chunked" (default) or "recurrent": the same numbers; a one-token call runs the recurrence.
        chunk_size: tokens per chunk of the chunked form.
        norm_eps: the output RMSNorm's epsilon.
        value_heads, value_dim: Hv and Dv (default H and D): each query/key head serves Hv / H value heads, each
            with its own decay, write strength, gate and state (Qwen3.5's grouped value heads).
        conv_kernel: K, a short causal convolution over the projected q, k and v (each channel its own K
            weights), then silu, before the recurrence (Qwen3.5); None: none (the zoo's layer).
        negative_eigenvalues: beta = 2 sigmoid(b(x)), in [0, 2], so a write may flip the direction of its key in
            the state (OLMo-Hybrid); False: beta = sigmoid(b(x)).
    """

    forms = ("recurrent", "chunked")

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        head_dim: int | None = None,
        out_bias: bool = True,
        form: str = "chunked",
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
        value_heads: int | None = None,
        value_dim: int | None = None,
        conv_kernel: int | None = None,
        negative_eigenvalues: bool = False,
    ) -> None:
        super().__init__(
            d_in=d_in,
            num_heads=num_heads,
            head_dim=head_dim,
            out_bias=out_bias,
            form=form,
            chunk_size=chunk_size,
            value_heads=value_heads,
            value_dim=value_dim,
        )
        hv, dv = self.value_heads, self.value_dim
        self.a_proj = nn.Linear(d_in, hv, bias=False)  # the decay's input, per value head
        self.b_proj = nn.Linear(d_in, hv, bias=False)  # beta's, per value head
        self.z_proj = nn.Linear(d_in, hv * dv, bias=False)  # the output gate
        # Mamba 2's decay: A in [1, 16] as its log; dt_bias so that softplus(dt_bias) starts in [1e-3, 1e-1]
        self.A_log = nn.Parameter(torch.empty(hv).uniform_(1, 16).log())
        dt = torch.empty(hv).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.norm = nn.RMSNorm(dv, eps=norm_eps)  # over each head's output, shared by the heads
        self.negative_eigenvalues = negative_eigenvalues
        self.add_convolution(conv_kernel)

    def gates(self, x: torch.Tensor, visibility: Visibility | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """g (log decay, <= 0) and beta, each (B, Hv, T); a padded token's are 0 (no decay, nothing written)."""
        wide = self.state_dtype  # at least float32, as Qwen3-Next computes them
        g = -self.A_log.to(wide).exp() * F.softplus(self.a_proj(x).to(wide) + self.dt_bias.to(wide))  # (B, T, Hv)
        beta = torch.sigmoid(self.b_proj(x).to(wide)) * (2.0 if self.negative_eigenvalues else 1.0)  # (B, T, Hv)
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            g, beta = g.where(real[..., None], 0.0), beta.where(real[..., None], 0.0)
        return g.transpose(1, 2), beta.transpose(1, 2)  # (B, Hv, T), in the state's dtype

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
        queries, keys, values = (t.to(self.state_dtype) for t in self.heads(qkv))
        queries = _unit(queries) / math.sqrt(self.head_dim)  # unit length, then scaled
        keys = _unit(keys)
        group = self.value_heads // self.num_heads  # each query/key head serves this many value heads, in a row
        if group > 1:  # (B, H, T, D) -> (B, Hv, T, D)
            queries, keys = queries.repeat_interleave(group, dim=1), keys.repeat_interleave(group, dim=1)
        g, beta = self.gates(x, visibility)
        if is_recording():
            flips = self.negative_eigenvalues
            self._record(lambda: gated_delta_weights(queries, keys, g, beta, negative_eigenvalues=flips), cache)
        state = cache.state() if isinstance(cache, StateCache) else None
        if isinstance(state, tuple):
            raise TypeError("this state cache has a normalizer; build it from GatedDeltaNet's layer_state()")
        flips = self.negative_eigenvalues
        out, new_state = self.recur(
            gated_delta_rule, (queries, keys, values, g, beta), state, cache, negative_eigenvalues=flips
        )
        self.keep(cache, new_state, x.shape[1], conv_after)
        b, t = x.shape[0], x.shape[1]
        gate = F.silu(self.z_proj(x)).view(b, t, self.value_heads, self.value_dim).transpose(1, 2)  # (B, Hv, T, Dv)
        return self.merge_heads(self.norm(out.to(x.dtype)) * gate)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """x over its length along the last dimension, as the gated delta rule's kernels (FLA, transformers) compute
    it: x / sqrt(|x|^2 + 1e-6), so a zero vector (a padded token's) stays zero."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + 1e-6)
