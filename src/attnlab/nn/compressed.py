"""``CompressedAttention``: DeepSeek-V4's compressed-sparse (CSA) and heavily compressed (HCA) attention layers.

Every V4 attention layer reads a sliding window of its own tokens, with a learned sink per head (gpt-oss's), and
one key-value head (K = V: a token's normed, turned projection is both). A compressed layer also reads *entries*:
each block of ``compress_block`` tokens pooled into one (``attnlab.functional.compression``), visible once its
block has closed. Two kinds, by ``index_topk``:

* compressed-sparse (``index_topk`` an int; V4's m = 4): overlapping blocks, and a lightning indexer of its own
  (its own compressor at ``index_head_dim``, queries from the query latent) scores the closed entries
  (``attnlab.functional.selection.index_scores``); each query reads its top ``index_topk`` (``top_k``);
* heavily compressed (``index_topk=None``; V4's m = 128): blocks that do not overlap, every closed entry read.

Queries come from a query latent (q_a_proj, an RMSNorm, q_b_proj, then an RMSNorm per head without weights); the
trailing ``rope_dim`` channels of queries, keys and entries turn on interleaved pairs (``turn_pairs``), and the
output turns back at the query's position before the grouped output projection (``o_groups`` groups of heads,
each to ``o_lora_rank``, then ``o_b_proj``). Weights carry transformers' names (``DeepseekV4Attention``).

Who may attend is one :class:`Visibility` over the keys' positions, an entry's being its block's last token:

    readable (:meth:`readable`): every token and every entry, the window, closing and the selection as a mask;
    fast (``forward``):           each query a row of its own over its window's tokens and its chosen entries,
                                  gathered by index (``attnlab.functional.selection``); tested equal.

``keys_read`` counts the entries the fast form's gathers read (from the gathered positions), ``window_read`` the
window's tokens. Its state (``layer_state``: kind "compressed") is ``attnlab.cache.compressed.CompressedCache``.

Shapes: B = batch, T = tokens, H = heads, D = head_dim, n = entries, K = entries chosen a query, W = window,
Hi / Di = indexer heads / head size, F = a token's compressor (and indexer) projections, E = d_model.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.cache.compressed import CompressedCache
from attnlab.cache.makers import LayerState
from attnlab.functional.attention import attention
from attnlab.functional.compression import closing_positions, turn_pairs
from attnlab.functional.eager import head_weights
from attnlab.functional.selection import (
    Selection,
    chosen_mask,
    gather_keys,
    gathered,
    keys_read,
    per_batch,
    per_query,
    top_k,
)
from attnlab.functional.visibility import Visibility
from attnlab.nn.compressor import Compressor, Indexer, check_shape
from attnlab.nn.index_loss import TrainsIndexer
from attnlab.nn.selection_record import record_compressed
from attnlab.observe import is_recording


class CompressedAttention(TrainsIndexer, nn.Module):
    """A V4 compressed layer (see the module's docstring). Keyword-only:

    Args:
        d_model, num_heads, head_dim, rope_dim (the trailing channels that turn), q_lora_rank.
        window: the sliding window every V4 layer reads (the query's own token included).
        compress_block: m, the tokens pooled into one entry (at least 2).
        index_topk: entries each query reads (compressed-sparse), or None: all of them (heavily compressed).
        index_heads, index_head_dim: the indexer's (compressed-sparse only).
        o_groups, o_lora_rank: the grouped output projection (o_groups divides num_heads).
        rope_theta: the base of the layer's RoPE; eps: its RMSNorms'.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        head_dim: int,
        rope_dim: int,
        q_lora_rank: int,
        window: int,
        compress_block: int,
        index_topk: int | None,
        index_heads: int = 1,
        index_head_dim: int = 0,
        o_groups: int = 1,
        o_lora_rank: int = 0,
        rope_theta: float = 10000.0,
        eps: float = 1e-6,
    ) -> None:
        check_shape(d_model=d_model, num_heads=num_heads, head_dim=head_dim, rope_dim=rope_dim, q_lora_rank=q_lora_rank,
                    window=window, compress_block=compress_block, index_topk=index_topk,
                    index_head_dim=index_head_dim, o_groups=o_groups)  # fmt: skip
        super().__init__()
        self.num_heads, self.head_dim, self.rope_dim, self.window = num_heads, head_dim, rope_dim, window
        self.compress_block, self.index_topk, self.o_groups = compress_block, index_topk, o_groups
        lora = o_lora_rank or d_model
        self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
        self.q_a_norm = nn.RMSNorm(q_lora_rank, eps=eps)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(d_model, head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(head_dim, eps=eps)
        self.o_a_proj = nn.Linear(num_heads * head_dim // o_groups, o_groups * lora, bias=False)  # g blocks
        self.o_b_proj = nn.Linear(o_groups * lora, d_model, bias=False)
        self.sinks = nn.Parameter(torch.zeros(num_heads))
        sparse = index_topk is not None
        self.compressor = Compressor(d_in=d_model, width=head_dim, block=compress_block, overlap=sparse, eps=eps)
        self.indexer = (
            Indexer(d_in=d_model, q_lora_rank=q_lora_rank, heads=index_heads, head_dim=index_head_dim,
                    block=compress_block, eps=eps)
            if sparse else None
        )  # fmt: skip
        self.eps = eps
        inv_freq = rope_theta ** (-torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("keys_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("window_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.inv_freq: torch.Tensor
        self.keys_read: torch.Tensor
        self.window_read: torch.Tensor

    def row_width(self) -> int:
        """F: what a token leaves for the compressors, values and gates (and the indexer's)."""
        widths = [self.compressor.kv_proj.out_features]
        if self.indexer is not None:
            widths.append(self.indexer.compressor.kv_proj.out_features)
        return 2 * sum(widths)

    def layer_state(self) -> LayerState:
        """The window's tokens, the closed entries (and the indexer's), the last tokens' projections."""
        w = self.q_a_proj.weight
        return LayerState(
            kind="compressed",
            kv_heads=1,
            head_dim=self.head_dim,
            window=self.window,
            index_dim=None if self.indexer is None else self.indexer.head_dim,
            block=self.compress_block,
            row_width=self.row_width(),
            dtype=w.dtype,
            device=w.device,
        )

    # ---- what every form shares ----

    def _project(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, D), keys (B, 1, T, D), the query latent (B, T, q_lora_rank) and the rows (B, T, F)."""
        b, t, _ = x.shape
        q_latent = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        q = q * torch.rsqrt(q.float().square().mean(-1, keepdim=True) + self.eps).to(q.dtype)
        keys = turn_pairs(self.kv_norm(self.kv_proj(x)), positions, self.inv_freq)[:, None]  # (B, 1, T, D)
        parts = [self.compressor.kv_proj(x), self.compressor.gate_proj(x)]
        if self.indexer is not None:
            xi = x.detach()  # the indexer trains apart, by its own loss (attnlab.nn.index_loss)
            parts += [self.indexer.compressor.kv_proj(xi), self.indexer.compressor.gate_proj(xi)]
        return turn_pairs(q, positions, self.inv_freq), keys, q_latent, torch.cat(parts, dim=-1)

    def _entries(self, rows: torch.Tensor, first: int, readable: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The compressor's and the indexer's entries of the span's whole blocks, from block ``first``."""
        c = 2 * self.compressor.kv_proj.out_features
        entries = self.compressor.entries(rows[..., :c], first, self.inv_freq, readable=readable)
        if self.indexer is None:
            return entries, None
        return entries, self.indexer.compressor.entries(rows[..., c:], first, self.inv_freq, readable=readable)

    def scores(
        self, x: torch.Tensor, q_latent: torch.Tensor, index: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The indexer's score of every (query, entry): (B, T, n), float32 (closed or not)."""
        assert self.indexer is not None  # a compressed-sparse layer
        return self.indexer.scores(x, q_latent, index, positions, self.inv_freq)

    def _select(self, x: torch.Tensor, q_latent: torch.Tensor, index: torch.Tensor, vis: Visibility) -> Selection:
        """The indexer's top ``index_topk`` closed entries of each query (``vis``: over the entries' positions), every
        entry scored without a graph (the loss scores the chosen ones again)."""
        assert self.index_topk is not None  # a compressed-sparse layer
        with torch.no_grad():
            return top_k(self.scores(x, q_latent, index, vis.q_pos), vis, self.index_topk)

    def _output(self, context: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The context (B, H, T, D) turned back at the queries' positions, through the grouped projection."""
        b, _, t, _ = context.shape
        back = turn_pairs(context, positions, self.inv_freq, inverse=True).transpose(1, 2)  # (B, T, H, D)
        groups = back.reshape(b, t, self.o_groups, -1)  # (B, T, g, H * D / g)
        weight = self.o_a_proj.weight.view(self.o_groups, -1, groups.shape[-1])  # (g, d_g, H * D / g)
        return self.o_b_proj(torch.einsum("btgi,goi->btgo", groups, weight).flatten(2))  # (B, T, E)

    # ---- the two forms ----

    def readable(self, x: torch.Tensor) -> torch.Tensor:
        """Every token and entry of a whole sequence (positions 0..T-1), one block at a time, the window, the
        closing and the selection a bool mask over them: the layer as V4 writes it."""
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device)
        q, keys, q_latent, rows = self._project(x, positions)
        entries, index = self._entries(rows, 0, readable=True)
        n = entries.shape[1]
        closing = closing_positions(0, n, self.compress_block, x.device)
        near = positions[:, None] - positions[None, :] < self.window  # (T, T): the window (causal comes below)
        chosen = torch.ones(b, 1, t, n, dtype=torch.bool, device=x.device)  # heavily compressed: all entries
        if index is not None:
            chosen = chosen_mask(
                self._select(x, q_latent, index, Visibility(q_pos=positions, k_pos=closing, causal=True)), n
            )
        mask = torch.cat((near.expand(b, 1, t, t), chosen), dim=-1)  # (B, 1, T, T + n)
        vis = Visibility(q_pos=positions, k_pos=torch.cat((positions, closing)), causal=True, mask=mask)
        every = torch.cat((keys, entries[:, None]), dim=2)  # (B, 1, T + n, D)
        context = attention(
            q, every, every, visibility=vis, scale=self.head_dim**-0.5, sinks=self.sinks, backend="eager"
        )
        return self._output(context, positions)

    def forward(
        self, x: torch.Tensor, *, positions: torch.Tensor | None = None, cache: CompressedCache | None = None
    ) -> torch.Tensor:
        """The fast form: each query over its window's tokens and its chosen entries alone, gathered. Without a
        cache the tokens are one sequence from 0; with one they follow what it holds (refused, before anything is
        written, where it is not this layer's kind or cannot take them)."""
        b, t, _ = x.shape
        m = self.compress_block
        if cache is not None:
            cache.check_layer(self.layer_state(), b, t)
        held = 0 if cache is None else cache.length
        if positions is None:
            positions = torch.arange(held, held + t, device=x.device)
        q, keys, q_latent, rows = self._project(x, positions)
        first = held // m  # the first entry this call closes
        start = max(0, first - 1) if self.indexer is not None else first  # overlap: the block before it too
        span = rows if cache is None else torch.cat((cache.rows_since(start * m), rows), dim=1)
        entries, index = self._entries(span, start, readable=False)
        entries, index = entries[:, first - start :], None if index is None else index[:, first - start :]
        if cache is None:
            key_pos = positions
        else:
            keys, key_pos, entries, index = cache.write(keys, rows, entries, index)
        vis_tokens = Visibility(q_pos=positions, k_pos=key_pos, window=self.window)
        slots = torch.arange(key_pos.shape[-1], device=x.device)
        allowed = vis_tokens.dense()[0]  # None: it hides none of the slots
        allowed = torch.ones(1, t, slots.numel(), dtype=torch.bool, device=x.device) if allowed is None else allowed
        allowed = allowed.reshape(-1, t, slots.numel()).expand(b, t, -1)  # (B|1, 1, T, S) -> (B, T, S)
        near = torch.where(allowed, slots, -1).topk(min(self.window, slots.numel()), dim=-1).values  # (B, T, W)
        rows_w = gathered(vis_tokens, Selection(near, self.window))
        picked = [gather_keys(keys, Selection(near, self.window))]  # (B * T, 1, W, D)
        assert rows_w.k_pos is not None  # gathered rows carry their keys' positions
        k_pos = [rows_w.k_pos]
        n = entries.shape[1]
        chosen: Selection | None = None
        if n:
            closing = closing_positions(0, n, m, x.device)
            vis_entries = Visibility(q_pos=positions, k_pos=closing, causal=True)
            if index is not None:
                chosen = self._select(x, q_latent, index, vis_entries)
            else:  # every closed entry
                closed = closing <= positions.reshape(-1, t, 1)  # (B|1, T, n)
                chosen = Selection(torch.where(closed, torch.arange(n, device=x.device), -1).expand(b, t, n), n)
            rows_e = gathered(vis_entries, chosen)
            picked.append(gather_keys(entries[:, None], chosen))  # (B * T, 1, K, D)
            assert rows_e.k_pos is not None
            k_pos.append(rows_e.k_pos)
            with torch.no_grad():
                self.keys_read.add_(keys_read(rows_e))
        with torch.no_grad():
            self.window_read.add_(keys_read(rows_w))
        if is_recording():  # what it read and chose, for the views (attnlab.nn.selection_record)
            record_compressed(q=q, keys=keys, key_pos=key_pos, entries=entries, window=allowed, near=near,
                              chosen=None if chosen is None else chosen.indices, selecting=index is not None,
                              positions=positions, block=m, scale=self.head_dim**-0.5, sinks=self.sinks)  # fmt: skip
        rows_vis = Visibility(q_pos=rows_w.q_pos, k_pos=torch.cat(k_pos, dim=1), causal=True)
        every = torch.cat(picked, dim=2)  # (B * T, 1, W + K, D)
        context = attention(
            per_query(q), every, every, visibility=rows_vis, scale=self.head_dim**-0.5, sinks=self.sinks
        )
        self.index_loss = None  # a call's loss, or none (no entry closed yet): never an earlier call's
        if index is not None and chosen is not None and self.keeps_index_loss():  # on the entries it read
            weights = head_weights(
                per_query(q).detach(),
                every.detach(),
                rows_vis,
                scale=self.head_dim**-0.5,
                heads=range(self.num_heads),
                sinks=self.sinks.detach(),
            )  # (B * T, H, 1, W + K)
            attended = weights[..., rows_w.tk :].sum(dim=1).view(b, t, -1)  # (B, T, K)
            assert self.indexer is not None  # index is its indexer's entries
            self.index_loss = self.indexer.loss(x, q_latent, index, positions, self.inv_freq, chosen, attended)
        return self._output(per_batch(context, b), positions)

    def reset_meter(self) -> None:
        """Zero ``keys_read`` and ``window_read``."""
        self.keys_read.zero_()
        self.window_read.zero_()

    def extra_repr(self) -> str:
        kind = "heavily compressed" if self.indexer is None else f"compressed-sparse, index_topk={self.index_topk}"
        return f"{kind}, compress_block={self.compress_block}, window={self.window}, heads={self.num_heads}"
