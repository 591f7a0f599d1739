"""``IndexedAttention``: DeepSeek Sparse Attention (DSA; DeepSeek-V3.2, GLM-5): latent attention whose queries each
read only the ``index_topk`` keys a lightning indexer chose.

The indexer (:class:`LightningIndexer`) has its own small heads: queries from the query latent
q_lat = q_a_layernorm(q_a_proj(x)) (``wq_b``: Hi heads of Di), one key a token from x (``wk``, then a LayerNorm),
and a weight per head from x (``weights_proj``, times Hi^-0.5). The first qk_rope_head_dim values of its queries
and keys turn with RoPE at the layer's angles: in the rotate-half layout (DeepSeek-V3.2) or on interleaved pairs
(GLM-5, ``index_rope_interleave``). Each query's score of each key it may see is
sum_j w_j * ReLU(q_j . k * Di^-0.5) (``attnlab.functional.selection.index_scores``); the main attention reads the
top ``index_topk`` (``top_k``), the selection expressed as a Visibility:

    readable:  the expanded MLA form over every key, all but the chosen hidden (what transformers computes)
    fast:      the absorbed form over each query's chosen latents alone, gathered by the selection's indices

tested equal. The fast form runs in ``forward``; ``keys_read`` counts the keys its gathers read (from the gathered
positions), ``queries_read`` the queries that read them.

Its state (``layer_state``: kind "indexed") is the latent and the indexer key side by side
(``attnlab.cache.indexed``), so a cache crops, pages and shares both together.

Shapes: B = batch, T = tokens, S = key slots, H = heads, R = kv_lora_rank, P = qk_rope_head_dim, Hi / Di =
indexer heads / head size, K = keys chosen a query.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.indexed import index_width
from attnlab.functional.attention import attention
from attnlab.functional.eager import head_weights
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.rotary import apply_rotary
from attnlab.functional.selection import (
    Selection,
    check_selectable,
    chosen_scores,
    gather_keys,
    gathered,
    index_scores,
    indexer_loss,
    keys_read,
    per_batch,
    per_query,
    restricted,
    top_k,
)
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import ForwardArgs, SharedKV
from attnlab.nn.index_loss import TrainsIndexer
from attnlab.nn.latent import LatentAttention
from attnlab.nn.selection_record import record_selection
from attnlab.observe import is_recording


class LightningIndexer(nn.Module):
    """The indexer's weights, under transformers' names (``indexer.wq_b``, ``wk``, ``k_norm``, ``weights_proj``)."""

    def __init__(self, *, d_in: int, q_lora_rank: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.wq_b = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_in, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_in, num_heads, bias=False)


class IndexedAttention(TrainsIndexer, LatentAttention):
    """Latent attention with DSA's top-k selection; ``LatentAttention``'s arguments and:

    Args:
        index_topk: keys each query reads (at least 1); a query that may see fewer reads those.
        index_heads, index_head_dim: the indexer's heads and their size (at least qk_rope_head_dim: RoPE turns
            the first qk_rope_head_dim values).
        index_rope_interleave: the indexer's RoPE on interleaved pairs (GLM-5) or rotate-half (DeepSeek-V3.2).
    """

    def __init__(
        self,
        *,
        index_topk: int,
        index_heads: int,
        index_head_dim: int,
        index_rope_interleave: bool = False,
        **latent: Any,
    ) -> None:
        check_positive_int("index_topk", index_topk, limit=2**31)
        check_positive_int("index_heads", index_heads, limit=2**12)
        check_positive_int("index_head_dim", index_head_dim, limit=2**16)
        if latent.get("q_lora_rank") is None:
            raise ValueError("the indexer's queries come from the query latent: set q_lora_rank (DSA has one)")
        if index_head_dim < latent.get("qk_rope_head_dim", 0):
            raise ValueError(
                f"the indexer turns its first qk_rope_head_dim={latent['qk_rope_head_dim']} values with RoPE: "
                f"index_head_dim={index_head_dim} must be at least that"
            )
        if not isinstance(index_rope_interleave, bool):
            raise TypeError(f"index_rope_interleave must be a bool, got {index_rope_interleave!r}")
        super().__init__(**latent)
        self.index_topk, self.index_rope_interleave = index_topk, index_rope_interleave
        self.indexer = LightningIndexer(
            d_in=self.d_in, q_lora_rank=latent["q_lora_rank"], num_heads=index_heads, head_dim=index_head_dim
        )
        self.register_buffer("keys_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("queries_read", torch.zeros((), dtype=torch.long), persistent=False)
        self.keys_read: torch.Tensor
        self.queries_read: torch.Tensor
        self.chosen: Selection | None = None  # the last call's choice, which GLM-5's shared layers read

    def layer_state(self) -> LayerState:
        """The latent [c, k_pe] and the indexer's key a token (``attnlab.cache.indexed``): 'plain', 'paged' or
        'prefix'; the caches that cannot hold indexer keys are refused by name (``ModelCache.build``)."""
        return LayerState(
            kind="indexed",
            kv_heads=1,
            head_dim=self.kv_lora_rank + self.qk_rope_head_dim,
            value_dim=self.kv_lora_rank,
            index_dim=self.indexer.head_dim,
            window=self.window,
            rotary=self.rotary,
            dtype=self.dtype,
            device=self.device,
        )

    # ---- the indexer ----

    def _turn_index(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the first P values of the indexer's (B, heads, T, Di), interleaved pairs de-interleaved first."""
        if self.rotary is None:
            return x
        p = self.qk_rope_head_dim
        if self.index_rope_interleave:  # pairs (2i, 2i+1) as (i, i + P/2): the same angles, dot products kept
            x = torch.cat((x[..., 0:p:2], x[..., 1:p:2], x[..., p:]), dim=-1)  # (B, heads, T, Di)
        cos, sin = self.rotary(positions, dtype=x.dtype)
        return apply_rotary(x, cos, sin)  # partial: the first P turn

    def index_queries(self, q_latent: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The indexer's queries (B, T, Hi, Di) from the query latent (B, T, q_lora_rank)."""
        b, t, _ = q_latent.shape
        heads = self.indexer.wq_b(q_latent).view(b, t, self.indexer.num_heads, -1).transpose(1, 2)  # (B, Hi, T, Di)
        return self._turn_index(heads, positions).transpose(1, 2)  # (B, T, Hi, Di)

    def index_keys(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The indexer's keys (B, T, Di), one head for all."""
        keys = self.indexer.k_norm(self.indexer.wk(x))  # (B, T, Di)
        return self._turn_index(keys[:, None], positions)[:, 0]  # (B, 1, T, Di) -> (B, T, Di)

    def index_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Each query's weight per indexer head (B, T, Hi) in float32, times Hi^-0.5."""
        proj = self.indexer.weights_proj
        return proj(x.to(proj.weight.dtype)).float() * self.indexer.num_heads**-0.5

    def scores(
        self, x: torch.Tensor, q_latent: torch.Tensor, index_keys: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The indexer's score of every (query, key slot): (B, T, S), float32."""
        queries = self.index_queries(q_latent, positions)
        return index_scores(queries, index_keys, self.index_weights(x), scale=self.indexer.head_dim**-0.5)

    def select(
        self,
        x: torch.Tensor,
        q_latent: torch.Tensor,
        index_keys: torch.Tensor,
        positions: torch.Tensor,
        vis: Visibility,
    ) -> Selection:
        """The top ``index_topk`` slots of every query, among those ``vis`` (bound to the slots) lets it see."""
        return top_k(self.scores(x, q_latent, index_keys, positions), vis, self.index_topk)

    # ---- the two forms ----

    def readable(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, selection: Selection, vis: Visibility
    ) -> torch.Tensor:
        """Every key, all but the chosen hidden: the expanded form under the restricted Visibility."""
        return self.expanded(q_nope, q_pe, latents, visibility=restricted(vis, selection))

    def attended(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, selection: Selection, vis: Visibility
    ) -> torch.Tensor:
        """The main attention's weight on each chosen key, summed over its heads: (B, T, K), no gradient (what the
        indexer's loss aims at, ``attnlab.nn.index_loss``)."""
        b, heads = q_nope.shape[0], q_nope.shape[1]
        assert self.scale is not None  # a latent layer always has its scale
        w_uk, _ = self._w()
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope.detach(), w_uk.detach())  # (B, H, T, R)
        queries = per_query(torch.cat((q_latent, q_pe.detach()), dim=-1))  # (B * T, H, 1, R + P)
        keys = gather_keys(latents.detach(), selection)  # (B * T, 1, K, R + P)
        weights = head_weights(queries, keys, gathered(vis, selection), scale=self.scale, heads=range(heads))
        return weights.sum(dim=1).view(b, -1, weights.shape[-1])  # (B * T, H, 1, K) -> (B, T, K)

    def gathered(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, selection: Selection, vis: Visibility
    ) -> torch.Tensor:
        """Each query over its chosen latents alone (B * T rows of one query), in the absorbed form."""
        b, r = q_nope.shape[0], self.kv_lora_rank
        w_uk, w_uv = self._w()
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, T, R)
        queries = per_query(torch.cat((q_latent, q_pe), dim=-1))  # (B * T, H, 1, R + P)
        rows = gathered(vis, selection)
        keys = gather_keys(latents, selection)  # (B * T, 1, K, R + P)
        if is_recording():  # the choice and the dense weights, for the views (attnlab.nn.selection_record)
            full, read = torch.cat((q_latent, q_pe), dim=-1), selection.indices  # (B, H, T, R + P), (B, T, K)
            record_selection(read=read, chosen=read, queries=full, keys=latents, dense=vis, scale=self.scale,
                             source="IndexedAttention")  # fmt: skip
        context = attention(queries, keys, keys[..., :r], visibility=rows, scale=self.scale, backend=self.backend)
        with torch.no_grad():
            self.keys_read.add_(keys_read(rows))
            self.queries_read.add_((rows.q_pos >= 0).sum())
        context = per_batch(context, b)  # (B, H, T, R)
        return self.merge_heads(torch.einsum("bhtr,hvr->bhtv", context, w_uv))  # (B, H, T, V) -> (B, T, E)

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
        """As :meth:`LatentAttention.forward`, each query over its chosen keys (the fast form); a cache must hold
        the indexer's keys (``layer_state()``'s), refused before anything is written."""
        if shared is not None:
            raise ValueError("an indexed layer keeps its own latents; KV sharing (shared=) is for softmax layers")
        given = ForwardArgs(mask, positions, cache, document_ids, mask_mod, score_mod, visibility)
        visibility, positions = self._prepare(x, given)  # everything checked: nothing is written before this
        check_selectable(visibility)
        width = None if cache is None else index_width(cache)
        if cache is not None and width != self.indexer.head_dim:
            raise TypeError(
                f"an indexed layer keeps its indexer keys ({self.indexer.head_dim} values a token) beside each latent: "
                "an IndexedCache or PagedIndexedCache (ModelCache.build from its layer_state()), got "
                f"{type(cache).__name__}" + ("" if width is None else f" holding {width}")
            )
        q_latent = self.query_latent(x)
        q_nope, q_pe, latents = self.project(x, positions, q_latent=q_latent)
        index_keys = self.index_keys(x.detach(), positions)  # (B, T, Di); the indexer trains apart (index_loss)
        vis = visibility
        if cache is not None:
            rows = torch.cat((latents, index_keys[:, None].to(latents.dtype)), dim=-1)  # (B, 1, T, R + P + Di)
            stored, _, key_pos = cache.update(rows, latents[..., : self.kv_lora_rank])
            width = self.kv_lora_rank + self.qk_rope_head_dim
            latents, index_keys = stored[..., :width], stored[:, 0, :, width:]  # (B, 1, S, R + P), (B, S, Di)
            vis = visibility.for_keys(key_pos)
        queries, weights = self.index_queries(q_latent.detach(), positions), self.index_weights(x.detach())
        scale = self.indexer.head_dim**-0.5
        with torch.no_grad():  # every slot scored, no graph kept: the loss scores the chosen ones again
            scores = index_scores(queries, index_keys, weights, scale=scale)  # (B, T, S)
        selection = self.chosen = top_k(scores, vis, self.index_topk)
        out = self.gathered(q_nope, q_pe, latents, selection, vis)
        self.index_loss = None  # a call's loss, or none: never an earlier call's
        if self.keeps_index_loss():
            picked = chosen_scores(queries, index_keys, weights, selection, scale=scale)  # (B, T, K)
            self.index_loss = indexer_loss(picked, self.attended(q_nope, q_pe, latents, selection, vis), selection)
        return out

    def reset_meter(self) -> None:
        """Zero ``keys_read`` and ``queries_read``."""
        self.keys_read.zero_()
        self.queries_read.zero_()

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, index_topk={self.index_topk}, index_heads={self.indexer.num_heads}, "
            f"index_head_dim={self.indexer.head_dim}, index_rope_interleave={self.index_rope_interleave}"
        )
