"""The state of an indexed layer (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5): MLA's latent and the lightning
indexer's key, side by side in one row a token.

An indexed layer attends like latent attention (``attnlab.nn.latent``: [c, k_pe] once per token for every head)
and chooses which keys each query reads with an indexer whose keys, ``index_dim`` values a token, are kept too:
the indexer scores every earlier token, so its keys must outlive the call that made them. Both are written at
the same slot, in one row [c, k_pe | k_index] of kv_lora_rank + rope_dim + index_dim values, so whatever keeps,
pages, shares or crops a latent keeps, pages, shares or crops its indexer key with it: going back to an earlier
token is the latent cache's own crop (its length), and paged rows and prefix blocks hold both halves.

Bytes per token and layer: (R + P + Di) x the element size (DeepSeek-V3.2 in bfloat16: (512 + 64 + 128) x 2 =
1,408, against MLA's 1,152).

Shapes: B = batch, S = capacity, R = kv_lora_rank, P = rope_dim, Di = index_dim.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.latent import LatentCache
from attnlab.cache.paged import PagedLatentCache, PagedRows


class IndexedCache(LatentCache):
    """A :class:`LatentCache` whose rows are [c, k_pe | k_index] (B, 1, S, R + P + Di); ``update`` takes the whole
    rows as keys and their first R columns as values, and returns the rows, their first R columns and positions."""

    def __init__(
        self,
        *,
        batch_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        index_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("index_dim", index_dim, limit=2**16)
        check_positive_int("rope_dim", rope_dim, limit=2**16)
        super().__init__(
            batch_size=batch_size,
            kv_lora_rank=kv_lora_rank,
            rope_dim=rope_dim + index_dim,  # the row's width past c: k_pe, then the indexer's key
            max_len=max_len,
            dtype=dtype,
            device=device,
        )
        self.rope_dim, self.index_dim = rope_dim, index_dim


class PagedIndexedCache(PagedLatentCache):
    """The same rows in paged blocks (``paged`` and ``prefix`` on an indexed layer): a row's latent and indexer key
    live in one block slot, so a block a prefix tree shares holds both."""

    def __init__(self, *, kv_lora_rank: int, rope_dim: int, index_dim: int, **pool: Any) -> None:
        check_positive_int("index_dim", index_dim, limit=2**16)
        super().__init__(kv_lora_rank=kv_lora_rank, rope_dim=rope_dim + index_dim, **pool)
        self.rope_dim, self.index_dim = rope_dim, index_dim


def index_width(cache: object) -> int | None:
    """The indexer keys' width a cache keeps beside each latent (an indexed cache, whole or some of its paged
    rows), or None for a cache that keeps none."""
    held = cache.cache if isinstance(cache, PagedRows) else cache  # some rows of a paged cache, or one whole
    return held.index_dim if isinstance(held, (IndexedCache, PagedIndexedCache)) else None
