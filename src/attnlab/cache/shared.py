"""KV sharing: a layer that keeps nothing and attends over an earlier layer's keys and values (Gemma 4).

Gemma 4's last ``num_kv_shared_layers`` layers compute no keys or values: each reads those of the last earlier
layer of its type (``GPTConfig.kv_source``), so the cache of those layers is the earlier layer's, counted once.
The keys reach the later layer inside one forward (``Attention``'s ``shared``); its own cache, a
:class:`SharedCache`, holds nothing, and answers for positions, room and cropping with its source's cache, the
one :meth:`attnlab.cache.ModelCache.build` hands it. Whatever the source keeps (its window's ring, paged blocks,
int8 codes), the later layer reads it as its source attended over it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnlab.cache.base import Cache, Capabilities, LayerCache


class SharedCache(LayerCache):
    """The cache of a layer that reads layer ``source``'s keys and values: it holds nothing of its own.

    Args:
        source: the source layer's index (as ``LayerState.source`` names it).
        of: the source layer's cache.
    """

    # what it can do is what its source can: planned as capable of all, so the source decides alone
    capabilities: ClassVar[Capabilities] = Capabilities(crop=True, rows=True, past_context=True, shares_prefixes=True)
    keeps_its_own = True  # no named cache changes it: it holds nothing

    def __init__(self, *, source: int, of: Cache) -> None:
        torch.nn.Module.__init__(self)  # nothing of a shape to check: it holds no tensor
        if not isinstance(of, Cache) or isinstance(of, SharedCache):
            raise TypeError(f"a shared layer reads the cache of a layer that computes keys, got {type(of).__name__}")
        self.source = source
        self._of = (of,)  # not a submodule: its buffers are its source's, counted there once

    @property
    def of(self) -> Cache:
        """The source layer's cache."""
        return self._of[0]

    def next_positions(self, t: int) -> torch.Tensor:
        """The positions its source's next ``t`` tokens get: the same tokens."""
        return self.of.next_positions(t)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise ValueError(
            f"this layer keeps no keys of its own: it reads layer {self.source}'s (KV sharing), which its model "
            "hands it in the same forward"
        )

    def room(self) -> int | None:
        return None  # its source answers for the tokens

    def crop(self, n: int) -> None:
        """Nothing to cut back: its source is cropped as a layer of its own."""

    def begin(self) -> bool:
        """Nothing of its own to undo: its source undoes its writes."""
        return True

    def rows(self, rows: list[int]) -> SharedCache:
        """Sequences ``rows`` of its source (a paged source's view: asked only when every layer has rows)."""
        return SharedCache(source=self.source, of=self.of.rows(rows))  # type: ignore[attr-defined]

    def extra_repr(self) -> str:
        return f"source={self.source}"
