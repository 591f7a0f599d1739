"""``attnlab.Attention``: the chapter's MultiHeadAttention, grown up.

One fused QKV projection, grouped-query heads, optional RoPE, a sliding
window, and a choice of backend (see ``attnlab.functional.attention``). The
book's names stay where they fit: d_in, d_out, num_heads, head_dim,
out_proj. Build it from the book's class, nn.MultiheadAttention, or Hugging
Face GPT-2 and Llama weights with the loaders in ``attnlab.models.loaders``.

Shapes: B = batch, T = tokens, H = query heads, Hkv = kv heads, D = head_dim.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn as nn

from attnlab._checks import check_dropout, check_heads, check_kv_heads, check_positive_int, check_scale, check_window
from attnlab.cache import Cache, LayerState
from attnlab.functional.attention import attention
from attnlab.functional.mods import (
    MaskMod,
    ScoreMod,
    document_positions,
)
from attnlab.functional.registry import Backend, check_backend
from attnlab.functional.rotary import RopeScaling, RotaryEmbedding, apply_rotary
from attnlab.functional.sigmoid import Normalization, check_normalize, sigmoid_attention
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention_checks import CallChecks


class ForwardArgs(NamedTuple):
    """What one call of :meth:`Attention.forward` was given besides x (its Args, in its order), passed on as one."""

    mask: torch.Tensor | None
    positions: torch.Tensor | None
    cache: Cache | None
    document_ids: torch.Tensor | None
    mask_mod: MaskMod | None
    score_mod: ScoreMod | None
    visibility: Visibility | None


class SharedKV(NamedTuple):
    """Keys (B, Hkv, Tk, D) and values (B, Hkv, Tk, Dv) a layer attended over, with their Visibility: what a later
    layer that shares them (``kv_source``) attends over too."""

    keys: torch.Tensor
    values: torch.Tensor
    visibility: Visibility


class Attention(CallChecks):
    """Multi-head self-attention with GQA, RoPE and pluggable backends.

    Args:
        d_in: input embedding size.
        num_heads: H, query heads.
        d_out: output size (defaults to d_in).
        num_kv_heads: Hkv, key/value heads; H must be a multiple. H = MHA,
            1 = MQA, in between = GQA. Defaults to H.
        head_dim: D; defaults to d_out // num_heads.
        qkv_bias: bias on the fused QKV projection.
        out_bias: bias on out_proj.
        dropout: on the attention weights, in training only, in [0, 1).
        is_causal: hide the future (bottom-right aligned with a cache).
        window: sliding-window size, or None.
        rope: apply rotary position embedding to q and k.
        rope_base: RoPE's theta.
        rope_scaling: a :class:`attnlab.functional.rotary.RopeScaling` (Llama 3's), or None.
        rotary_dim: how many dimensions of each head RoPE turns (partial rotation); None is head_dim.
        qk_norm: RMSNorm each head's query and key over head_dim before RoPE (Qwen3's ``q_norm``, ``k_norm``).
        qk_norm_over: "head" (Qwen3's, one norm over each head's D, shared by the heads) or "all" (OLMo's: one
            norm over all heads' queries, H * D, and one over the keys, Hkv * D).
        norm_eps: the QK-norm's epsilon.
        sinks: a learned sink logit per query head (gpt-oss): each row's softmax also counts exp(sink), so a
            row may give part of its attention to nothing (``attnlab.functional.attention``'s ``sinks``).
        scale: the softmax scale; None is 1/sqrt(head_dim) (GPT-2 variants
            that scale otherwise load with their own).
        output_gate: gated attention (Qwen3-Next): each head's context vector is multiplied elementwise by
            sigmoid(gate(x)) before out_proj, so a head can close on a token instead of putting its weight
            somewhere (``gate``: d_in -> H * Dv, no bias).
        backend: "auto", "eager", "sdpa" or "flash".
        value_dim: Dv, each value head's size where it is not D (MiMo-V2-Flash: 128 beside 192).
        value_scale: every value times this before it is attended or cached (MiMo-V2-Flash).
        keys_as_values: no value rows: the key projection's output, before its norm and RoPE, is the value
            (Gemma 4's full layers, ``attention_k_eq_v``).
        v_norm: each value head RMS-normed over Dv, without a weight (Gemma 4).
        rope_proportion: proportional RoPE (Gemma 4's full layers), the fraction of the frequencies that turn.
        kv_source: KV sharing (Gemma 4): this layer computes no keys or values and attends over those of layer
            ``kv_source`` of its model, which the model hands it in ``shared`` (its cache holds nothing).
        head_gate: the output gate with one opening a head (LFM3's ``gate_proj``: d_in -> H): each head's context
            vector times sigmoid(gate(x))_h. Not with ``output_gate``.
        normalize: "softmax", or "sigmoid": each weight sigmoid(score), rows not normalised (Gu et al.'s sigmoid
            attention without normalisation, ``attnlab.functional.sigmoid``; eager math, not with sinks).

    Input (B, T, d_in); output (B, T, d_out), always a tensor. The weights
    come out through :class:`attnlab.observe.Recorder`, keyed by this
    module's dotted name in its model.
    """

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        d_out: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = True,
        dropout: float = 0.0,
        is_causal: bool = True,
        window: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_scaling: RopeScaling | None = None,
        rotary_dim: int | None = None,
        qk_norm: bool = False,
        qk_norm_over: Literal["head", "all"] = "head",
        norm_eps: float = 1e-6,
        sinks: bool = False,
        scale: float | None = None,
        backend: Backend = "auto",
        output_gate: bool = False,
        value_dim: int | None = None,
        value_scale: float | None = None,
        keys_as_values: bool = False,
        v_norm: bool = False,
        rope_proportion: float | None = None,
        kv_source: int | None = None,
        head_gate: bool = False,
        normalize: Normalization = "softmax",
    ) -> None:
        # what it was built with, so a copy (ContextParallelAttention.from_attention) follows the module
        settings = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        super().__init__()
        self.settings = settings
        d_out = d_in if d_out is None else d_out
        for name, value in (("d_in", d_in), ("d_out", d_out)):
            check_positive_int(name, value, limit=2**20)
        check_positive_int("num_heads", num_heads, limit=2**16)
        if head_dim is None:
            check_heads(d_out, num_heads)  # or pass head_dim explicitly
            head_dim = d_out // num_heads
        check_positive_int("head_dim", head_dim, limit=2**16)
        value_dim = head_dim if value_dim is None else value_dim
        check_positive_int("value_dim", value_dim, limit=2**16)
        if keys_as_values and value_dim != head_dim:
            raise ValueError(
                f"keys_as_values makes each key its value: value_dim={value_dim} must be head_dim={head_dim}"
            )
        if kv_source is not None:
            check_positive_int("kv_source", kv_source + 1, limit=4096)  # a layer index, 0 included
        check_scale(value_scale)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_kv_heads(num_heads, num_kv_heads)
        check_dropout(dropout)
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
        if window is not None:
            check_window(window)
        check_scale(scale)
        check_backend(backend)
        for flag, value in (("qk_norm", qk_norm), ("output_gate", output_gate)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {value!r}")
        check_normalize(normalize)
        if normalize == "sigmoid" and (sinks or backend not in ("auto", "eager")):
            raise ValueError(
                f"sigmoid attention has no row sum for a sink to share, and runs its own eager math: got sinks={sinks} "
                f"and backend={backend!r}; leave sinks off and the backend 'auto'"
            )
        if (rope_scaling is not None or rotary_dim is not None) and not rope:
            raise ValueError("rope_scaling and rotary_dim shape RoPE: pass rope=True with them, or leave them out")

        self.d_in, self.d_out = d_in, d_out
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dropout = float(dropout)
        self.is_causal, self.window = is_causal, window
        self.scale = None if scale is None else float(scale)
        self.backend: Backend = backend
        self.normalize: Normalization = normalize

        self.value_dim, self.value_scale, self.keys_as_values = value_dim, value_scale, keys_as_values
        self.kv_source = kv_source
        # One fused projection: rows [0, H*D) are W_query, then W_key (Hkv*D), then W_value (Hkv*Dv); a layer that
        # reads another's keys has W_query alone, one whose keys are its values no W_value
        own_kv = 0 if kv_source is not None else num_kv_heads
        self.rows = (num_heads * head_dim, own_kv * head_dim, 0 if keys_as_values else own_kv * value_dim)
        self.qkv = nn.Linear(d_in, sum(self.rows), bias=qkv_bias)
        self.out_proj = nn.Linear(num_heads * value_dim, d_out, bias=out_bias)
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None  # (H,): gpt-oss's learned sinks
        if output_gate and head_gate:
            raise ValueError("output_gate opens each dimension of a head and head_gate each head: choose one")
        self.gate_per_head = head_gate  # LFM3's: one opening a head; Qwen3-Next's: one a dimension
        self.gate = (
            nn.Linear(d_in, num_heads * (1 if head_gate else value_dim), bias=False)
            if output_gate or head_gate
            else None
        )
        self.v_norm = nn.RMSNorm(value_dim, eps=norm_eps, elementwise_affine=False) if v_norm else None
        # Qwen3's QK-norm: one RMSNorm over head_dim, shared by the heads, for the queries and one for the keys
        if qk_norm_over not in ("head", "all"):
            raise ValueError(f"qk_norm_over must be 'head' or 'all', got {qk_norm_over!r}")
        whole = qk_norm_over == "all"
        self.qk_norm_over = qk_norm_over
        self.q_norm = nn.RMSNorm(head_dim * (num_heads if whole else 1), eps=norm_eps) if qk_norm else None
        keys_norm = qk_norm and kv_source is None
        self.k_norm = nn.RMSNorm(head_dim * (num_kv_heads if whole else 1), eps=norm_eps) if keys_norm else None
        self.rotary = (
            RotaryEmbedding(
                head_dim=head_dim,
                base=rope_base,
                scaling=rope_scaling,
                rotary_dim=rotary_dim,
                proportion=rope_proportion,
            )
            if rope
            else None
        )

    @property
    def visibility_key(self) -> int | None:
        """What a model shares one Visibility by, among its layers: the window (None: full attention)."""
        return self.window

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the activations: its weights', or float32 for int8 weights (``attnlab.linear.quantized``)."""
        dtype: torch.dtype = getattr(self.qkv, "dtype", None) or self.qkv.weight.dtype
        return dtype

    @property
    def device(self) -> torch.device:
        """Where its weights live (an int8 layer keeps its scale beside its int8 weight)."""
        return next(t for t in (*self.qkv.parameters(), *self.qkv.buffers())).device

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x (B, T, d_in) into q (B, H, T, D), k (B, Hkv, T, D) and v (B, Hkv, T, Dv); QK-normed, values
        normed and scaled, as the module has it (a layer that reads another's keys: k and v with no heads)."""
        b, t, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.rows == (h * d, h_kv * d, h_kv * d):
            heads = self.qkv(x).view(b, t, h + 2 * h_kv, d).transpose(1, 2)  # (B, H + 2 Hkv, T, D): three ops, not nine
            queries, keys, values = heads.split([h, h_kv, h_kv], dim=1)  # (B, H, T, D), (B, Hkv, T, D) twice
        else:
            q, k, v = self.qkv(x).split(self.rows, dim=-1)  # (B, T, H*D), (B, T, own Hkv*D), (B, T, own Hkv*Dv)
            queries = q.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
            keys = k.view(b, t, -1, d).transpose(1, 2)  # (B, Hkv or 0, T, D)
            values = keys if self.keys_as_values else v.view(b, t, -1, self.value_dim).transpose(1, 2)  # (.., Dv)
        if self.v_norm is not None:
            values = self.v_norm(values)  # over Dv, per head and token, before the keys are normed
        if self.value_scale is not None:
            values = values * self.value_scale
        if self.q_norm is not None and self.qk_norm_over == "all":
            queries = _whole(self.q_norm, queries)  # over all heads, per token
            keys = keys if self.k_norm is None else _whole(self.k_norm, keys)
        elif self.q_norm is not None:
            queries = self.q_norm(queries)  # over D, per head and token
            keys = keys if self.k_norm is None else self.k_norm(keys)
        return queries, keys, values

    def layer_state(self) -> LayerState:
        """What this layer keeps between calls: keys and values of its kv heads (a ring of its window when it
        slides), in its dtype, on its device. ``attnlab.cache.ModelCache.build`` turns it and a cache name into
        the layer's cache: ``ModelCache.build([attn.layer_state()], "plain", rows=1, capacity=64)[0]``."""
        return LayerState(
            kind="shared" if self.kv_source is not None else "full" if self.window is None else "sliding",
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            value_dim=None if self.value_dim == self.head_dim else self.value_dim,
            source=self.kv_source,
            window=self.window,
            rotary=self.rotary,
            dtype=self.dtype,
            device=self.device,
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
        visibility: Visibility | None = None,
        shared: dict[int | None, SharedKV] | None = None,
    ) -> torch.Tensor:
        """Attend over x (B, T, d_in), optionally after the tokens held in ``cache``.

        Args:
            mask: bool (True = may attend) or additive float, broadcastable to
                (B, H, T, Tk), where Tk counts every token seen: the cached
                ones and the new ones; e.g. a key padding mask (B, 1, 1, Tk).
            positions: token positions for RoPE, (T,) or (B, T); default the
                next T positions (0..T-1 without a cache).
            cache: any :class:`attnlab.cache.Cache` (``ModelCache.build`` from ``layer_state()`` gives one
                that fits); updated in place. The new tokens see every cached
                one, and the causal and window masks follow the cache's positions.
            document_ids: (B, T) integer ids of packed documents, non-decreasing
                along a row: no token sees another document, and RoPE positions
                restart at each document (unless ``positions`` are given). Not with a cache.
            mask_mod, score_mod: FlexAttention's signatures (``attnlab.functional.mods``),
                at absolute positions; a score_mod's tensors get their gradients.
            visibility: one built by :meth:`visibility_for` (a model builds it once and
                every layer shares it), instead of mask, document_ids and the mods.
            shared: KV sharing, one dict per forward of a model: a layer that computes keys leaves them
                there under its ``visibility_key`` (the last of each type wins), and a layer with
                ``kv_source`` attends over them instead of its own (Gemma 4's ``shared_kv_states``).

        Returns:
            (B, T, d_out).

        Raises:
            ValueError, TypeError: naming the bad value. Everything is checked
            before the cache is written, so a call that raises leaves it as it was.
        """
        given = ForwardArgs(mask, positions, cache, document_ids, mask_mod, score_mod, visibility)  # in this order
        visibility, positions = self._prepare(x, given)  # everything checked: nothing is written before this
        if self.kv_source is not None and (shared is None or self.visibility_key not in shared):
            raise ValueError(
                f"this layer reads layer {self.kv_source}'s keys and values (KV sharing), which its model hands it "
                "in shared=: run it inside its model, after that layer"
            )
        queries, keys, values = self.split_qkv(x)
        if self.rotary is not None:
            cos, sin = self.rotary(positions, dtype=queries.dtype)
            queries = apply_rotary(queries, cos, sin)
            keys = keys if self.kv_source is not None else apply_rotary(keys, cos, sin)
        if shared is not None and self.kv_source is not None:
            keys, values, visibility = shared[self.visibility_key]  # the source layer's, after its cache's write
        elif cache is not None:
            keys, values, key_pos = cache.update(keys, values)  # the only write; everything above is checked
            visibility = visibility.for_keys(key_pos)  # the next layer's cache returns the same positions: kept
        if shared is not None and self.kv_source is None:
            shared[self.visibility_key] = SharedKV(keys, values, visibility)
        out = self.attend(queries, keys, values, visibility=visibility, gate=self.gate_for(x))
        if cache is not None and cache.capabilities.observes:  # a cache that evicts by the attention its keys get
            cache.observe(queries, keys, values, visibility=visibility, scale=self.scale, normalize=self.normalize)
        return out

    def _prepare(self, x: torch.Tensor, given: ForwardArgs) -> tuple[Visibility, torch.Tensor]:
        """Check a call before anything is projected or written: who may attend, and the RoPE positions (given,
        each document's from 0, or the queries' own). ``ContextParallelAttention`` answers it on the ring."""
        self._check_input(x)
        b, t, _ = x.shape
        if given.cache is not None:
            self._check_cache(given.cache)
        visibility, positions = given.visibility, given.positions
        if visibility is None:
            visibility = self.visibility_for(
                x,
                mask=given.mask,
                cache=given.cache,
                document_ids=given.document_ids,
                mask_mod=given.mask_mod,
                score_mod=given.score_mod,
            )
        elif (
            given.mask is not None
            or given.document_ids is not None
            or given.mask_mod is not None
            or given.score_mod is not None
        ):
            raise ValueError("pass visibility= or mask, document_ids, mask_mod and score_mod, not both")
        if positions is None and given.document_ids is not None:
            positions = document_positions(given.document_ids)  # (B, T): each document starts at 0
        if positions is not None:
            self._check_positions(positions, b, t)
        if given.cache is not None and given.visibility is not None:  # one visibility_for built is checked there
            self.check_before_write(visibility)
        return visibility, visibility.q_pos if positions is None else positions  # default: 0..T-1, or after the cache

    def gate_for(self, x: torch.Tensor) -> torch.Tensor | None:
        """The output gate's openings sigmoid(gate(x)), (B, T, H * D), or None for a module without one."""
        if self.gate is None:
            return None
        opened = torch.sigmoid(self.gate(x))  # (B, T, H * Dv), or (B, T, H) one a head
        return opened.repeat_interleave(self.value_dim, dim=-1) if self.gate_per_head else opened  # (B, T, H * Dv)

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention and out_proj on projected (and rotated) q (B, H, Tq, D), k, v (B, Hkv, Tk, D); ``gate``:
        the output gate's openings (:meth:`gate_for`) when the module has one."""
        if self.normalize == "sigmoid":
            dropout = self.dropout if self.training else 0.0
            context = sigmoid_attention(
                queries, keys, values, visibility=visibility, scale=self.scale, dropout_p=dropout
            )
            return self.merge_heads(context, gate=gate)
        context_vec = attention(
            queries,
            keys,
            values,
            visibility=visibility,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
            backend=self.backend,
            sinks=self.sinks,
        )
        return self.merge_heads(context_vec, gate=gate)

    def merge_heads(self, context_vec: torch.Tensor, *, gate: torch.Tensor | None = None) -> torch.Tensor:
        """(B, H, T, D) context vectors -> heads side by side, through the output gate if the module has one
        (``gate``: its openings for the same tokens, :meth:`gate_for`), then out_proj: (B, T, d_out)."""
        b, _, t, _ = context_vec.shape
        context_vec = context_vec.transpose(1, 2).reshape(b, t, self.num_heads * self.value_dim)  # (B, T, H*Dv)
        if (gate is None) != (self.gate is None):
            raise ValueError(
                "this Attention has an output gate: pass gate=module.gate_for(x) for the same tokens"
                if gate is None
                else "gate= was given but this Attention has no output gate (build it with output_gate=True)"
            )
        if gate is not None:
            context_vec = context_vec * gate  # (B, T, H*D): each head's vector, opened or closed per dimension
        return self.out_proj(context_vec)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, is_causal={self.is_causal}, window={self.window}, "
            f"rope={self.rotary is not None}, qk_norm={self.q_norm is not None}, sinks={self.sinks is not None}, "
            f"scale={self.scale}, output_gate={self.gate is not None}, value_dim={self.value_dim}, "
            f"keys_as_values={self.keys_as_values}, v_norm={self.v_norm is not None}, kv_source={self.kv_source}, "
            f"backend={self.backend!r}"
        )


def _whole(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm`` over every head of a token at once: (B, H, T, D) -> (B, T, H * D), normed, and back."""
    b, h, t, d = x.shape
    return norm(x.transpose(1, 2).reshape(b, t, h * d)).view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
