"""The block table of a paged KV cache: block ids per sequence, lengths, a refcount per block, a free queue.

vLLM's block pool (Kwon et al., 2023). Every layer that pages allocates the
same block ids, so they share one table: the bookkeeping is done once per
forward, not once per layer, and touches only the blocks written (a queue of
free ids, not a scan). A block is taken only when a sequence's tokens reach
it (:meth:`BlockTable.waste`). :meth:`BlockTable.fork` shares a sequence's
blocks without copying them; a shared block is copied only when one of its
sequences writes into it (copy on write).

A write is planned, and refused if it does not fit, before anything changes;
the plan is kept until every layer that shares the table wrote through it,
and only then do the lengths move. A forward that fails between layers is
undone (:meth:`BlockTable.abort`), so a call that raises leaves the cache as
it was.

Shapes: B = batch, R = rows written, T = new tokens, M = blocks a sequence may hold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab._checks import check_positive_int


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
        self.freed: list[Callable[[int], None]] = []  # told when a block goes back: what was kept with it goes too

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
            for told in self.freed:
                told(block)
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
            for told in self.freed:
                told(block)

    def fork(self, src: int, dst: int) -> None:
        """Sequence ``dst`` continues from ``src``'s tokens, sharing its blocks until one of them writes."""
        self.check_row("src", src)
        self.check_row("dst", dst)
        if src == dst:
            raise ValueError(f"fork needs two different sequences, got src = dst = {src}")
        self.release(dst)
        self.take(dst, self.held[src], self.length[src])

    def crop(self, row: int, n: int) -> None:
        """Sequence ``row`` holds its first ``n`` tokens again (a refused guess taken back): the blocks past them go
        back (a shared one: a reference less); the block ``n`` ends in is written again, copied first if shared."""
        self.check_row("row", row)
        length = self.length[row]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"sequence {row} holds {length} tokens: it can go back to 0..{length}, not {n!r}")
        self.abort()
        keep = -(-n // self.block_size)
        for block in self.held[row][keep:]:
            self.drop(block)
        self.held[row] = self.held[row][:keep]
        self.table[row, keep:] = -1
        self.length[row] = n
        self.lengths[row] = n

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
