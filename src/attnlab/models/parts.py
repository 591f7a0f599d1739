"""The decoder's parts: its norms, its MLPs and the block that holds them, each chosen by ``GPTConfig``.

A block is the book's ``TransformerBlock`` in its names (``norm1``, ``att``, ``drop_resid``, ``norm2``, ``ff``),
whatever the family:

- GPT-2 (chapter 4): LayerNorm before each sublayer, a 4x GELU MLP (``ff.0``, ``ff.2``) with biases;
- Llama 3, Mistral, Qwen2 and Qwen3 (the book's Llama 3 and Qwen3 chapters): RMSNorm before each sublayer and
  the gated ``FeedForward`` (``fc1`` the gate, ``fc2`` up, ``fc3`` down), no biases;
- ``norm_placement="post"`` (OLMo 2): each sublayer's output is normed before it is added back;
- Gemma 4: experts beside the MLP (``moe_beside.py``), then a per-layer input and a scalar (``per_layer.py``).

The MLPs themselves (FeedForward, MoEFeedForward) are ``mlp.py``'s.

The attention is ``attnlab.Attention`` with the layer's own window from the config's pattern, so every backend,
cache and the Recorder work in every family.

Shapes: B = batch, T = tokens, E = emb_dim, F = the MLP's hidden width.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from attnlab.cache import Cache
from attnlab.functional.visibility import Visibility
from attnlab.models.block_layers import make_block_sparse
from attnlab.models.config import GPTConfig
from attnlab.models.mlp import FeedForward, MoEFeedForward
from attnlab.models.moe_beside import MoEBeside
from attnlab.models.per_layer import LayerEnd, PerLayerEmbedding
from attnlab.models.v4_layers import TokenIds, make_hyper, make_v4_attention, make_v4_moe
from attnlab.nn.attention import Attention, SharedKV
from attnlab.nn.convolution import GatedShortConvolution
from attnlab.nn.indexed import IndexedAttention
from attnlab.nn.indexed_shared import SharedIndexAttention
from attnlab.nn.kda import KimiDeltaAttention
from attnlab.nn.latent import LatentAttention
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention


def make_norm(config: GPTConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` (emb_dim): LayerNorm (GPT-2's, with a shift) or RMSNorm (scale only)."""
    size = config.emb_dim if size is None else size
    if config.norm == "rmsnorm":
        return nn.RMSNorm(size, eps=config.layer_norm_eps)
    return nn.LayerNorm(size, eps=config.layer_norm_eps)


def make_mlp(config: GPTConfig, layer: int = 0) -> nn.Module:
    """GPT-2's GELU MLP (``ff.0``, ``ff.2``: the names its checkpoints keep), the gated FeedForward, or on a
    sparse layer the mixture of experts."""
    e, f = config.emb_dim, config.ff_dim
    if config.deepseek_v4 is not None:  # DeepSeek-V4's clamped experts, hash-routed on its first layers
        return make_v4_moe(config, layer)
    if config.double_wide_shared and config.kv_source(layer) is not None:
        f = 2 * f  # Gemma 4's layers that share keys: an MLP twice as wide (use_double_wide_mlp)
    if config.num_experts and not config.moe_beside and layer not in config.dense_layers:
        return MoEFeedForward(
            emb_dim=e,
            hidden_dim=config.moe_intermediate_size or f,
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            norm_topk_prob=config.norm_topk_prob,
            clamped=config.mlp == "clamped_swiglu",
            grouped=(config.n_group, config.topk_group, config.routed_scaling_factor)
            if config.router == "grouped_sigmoid"
            else None,
            shared=(
                config.n_shared_experts * (config.shared_expert_dim or config.moe_intermediate_size or f),
                config.shared_expert_gate,
            ),
        )
    if config.mlp in ("swiglu", "geglu"):
        return FeedForward(emb_dim=e, hidden_dim=f, bias=config.bias, gelu=config.mlp == "geglu")
    return nn.Sequential(
        nn.Linear(e, f, bias=config.bias), nn.GELU(approximate="tanh"), nn.Linear(f, e, bias=config.bias)
    )


def make_beside(config: GPTConfig) -> MoEBeside | None:
    """Gemma 4's experts beside each MLP (``moe_beside``), or None."""
    if not config.moe_beside:
        return None
    f = config.moe_intermediate_size or config.ff_dim
    k = config.num_experts_per_tok
    return MoEBeside(
        emb_dim=config.emb_dim, hidden_dim=f, num_experts=config.num_experts, k=k, eps=config.layer_norm_eps
    )


def make_ple(config: GPTConfig) -> PerLayerEmbedding | TokenIds | None:
    """The model's per-layer embeddings (``ple_dim`` > 0: Gemma 4's PLE), the token ids (DeepSeek-V4's hash
    routing), or None."""
    if config.deepseek_v4 is not None:
        return TokenIds()
    if not config.ple_dim:
        return None
    c = config
    return PerLayerEmbedding(
        vocab_size=c.vocab_size, emb_dim=c.emb_dim, n_layers=c.n_layers, ple_dim=c.ple_dim, eps=c.layer_norm_eps
    )


def make_attention(config: GPTConfig, layer: int) -> LatentAttention:
    """A layer's latent attention (DeepSeek-V3), its RoPE and window from the config's pattern; with index_topk,
    DeepSeek Sparse Attention's (IndexedAttention: its lightning indexer and top-k selection)."""
    assert config.kv_lora_rank is not None
    rope_base, rope_scaling = config.layer_rope(layer)
    indexed: dict[str, Any] = {}
    if config.index_topk is not None:
        indexed = dict(index_topk=config.index_topk, index_heads=config.index_heads)
        indexed |= dict(index_head_dim=config.index_head_dim, index_rope_interleave=config.index_rope_interleave)
    shared = layer in config.index_shared  # GLM-5: an earlier layer's choice, no indexer of its own
    return (SharedIndexAttention if shared else IndexedAttention if indexed else LatentAttention)(
        **indexed,
        d_in=config.emb_dim,
        num_heads=config.n_heads,
        kv_lora_rank=config.kv_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim,
        q_lora_rank=config.q_lora_rank,
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        rope_interleave=config.rope_interleave,
        rope=config.rope,
        window=config.layer_window(layer),
        scale=config.attn_scale,
        backend=config.backend,
    )


def make_kda(config: GPTConfig) -> KimiDeltaAttention:
    """A "kda" layer (Kimi Linear): its heads, head size, convolution and output norm's epsilon from the config's
    delta_* fields and conv_kernel."""
    return KimiDeltaAttention(
        d_in=config.emb_dim,
        num_heads=config.delta_heads or config.n_heads,
        head_dim=config.delta_head_dim or config.d_head,
        out_bias=config.bias,
        norm_eps=config.delta_norm_eps or config.layer_norm_eps,
        conv_kernel=config.conv_kernel,
    )


def make_softmax(config: GPTConfig, layer: int) -> Attention:
    """Layer ``layer``'s softmax attention: its type's own shape (``GPTConfig.layer_shape``), window and RoPE."""
    shape, (rope_base, rope_scaling) = config.layer_shape(layer), config.layer_rope(layer)
    return Attention(
        d_in=config.emb_dim,
        num_heads=config.n_heads,
        num_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        qkv_bias=config.qkv_bias,
        out_bias=config.bias,
        dropout=config.drop_rate,
        is_causal=True,
        window=config.layer_window(layer),
        rope=config.rope,
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        rotary_dim=shape.rotary_dim,
        qk_norm=config.qk_norm,
        qk_norm_over=config.qk_norm_over,
        norm_eps=config.layer_norm_eps,
        sinks=shape.sinks,
        scale=config.attn_scale,
        backend=config.backend,
        output_gate=config.attn_output_gate,
        head_gate=config.attn_head_gate,
        value_dim=config.v_head_dim or None,
        value_scale=config.value_scale,
        keys_as_values=shape.keys_as_values,
        v_norm=config.v_norm,
        rope_proportion=shape.rope_proportion,
        kv_source=shape.kv_source,
        normalize=config.attn_normalize,
    )


class TransformerBlock(nn.Module):
    """Pre-norm: x + drop(att(norm1(x))), then x + drop(ff(norm2(x))); post-norm: x + drop(norm1(att(x))), then
    x + drop(norm2(ff(x))); sandwich: x + drop(post_norm1(att(norm1(x)))), then x + drop(post_norm2(ff(norm2(x)))).
    Layer ``layer`` of the config's pattern: full attention or its sliding window, with that kind's RoPE, and a
    dense MLP or the mixture of experts."""

    def __init__(self, config: GPTConfig, *, layer: int = 0) -> None:
        super().__init__()
        e = config.emb_dim
        kind = config.layer_type(layer)
        own = config.delta_norm_placement if kind == "delta" else None  # OLMo-Hybrid's: pre there, post elsewhere
        self.placement = own or config.norm_placement
        self.norm1 = make_norm(config)
        self.att: Attention | LinearAttention | GatedDeltaNet | KimiDeltaAttention | GatedShortConvolution = (
            make_v4_attention(config, layer)  # type: ignore[assignment]
            if config.deepseek_v4 is not None
            else make_kda(config)
            if kind == "kda"
            else make_attention(config, layer)
            if config.kv_lora_rank is not None
            else LinearAttention(d_in=e, num_heads=config.n_heads, head_dim=config.d_head, out_bias=config.bias)
            if kind == "linear"
            else GatedDeltaNet(
                d_in=e,
                num_heads=config.delta_heads or config.n_heads,
                head_dim=config.delta_head_dim or config.d_head,
                out_bias=config.bias,
                norm_eps=config.delta_norm_eps or config.layer_norm_eps,
                value_heads=config.delta_value_heads,
                value_dim=config.delta_value_dim,
                conv_kernel=config.conv_kernel,
                negative_eigenvalues=config.delta_negative_eigenvalues,
            )
            if kind == "delta"
            else GatedShortConvolution(d_in=e, kernel=config.conv_kernel or 3, bias=config.conv_bias)
            if kind == "conv"
            else make_block_sparse(config, layer)
            if kind in ("moba", "nsa")
            else make_softmax(config, layer)
        )
        self.drop_resid = nn.Dropout(config.drop_rate)
        self.norm2 = make_norm(config)
        self.ff = make_mlp(config, layer)
        if self.placement == "sandwich":  # Gemma's: a norm after each sublayer too, before it is added back
            self.post_norm1, self.post_norm2 = make_norm(config), make_norm(config)
        self.moe = make_beside(config)  # Gemma 4's experts beside the MLP, or None
        self.hyper = make_hyper(config, layer)  # DeepSeek-V4's hyper-connections (models/hyper.py), or None
        self.end = (  # Gemma 4's per-layer input and layer scalar, or None
            LayerEnd(
                layer=layer, emb_dim=e, ple_dim=config.ple_dim, scalar=config.layer_scalar, eps=config.layer_norm_eps
            )
            if config.ple_dim or config.layer_scalar
            else None
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        visibility: Visibility,
        positions: torch.Tensor | None,
        cache: Cache | None,
        shared: dict[int | None, SharedKV] | None = None,
        per_layer: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``shared``: the keys the model's layers leave for the layers that share them (KV sharing), or None;
        ``per_layer``: every layer's per-layer input (B, T, L, P) where the model has them (Gemma 4's PLE)."""
        if self.hyper is not None:  # DeepSeek-V4: N residual streams; per_layer: the token ids its hash layers read
            return self.hyper(
                x,
                lambda h: self.att(self.norm1(h), visibility=visibility, positions=positions, cache=cache),
                lambda h: self.ff(self.norm2(h), per_layer),
            )
        extra: dict[str, Any] = {"shared": shared} if shared is not None and isinstance(self.att, Attention) else {}
        if self.placement == "post":
            x = x + self._resid(
                self.norm1(self.att(x, visibility=visibility, positions=positions, cache=cache, **extra))
            )
            x = x + self._resid(self.norm2(self.ff(x)))
        elif self.placement == "sandwich":
            att = self.att(self.norm1(x), visibility=visibility, positions=positions, cache=cache, **extra)
            x = x + self._resid(self.post_norm1(att))
            x = x + self._resid(self.post_norm2(self._mlp(x)))
        else:
            x = x + self._resid(
                self.att(self.norm1(x), visibility=visibility, positions=positions, cache=cache, **extra)
            )
            x = x + self._resid(self._mlp(x))
        return x if self.end is None else self.end(x, per_layer)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP on norm2(x), and the experts beside it where the layer has them (Gemma 4's, on x itself)."""
        out = self.ff(self.norm2(x))
        return out if self.moe is None else self.moe(x, out)

    def _resid(self, x: torch.Tensor) -> torch.Tensor:
        """``drop_resid`` while it trains (its own flag: Monte-Carlo dropout turns on the dropouts alone); in
        evaluation, where it is the identity, not called at all (a module call costs a decode step microseconds
        per layer)."""
        return self.drop_resid(x) if self.drop_resid.training else x
