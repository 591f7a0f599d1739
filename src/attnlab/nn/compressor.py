"""The weights of DeepSeek-V4's compressors (``attnlab.nn.compressed``): the pooling of each block of tokens into
one entry, and the compressed-sparse layer's lightning indexer, under transformers' names.

Shapes: B = batch, n = entries, m = block, C = D (no overlap) or 2D (overlap), D = an entry's width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.functional.compression import compress, compress_readable, entry_positions, turn_pairs


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
