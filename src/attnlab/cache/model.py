"""The model's cache: every layer's cache of one model as one object, which generation plans with.

A model builds it (``GPT.make_caches``) from a cache name or factory; each
layer's cache may be of its own kind (a ring for a sliding-window layer, a
full cache for a global one). What it can do is what every layer can
(:class:`~attnlab.cache.base.Capabilities`, combined once here), so the
decode loop asks it, never its layers' types:

- ``rows``: sequences admitted, run and released on their own (paged
  layers, which then share one :class:`~attnlab.cache.paged.BlockTable`);
- ``crop``: cut back after a speculative pass;
- ``past_context``: runs past the model's context (sinks, with RoPE);
- ``shares_prefixes``: a prompt starts from blocks an earlier one filled, so
  prompts are admitted one a pass (a prefix cache).

:meth:`admit` and :meth:`written` are where a cache that shares prefixes
(:class:`~attnlab.cache.prefix.PrefixCache`) takes and remembers blocks; here
they do nothing else. A ``ModelCache`` is a sequence of its layers' caches
(``cache[0]``, ``len(cache)``), which is what the model's forward walks.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator

from attnlab.cache.base import Cache, Capabilities
from attnlab.cache.paged import BlockTable, PagedKVCache


class ModelCache:
    """Every layer's cache; the paged ones share one block table.

    Args:
        layers: one cache per layer, in order.
    """

    def __init__(self, layers: list[Cache]) -> None:
        if not isinstance(layers, list) or not layers or not all(isinstance(c, Cache) for c in layers):
            raise TypeError("layers must be a non-empty list of caches, one per layer (make them with make_caches)")
        self.layers = layers
        self.capabilities: Capabilities = functools.reduce(operator.and_, (c.capabilities for c in layers))
        paged = [c for c in layers if isinstance(c, PagedKVCache)]
        self.table: BlockTable | None = paged[0].table if paged else None
        for layer in paged[1:]:  # every layer allocates the same ids: one table, one refcount, one free queue
            layer.share(paged[0].table)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Cache:
        return self.layers[layer]

    def __iter__(self) -> Iterator[Cache]:
        return iter(self.layers)

    @property
    def batch_size(self) -> int:
        return int(getattr(self.layers[0], "batch_size", 0))

    def views(self, rows: list[int]) -> list[Cache]:
        """The layers' caches for sequences ``rows`` (all of them, in order, for a cache without ``rows``)."""
        if rows == list(range(self.batch_size)):
            return self.layers
        if not self.capabilities.rows:
            raise ValueError(
                f"this cache runs its {self.batch_size} sequences together; rows {rows} alone need a paged cache"
            )
        return [layer.rows(rows) for layer in self.layers if isinstance(layer, PagedKVCache)]

    def room(self) -> int | None:
        """Tokens the next call may bring (None: any that fit): the least any layer takes."""
        rooms = [r for r in (layer.room() for layer in self.layers) if r is not None]
        return min(rooms) if rooms else None

    def crop(self, n: int) -> None:
        """Keep every layer's first ``n`` tokens (a speculative pass's refused guesses go)."""
        if not self.capabilities.crop:
            raise ValueError("this cache cannot be cropped back; speculative decoding needs the plain cache")
        for layer in self.layers:
            layer.crop(n)  # type: ignore[attr-defined]  # capabilities.crop: every layer has it

    def admit(self, row: int, tokens: list[int], *, total: int) -> int:
        """Sequence ``row`` starts on ``tokens`` and will hold ``total``; how many it holds already (0 here)."""
        if self.table is not None:
            self.table.release(row)
        return 0

    def written(self, row: int, tokens: list[int]) -> None:
        """Sequence ``row`` now holds ``tokens`` (a prefix cache remembers their full blocks)."""

    def release(self, row: int) -> None:
        """Sequence ``row`` is done: its blocks go back (a cache without rows keeps its batch whole)."""
        if self.table is not None:
            self.table.release(row)

    def abort(self) -> None:
        """A forward failed between layers: a paged write planned but not made by every layer is undone."""
        if self.table is not None:
            self.table.abort()
