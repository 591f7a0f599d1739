"""The model's cache: every layer's cache of one model as one object, which generation plans with.

:meth:`ModelCache.build` is the one place that turns what each layer declares
(:class:`~attnlab.cache.plan.LayerState`: ``attention.layer_state()``) and the
user's cache choice (a name in ``CACHES`` or a factory) into layer caches, by
one table (``attnlab.cache.plan.TABLE``): a ring for a sliding-window layer, a
state for a recurrent one, a latent cache for MLA, the named cache for the
layers of keys and values; one block table for every paged layer; a prefix
tree for "prefix". :meth:`ModelCache.plan` answers what such a cache can do,
and refuses what cannot be built, without building anything. What it can do
is what every layer can (:class:`~attnlab.cache.base.Capabilities`, declared
by the classes, combined once here), so the decode loop asks it, never its
layers' types:

- ``rows``: sequences admitted, run and released on their own (paged
  layers, which then share one :class:`~attnlab.cache.paged.BlockTable`);
- ``crop``: go back after a speculative pass (:meth:`mark` before it, :meth:`crop` after: a ring to any of its
  spare tokens, a recurrent state to its mark, whose kept tokens run again);
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
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from attnlab._checks import check_positive_int
from attnlab.cache.base import Cache, Capabilities, LayerCache
from attnlab.cache.factories import CACHES, CacheFactory, cache_name
from attnlab.cache.kv import SlidingWindowCache
from attnlab.cache.paged import BlockTable, PagedKVCache
from attnlab.cache.plan import LayerState, choose, sizes_for
from attnlab.cache.prefix import PrefixTree
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.cache.row_states import RowStates
from attnlab.cache.undo import Undoing


def combined(classes: Sequence[Any], *, shares_prefixes: bool = False) -> Capabilities:
    """What a model cache of layers of these cache classes can do, read off their declarations (a prefix cache
    also shares prefixes). Past the context: a layer that keeps its own memory (a window's ring, a recurrent
    state) runs on past any length, so the other layers decide (Gemma 3 with a sink cache on its global layers)."""
    together: Capabilities = functools.reduce(operator.and_, (cls.capabilities for cls in classes))
    named = [
        cls.capabilities.past_context for cls in classes if not (issubclass(cls, LayerCache) and cls.keeps_its_own)
    ]
    together = replace(together, past_context=bool(named) and all(named))
    return replace(together, shares_prefixes=True) if shares_prefixes else together


def why_no_crop(caches: Sequence[Any]) -> str:
    """Why the first of ``caches`` (layer caches, or the classes a plan chose) that cannot go back cannot, as its
    class declares."""
    refusing = next(c for c in caches if not c.capabilities.crop)
    cls = refusing if isinstance(refusing, type) else type(refusing)
    why = cls.why_no_crop if issubclass(cls, LayerCache) else "a cache of one's own declares nothing"
    article = "an" if cls.__name__[0] in "AEIOU" else "a"
    return f"{article} {cls.__name__} cannot: {why}"


class ModelCache(Undoing):
    """Every layer's cache; the paged ones share one block table.

    Args:
        layers: one cache per layer, in order (:meth:`build` makes them).
    """

    shares_prefixes: ClassVar[bool] = False  # declared: a prefix cache's prompts start from earlier ones' blocks

    def __init__(self, layers: list[Cache]) -> None:
        if not isinstance(layers, list) or not layers or not all(isinstance(c, Cache) for c in layers):
            raise TypeError("layers must be a non-empty list of caches, one per layer (make them with make_caches)")
        self.layers = layers
        self.capabilities = combined([type(c) for c in layers], shares_prefixes=self.shares_prefixes)
        paged = [c for c in layers if isinstance(c, PagedKVCache)]
        self.states = [c for c in layers if isinstance(c, RowStates)]  # a state per row, written through the table
        self.table: BlockTable | None = paged[0].table if paged else self.states[0].table if self.states else None
        for layer in paged[1:]:  # caches made by hand: every layer then writes through the first one's table
            layer.share(paged[0].table)
        if any(state.table is not self.table for state in self.states):
            raise ValueError(
                "a model cache's row states write through its one block table: build it with ModelCache.build"
            )

    @staticmethod
    def plan(layers: Sequence[LayerState], cache: str | CacheFactory = "plain") -> Capabilities:
        """What the model cache :meth:`build` would make can do, read off the classes' declarations; what the
        table refuses is refused here (``ValueError``, with the reason), and nothing is allocated (a cache's own
        knobs are checked when it is built).

        A factory of the user's own declares nothing, so a layer given one is planned as capable of nothing
        (build it and read its ``capabilities``)."""
        sharing = _KINDS.get(cache_name(cache) or "", ModelCache).shares_prefixes
        chosen = choose(layers, cache)
        return combined([c.cls for c in chosen], shares_prefixes=sharing)

    @staticmethod
    def build(
        layers: Sequence[LayerState],
        cache: str | CacheFactory = "plain",
        *,
        rows: int,
        capacity: int,
        context_length: int | None = None,
        spare: int = 0,
    ) -> ModelCache:
        """The model cache for ``layers`` (each layer's declared state, in order) and the user's ``cache``.

        Args:
            layers: ``[attention.layer_state() for each layer]``.
            cache: a name in ``attnlab.cache.CACHES`` (with its knobs: ``partial(CACHES["h2o"], budget=64)``), or
                a factory of one's own taking ``attnlab.cache.FactoryArgs``. A sliding layer keeps its window's
                ring and a recurrent layer its state whichever of attnlab's caches is named; a latent layer
                keeps its latent cache (plain, int8, int4). "prefix" makes a :class:`PrefixCache`.
            rows: sequences it holds at once.
            capacity: the most tokens one sequence will hold (prompt and new ones).
            context_length: what the model was trained on (a sink cache's window is sized by it).
            spare: the most tokens a speculative pass may go back by (a sliding layer's ring keeps that many slots
                more, so its window is whole after any of them is refused): the guesses of a pass, plus one.

        Raises:
            ValueError: a name that applies to no layer, or to a layer that cannot keep it, with the reason.

        One layer alone: ``ModelCache.build([attn.layer_state()], rows=1, capacity=64)[0]``.
        """
        check_positive_int("rows", rows, limit=2**20)
        check_positive_int("capacity", capacity, limit=2**27)
        chosen = choose(layers, cache)
        sizes = sizes_for(layers, chosen, cache, rows=rows, capacity=capacity, context=context_length, spare=spare)
        for state, choice in zip(layers, chosen, strict=True):
            sizes.made.append(choice.make(state, sizes))
        return _KINDS.get(cache_name(cache) or "", ModelCache)(sizes.made)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Cache:
        return self.layers[layer]

    def __iter__(self) -> Iterator[Cache]:
        return iter(self.layers)

    @property
    def batch_size(self) -> int:
        first = self.layers[0]  # a cache of one's own (the Cache protocol) need not say
        return first.batch_size if isinstance(first, LayerCache) else 0

    def views(self, rows: list[int]) -> list[Cache]:
        """The layers' caches for sequences ``rows`` (all of them, in order, for a cache without ``rows``)."""
        if rows == list(range(self.batch_size)):
            return self.layers
        if not self.capabilities.rows:
            raise ValueError(
                f"this cache runs its {self.batch_size} sequences together; rows {rows} alone need a paged cache"
            )
        return [layer.rows(rows) for layer in self.layers]  # type: ignore[attr-defined]  # capabilities.rows: all have it

    def room(self) -> int | None:
        """Tokens the next call may bring (None: any that fit): the least any layer takes."""
        rooms = [r for r in (layer.room() for layer in self.layers) if r is not None]
        return min(rooms) if rooms else None

    def mark(self) -> None:
        """A pass whose last tokens may be refused starts here: each layer that goes back to a mark keeps one."""
        for layer in self.layers:
            if isinstance(layer, LayerCache):
                layer.mark()

    def room_back(self) -> int | None:
        """The fewest tokens any layer can go back by (a ring's or a quantized cache's spare slots); None: any."""
        rooms = [layer.spare for layer in self.layers if isinstance(layer, SlidingWindowCache | QuantizedKVCache)]
        return min(rooms) if rooms else None

    def crop(self, n: int) -> int:
        """Go back to the first ``n`` tokens, or as near before as every layer can (a recurrent state: its mark);
        how many every layer holds now. Checked whole before any layer changes; the tokens between run again."""
        if not self.capabilities.crop:
            raise ValueError(f"this cache cannot go back to an earlier token: {why_no_crop(self.layers)}")
        if self.capabilities.rows:
            raise ValueError("this cache's rows run on their own and go back one by one: crop_row(row, n)")
        to = min(layer.reach(n) for layer in self.layers)  # type: ignore[attr-defined]  # capabilities.crop: all do
        for layer in self.layers:
            layer.crop(to)  # type: ignore[attr-defined]
        return to

    def crop_row(self, row: int, n: int) -> int:
        """Sequence ``row`` (of a cache whose rows run on their own) goes back to its first ``n`` tokens, or as near
        before as every layer can (a state per row: its mark); how many it holds now. Checked whole first."""
        if self.table is None or not self.capabilities.rows:
            raise ValueError("crop_row is for a cache whose rows run on their own (paged, prefix): use crop(n)")
        if not self.capabilities.crop:
            raise ValueError(f"this cache cannot go back to an earlier token: {why_no_crop(self.layers)}")
        to = min([n, *(state.reach_row(row, n) for state in self.states)])
        for state in self.states:  # before the table moves: they read the row's length in it
            state.crop_row(row, to)
        self.table.crop(row, to)
        return to

    def admit(self, row: int, tokens: list[int], *, total: int) -> int:
        """Sequence ``row`` starts on ``tokens`` and will hold ``total``; how many it holds already (0 here)."""
        self.release(row)
        return 0

    def stops(self, row: int, t: int) -> list[int]:
        """Where ``t`` tokens fed to sequence ``row`` must end a call before their end (none here): a prefix cache
        keeps a recurrent state only where a call ends, at each block's end."""
        return []

    def written(self, row: int, tokens: list[int]) -> None:
        """Sequence ``row`` now holds ``tokens`` (a prefix cache remembers their full blocks)."""

    def release(self, row: int) -> None:
        """Sequence ``row`` is done: its blocks go back (a cache without rows keeps its batch whole)."""
        if self.table is not None:
            self.table.release(row)
        for state in self.states:
            state.release(row)


class PrefixCache(PrefixTree, ModelCache):
    """Paged layers sharing one block table, and a radix tree over token ids that lets prompts share full blocks
    (``attnlab.cache.prefix``). ``ModelCache.build(..., "prefix", ...)`` makes one.

    Args:
        layers: one ``PagedKVCache`` per layer, all of one shape, sharing one block table.
    """

    shares_prefixes = True

    def __init__(self, layers: list[Cache]) -> None:
        ModelCache.__init__(self, layers)
        if self.table is None or not self.capabilities.rows:
            raise TypeError(
                "a PrefixCache's layers must all have rows of their own, written through one block table (paged "
                "keys, a state per row): build it with ModelCache.build(..., 'prefix', ...)"
            )
        self.grow(self.table)

    def resumes_at(self, block: int) -> bool:
        """A prompt may start after ``block`` when every row-state layer kept its state at that block's end."""
        return all(state.has(block) for state in self.states)

    def kept_at(self, row: int, depth: int, block: int) -> None:
        """The tree holds sequence ``row``'s block ``depth`` as ``block``: each row-state layer's state there with it."""
        for state in self.states:
            state.keep(row, depth, block)

    def admit(self, row: int, tokens: list[int], *, total: int | None = None) -> int:
        reused = PrefixTree.admit(self, row, tokens, total=total)
        for state in self.states if reused else ():  # the state after the last block taken
            state.resume(row, self.blocks.held[row][-1])
        return reused

    def release(self, row: int) -> None:
        PrefixTree.release(self, row)
        for state in self.states:
            state.release(row)

    def stops(self, row: int, t: int) -> list[int]:
        """Each block's end among ``t`` tokens fed to sequence ``row`` (with row-state layers: their states are
        kept where a call ends), as counts of the tokens fed before it."""
        if not self.states:
            return []
        held, size = self.blocks.length[row], self.block_size
        return list(range(size - held % size, t, size))

    def kept_nbytes(self) -> int:
        """Bytes of recurrent and convolution states kept at block ends (what resuming after a block costs)."""
        return sum(state.kept_nbytes() for state in self.states)

    @classmethod
    def for_model(cls, model: Any, *, batch_size: int, max_len: int, num_blocks: int | None = None) -> PrefixCache:
        """A prefix cache for every layer of ``model`` (anything with ``make_caches``): ``batch_size`` sequences at
        once, each up to ``max_len`` tokens, ``num_blocks`` blocks (default: room for twice what the rows can
        hold, the rest kept for prefixes)."""
        check_positive_int("batch_size", batch_size, limit=4096)
        check_positive_int("max_len", max_len, limit=2**27)
        if num_blocks is not None:
            check_positive_int("num_blocks", num_blocks, limit=2**24)
        given = CACHES["prefix"] if num_blocks is None else functools.partial(CACHES["prefix"], num_blocks=num_blocks)
        made = model.make_caches(batch_size=batch_size, max_len=max_len, cache=given)
        assert isinstance(made, PrefixCache)  # the "prefix" name builds one
        return made


_KINDS: dict[str, type[ModelCache]] = {"prefix": PrefixCache}  # the model caches a name makes (default ModelCache)
