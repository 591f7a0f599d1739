"""A model call that fails halfway leaves every layer's cache as it was: what ``ModelCache`` does around each call.

A call writes each layer's cache in turn; one that fails between layers (an error a later layer raises, Ctrl-C)
would leave the earlier layers a call ahead of the later ones. :func:`passing` wraps each model call
(``GPT.forward`` on a model cache: a user's own loop; the decode loop releases a kept cache's rows instead): :meth:`Undoing.begin` asks every layer to keep
what it needs to come back (``LayerCache.begin``: cheaply, as it writes), :meth:`Undoing.commit` lets it go, and
:meth:`Undoing.abort` puts it back. A layer that cannot come back (a sink or int8/int4 cache: their writes reshape
what they hold) and wrote leaves the model cache refusing the next call by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from attnlab.cache.base import Cache, LayerCache
from attnlab.cache.blocks import BlockTable


class ByLength:
    """For a layer cache whose writes go past its length, in place (what is past it is overwritten by the next):
    the length when a call began is all its undo needs. Its own ``begin`` says whether it can (``keep_length``)."""

    _length: torch.Tensor
    _begun: torch.Tensor | None = None

    def keep_length(self) -> None:
        self._begun = self._length.clone()

    def touched(self) -> bool:
        """Whether it wrote since the call began (for one that cannot undo: sink, int8/int4)."""
        return self._begun is None or not torch.equal(self._length, self._begun)

    def undo(self) -> None:
        if self._begun is not None:
            self._length.copy_(self._begun)
        self.commit()

    def commit(self) -> None:
        self._begun = None


class Undoing:
    """What a model cache does around each call: ``layers`` (its layers' caches), ``table`` (its block table)."""

    layers: list[Cache]
    table: BlockTable | None

    broken: str | None = None  # why a failed pass left this cache unusable (a layer that could not undo)
    _begun: list[bool] | None = None  # per layer, whether it can undo the pass begun (None: no pass open)

    def begin(self) -> None:
        """A model call starts: every layer keeps what it needs to come back here (``LayerCache.begin``). Refused
        on a cache a failed call left halfway through a layer that could not undo."""
        if self.broken is not None:
            raise ValueError(self.broken)
        self._begun = [layer.begin() if isinstance(layer, LayerCache) else False for layer in self.layers]

    def commit(self) -> None:
        """The call ended whole: what the layers kept to undo it goes."""
        for layer in self.layers if self._begun is not None else ():
            if isinstance(layer, LayerCache):
                layer.commit()
        self._begun = None

    def abort(self) -> None:
        """A call failed (between layers, or Ctrl-C): every layer goes back to how :meth:`begin` found it, bitwise
        (a paged write not every layer made is undone by the block table). A layer that cannot undo (sink,
        int8/int4: their writes reshape what they hold) and wrote leaves the cache refusing to go on."""
        if self.table is not None:
            self.table.abort()
        begun, self._begun = self._begun, None
        if begun is None:
            return
        for layer, can in zip(self.layers, begun, strict=True):
            if can:
                layer.undo()  # type: ignore[attr-defined]  # begin said so: a LayerCache
        stuck = [
            type(layer).__name__
            for layer, can in zip(self.layers, begun, strict=True)
            if not can and (not isinstance(layer, LayerCache) or layer.touched())
        ]
        if stuck:
            self.broken = (
                f"a call failed halfway through this cache, and its {stuck[0]} layers cannot undo what they wrote "
                "before the failure: build a new cache (make_caches) or use one that can ('plain', 'paged')"
            )


@contextlib.contextmanager
def passing(cache: object) -> Iterator[None]:
    """One model call on ``cache`` (a ``ModelCache``; anything else passes through): begun, committed when it
    ends whole, aborted when it raises (Ctrl-C too), so that a call that fails leaves every layer as it was."""
    if not isinstance(cache, Undoing):
        yield
        return
    cache.begin()
    try:
        yield
    except BaseException:
        cache.abort()
        raise
    cache.commit()
