"""A compressed layer's state in paged blocks (DeepSeek-V4 under the 'paged' and 'prefix' caches): rows that come
and go, each at its own length, and prompts that start where an earlier one's blocks end.

What ``CompressedCache`` (``attnlab.cache.compressed``) keeps, split by what it depends on:

* the window's keys: a token's key depends on that token alone, so every key is kept in the model's pages (P
  tokens a page, the block table's), as a paged sliding layer keeps its window: the window at any page's end is
  in the pages, nothing to restore;
* the closed entries (and the indexer's): entry w pools tokens up to its block's last, (w + 1) * m - 1, so it is
  written into the page that holds that token; a page a prefix tree shares holds the entries its tokens closed.
  This needs the compression block m and the page P to line up (m divides P, or P divides m): otherwise an entry
  straddles a page that could be shared without it, and the plan refuses the layer by name
  (:func:`check_aligned`);
* the last tokens' projections (the open block's, and the block before it, which an overlapping block pools too):
  a ring of 2m + spare a row (a row's state, ``RowStates``), kept at the page ends that close a compression block
  (a prefix cache's snapshot, freed with the page) and restored there when a prompt resumes after that page.

So a prefix cache resumes at a page end every layer kept: every page with m dividing P; every m / P pages with P
dividing m. A row runs alone (the layer's call is per row: ``CompressedRow``, a batch of one whose length is its
own), and the rows of a group write through one plan of the block table.

Shapes: B = rows, N = pages in the pool, P = page size (tokens), E = entries a page (P // m, or 1), D = head_dim,
Di = index_dim, F = row_width, C = ring (2m + spare), T = new tokens, S = window tokens returned, n = entries.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import LayerCache
from attnlab.cache.blocks import BlockTable, Write
from attnlab.cache.compressed import CompressedCache, Declared
from attnlab.cache.makers import LayerState, Sizes
from attnlab.cache.row_states import RowStates
from attnlab.functional.compression import check_block

NOT_ALIGNED = (
    "a compressed layer in paged blocks writes each entry into the page holding its block's last token, so that a "
    "page a prefix shares holds the entries its tokens closed: its block of {block} tokens must divide the page of "
    "{page} tokens or be a multiple of it, and {block} is neither; use 'plain' (the default) for this model"
)


def check_aligned(block: int, page: int) -> None:
    """Refuse a compression block that neither divides the page nor is a multiple of it (:data:`NOT_ALIGNED`)."""
    if page % block and block % page:
        raise ValueError(NOT_ALIGNED.format(block=block, page=page))


class PagedCompressedCache(RowStates, LayerCache):
    """A compressed layer's keys and entries in the model's pages, its rows' rings as row states (see the
    module's docstring). Keyword-only: ``table`` (the model's block table), the layer's ``head_dim``, ``window``,
    ``block``, ``row_width``, ``index_dim``; ``spare`` (the ring's slots more), ``keeps_ends`` (a prefix cache:
    keep the ring at each page end that closes a block)."""

    keeps_its_own = True  # its capabilities: RowStates' (rows, crop to a mark)

    def __init__(
        self,
        *,
        table: BlockTable,
        head_dim: int,
        window: int,
        block: int,
        row_width: int,
        index_dim: int | None = None,
        spare: int = 0,
        keeps_ends: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_block(block)
        check_aligned(block, table.block_size)
        check_positive_int("row_width", row_width, limit=2**20)
        check_positive_int("window", window, limit=2**27)
        if index_dim is not None:
            check_positive_int("index_dim", index_dim, limit=2**16)
        LayerCache.__init__(self, batch_size=table.batch_size, num_kv_heads=1, head_dim=head_dim, dtype=dtype)
        n, p = table.num_blocks, table.block_size
        self.block, self.window, self.spare, self.index_dim = block, window, spare, index_dim
        self.per_page, self.slots = max(1, p // block), 2 * block + spare
        self.register_buffer("k_pool", torch.zeros(n, p, head_dim, dtype=dtype, device=device), persistent=False)
        entries = torch.zeros(n, self.per_page, head_dim, dtype=dtype, device=device)
        self.register_buffer("entry_pool", entries, persistent=False)
        index = None if index_dim is None else torch.zeros(n, self.per_page, index_dim, dtype=dtype, device=device)
        self.register_buffer("index_pool", index, persistent=False)
        ring = torch.zeros(table.batch_size, self.slots, row_width, dtype=dtype, device=device)
        self.register_buffer("ring", ring, persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.k_pool: torch.Tensor
        self.entry_pool: torch.Tensor
        self.index_pool: torch.Tensor | None
        self.ring: torch.Tensor
        self._made(table, {}, keeps_ends=keeps_ends)

    def _held(self) -> torch.Tensor:
        return self.k_pool

    def _tensors(self) -> list[torch.Tensor]:
        return [self.ring]

    def _view(self, rows: list[int]) -> CompressedRows:
        return CompressedRows(self, rows)

    def each(self, batch: int) -> list[CompressedRow]:
        """Every row, one a call (the layer's forward on the whole model cache)."""
        return self._view(list(range(self.batch_size))).each(batch)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise TypeError(_NOT_KV)

    def reach(self, n: int) -> int:
        raise ValueError("this cache's rows run on their own and go back one by one: ModelCache.crop_row(row, n)")

    def crop(self, n: int) -> None:
        raise ValueError("this cache's rows run on their own and go back one by one: ModelCache.crop_row(row, n)")

    # ---- where things live in the pages ----

    def entry_slots(self, row: int, first: int, last: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages and places (n,), (n,) of row ``row``'s entries first..last-1: each in its block's last token's
        page, at its place among the page's E entries."""
        w = torch.arange(first, last, device=self.k_pool.device)
        p = self.table.block_size
        pages = self.table.table[row].to(w.device)[((w + 1) * self.block - 1) // p]
        return pages, (w * self.block % p) // self.block

    def token_slots(self, row: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages and offsets (S,), (S,) of row ``row``'s tokens start..end-1."""
        pos = torch.arange(start, end, device=self.k_pool.device)
        p = self.table.block_size
        return self.table.table[row].to(pos.device)[pos // p], pos % p

    def copy_pages(self, write: Write) -> None:
        """Copy on write: a shared page a row now writes into is copied first (a fork's last, partly filled)."""
        for source, page in write.copies:
            for pool in (self.k_pool, self.entry_pool, self.index_pool):
                if pool is not None:
                    pool[page].copy_(pool[source])

    def keeps_at(self, end: int) -> bool:
        """Whether the ring is kept at ``end`` tokens: a page end that closes a block (a prefix resumes there)."""
        return self.keeps_ends and end % self.table.block_size == 0 and end % self.block == 0


_NOT_KV = (
    "a paged compressed cache keeps a compressed layer's keys, entries and rows together: it is written by "
    "CompressedAttention a row at a time (each()), not by a layer of keys and values"
)


class CompressedRows:
    """Some rows of a :class:`PagedCompressedCache` (a group the decode loop feeds at once), as the layer's cache:
    :meth:`each` gives each row's batch of one; their writes share one plan of the block table."""

    capabilities = PagedCompressedCache.capabilities

    def __init__(self, owner: PagedCompressedCache, rows: list[int]) -> None:
        self.owner, self.picked = owner, tuple(rows)
        self.plan: Write | None = None
        self.wrote = 0

    @property
    def batch_size(self) -> int:
        return len(self.picked)

    def next_positions(self, t: int) -> torch.Tensor:
        """Each row's next ``t`` positions, (R, T)."""
        return self.owner.table.next_positions(list(self.picked), t).to(self.owner.k_pool.device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise TypeError(_NOT_KV)

    def room(self) -> int | None:
        return None

    def observe(self, *args: object, **kwargs: object) -> None:
        """Nothing weighed."""

    def each(self, batch: int) -> list[CompressedRow]:
        """Each row as a cache of batch one, in order (``batch``: the layer's input's, checked to be this view's)."""
        if batch != len(self.picked):
            raise ValueError(f"these paged rows are {len(self.picked)} sequences, got a batch of {batch}")
        return [CompressedRow(self, n) for n in range(len(self.picked))]

    def planned(self, t: int) -> Write:
        """The block table's plan for ``t`` tokens of every row here (one for every layer of the forward), the
        pages it copies copied into this layer's pools first."""
        if self.plan is None or self.plan.t != t:
            self.plan = self.owner.table.plan(self.picked, t)  # refused, nothing changed, where rows cannot hold t
            self.owner.copy_pages(self.plan)
            self.wrote = 0
        return self.plan

    def done(self, write: Write) -> None:
        """One row wrote; after the last, this layer wrote the plan."""
        self.wrote += 1
        if self.wrote == len(self.picked):
            self.owner.table.wrote(write)
            self.plan = None


class CompressedRow(CompressedCache):
    """One row of a paged compressed cache as a ``CompressedCache`` of batch one (what ``CompressedAttention``
    reads and writes): its length the block table's, its keys and entries in the pages, its ring the row's."""

    def __init__(self, group: CompressedRows, n: int) -> None:
        owner = group.owner
        LayerCache.__init__(self, batch_size=1, num_kv_heads=1, head_dim=owner.head_dim, dtype=owner.k_pool.dtype)
        self.group, self.n, self.row, self.owner = group, n, group.picked[n], owner
        self.block, self.window, self.spare, self.index_dim = owner.block, owner.window, owner.spare, owner.index_dim
        self.slots = owner.slots

    def _held(self) -> torch.Tensor:
        return self.owner.k_pool

    @property
    def length(self) -> int:
        return self.owner.table.length[self.row]

    def next_positions(self, t: int) -> torch.Tensor:
        return self.length + torch.arange(t, device=self.owner.k_pool.device)

    def room(self) -> int | None:
        return None

    def check_layer(self, state: Declared, batch: int, t: int) -> None:
        got = state.block, state.index_dim, state.row_width, state.window
        mine = self.block, self.index_dim, self.owner.ring.shape[-1], self.window
        if state.kind != "compressed" or got != mine:
            raise TypeError(
                f"this paged compressed cache holds (block, index_dim, row_width, window) {mine}; the layer declares "
                f"{got}: build its cache from its layer_state() (ModelCache.build)"
            )
        if batch != 1:
            raise ValueError(f"a paged compressed row is a batch of one, got {batch}: the layer runs its rows apart")
        most = self.owner.table.blocks_per_seq * self.owner.table.block_size
        if self.length + t > most:
            raise ValueError(
                f"sequence {self.row} holds {self.length} tokens and cannot take {t} more: this cache was built for "
                f"max_len={most}; build it with a larger max_len"
            )

    def rows_since(self, start: int) -> torch.Tensor:
        """The row's projections of tokens start..L-1 (1, L - start, F), from its ring."""
        held = self.length
        if not max(0, held - self.slots) <= start <= held:
            raise ValueError(f"the ring holds tokens {max(0, held - self.slots)}..{held - 1}, not from {start}")
        slots = torch.arange(start, held, device=self.owner.ring.device) % self.slots
        return self.owner.ring[self.row : self.row + 1].index_select(1, slots)

    def write(
        self, keys: torch.Tensor, rows: torch.Tensor, entries: torch.Tensor, index: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keep this row's T new tokens: keys (1, 1, T, D) and the entries they closed (1, n, D) in the pages, rows
        (1, T, F) in its ring. Returns the window's keys (1, 1, S, D), their positions (S,), every closed entry
        (1, n', D) and the indexer's: what the layer attends over."""
        owner, held, t = self.owner, self.length, rows.shape[1]
        first, closed = held // self.block, (held + t) // self.block
        if entries.shape[1] != closed - first or (index is None) != (owner.index_pool is None):
            raise ValueError(
                f"tokens {held}..{held + t - 1} close entries {first}..{closed - 1}, got {entries.shape[1]}"
            )
        self.check(keys, keys)
        write = self.group.planned(t)
        pages, offsets = owner.token_slots(self.row, held, held + t)
        owner.k_pool[pages, offsets] = keys[0, 0]  # (T, D) into (N, P, D)
        pages, places = owner.entry_slots(self.row, first, closed)
        owner.entry_pool[pages, places] = entries[0]  # (n, D) into (N, E, D)
        if owner.index_pool is not None and index is not None:
            owner.index_pool[pages, places] = index[0]
        self._ring(rows, held, t)
        self.group.done(write)
        start = max(0, held - self.window + 1)  # the first query's window starts here
        pages, offsets = owner.token_slots(self.row, start, held + t)
        window = owner.k_pool[pages, offsets][None, None]  # (S, D) -> (1, 1, S, D)
        positions = torch.arange(start, held + t, device=window.device)
        pages, places = owner.entry_slots(self.row, 0, closed)
        every = owner.entry_pool[pages, places][None]  # (n', D) -> (1, n', D)
        index_all = None if owner.index_pool is None else owner.index_pool[pages, places][None]
        return window, positions, every, index_all

    def _ring(self, rows: torch.Tensor, held: int, t: int) -> None:
        """The row's last C projections into its ring (what they overwrite kept while a pass is open), and the
        ring kept where the row reaches a page end that closes a block."""
        owner, r = self.owner, self.row
        index = torch.tensor([r], device=owner.ring.device)
        if owner._overwritten is not None:  # a pass began: the row as it was, for undo
            owner._overwritten.append((index, [owner.ring.index_select(0, index)]))
        last = torch.arange(held + max(0, t - self.slots), held + t, device=rows.device)  # the ring keeps the last C
        owner.ring[r, last % self.slots] = rows[0, t - last.numel() :]
        if owner.keeps_at(held + t):
            owner.ends[r][(held + t) // owner.table.block_size - 1] = [owner.ring[r].clone()]

    # a row is written, undone and cut back through its owner (ModelCache: begin, abort, crop_row)
    def begin(self) -> bool:
        return True

    def undo(self) -> None:
        """Nothing of its own: its owner undoes."""

    def commit(self) -> None:
        """Nothing of its own."""


def make_paged_compressed(state: LayerState, sizes: Sizes) -> PagedCompressedCache:
    """A compressed layer's cache under 'paged' and 'prefix': in the model's pages, keeping its ring at
    block-closing page ends for a prefix cache."""
    assert sizes.table is not None and state.block is not None and state.row_width is not None  # planned so
    assert state.window is not None  # LayerState checks a compressed layer declares it
    return PagedCompressedCache(
        table=sizes.table,
        head_dim=state.head_dim,
        window=state.window,
        block=state.block,
        row_width=state.row_width,
        index_dim=state.index_dim,
        spare=sizes.spare,
        keeps_ends=sizes.shares,
        dtype=state.dtype,
        device=state.device,
    )
