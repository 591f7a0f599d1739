"""The weights of DeepSeek-V4's compressors (``attnlab.nn.compressed``): the pooling of each block of tokens into
one entry, and the compressed-sparse layer's lightning indexer, under transformers' names.

Shapes: B = batch, n = entries, m = block, C = D (no overlap) or 2D (overlap), D = an entry's width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.functional.compression import check_block, compress, compress_readable, entry_positions, turn_pairs
from attnlab.functional.selection import Selection, chosen_scores, index_scores, indexer_loss


class Compressor(nn.Module):
    """Values and gate logits a token (``kv_proj``, ``gate_proj``: C = 2D with ``overlap``), a bias a place in the
    block (``position_bias``), and the entries' RMSNorm (``kv_norm``)."""

    def __init__(self, *, d_in: int, width: int, block: int, overlap: bool, eps: float) -> None:
        super().__init__()
        c = 2 * width if overlap else width
        self.width, self.block, self.overlap = width, block, overlap
        self.kv_proj = nn.Linear(d_in, c, bias=False)
        self.gate_proj = nn.Linear(d_in, c, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(block, c))
        self.kv_norm = nn.RMSNorm(width, eps=eps)

    def entries(
        self, rows: torch.Tensor, first: int, inv_freq: torch.Tensor, *, readable: bool = False
    ) -> torch.Tensor:
        """Entries of the span's whole blocks (rows (B, n * m + rest, 2C): values then gates, from block ``first``'s
        first token, that block with nothing before it), normed and turned at their blocks' first positions."""
        c = rows.shape[-1] // 2
        pool = compress_readable if readable else compress
        pooled = pool(rows[..., :c], rows[..., c:], self.position_bias, block=self.block, overlap=self.overlap)
        normed = self.kv_norm(pooled.float()).to(rows.dtype)  # (B, n, D)
        return turn_pairs(normed, entry_positions(first, normed.shape[1], self.block, rows.device), inv_freq)


class Indexer(nn.Module):
    """The compressed-sparse layer's lightning indexer: a compressor of its own at Di, queries from the query latent
    (``q_b_proj``: Hi heads of Di) and a weight a head (``weights_proj``, times Hi^-0.5)."""

    def __init__(self, *, d_in: int, q_lora_rank: int, heads: int, head_dim: int, block: int, eps: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.compressor = Compressor(d_in=d_in, width=head_dim, block=block, overlap=True, eps=eps)
        self.q_b_proj = nn.Linear(q_lora_rank, heads * head_dim, bias=False)
        self.weights_proj = nn.Linear(d_in, heads, bias=False)

    def inputs(
        self, x: torch.Tensor, q_latent: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Its queries (B, T, Hi, Di), turned at ``positions``, and its weights (B, T, Hi), from detached inputs: the
        indexer trains by its own loss alone (``attnlab.nn.index_loss``)."""
        b, t, _ = x.shape
        heads = self.q_b_proj(q_latent.detach()).view(b, t, self.heads, -1)  # (B, T, Hi, Di)
        queries = turn_pairs(heads.transpose(1, 2), positions, inv_freq).transpose(1, 2)  # (B, T, Hi, Di)
        return queries, self.weights_proj(x.detach()).float() * self.heads**-0.5

    def scores(
        self, x: torch.Tensor, q_latent: torch.Tensor, index: torch.Tensor, positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Its score of every (query, entry) of ``index`` (B, n, Di): (B, T, n), float32."""
        queries, weights = self.inputs(x, q_latent, positions, inv_freq)
        return index_scores(queries, index, weights, scale=self.head_dim**-0.5)

    def loss(
        self, x: torch.Tensor, q_latent: torch.Tensor, index: torch.Tensor, positions: torch.Tensor,
        inv_freq: torch.Tensor, chosen: Selection, attended: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Its loss on the ``chosen`` entries, against the main attention's weights there (B, T, K)."""
        queries, weights = self.inputs(x, q_latent, positions, inv_freq)
        picked = chosen_scores(queries, index, weights, chosen, scale=self.head_dim**-0.5)  # (B, T, K)
        return indexer_loss(picked, attended, chosen)


def check_shape(
    *,
    d_model: int,
    num_heads: int,
    head_dim: int,
    rope_dim: int,
    q_lora_rank: int,
    window: int,
    compress_block: int,
    index_topk: int | None,
    index_head_dim: int,
    o_groups: int,
) -> None:
    """Refuse a compressed layer's shape that cannot be built (``CompressedAttention``'s arguments), by name."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
        check_positive_int(name, value, limit=2**16)
    for name, value in (("rope_dim", rope_dim), ("q_lora_rank", q_lora_rank), ("window", window)):
        check_positive_int(name, value, limit=2**27)
    check_positive_int("o_groups", o_groups, limit=2**12)
    check_block(compress_block)
    if rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(
            f"rope_dim={rope_dim} turns pairs of a head's last channels: even, at most head_dim={head_dim}"
        )
    if num_heads % o_groups:
        raise ValueError(
            f"o_groups={o_groups} splits the heads into equal groups: it must divide num_heads={num_heads}"
        )
    if index_topk is not None:
        check_positive_int("index_topk", index_topk, limit=2**31)
        check_positive_int("index_head_dim", index_head_dim, limit=2**16)
        if index_head_dim < rope_dim:
            raise ValueError(f"index_head_dim={index_head_dim} turns its last rope_dim={rope_dim}: at least that")
