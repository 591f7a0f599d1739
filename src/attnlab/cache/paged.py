"""A paged KV cache: one layer's pool of fixed-size blocks, written through a block table every paging layer shares.

vLLM's design (Kwon et al., 2023). Keys and values live in a pool of
``num_blocks`` blocks of ``block_size`` tokens per layer; a sequence owns a
row of the :class:`~attnlab.cache.blocks.BlockTable`, the ids of its blocks in
order, and a length, and the table does the bookkeeping (taking, sharing,
copying on write, undoing) once for every layer.

Sequences of different lengths share one batch: each has its own positions,
and ``update`` returns them per row, (B, S), -1 for a slot that holds nothing:
all ``attnlab.Attention`` needs.

Shapes: B = batch, R = rows written, Hkv = kv heads, D = head_dim, T = new
tokens, N = blocks in the pool, P = block_size, S = slots a sequence may hold.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.cache.base import Capabilities, LayerCache
from attnlab.cache.blocks import BlockTable


class PagedKVCache(LayerCache):
    """One layer's pool of ``num_blocks`` blocks of ``block_size`` tokens, written through a :class:`BlockTable`
    (its own, or one that every paged layer of a model shares: ``attnlab.cache.ModelCache``).

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores.
        num_blocks: blocks in the pool, shared by every sequence.
        max_len: the most tokens one sequence may hold.
        block_size: tokens per block (16, as vLLM's default).
        table: the block table to write through, shared with the model's other paged layers
            (``ModelCache.build`` makes one); default, a table of its own.
        dtype, device: of the pool.
    """

    capabilities = Capabilities(rows=True, crop=True)  # row by row: ModelCache.crop_row, through the table

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        max_len: int,
        block_size: int = 16,
        table: BlockTable | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        value_dim: int | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, value_dim=value_dim
        )
        if table is None:
            table = BlockTable(
                batch_size=batch_size, num_blocks=num_blocks, max_len=max_len, block_size=block_size, device=device
            )
        elif table.shape() != (batch_size, num_blocks, block_size, -(-max_len // block_size)):
            raise ValueError(
                f"a shared block table must have this layer's shape (batch, blocks, block size, blocks per sequence) "
                f"{(batch_size, num_blocks, block_size, -(-max_len // block_size))}, got {table.shape()}"
            )
        self.table = table
        self.table.layers += 1
        # (Hkv, N, P, D): heads outermost, so that a row's gathered blocks, (Hkv, R, m, P, D) permuted to
        # (R, Hkv, m, P, D), merge m and P into one axis as a view: a decode step copies each block once
        pool = (num_kv_heads, num_blocks, block_size, head_dim)
        self.register_buffer("k_pool", torch.zeros(pool, dtype=dtype, device=device), persistent=False)
        values = (*pool[:3], self.value_dim)
        self.register_buffer("v_pool", torch.zeros(values, dtype=dtype, device=device), persistent=False)
        self.k_pool: torch.Tensor
        self.v_pool: torch.Tensor

    def _apply(self, fn: Any, recurse: bool = True) -> PagedKVCache:
        """``.to()`` and the like move the block table with the pool (a shared one is moved once per layer,
        which leaves it where the last put it)."""
        super()._apply(fn, recurse)
        self.table.table, self.table.lengths = fn(self.table.table), fn(self.table.lengths)
        return self

    def share(self, table: BlockTable) -> None:
        """Write through ``table`` (another layer's, of the same shape, before anything is written)."""
        if table is self.table:
            return
        if table.shape() != self.table.shape() or any(self.table.length) or any(table.length):
            raise ValueError(
                f"paged layers share a block table only when empty and of one shape, got {table.shape()} and "
                f"{self.table.shape()} (batch, blocks, block size, blocks per sequence)"
            )
        self.table.layers -= 1
        self.table = table
        table.layers += 1

    @property
    def block_table(self) -> torch.Tensor:
        return self.table.table

    @property
    def lengths(self) -> torch.Tensor:
        return self.table.lengths

    @property
    def refcount(self) -> list[int]:
        return self.table.refcount

    @property
    def num_blocks(self) -> int:
        return self.table.num_blocks

    @property
    def block_size(self) -> int:
        return self.table.block_size

    def free_blocks(self) -> int:
        return self.table.free_blocks()

    def waste(self) -> int:
        return self.table.waste()

    def fork(self, src: int, dst: int) -> None:
        self.table.fork(src, dst)

    def release(self, row: int) -> None:
        self.table.release(row)

    def reach(self, n: int) -> int:
        """Any token: a row goes back through the block table (``BlockTable.crop``), every paged layer at once."""
        return n

    def crop(self, n: int) -> None:
        """Nothing of its own: ``ModelCache.crop_row`` cuts the row back in the one block table."""

    def begin(self) -> bool:
        """A pass starts: the block table undoes a write not every layer made (``BlockTable.abort``), and what a
        write put in the pool past a row's length is overwritten by the next: nothing to keep here."""
        return True

    # ---- the protocol ----

    def next_positions(self, t: int) -> torch.Tensor:
        """Each sequence's next ``t`` positions, (B, T): its own length onward."""
        return self.table.next_positions(list(range(self.batch_size)), t)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D) to every sequence; return keys, values (B, Hkv, S, D) and positions (B, S)."""
        return self.write(tuple(range(self.batch_size)), k, v)

    def sequence(self, row: int) -> PagedRows:
        """Sequence ``row`` alone, as a cache of batch 1 over the same pool (a new prompt is prefilled into it
        while the other sequences keep their tokens: continuous batching)."""
        return self.rows([row])

    def rows(self, rows: list[int]) -> PagedRows:
        """Some of the sequences, as a cache of batch len(rows) over the same pool."""
        if not rows or len(set(rows)) != len(rows):
            raise ValueError(f"rows must name distinct sequences of this cache, got {rows!r}")
        for row in rows:
            self.table.check_row("row", row)
        return PagedRows(self, rows)

    def write(
        self, rows: tuple[int, ...], k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write k, v (R, Hkv, T, D) after the tokens of ``rows``; their keys, values (R, Hkv, S, D) and
        positions (R, S)."""
        self.check(k, v, batch=len(rows))
        plan = self.table.plan(rows, k.shape[2])
        for source, block in plan.copies:  # copy on write: this sequence gets its own copy of a shared block
            self.k_pool[:, block].copy_(self.k_pool[:, source])
            self.v_pool[:, block].copy_(self.v_pool[:, source])
        self.k_pool[:, plan.blocks, plan.offsets] = k.transpose(0, 1)  # (Hkv, R, T, D) into (Hkv, N, P, D)
        self.v_pool[:, plan.blocks, plan.offsets] = v.transpose(0, 1)
        self.table.wrote(plan)
        return self.gathered(plan.index, plan.ends)

    def gathered(
        self, index: torch.Tensor | None = None, ends: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The keys and values of rows ``index`` (default all) in order, (R, Hkv, S, D), and their positions
        (R, S), -1 past each row's end (``ends``, default its length)."""
        index = torch.arange(self.batch_size, device=self.lengths.device) if index is None else index
        ends = self.lengths[index] if ends is None else ends
        p = self.block_size
        # only the blocks up to the longest row's end: gathering all blocks_per_seq copied the whole context's
        # worth of keys for every row, layer and step (at 32 rows, most of a decode step's time)
        m = max(1, -(-int(ends.max()) // p)) if len(index) else 1
        table = self.block_table[index, :m].clamp(min=0)  # (R, m): an unused entry reads block 0, hidden
        shape = (len(index), self.num_kv_heads, m * p, self.head_dim)
        keys = self.k_pool[:, table].transpose(0, 1).reshape(shape)  # (Hkv, R, m, P, D) -> (R, Hkv, m * P, D), a view
        values = self.v_pool[:, table].transpose(0, 1).reshape(*shape[:3], self.value_dim)
        slots = torch.arange(m * p, device=ends.device)[None, :]  # (1, S)
        return keys, values, torch.where(slots < ends[:, None], slots, -1)  # positions (R, S)


class PagedRows:
    """Some sequences of a :class:`PagedKVCache`, as a cache of their own (the ``Cache`` protocol) over its pool."""

    capabilities = PagedKVCache.capabilities

    def __init__(self, cache: PagedKVCache, rows: list[int]) -> None:
        self.cache, self.rows = cache, tuple(rows)

    def next_positions(self, t: int) -> torch.Tensor:
        """These sequences' next ``t`` positions, (R, T)."""
        return self.cache.table.next_positions(list(self.rows), t)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (R, Hkv, T, D) to these sequences; their keys, values (R, Hkv, S, D) and positions (R, S)."""
        return self.cache.write(self.rows, k, v)

    def room(self) -> int | None:
        return None

    def observe(self, *args: object, **kwargs: object) -> None:
        """Paged blocks weigh nothing."""


class PagedLatentCache(PagedKVCache):
    """MLA's latents, [c, k_pe] per token (``kv_lora_rank + rope_dim`` values), in paged blocks: the keys of one
    head, whose first ``kv_lora_rank`` values are the values (stored once, as ``LatentCache`` stores them).

    Args:
        kv_lora_rank, rope_dim: the latent's two parts; the rest as :class:`PagedKVCache`.
    """

    def __init__(self, *, kv_lora_rank: int, rope_dim: int, **pool: Any) -> None:
        super().__init__(num_kv_heads=1, head_dim=kv_lora_rank + rope_dim, value_dim=kv_lora_rank, **pool)
        self.kv_lora_rank = kv_lora_rank
        self.v_pool = self.k_pool.new_zeros(0)  # the values are the latents' first kv_lora_rank: none kept apart

    def write(
        self, rows: tuple[int, ...], k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write the latents k (R, 1, T, R + P) of ``rows`` (v, their first R values, is not kept apart)."""
        self.check(k, v, batch=len(rows))
        plan = self.table.plan(rows, k.shape[2])
        for source, block in plan.copies:
            self.k_pool[:, block].copy_(self.k_pool[:, source])
        self.k_pool[:, plan.blocks, plan.offsets] = k.transpose(0, 1)  # (1, R, T, R + P) into (1, N, P, R + P)
        self.table.wrote(plan)
        return self.gathered(plan.index, plan.ends)

    def gathered(
        self, index: torch.Tensor | None = None, ends: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The latents of rows ``index`` (R, 1, S, R + P), their first kv_lora_rank as values, and positions."""
        index = torch.arange(self.batch_size, device=self.lengths.device) if index is None else index
        ends = self.lengths[index] if ends is None else ends
        p = self.block_size
        m = max(1, -(-int(ends.max()) // p)) if len(index) else 1
        table = self.block_table[index, :m].clamp(min=0)  # (R, m)
        shape = (len(index), 1, m * p, self.head_dim)
        latents = self.k_pool[:, table].transpose(0, 1).reshape(shape)  # (1, R, m, P, R + P) -> (R, 1, m * P, R + P)
        slots = torch.arange(m * p, device=ends.device)[None, :]  # (1, S)
        return latents, latents[..., : self.kv_lora_rank], torch.where(slots < ends[:, None], slots, -1)
