"""Layers whose memory of the past is a state of fixed size: ``LinearAttention`` and ``GatedDeltaNet``.

They take the place of ``attnlab.Attention`` in a decoder block (``GPTConfig.layer_types`` names them
"linear" and "delta") and speak its call: ``forward(x, visibility=, positions=, cache=)``, with a
:class:`~attnlab.cache.state.StateCache` (``ModelCache.build`` from :meth:`layer_state`) instead of a KV cache. The chapter's
notation, grown: x is projected to queries, keys and values per head, as for ``MultiHeadAttention``; what
changes is how they are combined (``attnlab.functional.recurrent``):

- ``LinearAttention`` (Katharopoulos et al., 2020): phi(q) . phi(k) in place of exp(q . k / sqrt(D)),
  phi = elu + 1, so the past is a (D, D) state per head and a (D,) normalizer;
- ``GatedDeltaNet`` (Yang et al., 2024; Qwen3-Next's linear layers): unit-length q and k, a decay
  exp(g) per token and head (g = -exp(A_log) * softplus(a(x) + dt_bias), as Mamba 2 decays), a write
  strength beta = sigmoid(b(x)), and the output normed per head and gated by silu(z(x)) (RMSNorm, then
  times the gate). Qwen3-Next also runs a short causal convolution over q, k and v first; this layer
  does not (a state of fixed size without it; a choice of this zoo, said in docs/zoo.md).

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
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.state import StateCache
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.recurrent import (
    feature_map,
    gated_delta_rule,
    gated_delta_weights,
    linear_attention,
    linear_attention_weights,
)
from attnlab.functional.visibility import Visibility
from attnlab.observe import is_recording, note_unobserved, record

RECURRENT_FORMS = ("recurrent", "parallel", "chunked")


class RecurrentLayer(nn.Module):
    """What the two recurrent layers share: the fused projection, the checks, the cache and the padding."""

    window: ClassVar[None] = None  # no window: a block's visibility is keyed by it
    visibility_key: ClassVar[str] = "recurrent"
    forms: ClassVar[tuple[str, ...]] = RECURRENT_FORMS
    normalizer: ClassVar[bool] = False

    def __init__(
        self, *, d_in: int, num_heads: int, head_dim: int | None, out_bias: bool, form: str, chunk_size: int
    ) -> None:
        super().__init__()
        check_positive_int("d_in", d_in, limit=2**20)
        check_positive_int("num_heads", num_heads, limit=2**16)
        if head_dim is None:
            if d_in % num_heads:
                raise ValueError(f"d_in={d_in} must be divisible by num_heads={num_heads}, or pass head_dim")
            head_dim = d_in // num_heads
        check_positive_int("head_dim", head_dim, limit=2**16)
        check_positive_int("chunk_size", chunk_size, limit=2**16)
        if form not in self.forms:
            raise ValueError(f"form must be one of {list(self.forms)} for {type(self).__name__}, got {form!r}")
        self.d_in, self.num_heads, self.head_dim = d_in, num_heads, head_dim
        self.form, self.chunk_size = form, chunk_size
        self.qkv = nn.Linear(d_in, 3 * num_heads * head_dim, bias=False)  # rows: W_query, W_key, W_value
        self.out_proj = nn.Linear(num_heads * head_dim, d_in, bias=out_bias)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the activations: its weights', or float32 for int8 weights (``attnlab.linear.quantized``)."""
        dtype: torch.dtype = getattr(self.qkv, "dtype", None) or self.qkv.weight.dtype
        return dtype

    @property
    def state_values(self) -> int:
        """The numbers the state holds for one sequence, whatever its length: per head a (Dk, Dv) matrix, and a
        (Dk,) normalizer for linear attention (what the cache of its :meth:`layer_state` allocates)."""
        per_head = self.head_dim * self.head_dim + (self.head_dim if self.normalizer else 0)
        return self.num_heads * per_head

    @property
    def state_dtype(self) -> torch.dtype:
        """What the recurrence runs and its state is kept in: float32 at least."""
        return torch.promote_types(self.dtype, torch.float32)

    @property
    def device(self) -> torch.device:
        return next(t for t in (*self.qkv.parameters(), *self.qkv.buffers())).device

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, E) -> q, k, v (B, H, T, D)."""
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.num_heads, self.head_dim)  # (B, T, 3, H, D)
        queries, keys, values = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
        return queries, keys, values

    def layer_state(self) -> LayerState:
        """What this layer keeps: its state, per head a (Dk, Dv) matrix (and linear attention's (Dk,)
        normalizer), in float32 at least, whatever the length. ``attnlab.cache.ModelCache.build`` gives it a
        StateCache whichever of attnlab's caches a model names (they hold keys and values, which it has none of)."""
        return LayerState(
            kind="recurrent",
            kv_heads=self.num_heads,
            head_dim=self.head_dim,
            value_dim=self.head_dim,
            normalizer=self.normalizer,
            dtype=self.state_dtype,
            device=self.device,
        )

    def visibility_for(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
    ) -> Visibility:
        """Causal, with the key padding ``mask`` (B, 1, 1, Tk) a model passes; nothing else applies to a
        recurrent layer, and anything else is refused here, before anything is written."""
        name = type(self).__name__
        if document_ids is not None:
            raise ValueError(
                f"{name} carries one state along each row: packed documents (document_ids) would read into each "
                "other's state; train on one document a row"
            )
        if mask_mod is not None or score_mod is not None:
            raise ValueError(
                f"{name} has no scores for a mask_mod or score_mod to change; use them on softmax layers only"
            )
        b, t = x.shape[0], x.shape[1]
        if mask is not None and (
            mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] != b or mask.shape[1:3] != (1, 1)
        ):
            raise ValueError(
                f"{name} takes only a key padding mask, bool (batch, 1, 1, tokens seen) = ({b}, 1, 1, ...); "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        q_pos = cache.next_positions(t) if cache is not None else torch.arange(t, device=x.device)
        return Visibility(q_pos=q_pos, causal=True, mask=mask)

    def _real(self, visibility: Visibility | None, b: int, t: int) -> torch.Tensor | None:
        """(B, T) True on real tokens, from the key padding mask; None when nothing is padded."""
        allowed = None if visibility is None else visibility.allowed
        if allowed is None:
            return None
        if allowed.shape[-1] < t:
            raise ValueError(f"the padding mask covers {allowed.shape[-1]} tokens, fewer than the {t} given")
        return allowed[:, 0, 0, -t:].expand(b, t)  # (B, T)

    def _check(self, x: object, cache: Cache | None) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_in:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"expected input (batch, tokens, d_in={self.d_in}), got {shape}")
        if x.dtype != self.dtype:
            raise TypeError(f"input dtype {x.dtype} differs from the module's {self.dtype}; use x.to({self.dtype})")
        if cache is not None and not isinstance(cache, StateCache):
            raise TypeError(
                f"a {type(self).__name__} layer reads a StateCache (built from its layer_state()), got {type(cache).__name__}"
            )
        if isinstance(cache, StateCache) and (cache.batch_size, cache.num_kv_heads) != (x.shape[0], self.num_heads):
            raise ValueError(
                f"this state cache holds batch {cache.batch_size} and {cache.num_kv_heads} heads; the call has batch "
                f"{x.shape[0]} and the layer {self.num_heads} heads: build it with ModelCache.build(..., rows={x.shape[0]})"
            )

    def _form(self, t: int) -> str:
        """The form a call runs: the module's, but one token at a time is the recurrence itself."""
        return "recurrent" if t == 1 else self.form

    def _record(self, weights: Callable[[], torch.Tensor], cache: Cache | None) -> None:
        """For a Recorder: the implicit weights the recurrence equals over this call's tokens ("attn_weights"),
        when the call starts from an empty state (what came before a cache's state is no longer there)."""
        if isinstance(cache, StateCache) and cache.length:
            note_unobserved(f"{type(self).__name__} keeps a state, not its weights, for the tokens before this call")
            return
        record("attn_weights", weights().detach(), source=type(self).__name__)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))  # (B, T, E)


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
        if is_recording():
            real = self._real(visibility, x.shape[0], x.shape[1])
            self._record(lambda: linear_attention_weights(queries, keys, real=real), cache)
        state = cache.state() if isinstance(cache, StateCache) else None
        if state is not None and not isinstance(state, tuple):
            raise TypeError("this state cache has no normalizer; build it from LinearAttention's layer_state()")
        out, new_state = linear_attention(
            queries, keys, values, state=state, form=self._form(x.shape[1]), chunk_size=self.chunk_size
        )
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            out = out.where(real[:, None, :, None], 0.0)  # a padded token's own output (nothing real before it)
        if isinstance(cache, StateCache):
            cache.write(new_state, x.shape[1])
        return self.merge_heads(out.to(x.dtype))


class GatedDeltaNet(RecurrentLayer):
    """The gated delta rule (Yang et al., 2024) as a layer, in Qwen3-Next's parts without its convolution.

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T, out_t = norm(S_t^T q_t) * silu(z_t).

    Args:
        d_in: E; num_heads: H; head_dim: D (default E // H).
        out_bias: bias on out_proj.
        form: "chunked" (default) or "recurrent": the same numbers; a one-token call runs the recurrence.
        chunk_size: tokens per chunk of the chunked form.
        norm_eps: the output RMSNorm's epsilon.
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
    ) -> None:
        super().__init__(
            d_in=d_in, num_heads=num_heads, head_dim=head_dim, out_bias=out_bias, form=form, chunk_size=chunk_size
        )
        h, d = self.num_heads, self.head_dim
        self.a_proj = nn.Linear(d_in, h, bias=False)  # the decay's input, per head
        self.b_proj = nn.Linear(d_in, h, bias=False)  # beta's, per head
        self.z_proj = nn.Linear(d_in, h * d, bias=False)  # the output gate
        # Mamba 2's decay: A in [1, 16] as its log; dt_bias so that softplus(dt_bias) starts in [1e-3, 1e-1]
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        dt = torch.empty(h).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.norm = nn.RMSNorm(d, eps=norm_eps)  # over each head's output, shared by the heads

    def gates(self, x: torch.Tensor, visibility: Visibility | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """g (log decay, <= 0) and beta, each (B, H, T); a padded token's are 0 (no decay, nothing written)."""
        wide = self.state_dtype  # at least float32, as Qwen3-Next computes them
        g = -self.A_log.to(wide).exp() * F.softplus(self.a_proj(x).to(wide) + self.dt_bias.to(wide))  # (B, T, H)
        beta = torch.sigmoid(self.b_proj(x).to(wide))  # (B, T, H)
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            g, beta = g.where(real[..., None], 0.0), beta.where(real[..., None], 0.0)
        return g.transpose(1, 2), beta.transpose(1, 2)  # (B, H, T), in the state's dtype

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
        queries, keys, values = (t.to(self.state_dtype) for t in self.split_qkv(x))
        queries = F.normalize(queries, dim=-1, eps=1e-6) / math.sqrt(self.head_dim)  # unit length, then scaled
        keys = F.normalize(keys, dim=-1, eps=1e-6)
        g, beta = self.gates(x, visibility)
        if is_recording():
            self._record(lambda: gated_delta_weights(queries, keys, g, beta), cache)
        state = cache.state() if isinstance(cache, StateCache) else None
        if isinstance(state, tuple):
            raise TypeError("this state cache has a normalizer; build it from GatedDeltaNet's layer_state()")
        out, new_state = gated_delta_rule(
            queries, keys, values, g, beta, state=state, form=self._form(x.shape[1]), chunk_size=self.chunk_size
        )
        if isinstance(cache, StateCache):
            cache.write(new_state, x.shape[1])
        b, t = x.shape[0], x.shape[1]
        gate = F.silu(self.z_proj(x)).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        return self.merge_heads(self.norm(out.to(x.dtype)) * gate)
