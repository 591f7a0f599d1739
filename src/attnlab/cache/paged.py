"""A paged KV cache: one pool of fixed-size blocks shared by a batch, a block table per sequence.

vLLM's layout (Kwon et al., 2023). Keys and values live in a pool of
``num_blocks`` blocks of ``block_size`` tokens; each sequence of the batch
owns a row of the block table, the ids of its blocks in order, and a length.
A block is taken from the free list only when a sequence's tokens reach it,
so the memory a sequence holds beyond its tokens is at most one partly
filled block (:meth:`waste` says how much). Sequences of different lengths
share one batch: each has its own positions, and ``update`` returns them per
row, (B, S), with -1 for a slot that holds nothing, which is all
``attnlab.Attention`` needs (its ``Visibility`` reads per-row positions).

:meth:`fork` gives a sequence the blocks of another without copying them
(parallel samples of one prompt); a shared block is copied only when one of
its sequences writes into it (copy on write). :meth:`release` gives a
finished sequence's blocks back to the pool for the next prompt.

``update`` checks everything, the pool's room included, before it writes,
so a call that raises leaves the cache as it was.

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, N = blocks in
the pool, P = block_size, M = blocks a sequence may hold, S = M * P slots.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int


class PagedKVCache(nn.Module):
    """Blocks of ``block_size`` tokens from one pool of ``num_blocks``, a block table per sequence.

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores.
        num_blocks: blocks in the pool, shared by every sequence.
        block_size: tokens per block (16, as vLLM's default).
        max_len: the most tokens one sequence may hold (its block table's width is ceil(max_len / block_size)).
        dtype, device: of the pool.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        max_len: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_positive_int(name, value, limit=2**20)
        check_positive_int("num_blocks", num_blocks, limit=2**24)
        check_positive_int("block_size", block_size, limit=2**16)
        check_positive_int("max_len", max_len, limit=2**27)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"cache dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks_per_seq = -(-max_len // block_size)
        pool = (num_blocks, num_kv_heads, block_size, head_dim)
        self.register_buffer("k_pool", torch.zeros(pool, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_pool", torch.zeros(pool, dtype=dtype, device=device), persistent=False)
        table = torch.full((batch_size, self.blocks_per_seq), -1, dtype=torch.long, device=device)
        self.register_buffer("block_table", table, persistent=False)  # (B, M): block ids, -1 none
        self.register_buffer("lengths", torch.zeros(batch_size, dtype=torch.long, device=device), persistent=False)
        self.refcount = [0] * num_blocks  # sequences holding each block: 0 = free
        self.k_pool: torch.Tensor
        self.v_pool: torch.Tensor
        self.block_table: torch.Tensor
        self.lengths: torch.Tensor

    # ---- the protocol ----

    def next_positions(self, t: int) -> torch.Tensor:
        """Each sequence's next ``t`` positions, (B, T): its own length onward."""
        return self.lengths[:, None] + torch.arange(t, device=self.lengths.device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D) to every sequence; return keys, values (B, Hkv, S, D) and positions (B, S)."""
        self._check(k, v, self.batch_size)
        self._append(list(range(self.batch_size)), k, v)
        return self.gathered()

    def sequence(self, row: int) -> PagedRows:
        """Sequence ``row`` alone, as a cache of batch 1 over the same pool: a new prompt is prefilled into it
        while the other sequences keep their tokens (continuous batching)."""
        return self.rows([row])

    def rows(self, rows: list[int]) -> PagedRows:
        """Some of the sequences, as a cache of batch len(rows) over the same pool: a decode step for the
        sequences still running, while finished ones wait for a new prompt."""
        if not rows or len(set(rows)) != len(rows):
            raise ValueError(f"rows must name distinct sequences of this cache, got {rows!r}")
        for row in rows:
            self._check_row("row", row)
        return PagedRows(self, list(rows))

    def _append(self, rows: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (len(rows), Hkv, T, D) after the tokens of sequences ``rows``."""
        t = k.shape[2]
        lengths = [int(self.lengths[r]) for r in rows]
        plan = self._plan(rows, lengths, t)  # every block to take or copy, decided (and refused) before any write
        for b, slot, block, copy_from in plan:
            if copy_from is not None:  # copy on write: this sequence gets its own copy of a shared block
                self.k_pool[block].copy_(self.k_pool[copy_from])
                self.v_pool[block].copy_(self.v_pool[copy_from])
                self.refcount[copy_from] -= 1
            self.refcount[block] += 1
            self.block_table[b, slot] = block
        index = torch.tensor(rows, device=self.lengths.device)
        new = self.lengths[index][:, None] + torch.arange(t, device=self.lengths.device)  # (R, T)
        blocks = self.block_table[index].gather(1, new // self.block_size)  # (R, T): the block of each new token
        offsets = new % self.block_size
        self.k_pool[blocks, :, offsets] = k.transpose(1, 2)  # (R, T, Hkv, D) into (N, Hkv, P, D)
        self.v_pool[blocks, :, offsets] = v.transpose(1, 2)
        self.lengths[index] += t

    # ---- what it holds ----

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every sequence's keys and values in order, (B, Hkv, S, D), and their positions (B, S), -1 empty."""
        b, m, p = self.batch_size, self.blocks_per_seq, self.block_size
        table = self.block_table.clamp(min=0)  # (B, M); an unused entry reads block 0, hidden by its position
        keys = self.k_pool[table].permute(0, 2, 1, 3, 4).reshape(b, self.num_kv_heads, m * p, self.head_dim)
        values = self.v_pool[table].permute(0, 2, 1, 3, 4).reshape(b, self.num_kv_heads, m * p, self.head_dim)
        slots = torch.arange(m * p, device=self.lengths.device)[None, :]  # (1, S)
        positions = torch.where(slots < self.lengths[:, None], slots, -1)  # (B, S)
        return keys, values, positions

    def waste(self) -> int:
        """Token slots held in blocks but not used: at most one partly filled block per sequence."""
        held = sum(int((self.block_table[b] >= 0).sum()) for b in range(self.batch_size)) * self.block_size
        return held - int(self.lengths.sum())

    def free_blocks(self) -> int:
        return sum(1 for r in self.refcount if r == 0)

    # ---- sequences come and go ----

    def fork(self, src: int, dst: int) -> None:
        """Sequence ``dst`` continues from ``src``'s tokens, sharing its blocks until one of them writes."""
        self._check_row("src", src)
        self._check_row("dst", dst)
        if src == dst:
            raise ValueError(f"fork needs two different sequences, got src = dst = {src}")
        self.release(dst)
        self.block_table[dst] = self.block_table[src]
        self.lengths[dst] = self.lengths[src]
        for block in self.block_table[src].tolist():
            if block >= 0:
                self.refcount[block] += 1

    def release(self, row: int) -> None:
        """Sequence ``row`` is finished: its blocks go back to the pool (shared ones when no one holds them)."""
        self._check_row("row", row)
        for block in self.block_table[row].tolist():
            if block >= 0:
                self.refcount[block] -= 1
        self.block_table[row] = -1
        self.lengths[row] = 0

    # ---- checks, all before a write ----

    def _plan(self, rows: list[int], lengths: list[int], t: int) -> list[tuple[int, int, int, int | None]]:
        """(sequence, table slot, block, block to copy from or None) for every block the next ``t`` tokens need."""
        free = [n for n, r in enumerate(self.refcount) if r == 0]
        holders = list(self.refcount)  # as the plan goes: a sequence that copies a shared block lets go of it
        plan: list[tuple[int, int, int, int | None]] = []
        table = self.block_table.tolist()
        for b, length in zip(rows, lengths, strict=True):
            if length + t > self.blocks_per_seq * self.block_size:
                raise ValueError(
                    f"sequence {b} holds {length} tokens and cannot take {t} more: this cache was built for "
                    f"max_len={self.blocks_per_seq * self.block_size}; build it with a larger max_len"
                )
            first, last = length // self.block_size, (length + t - 1) // self.block_size
            for slot in range(first, last + 1):
                block = table[b][slot]
                if block < 0:
                    needed = (b, slot, None)
                elif holders[block] > 1 and slot == length // self.block_size and length % self.block_size:
                    needed = (b, slot, block)  # a shared, partly filled block it is about to write into
                    holders[block] -= 1  # the last holder left writes into it in place
                else:
                    continue
                if not free:
                    raise ValueError(
                        f"the pool is full: its {self.num_blocks} blocks of {self.block_size} tokens are taken; "
                        "release finished sequences or build the cache with more num_blocks"
                    )
                plan.append((needed[0], needed[1], free.pop(0), needed[2]))
        return plan

    def _check_row(self, name: str, row: object) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.batch_size:
            raise ValueError(f"{name} must be a sequence of this cache, an int in [0, {self.batch_size}), got {row!r}")

    def _check(self, k: torch.Tensor, v: torch.Tensor, batch: int) -> None:
        for name, x in (("keys", k), ("values", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be a 4-D tensor (batch, kv_heads, T, head_dim), got {shape}")
            expected = (batch, self.num_kv_heads, self.head_dim)
            if (x.shape[0], x.shape[1], x.shape[3]) != expected:
                raise ValueError(
                    f"this cache holds (batch, kv_heads, head_dim) = {expected}, got {name} of shape "
                    f"{tuple(x.shape)}; build it for the model and batch (make_caches(..., cache='paged'))"
                )
            if x.dtype != self.k_pool.dtype:
                raise TypeError(f"{name} are {x.dtype} but the pool holds {self.k_pool.dtype}")
            if x.device != self.k_pool.device:
                raise ValueError(f"{name} are on {x.device} but the pool is on {self.k_pool.device}")
            if torch.is_grad_enabled() and x.requires_grad:
                raise ValueError(f"{name} require grad, but a KV cache is for inference: decode under torch.no_grad()")
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"keys and values must hold the same number of tokens, got {k.shape[2]} and {v.shape[2]}")


class PagedRows:
    """Some sequences of a :class:`PagedKVCache`, as a cache of their own (the ``Cache`` protocol) over its pool."""

    def __init__(self, cache: PagedKVCache, rows: list[int]) -> None:
        self.cache, self.rows = cache, rows
        self.index = torch.tensor(rows, device=cache.lengths.device)

    def next_positions(self, t: int) -> torch.Tensor:
        """These sequences' next ``t`` positions, (R, T)."""
        return self.cache.lengths[self.index][:, None] + torch.arange(t, device=self.cache.lengths.device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (R, Hkv, T, D) to these sequences; their keys, values (R, Hkv, S, D) and positions (R, S)."""
        self.cache._check(k, v, len(self.rows))
        self.cache._append(self.rows, k, v)
        keys, values, positions = self.cache.gathered()
        return keys[self.index], values[self.index], positions[self.index]
