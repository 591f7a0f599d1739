"""What the layers of ``attnlab.nn.recurrent`` share to speak ``attnlab.Attention``'s call: projections per
head, the StateCache their :meth:`RecurrentLayer.layer_state` asks for, which tokens are real, the form a call runs.

Shapes: B = batch, T = tokens, E = d_in, H = heads, D = head_dim; Hv, Dv: the value heads and their size where they
differ (Qwen3.5's grouped value heads: each query/key head serves Hv / H of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.state import StateCache
from attnlab.functional.convolution import short_convolution
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.visibility import Visibility
from attnlab.observe import note_unobserved, record

RECURRENT_FORMS = ("recurrent", "parallel", "chunked")


class StateLayer(nn.Module):
    """A layer that carries a state along each row instead of attending (the recurrent layers, LFM's convolution
    layers): causal by construction, it takes only a key padding mask, and knows which tokens are real."""

    window: ClassVar[None] = None  # no window: a block's visibility is keyed by it
    visibility_key: ClassVar[str] = "recurrent"

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


class RecurrentLayer(StateLayer):
    """What the two recurrent layers share: the fused projection, the checks, the cache and the padding."""

    forms: ClassVar[tuple[str, ...]] = RECURRENT_FORMS
    normalizer: ClassVar[bool] = False

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        head_dim: int | None,
        out_bias: bool,
        form: str,
        chunk_size: int,
        value_heads: int | None = None,
        value_dim: int | None = None,
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
        value_heads = num_heads if value_heads is None else value_heads
        value_dim = head_dim if value_dim is None else value_dim
        check_positive_int("value_heads", value_heads, limit=2**16)
        check_positive_int("value_dim", value_dim, limit=2**16)
        if value_heads % num_heads:
            raise ValueError(f"value_heads={value_heads} must be a multiple of num_heads={num_heads} (grouped values)")
        self.d_in, self.num_heads, self.head_dim = d_in, num_heads, head_dim
        self.value_heads, self.value_dim = value_heads, value_dim
        self.form, self.chunk_size = form, chunk_size
        # rows: W_query (H * D), W_key (H * D), W_value (Hv * Dv)
        self.qkv = nn.Linear(d_in, 2 * num_heads * head_dim + value_heads * value_dim, bias=False)
        self.out_proj = nn.Linear(value_heads * value_dim, d_in, bias=out_bias)
        self.conv: nn.Conv1d | None = None  # a short convolution before the recurrence: add_convolution

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the activations: its weights', or float32 for int8 weights (``attnlab.linear.quantized``)."""
        dtype: torch.dtype = getattr(self.qkv, "dtype", None) or self.qkv.weight.dtype
        return dtype

    @property
    def state_values(self) -> int:
        """The numbers the state holds for one sequence, whatever its length: per head a (Dk, Dv) matrix, and a
        (Dk,) normalizer for linear attention (what the cache of its :meth:`layer_state` allocates)."""
        per_head = self.head_dim * self.value_dim + (self.head_dim if self.normalizer else 0)
        return self.value_heads * per_head

    @property
    def state_dtype(self) -> torch.dtype:
        """What the recurrence runs and its state is kept in: float32 at least."""
        return torch.promote_types(self.dtype, torch.float32)

    @property
    def device(self) -> torch.device:
        return next(t for t in (*self.qkv.parameters(), *self.qkv.buffers())).device

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, E) -> q, k (B, H, T, D) and v (B, Hv, T, Dv)."""
        return self.heads(self.qkv(x))

    def heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection's rows (B, T, 2 * H * D + Hv * Dv) as q, k (B, H, T, D) and v (B, Hv, T, Dv)."""
        b, t, _ = qkv.shape
        h, d = self.num_heads, self.head_dim
        queries, keys, values = qkv.split([h * d, h * d, self.value_heads * self.value_dim], dim=-1)
        queries = queries.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
        keys = keys.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
        return queries, keys, values.view(b, t, self.value_heads, self.value_dim).transpose(1, 2)  # (B, Hv, T, Dv)

    def layer_state(self) -> LayerState:
        """What this layer keeps: its state, per head a (Dk, Dv) matrix (and linear attention's (Dk,)
        normalizer), in float32 at least, whatever the length. ``attnlab.cache.ModelCache.build`` gives it a
        StateCache whichever of attnlab's caches a model names (they hold keys and values, which it has none of)."""
        return LayerState(
            kind="recurrent",
            kv_heads=self.value_heads,
            head_dim=self.head_dim,
            value_dim=self.value_dim,
            normalizer=self.normalizer,
            conv=self.conv_state_shape,
            dtype=self.state_dtype,
            device=self.device,
        )

    def add_convolution(self, kernel: int | None) -> None:
        """A short causal convolution of ``kernel`` taps over the projected q, k and v, each channel its own filter
        (``conv``, weight (C, 1, K): Qwen3.5's, OLMo-Hybrid's and Kimi Delta Attention's), or none (None)."""
        if kernel is not None:
            check_positive_int("conv_kernel", kernel, limit=64)
            channels = self.qkv.out_features
            self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, bias=False)  # weight (C, 1, K)

    @property
    def conv_state_shape(self) -> tuple[int, int] | None:
        """(channels, kernel - 1) of the short convolution before the recurrence, or None without one."""
        return None if self.conv is None else (self.conv.out_channels, self.conv.kernel_size[0] - 1)

    def convolved(
        self, x: torch.Tensor, visibility: Visibility | None, cache: Cache | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The projected q, k and v (B, T, C), through the short convolution and silu where the layer has one,
        a padded token's inputs zeroed (as the zeros before a row's first token); and the convolution's state
        after them (None without a convolution): while the cache keeps each token's state (``cache.each``), all
        K - 1 + T inputs (B, C, K - 1 + T), whose slices are the state after each token."""
        qkv = self.qkv(x)  # (B, T, C)
        if self.conv is None:
            return qkv, None
        real = self._real(visibility, x.shape[0], x.shape[1])
        if real is not None:
            qkv = qkv.where(real[..., None], 0.0)
        before = cache.conv_state() if isinstance(cache, StateCache) else None
        each = isinstance(cache, StateCache) and cache.each  # a pass of guesses: every token's inputs, not the last
        out, after = short_convolution(qkv, self.conv.weight[:, 0], state=before, each=each)
        return F.silu(out), after

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
        if isinstance(cache, StateCache) and (cache.batch_size, cache.num_kv_heads) != (x.shape[0], self.value_heads):
            raise ValueError(
                f"this state cache holds batch {cache.batch_size} and {cache.num_kv_heads} heads; the call has batch "
                f"{x.shape[0]} and the layer {self.value_heads} heads: build it with ModelCache.build(..., rows={x.shape[0]})"
            )

    def _form(self, t: int) -> str:
        """The form a call runs: the module's, but one token at a time is the recurrence itself."""
        return "recurrent" if t == 1 else self.form

    def recur(
        self,
        rule: Callable[..., tuple[torch.Tensor, Any]],
        tensors: tuple[torch.Tensor, ...],
        state: Any,
        cache: Cache | None,
        **options: Any,
    ) -> tuple[torch.Tensor, Any]:
        """``rule`` (a function of ``attnlab.functional``) over the call's ``tensors`` (each (B, H, T, ...)) after
        ``state``: the output (B, H, T, Dv) and the state after the call, or, while the cache keeps each token's
        (``cache.each_tokens(T)`` = M > 0), the states after the last M (B, H, M, ...): the module's form runs up to
        them, the recurrence through them."""
        t = tensors[0].shape[2]
        last = cache.each_tokens(t) if isinstance(cache, StateCache) else 0
        if not last:
            return rule(*tensors, state=state, form=self._form(t), chunk_size=self.chunk_size, **options)
        outs = []
        if last < t:  # a prompt read in the pass: its fast form up to the tokens a crop may go back to
            out, state = rule(
                *(x[:, :, : t - last] for x in tensors),
                state=state,
                form=self._form(t - last),
                chunk_size=self.chunk_size,
                **options,
            )
            outs.append(out)
        out, states = rule(*(x[:, :, t - last :] for x in tensors), state=state, form="recurrent", each=True, **options)
        return torch.cat([*outs, out], dim=2), states

    def keep(
        self,
        cache: Cache | None,
        state: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        tokens: int,
        conv: torch.Tensor | None,
    ) -> None:
        """Write the state after the call into ``cache`` (a StateCache): the last, or while the cache keeps each
        token's (``cache.each``: :meth:`recur` ran the recurrence with ``each=True``) the states after the last
        tokens and the convolution's every input."""
        if not isinstance(cache, StateCache):
            return
        if cache.each:
            cache.write_each(state, tokens, inputs=conv)
        else:
            cache.write(state, tokens, conv=conv)

    def _record(self, weights: Callable[[], torch.Tensor], cache: Cache | None) -> None:
        """For a Recorder: the implicit weights the recurrence equals over this call's tokens ("attn_weights"),
        when the call starts from an empty state (what came before a cache's state is no longer there)."""
        if isinstance(cache, StateCache) and cache.length:
            note_unobserved(f"{type(self).__name__} keeps a state, not its weights, for the tokens before this call")
            return
        record("attn_weights", weights().detach(), source=type(self).__name__)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, Hv, T, Dv) -> (B, T, E) through out_proj."""
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.value_heads * self.value_dim))  # (B, T, E)
