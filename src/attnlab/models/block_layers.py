"""A "moba" or "nsa" layer of a decoder, built from ``GPTConfig.sparse_blocks`` (``attnlab.models.block_spec``)
for ``attnlab.models.parts``: the softmax layer's shape (heads, key heads, RoPE, biases) with the block choice."""

from __future__ import annotations

from typing import Any

from attnlab.models.config import GPTConfig
from attnlab.nn.moba import MoBAAttention
from attnlab.nn.nsa import NSAAttention


def make_block_sparse(config: GPTConfig, layer: int) -> MoBAAttention:
    """Layer ``layer``'s MoBA or NSA attention, at the config's context length."""
    spec = config.sparse_blocks
    assert spec is not None  # GPTConfig refuses a "moba" or "nsa" layer without it
    rope_base, rope_scaling = config.layer_rope(layer)
    shape: dict[str, Any] = dict(d_in=config.emb_dim, num_heads=config.n_heads, head_dim=config.d_head)
    shape |= dict(num_kv_heads=config.n_kv_heads, qkv_bias=config.qkv_bias, out_bias=config.bias)
    shape |= dict(dropout=config.drop_rate, rope=config.rope, rope_base=rope_base, rope_scaling=rope_scaling)
    shape |= dict(scale=config.attn_scale, backend=config.backend, context_length=config.context_length)
    if config.layer_type(layer) == "moba":
        return MoBAAttention(block_size=spec.block, top_k=spec.top_k, **shape)
    return NSAAttention(
        compress_block=spec.compress_block,
        stride=spec.stride,
        select_block=spec.select_block,
        select_n=spec.select_n,
        slide=spec.slide,
        **shape,
    )
