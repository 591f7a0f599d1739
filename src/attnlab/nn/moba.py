"""``MoBAAttention``: softmax attention whose queries each read a few blocks of keys (MoBA, Lu et al. 2025).

The keys split into blocks of ``block_size`` positions; each head's query scores each block wholly before its
own by q . mean(keys of the block), reads its own block (causal inside it) and the best others, ``top_k``
blocks in all (``attnlab.functional.sparse_blocks.moba_select``). The choice is a Visibility:

    readable:  every key, all but the chosen blocks hidden (:meth:`MoBAAttention.readable`)
    fast:      each head's query over its chosen blocks' keys alone, gathered by their slots (``forward``)

tested equal (inside a ``Recorder`` the layer records the readable form's weights, (B, H, T, S), as its
``attn_weights``); ``keys_read`` counts the keys the gathers read for each query, a key counted once however many
heads read it (as a dense layer's meter counts: ``attnlab.bench.sparse_meter``), ``queries_read`` the queries.
It needs no weights of its own: ``Attention``'s projections, RoPE and output.

Its state (``layer_state``: kind "blocks") is every position's keys and values, as a full layer's, in the caches
that keep each row's keys at consecutive slots ('plain', 'paged', 'prefix'; ``attnlab.cache.plan``); a left
padded batch reads blocks of each row's own positions.

Shapes: B = batch, H = heads, T = tokens, S = key slots, D = head size.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.cache import LayerState
from attnlab.cache.kv import KVCache
from attnlab.cache.paged import PagedKVCache, PagedRows
from attnlab.functional.attention import attention
from attnlab.functional.rotary import apply_rotary
from attnlab.functional.sparse_blocks import (
    check_blocks,
    chosen_visibility,
    distinct_keys,
    gathered_attention,
    moba_select,
)
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import Attention, ForwardArgs
from attnlab.nn.selection_record import record_blocks
from attnlab.observe import is_recording, record

ROW_CACHES = (KVCache, PagedKVCache, PagedRows)  # each row's keys at consecutive slots, none dropped or rounded


def check_block_visibility(vis: Visibility) -> None:
    """Refuse what a block choice cannot read: moved scores, mods, a mask that differs by head or query."""
    if vis.bias is not None or vis.score_mod is not None or vis.mask_mod is not None:
        raise ValueError(
            "a block-sparse layer (MoBA, NSA) chooses blocks of each row's positions: a float mask, mask_mod or "
            "score_mod (packed documents among them) would reach inside its blocks; pass a key padding mask alone"
        )
    allowed = vis.allowed
    if allowed is not None and (allowed.shape[-2] != 1 or (allowed.dim() == 4 and allowed.shape[1] != 1)):
        raise ValueError(
            f"a block-sparse layer reads a key padding mask (B, 1, 1, Tk), got a mask of shape {tuple(allowed.shape)}"
        )


def row_positions(vis: Visibility, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's own positions (q (B, Tq), k (B, S), -1 for none): the call's positions less its left padding."""
    assert vis.k_pos is not None  # bound: a cache's positions, or the call's own keys
    q_pos, k_pos = vis.q_pos.expand(batch, vis.tq), vis.k_pos.expand(batch, vis.tk)
    if vis.allowed is None:
        return q_pos, k_pos
    hidden = ~vis.allowed.reshape(-1, vis.allowed.shape[-1]).expand(batch, vis.tk)  # (B, S)
    pad = hidden.sum(-1, keepdim=True)  # (B, 1)
    if not torch.equal(hidden, torch.arange(vis.tk, device=hidden.device) < pad):
        raise ValueError(
            "a block-sparse layer reads left padding alone: a mask hiding keys after a row's first real one"
        )
    k_pos = torch.where(hidden | (k_pos < 0), -1, k_pos - pad)
    return torch.where(q_pos - pad >= 0, q_pos - pad, -1), k_pos


class MoBAAttention(Attention):
    """``Attention`` (causal, no window) reading ``top_k`` blocks of ``block_size`` keys a head and query.

    Args:
        block_size: positions a block (at least 1).
        top_k: blocks a query reads, its own included; at most the blocks ``context_length`` holds.
        context_length: the longest context the layer serves (``top_k`` is checked against its blocks).
        attention: ``Attention``'s arguments (no window, sinks or keys shared with another layer).
    """

    def __init__(self, *, block_size: int, top_k: int, context_length: int, **attention: Any) -> None:
        check_blocks(block_size, top_k, context_length, names=("block_size", "top_k"))
        for name in ("window", "sinks", "kv_source"):
            if attention.get(name):
                raise ValueError(f"a block-sparse layer chooses among all its own keys: {name}={attention[name]!r}")
        if attention.get("is_causal") is False:
            raise ValueError("a block-sparse layer is causal (its own block is read up to the query): is_causal=True")
        super().__init__(**attention)
        self.block_size, self.top_k, self.context_length = block_size, top_k, context_length
        self.register_buffer("keys_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("queries_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.keys_read: torch.Tensor
        self.queries_read: torch.Tensor

    def layer_state(self) -> LayerState:
        """Every position's keys and values, at consecutive slots: kind "blocks" (``attnlab.cache.plan``)."""
        return LayerState(
            kind="blocks",
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            value_dim=None if self.value_dim == self.head_dim else self.value_dim,
            rotary=self.rotary,
            dtype=self.dtype,
            device=self.device,
        )

    def _prepare(self, x: torch.Tensor, given: ForwardArgs) -> tuple[Visibility, torch.Tensor]:
        """``Attention``'s checks, and what a block choice cannot read, refused before the cache is written."""
        if given.cache is not None and not isinstance(given.cache, ROW_CACHES):
            raise TypeError(
                f"a block-sparse layer reads each row's keys at consecutive slots: a KVCache or PagedKVCache "
                f"(ModelCache.build from its layer_state(): 'plain', 'paged' or 'prefix'), got {type(given.cache).__name__}"
            )
        visibility, positions = super()._prepare(x, given)
        check_block_visibility(visibility)
        if visibility.allowed is not None and visibility.k_pos is not None:
            row_positions(visibility, x.shape[0])  # the padding is checked here, before anything is written
        return visibility, positions

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The fast form: each head's query over its chosen blocks' keys alone, then the output."""
        q_pos, k_pos = row_positions(visibility, queries.shape[0])
        chosen = moba_select(queries, keys, q_pos, k_pos, block=self.block_size, top_k=self.top_k)
        dropout = self.dropout if self.training else 0.0
        context, picked = gathered_attention(
            queries, keys, values, chosen, q_pos, k_pos, block=self.block_size, scale=self.scale, dropout_p=dropout
        )
        with torch.no_grad():
            self.keys_read.add_(distinct_keys(picked).sum())
            self.queries_read.add_((q_pos >= 0).sum())
            if is_recording():  # what each head gave each key (B, H, Tq, S): the readable form's weights, equal
                vis = chosen_visibility(chosen, q_pos, k_pos, self.block_size, self.num_heads)
                _, weights = attention(queries, keys, values, visibility=vis, scale=self.scale, return_weights=True)
                record("attn_weights", weights, source=type(self).__name__)
                record_blocks(chosen=chosen, queries=queries, keys=keys, q_pos=q_pos, k_pos=k_pos, scale=self.scale,
                              source=type(self).__name__)  # fmt: skip
        return self.merge_heads(context, gate=gate)

    def readable(self, x: torch.Tensor) -> torch.Tensor:
        """The readable form of a call without a cache: every key scored, all but the chosen blocks hidden."""
        b, t, _ = x.shape
        queries, keys, values = self.split_qkv(x)
        positions = torch.arange(t, device=x.device)
        if self.rotary is not None:
            cos, sin = self.rotary(positions, dtype=queries.dtype)
            queries, keys = apply_rotary(queries, cos, sin), apply_rotary(keys, cos, sin)
        pos = positions.expand(b, t)
        chosen = moba_select(queries, keys, pos, pos, block=self.block_size, top_k=self.top_k)
        vis = chosen_visibility(chosen, pos, pos, self.block_size, self.num_heads)
        context = attention(queries, keys, values, visibility=vis, scale=self.scale, backend="eager")
        return self.merge_heads(context, gate=self.gate_for(x))

    def reset_meter(self) -> None:
        """Zero ``keys_read`` and ``queries_read``."""
        self.keys_read.zero_()
        self.queries_read.zero_()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}, top_k={self.top_k}"
