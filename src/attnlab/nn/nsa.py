"""``NSAAttention``: Native Sparse Attention (Yuan et al. 2025): three branches per query, mixed by gates.

Each head's query reads (``attnlab.functional.nsa``):

* compressed: one entry per block of ``compress_block`` keys (and values), a block every ``stride`` tokens,
  visible once its block has closed; here a learned linear map over the block after a learned intra-block
  position embedding, initialised to mean-pooling (``functional.nsa.compress``);
* selected: the ``select_n`` blocks of ``select_block`` tokens its GQA group's compressed weights score highest,
  with the first block and the two local ones always among them (``functional.nsa.nsa_select``);
* sliding: its last ``slide`` tokens, through attnlab's windowed attention.

Each branch has keys and values of its own (a token's key row is [compressed | selected | sliding], each
``head_dim`` wide), and the outputs are mixed per head by sigmoid gates from the input:
o = g_cmp * o_cmp + g_slc * o_slc + g_win * o_win, g = sigmoid(gate_proj(x)) (one linear map; the paper's gates
come from a small MLP and a sigmoid). The selected branch has two forms, tested equal:

    readable:  every key, all but the chosen blocks hidden (``readable=True``); the window over every key, eager
    fast:      each group's query over its chosen blocks' keys alone, gathered (``forward``)

Inside a ``Recorder`` the layer records what it gave each key as its ``attn_weights`` (:meth:`weights_map`).
``keys_read`` counts the keys each query's three branches drew on, a key counted once however many heads or
branches read it (``functional.nsa.nsa_keys_read``; a dense layer's meter counts so too), ``queries_read`` the
queries. The compressed entries are made again from every closed block's keys at each call (below), so a query
past the first closed block draws on every key before its latest entry: in this form NSA reads about as many
keys as dense attention, and its saving is in the scores (entries, blocks and a window, not every key).

Its state (kind "blocks") is every position's three key and value rows, in the caches that keep each row's keys at
consecutive slots (``attnlab.cache.plan``); the compressed entries are computed again from those keys at each
call (a decode step compresses every closed block again), so no cache holds them apart.

Shapes: B = batch, H = heads, Hk = key heads, T = tokens, S = key slots, D = head size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from attnlab.cache import Cache, LayerState
from attnlab.functional.attention import attention
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.nsa import check_nsa, compress, compressed_attention, nsa_keys_read, nsa_select
from attnlab.functional.rotary import apply_rotary
from attnlab.functional.sparse_blocks import chosen_visibility, gathered_attention
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import ForwardArgs, SharedKV
from attnlab.nn.moba import MoBAAttention, row_positions
from attnlab.nn.selection_record import record_blocks
from attnlab.observe import is_recording, record

BRANCHES = ("compressed", "selected", "sliding")


class NSAAttention(MoBAAttention):
    """Native Sparse Attention over ``Attention``'s projections widened to three key and value rows a head.

    Args:
        compress_block, stride: the compressed branch's block and the tokens between block starts (``stride``
            divides ``compress_block``).
        select_block, select_n: the selected branch's block (``stride`` divides it) and blocks read a query
            (at least 3: the first and two local ones among them; at most the blocks of ``context_length``).
        slide: the sliding branch's window.
        context_length: the longest context the layer serves.
        attention: ``Attention``'s arguments (no window, sinks or keys shared with another layer).
    """

    def __init__(
        self,
        *,
        compress_block: int,
        stride: int,
        select_block: int,
        select_n: int,
        slide: int,
        context_length: int,
        **attention: Any,
    ) -> None:
        check_nsa(
            compress_block=compress_block,
            stride=stride,
            select_block=select_block,
            select_n=select_n,
            window=slide,
            context=context_length,
        )
        super().__init__(block_size=select_block, top_k=select_n, context_length=context_length, **attention)
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.value_dim != d or self.keys_as_values or self.gate is not None:
            raise ValueError("NSA's three key and value rows are head_dim wide each, without an output gate")
        self.compress_block, self.stride, self.slide = compress_block, stride, slide
        self.rows = (h * d, 3 * hk * d, 3 * hk * d)
        self.qkv = nn.Linear(self.d_in, sum(self.rows), bias=self.qkv.bias is not None)
        mean = torch.eye(d).expand(compress_block, d, d) / compress_block  # (l, D, D): a fresh layer mean-pools
        self.compress_k, self.compress_v = nn.Parameter(mean.clone()), nn.Parameter(mean.clone())
        self.compress_k_pos = nn.Parameter(torch.zeros(compress_block, d))  # intra-block position, added first
        self.compress_v_pos = nn.Parameter(torch.zeros(compress_block, d))
        self.gate_proj = nn.Linear(self.d_in, 3 * h)  # each head's three gates, sigmoid(gate_proj(x))

    def layer_state(self) -> LayerState:
        """Every position's three key and value rows (3 * head_dim a head): kind "blocks"."""
        return LayerState(
            kind="blocks",
            kv_heads=self.num_kv_heads,
            head_dim=3 * self.head_dim,
            rotary=self.rotary,
            dtype=self.dtype,
            device=self.device,
        )

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries (B, H, T, D) and the three branches' keys and values side by side (B, Hk, T, 3D), turned."""
        b, t, _ = x.shape
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split(self.rows, dim=-1)  # (B, T, H*D), (B, T, 3*Hk*D) twice
        queries = q.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
        keys = k.view(b, t, 3 * hk, d).transpose(1, 2)  # (B, 3 Hk, T, D): each head's three rows in turn
        if self.rotary is not None:
            cos, sin = self.rotary(positions, dtype=queries.dtype)
            queries, keys = apply_rotary(queries, cos, sin), apply_rotary(keys, cos, sin)
        keys = keys.transpose(1, 2).reshape(b, t, hk, 3 * d).transpose(1, 2)  # (B, Hk, T, 3D)
        values = v.view(b, t, hk, 3 * d).transpose(1, 2)  # (B, Hk, T, 3D)
        return queries, keys, values

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
        readable: bool = False,
    ) -> torch.Tensor:
        """As ``Attention.forward``: (B, T, d_in) -> (B, T, d_in); ``readable``: the selected branch's readable
        form, and the window over every key, eager."""
        given = ForwardArgs(mask, positions, cache, document_ids, mask_mod, score_mod, visibility)
        visibility, positions = self._prepare(x, given)  # everything checked: nothing is written before this
        queries, keys, values = self.project(x, positions)
        if cache is not None:
            keys, values, key_pos = cache.update(keys, values)  # the only write
            visibility = visibility.for_keys(key_pos)
        outputs = self.branches(queries, keys, values, visibility, readable=readable)  # (B, H, T, D) each
        g = torch.sigmoid(self.gate_proj(x)).view(*x.shape[:2], self.num_heads, 3).permute(3, 0, 2, 1)[..., None]
        if is_recording():
            with torch.no_grad():
                record("attn_weights", self.weights_map(queries, keys, values, visibility, g), source="NSAAttention")
        return self.merge_heads(g[0] * outputs[0] + g[1] * outputs[1] + g[2] * outputs[2])  # g: (3, B, H, T, 1)

    def branches(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, vis: Visibility, *, readable: bool = False
    ) -> list[torch.Tensor]:
        """The three branches' contexts (B, H, T, D): compressed, selected, sliding."""
        d, scale = self.head_dim, self.scale if self.scale is not None else self.head_dim**-0.5
        q_pos, k_pos = row_positions(vis, q.shape[0])
        k_cmp, k_slc, k_win = keys.split(d, dim=-1)  # (B, Hk, S, D) each
        v_cmp, v_slc, v_win = values.split(d, dim=-1)
        entry_k, ends = compress(k_cmp, k_pos, self.compress_k, self.compress_k_pos, block=self.compress_block, stride=self.stride)  # fmt: skip
        entry_v, _ = compress(v_cmp, k_pos, self.compress_v, self.compress_v_pos, block=self.compress_block, stride=self.stride)  # fmt: skip
        o_cmp, weights = compressed_attention(q, entry_k, entry_v, ends, q_pos, scale)
        chosen = nsa_select(
            weights,
            q_pos,
            keys.shape[2],
            kv_heads=self.num_kv_heads,
            compress_block=self.compress_block,
            stride=self.stride,
            select_block=self.block_size,
            select_n=self.top_k,
        )
        dropout = self.dropout if self.training else 0.0
        window = Visibility(q_pos=q_pos, k_pos=k_pos, window=self.slide)
        if readable:
            vis_slc = chosen_visibility(chosen, q_pos, k_pos, self.block_size, self.num_heads)
            o_slc = attention(q, k_slc, v_slc, visibility=vis_slc, scale=scale, backend="eager")
            o_win = attention(q, k_win, v_win, visibility=window, scale=scale, backend="eager")
            return [o_cmp, o_slc, o_win]
        o_slc, picked = gathered_attention(
            q, k_slc, v_slc, chosen, q_pos, k_pos, block=self.block_size, scale=scale, dropout_p=dropout
        )
        o_win = attention(q, k_win, v_win, visibility=window, scale=scale, dropout_p=dropout, backend=self.backend)
        with torch.no_grad():
            self.keys_read.add_(nsa_keys_read(picked, ends, q_pos, window=self.slide).sum())
            self.queries_read.add_((q_pos >= 0).sum())
            if is_recording():  # the selected branch's choice; the window and the entries it reads besides
                near = window._structure(q_pos[:, :, None], k_pos[:, None, :])  # (B, T, S): Visibility's one predicate
                record_blocks(chosen=chosen, queries=q, keys=k_slc, q_pos=q_pos, k_pos=k_pos, scale=scale,
                              source="NSAAttention", also={"window_slots": near, "entry_ends": ends})  # fmt: skip
        return [o_cmp, o_slc, o_win]

    def weights_map(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, vis: Visibility, g: torch.Tensor
    ) -> torch.Tensor:
        """What the layer gave each key, (B, H, Tq, S): each branch's weights times its gate, over the sum of the
        gates of the branches that read something (rows sum to 1); a compressed entry's weight spread evenly over
        its block's tokens (what a Recorder keeps)."""
        d, scale = self.head_dim, self.scale if self.scale is not None else self.head_dim**-0.5
        q_pos, k_pos = row_positions(vis, q.shape[0])
        entry_k, ends = compress(keys[..., :d], k_pos, self.compress_k, self.compress_k_pos, block=self.compress_block, stride=self.stride)  # fmt: skip
        entry_v, _ = compress(values[..., :d], k_pos, self.compress_v, self.compress_v_pos, block=self.compress_block, stride=self.stride)  # fmt: skip
        _, w_cmp = compressed_attention(q, entry_k, entry_v, ends, q_pos, scale)  # (B, H, Tq, C)
        starts = torch.arange(w_cmp.shape[-1], device=q.device)[:, None] * self.stride  # (C, 1)
        covers = (k_pos[:, None, :] >= starts) & (k_pos[:, None, :] < starts + self.compress_block)  # (B, C, S)
        spread = torch.einsum("bhtc,bcs->bhts", w_cmp, covers.to(w_cmp.dtype)) / self.compress_block
        chosen = nsa_select(
            w_cmp,
            q_pos,
            keys.shape[2],
            kv_heads=self.num_kv_heads,
            compress_block=self.compress_block,
            stride=self.stride,
            select_block=self.block_size,
            select_n=self.top_k,
        )
        vis_slc = chosen_visibility(chosen, q_pos, k_pos, self.block_size, self.num_heads)
        _, w_slc = attention(q, keys[..., d : 2 * d], values[..., d : 2 * d], visibility=vis_slc, scale=scale, return_weights=True)  # fmt: skip
        window = Visibility(q_pos=q_pos, k_pos=k_pos, window=self.slide)
        _, w_win = attention(q, keys[..., 2 * d :], values[..., 2 * d :], visibility=window, scale=scale, return_weights=True)  # fmt: skip
        read = (w_cmp.sum(-1, keepdim=True) > 0).to(g.dtype)  # (B, H, Tq, 1): 0 before the first block closes
        return (g[0] * spread + g[1] * w_slc + g[2] * w_win) / (g[0] * read + g[1] + g[2])

    def readable(self, x: torch.Tensor) -> torch.Tensor:
        """The readable form of a call without a cache."""
        return self.forward(x, readable=True)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, compress_block={self.compress_block}, stride={self.stride}, slide={self.slide}"
