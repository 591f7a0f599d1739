"""A paged KV cache: pools of fixed-size blocks, and one block table for every layer that pages.

vLLM's design (Kwon et al., 2023). Keys and values live in a pool of
``num_blocks`` blocks of ``block_size`` tokens per layer; a sequence owns a
row of the :class:`BlockTable`, the ids of its blocks in order, and a length.
Every layer allocates the same block ids, so the layers that page share one
table, one refcount per block and one free queue (vLLM's block pool): the
bookkeeping is done once per forward, not once per layer, and a decode step's
bookkeeping touches only the blocks it writes, never the whole pool (a queue
of free ids, not a scan).

A block is taken only when a sequence's tokens reach it, so the memory a
sequence holds beyond its tokens is at most one partly filled block
(:meth:`BlockTable.waste`). Sequences of different lengths share one batch:
each has its own positions, and ``update`` returns them per row, (B, S), -1
for a slot that holds nothing: all ``attnlab.Attention`` needs.

:meth:`BlockTable.fork` gives a sequence the blocks of another without
copying them; a shared block is copied only when one of its sequences writes
into it (copy on write). :meth:`BlockTable.release` gives a finished
sequence's blocks back.

A write is planned, and refused if it does not fit, before anything changes;
the plan is kept until every layer that shares the table wrote through it,
and only then do the lengths move. A forward that fails between layers is
undone (:meth:`BlockTable.abort`), so a call that raises leaves the cache as
it was.

Shapes: B = batch, R = rows written, Hkv = kv heads, D = head_dim, T = new
tokens, N = blocks in the pool, P = block_size, M = blocks a sequence may
hold, S = M * P slots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache


@dataclass
class Write:
    """One forward's tokens for some rows: where each goes, decided once for every layer."""

    rows: tuple[int, ...]
    t: int
    index: torch.Tensor  # (R,) the rows
    blocks: torch.Tensor  # (R, T) the block of each new token
    offsets: torch.Tensor  # (R, T) its slot in the block
    ends: torch.Tensor  # (R,) each row's length once written
    copies: list[tuple[int, int]] = field(default_factory=list)  # (from, to): copy on write, in every layer's pool
    taken: list[tuple[int, int, int, int | None]] = field(default_factory=list)  # (row, slot, block, replaced)
    written: int = 0  # layers that wrote it


class BlockTable:
    """Block ids per sequence, their lengths, a refcount per block and a queue of free ones, for all the
    layers that page.

    Args:
        batch_size: sequences (rows).
        num_blocks: blocks in every layer's pool.
        max_len: the most tokens one sequence may hold (a row's width is ceil(max_len / block_size)).
        block_size: tokens per block (16, as vLLM's default).
        device: of the table and lengths.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        num_blocks: int,
        max_len: int,
        block_size: int = 16,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("batch_size", batch_size, limit=2**20)
        check_positive_int("num_blocks", num_blocks, limit=2**24)
        check_positive_int("block_size", block_size, limit=2**16)
        check_positive_int("max_len", max_len, limit=2**27)
        self.batch_size, self.num_blocks, self.block_size = batch_size, num_blocks, block_size
        self.blocks_per_seq = -(-max_len // block_size)
        self.table = torch.full((batch_size, self.blocks_per_seq), -1, dtype=torch.long, device=device)  # (B, M)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.held: list[list[int]] = [[] for _ in range(batch_size)]  # each row's block ids, in order
        self.length = [0] * batch_size  # the lengths, read without a device sync
        self.refcount = [0] * num_blocks  # holders of each block (sequences, a prefix tree): 0 = free
        self.free: deque[int] = deque(range(num_blocks))
        self.layers = 0  # the caches that write through it: a write is done once they all did
        self.pending: Write | None = None

    def shape(self) -> tuple[int, int, int, int]:
        return self.batch_size, self.num_blocks, self.block_size, self.blocks_per_seq

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.table, self.lengths))

    def next_positions(self, rows: list[int], t: int) -> torch.Tensor:
        """The rows' next ``t`` positions, (R, T)."""
        start = torch.tensor([self.length[r] for r in rows], device=self.lengths.device)
        return start[:, None] + torch.arange(t, device=self.lengths.device)

    def plan(self, rows: tuple[int, ...], t: int) -> Write:
        """Where ``t`` new tokens of each of ``rows`` go; the blocks they need taken now (refused, with nothing
        changed, if the pool or a row cannot hold them). Every layer of one forward gets the same plan."""
        if self.pending is not None:
            if (self.pending.rows, self.pending.t) == (rows, t) and self.pending.written < self.layers:
                return self.pending  # another layer of the same forward
            self.abort()  # a forward that stopped between layers: undone before this one
        p = self.block_size
        needs: list[tuple[int, int, int | None]] = []  # (row, slot, block to copy from)
        letting_go: dict[int, int] = {}  # shared blocks a row copies: the last holder left writes in place
        for row in rows:
            length = self.length[row]
            if length + t > self.blocks_per_seq * p:
                raise ValueError(
                    f"sequence {row} holds {length} tokens and cannot take {t} more: this cache was built for "
                    f"max_len={self.blocks_per_seq * p}; build it with a larger max_len"
                )
            for slot in range(length // p, (length + t - 1) // p + 1):
                if slot >= len(self.held[row]):
                    needs.append((row, slot, None))
                    continue
                block = self.held[row][slot]
                holders = self.refcount[block] - letting_go.get(block, 0)
                if holders > 1 and slot == length // p and length % p:  # shared, partly filled, about to be written
                    needs.append((row, slot, block))
                    letting_go[block] = letting_go.get(block, 0) + 1
        if len(needs) > len(self.free):
            raise ValueError(
                f"the pool is full: its {self.num_blocks} blocks of {p} tokens are taken; release finished "
                "sequences or build the cache with more num_blocks"
            )
        taken: list[tuple[int, int, int, int | None]] = []
        for row, slot, source in needs:
            block = self.free.popleft()
            self.refcount[block] += 1
            if source is None:
                self.held[row].append(block)
            else:
                self.held[row][slot] = block
                self.refcount[source] -= 1
            self.table[row, slot] = block
            taken.append((row, slot, block, source))
        new = self.next_positions(list(rows), t)  # (R, T)
        index = torch.tensor(rows, device=self.lengths.device)
        write = Write(
            rows=rows,
            t=t,
            index=index,
            blocks=self.table[index].gather(1, new // p),  # (R, T): the block of each new token
            offsets=new % p,
            ends=new[:, -1] + 1,
            copies=[(source, block) for _, _, block, source in taken if source is not None],
            taken=taken,
        )
        self.pending = write
        return write

    def wrote(self, write: Write) -> None:
        """One layer wrote ``write``; after the last, the rows' lengths move."""
        write.written += 1
        if write.written < self.layers:
            return
        for row in write.rows:
            self.length[row] += write.t
        self.lengths[write.index] = write.ends
        self.pending = None

    def abort(self) -> None:
        """Undo a write planned but not written by every layer: its blocks go back, shared ones are shared again."""
        write, self.pending = self.pending, None
        for row, slot, block, source in reversed(write.taken if write is not None else []):
            self.refcount[block] -= 1
            self.free.appendleft(block)
            if source is None:
                self.held[row].pop()
                self.table[row, slot] = -1
            else:
                self.held[row][slot] = source
                self.refcount[source] += 1
                self.table[row, slot] = source

    def take(self, row: int, blocks: list[int], length: int) -> None:
        """Row ``row`` (empty) starts on ``blocks`` that others hold (a prefix tree's): a reference each."""
        self.held[row] = list(blocks)
        for n, block in enumerate(blocks):
            self.refcount[block] += 1
            self.table[row, n] = block
        self.length[row] = length
        self.lengths[row] = length

    def hold(self, block: int) -> None:
        self.refcount[block] += 1

    def drop(self, block: int) -> None:
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free.append(block)

    def fork(self, src: int, dst: int) -> None:
        """Sequence ``dst`` continues from ``src``'s tokens, sharing its blocks until one of them writes."""
        self.check_row("src", src)
        self.check_row("dst", dst)
        if src == dst:
            raise ValueError(f"fork needs two different sequences, got src = dst = {src}")
        self.release(dst)
        self.take(dst, self.held[src], self.length[src])

    def release(self, row: int) -> None:
        """Sequence ``row`` is finished: its blocks go back to the pool (shared ones when no one holds them)."""
        self.check_row("row", row)
        self.abort()  # a write planned by a forward that did not finish is not this row's to keep
        for block in self.held[row]:
            self.drop(block)
        self.held[row] = []
        self.table[row] = -1
        self.length[row] = 0
        self.lengths[row] = 0

    def waste(self) -> int:
        """Token slots held in blocks but not used: at most one partly filled block per sequence."""
        return sum(len(h) for h in self.held) * self.block_size - sum(self.length)

    def free_blocks(self) -> int:
        return len(self.free)

    def check_row(self, name: str, row: object) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.batch_size:
            raise ValueError(f"{name} must be a sequence of this cache, an int in [0, {self.batch_size}), got {row!r}")


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

    capabilities = Capabilities(rows=True)

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
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
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
        self.register_buffer("v_pool", torch.zeros(pool, dtype=dtype, device=device), persistent=False)
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
        table = self.block_table[index, :m].clamp(
            min=0
        )  # (R, m); an unused entry reads block 0, hidden by its position
        shape = (len(index), self.num_kv_heads, m * p, self.head_dim)
        keys = self.k_pool[:, table].transpose(0, 1).reshape(shape)  # (Hkv, R, m, P, D) -> (R, Hkv, m * P, D), a view
        values = self.v_pool[:, table].transpose(0, 1).reshape(shape)
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
        keys, values, positions = self.cache.write(self.rows, k, v)
        return keys, values, positions

    def room(self) -> int | None:
        return None

    def observe(self, *args: object, **kwargs: object) -> None:
        """Paged blocks weigh nothing."""
