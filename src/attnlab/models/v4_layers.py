"""A DeepSeek-V4 decoder's parts, built from ``GPTConfig.deepseek_v4`` (``attnlab.models.v4_spec``) for
``attnlab.models.parts``: the compressed attention speaking the block's call (:class:`V4Attention`), the mixture
(``moe_v4``), the hyper-connections (``hyper``), and :class:`TokenIds`, which hands every block the tokens' ids
(a hash layer routes by them) where Gemma 4 hands its per-layer inputs.

Shapes: B = batch, T = tokens, E = emb_dim.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn as nn

from attnlab.cache import Cache, LayerState
from attnlab.cache.compressed import CompressedCache
from attnlab.cache.compressed_paged import CompressedRows, PagedCompressedCache
from attnlab.functional.attention import attention
from attnlab.functional.compression import turn_pairs
from attnlab.functional.visibility import Visibility
from attnlab.models.config import GPTConfig
from attnlab.models.hyper import HyperBlock
from attnlab.models.moe_v4 import DeepseekV4MoE
from attnlab.models.v4_spec import DeepseekV4Spec
from attnlab.nn.compressed import CompressedAttention


class V4Attention(CompressedAttention):
    """``CompressedAttention`` in a block: its own visibility (causal over its window and closed entries, which it
    works out itself), the cache's positions; a padding mask, packed documents and mods refused by name."""

    visibility_key: ClassVar[str] = "compressed"

    def visibility_for(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        **mods: Any,
    ) -> Visibility:
        if mask is not None or document_ids is not None or any(m is not None for m in mods.values()):
            raise ValueError(
                "DeepSeek-V4's compressed layers pool every token of a block into its entry: a padded row, packed "
                "documents or a mask_mod/score_mod would reach into them; run one unpadded prompt a row, without mods"
            )
        held = cache.length if isinstance(cache, CompressedCache) else 0
        return Visibility(q_pos=torch.arange(held, held + x.shape[1], device=x.device), causal=True)

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
        visibility: Visibility | None = None,
        **_: Any,
    ) -> torch.Tensor:
        if isinstance(cache, PagedCompressedCache | CompressedRows):  # paged rows, each its own length: one a call
            run = super().forward
            return torch.cat([run(x[n : n + 1], cache=row) for n, row in enumerate(cache.each(len(x)))])
        if cache is not None and not isinstance(cache, CompressedCache):
            raise TypeError(f"a V4 layer keeps a CompressedCache (its layer_state()), got {type(cache).__name__}")
        return super().forward(x, cache=cache)


class V4SlidingAttention(V4Attention):
    """A V4 layer without a compressor ("sliding_attention"): its window's tokens and the sinks alone, at the main
    RoPE. Its state is a plain sliding window of one key-value head (its keys are its values)."""

    def __init__(self, **shape: Any) -> None:
        super().__init__(compress_block=2, index_topk=None, **shape)
        del self.compressor  # no entries: nothing of it in the checkpoint

    def layer_state(self) -> LayerState:
        w = self.q_a_proj.weight
        return LayerState(
            kind="sliding", kv_heads=1, head_dim=self.head_dim, window=self.window, dtype=w.dtype, device=w.device
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
        visibility: Visibility | None = None,
        **_: Any,
    ) -> torch.Tensor:
        b, t = x.shape[0], x.shape[1]
        positions = torch.arange(t, device=x.device) if cache is None else cache.next_positions(t)
        latent = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(latent).view(b, t, self.num_heads, -1).transpose(1, 2)  # (B, T, H * D) -> (B, H, T, D)
        q = turn_pairs(q * torch.rsqrt(q.square().mean(-1, keepdim=True) + self.eps), positions, self.inv_freq)
        keys = turn_pairs(self.kv_norm(self.kv_proj(x)), positions, self.inv_freq)[:, None]  # (B, 1, T, D)
        key_pos = positions
        if cache is not None:
            keys, _values, key_pos = cache.update(keys, keys)  # its keys are its values
        vis = Visibility(q_pos=positions, k_pos=key_pos, window=self.window, causal=True)
        context = attention(q, keys, keys, visibility=vis, scale=self.head_dim**-0.5, sinks=self.sinks)
        return self._output(context, positions)

    def readable(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def extra_repr(self) -> str:
        return f"sliding, window={self.window}, heads={self.num_heads}"


def yarn_inv_freq(spec: DeepseekV4Spec) -> torch.Tensor:
    """The compressed layers' inverse frequencies (rope_dim / 2,): theta ``compress_theta``, YaRN's if scaled."""
    r = spec.rope_dim
    inv_freq = spec.compress_theta ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
    s = spec.compress_scaling
    return inv_freq if s is None else s.inv_freq(inv_freq, spec.compress_theta)


def make_v4_attention(config: GPTConfig, layer: int) -> V4Attention:
    """Layer ``layer``'s: compressed at the compressed RoPE (YaRN's), or sliding at the main one."""
    spec = config.deepseek_v4
    assert spec is not None and config.window is not None
    shape: dict[str, Any] = dict(d_model=config.emb_dim, num_heads=config.n_heads, head_dim=config.d_head)
    shape |= dict(rope_dim=spec.rope_dim, q_lora_rank=spec.q_lora_rank, window=config.window, o_groups=spec.o_groups)
    shape |= dict(o_lora_rank=spec.o_lora_rank, eps=config.layer_norm_eps)
    if spec.layer_kinds[layer] == "sliding":
        return V4SlidingAttention(rope_theta=config.rope_base, **shape)
    sparse = spec.layer_kinds[layer] == "compressed_sparse"
    att = V4Attention(
        **shape,
        compress_block=spec.block(layer),
        index_topk=spec.index_topk if sparse else None,
        index_heads=spec.index_heads,
        index_head_dim=spec.index_head_dim if sparse else 0,
        rope_theta=spec.compress_theta,
    )
    att.inv_freq.copy_(yarn_inv_freq(spec))
    return att


def make_v4_moe(config: GPTConfig, layer: int) -> DeepseekV4MoE:
    spec = config.deepseek_v4
    assert spec is not None and config.moe_intermediate_size is not None
    return DeepseekV4MoE(
        emb_dim=config.emb_dim,
        hidden_dim=config.moe_intermediate_size,
        num_experts=config.num_experts,
        k=config.num_experts_per_tok,
        scoring=spec.scoring,
        routed_scaling_factor=config.routed_scaling_factor,
        limit=spec.swiglu_limit,
        vocab_size=config.vocab_size if layer in spec.hash_layers else None,
    )


def make_hyper(config: GPTConfig, layer: int) -> HyperBlock | None:
    """The block's hyper-connections, or None (a model without them)."""
    spec = config.deepseek_v4
    if spec is None:
        return None
    return HyperBlock(
        n=spec.hc_mult,
        emb_dim=config.emb_dim,
        iters=spec.hc_sinkhorn_iters,
        hc_eps=spec.hc_eps,
        norm_eps=config.layer_norm_eps,
        first=layer == 0,
        last=layer == config.n_layers - 1,
    )


class TokenIds(nn.Module):
    """What a V4 model hands its blocks as their per-layer input: the tokens' ids (B, T) themselves."""

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return ids
