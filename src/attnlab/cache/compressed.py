"""The state of a compressed layer (DeepSeek-V4's compressed-sparse and heavily compressed attention).

A compressed layer (``attnlab.nn.compressed``) reads a sliding window of its tokens and the entries of closed
blocks of ``block`` tokens, so it keeps three things a row:

* the window: a ring of its last ``window`` keys, and ``spare`` more (``SlidingWindowCache``);
* the entries of the blocks closed so far, the compressor's (D values) and, in a compressed-sparse layer, the
  indexer's (Di) beside them: entry w is written once, when token (w + 1) * block - 1 arrives, and never again;
* the last tokens' projections (values and gates of both compressors, F a token) in a ring of 2 * block + spare:
  the open block's tokens, which the next entry pools, and the block before it, whose first series the next
  entry pools too (transformers' ``DeepseekV4CSACache`` keeps these two as ``buffer_kv`` and ``overlap_kv``).

Everything is a function of the length L: entries 0..L // block - 1 are closed, the open block's tokens are
L // block * block..L - 1, and the overlap is the block before them. So going back to an earlier token n
(:meth:`crop`, speculation) is setting the length, and the ring must still hold the block before n's open one:
n at least L - spare, as the window's ring asks (:meth:`reach`).

Bytes a token and layer, past the window: (D + Di) / block x the element size (V4's compressed-sparse layer in
bfloat16: (512 + 128) x 2 / 4 = 320; its heavily compressed one: 512 x 2 / 128 = 8), beside a fixed ring of
window x D + (2 * block + spare) x F elements.

Shapes: B = batch, N = entries room (max_len // block), D = head_dim, Di = index_dim, F = row_width, C = ring.
"""

from __future__ import annotations

from typing import Protocol

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache
from attnlab.cache.kv import SlidingWindowCache
from attnlab.functional.compression import check_block


class Declared(Protocol):
    """What a layer declares of itself (``cache.makers.LayerState``, which imports this module) that this cache
    checks against what it was built for."""

    @property
    def kind(self) -> str: ...
    @property
    def window(self) -> int | None: ...
    @property
    def block(self) -> int | None: ...
    @property
    def index_dim(self) -> int | None: ...
    @property
    def row_width(self) -> int | None: ...


class CompressedCache(LayerCache):
    """A compressed layer's window, closed entries and last tokens' projections (see the module's docstring)."""

    capabilities = Capabilities(crop=True)
    keeps_its_own = True  # whatever cache is named: its entries are not keys and values a named cache builds

    def __init__(
        self,
        *,
        batch_size: int,
        head_dim: int,
        window: int,
        block: int,
        row_width: int,
        max_len: int,
        index_dim: int | None = None,
        spare: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_block(block)
        check_positive_int("row_width", row_width, limit=2**20)
        check_positive_int("max_len", max_len, limit=2**27)
        if index_dim is not None:
            check_positive_int("index_dim", index_dim, limit=2**16)
        super().__init__(batch_size=batch_size, num_kv_heads=1, head_dim=head_dim, dtype=dtype)
        self.ring = SlidingWindowCache(
            batch_size=batch_size,
            num_kv_heads=1,
            head_dim=head_dim,
            window=window,
            spare=spare,
            dtype=dtype,
            device=device,
        )
        self.block, self.window, self.spare, self.max_len, self.index_dim = block, window, spare, max_len, index_dim
        self.slots = 2 * block + spare
        room = max_len // block
        self.register_buffer(
            "entries", torch.zeros(batch_size, room, head_dim, dtype=dtype, device=device), persistent=False
        )
        index = None if index_dim is None else torch.zeros(batch_size, room, index_dim, dtype=dtype, device=device)
        self.register_buffer("index", index, persistent=False)
        self.register_buffer(
            "rows", torch.zeros(batch_size, self.slots, row_width, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.entries: torch.Tensor
        self.index: torch.Tensor | None
        self.rows: torch.Tensor
        self._length: torch.Tensor
        self._kept: tuple[int, torch.Tensor] | None = None

    def _held(self) -> torch.Tensor:
        return self.entries

    @property
    def length(self) -> int:
        return int(self._length)

    def next_positions(self, t: int) -> torch.Tensor:
        return self._length + torch.arange(t, device=self.entries.device)

    def room(self) -> int | None:
        return self.max_len - self.length

    def bytes_a_token(self) -> float:
        """What each token adds past the window: its share of an entry (and of the indexer's), in bytes."""
        width = self.head_dim + (self.index_dim or 0)
        return width * self.entries.element_size() / self.block

    def check_layer(self, state: Declared, batch: int, t: int) -> None:
        """Refuse, before anything is written, a layer this cache was not built for, or ``t`` tokens it cannot
        take (``state``: the layer's ``layer_state()``)."""
        got = state.block, state.index_dim, state.row_width
        mine = self.block, self.index_dim, self.rows.shape[-1]
        if state.kind != "compressed" or got != mine or state.window != self.window:
            raise TypeError(
                f"this CompressedCache holds blocks of {self.block}, indexer entries of {self.index_dim}, rows of "
                f"{mine[2]} and a window of {self.window}; the layer declares {got} and window "
                f"{state.window}: build its cache from its layer_state() (ModelCache.build)"
            )
        if batch != self.batch_size:
            raise ValueError(f"this cache holds batch_size={self.batch_size}, got a batch of {batch}: build one for it")
        if self.length + t > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {self.length} of max_len={self.max_len} tokens and cannot take {t} "
                f"more; build it with max_len >= {self.length + t}, or crop()/reset() it"
            )

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Refused: a compressed layer writes its tokens, rows and entries together (:meth:`write`)."""
        raise TypeError(
            "a CompressedCache keeps a compressed layer's window, entries and rows together: it is written by "
            "CompressedAttention (write()), not by a layer of keys and values"
        )

    def rows_since(self, start: int) -> torch.Tensor:
        """The projections of tokens start..L-1 (B, L - start, F), from the ring: ``start`` is the open block's
        first token, or the block's before it."""
        held = self.length
        if not max(0, held - self.slots) <= start <= held:
            raise ValueError(f"the ring holds tokens {max(0, held - self.slots)}..{held - 1}, not from {start}")
        slots = torch.arange(start, held, device=self.rows.device) % self.slots
        return self.rows.index_select(1, slots)

    def write(
        self, keys: torch.Tensor, rows: torch.Tensor, entries: torch.Tensor, index: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keep T new tokens: their keys (B, 1, T, D) in the window, their rows (B, T, F) in the ring, and the
        entries they closed (B, n, D) (and the indexer's). Returns the window's keys (B, 1, S, D) with their
        positions (S,), and every closed entry (B, N', D) (and the indexer's): what the layer attends over."""
        held, t = self.length, rows.shape[1]
        first, closed = held // self.block, (held + t) // self.block
        if entries.shape[1] != closed - first or (index is None) != (self.index is None):
            raise ValueError(
                f"tokens {held}..{held + t - 1} close entries {first}..{closed - 1}, got {entries.shape[1]}"
            )
        self.check(keys, keys)
        window_keys, _, positions = self.ring.update(keys, keys)
        last = torch.arange(held + max(0, t - self.slots), held + t, device=rows.device)  # the ring keeps the last C
        self.rows.index_copy_(1, last % self.slots, rows[:, t - last.numel() :])
        self.entries[:, first:closed] = entries
        if self.index is not None and index is not None:
            self.index[:, first:closed] = index
        self._length.add_(t)
        index_all = None if self.index is None else self.index[:, :closed]
        return window_keys, positions, self.entries[:, :closed], index_all

    # ---- going back ----

    def begin(self) -> bool:
        """A pass starts: the length and the ring of rows are kept (entries past the length are never read)."""
        self.ring.begin()
        self._kept = (self.length, self.rows.clone())
        return True

    def undo(self) -> None:
        self.ring.undo()
        if self._kept is not None:
            self._length.fill_(self._kept[0])
            self.rows.copy_(self._kept[1])
        self._kept = None

    def commit(self) -> None:
        self.ring.commit()
        self._kept = None

    def touched(self) -> bool:
        return self._kept is None or self._kept[0] != self.length

    def reach(self, n: int) -> int:
        """``n`` for any of the last ``spare`` tokens: the window's ring and the rows' ring both still hold it."""
        return self.ring.reach(n)

    def crop(self, n: int) -> None:
        """Hold the first ``n`` tokens again: entries past n // block are dropped with the length."""
        self.ring.crop(self.reach(n))
        self._length.fill_(n)

    def reset(self) -> None:
        self.ring.reset()
        self._length.zero_()
