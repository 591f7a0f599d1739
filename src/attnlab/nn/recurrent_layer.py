"""What the layers of ``attnlab.nn.recurrent`` share to speak ``attnlab.Attention``'s call: projections per
head, the StateCache their :meth:`RecurrentLayer.layer_state` asks for, which tokens are real, the form a call runs.

Shapes: B = batch, T = tokens, E = d_in, H = heads, D = head_dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.state import StateCache
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.visibility import Visibility
from attnlab.observe import note_unobserved, record

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
