"""The named caches: ``CACHES`` maps each name to the factory that builds one layer's cache of it.

"plain" (``KVCache``, the default), "paged" (``PagedKVCache``), "prefix"
(paged layers under a radix tree over token ids: ``PrefixCache``), "sink"
(``SinkCache``, StreamingLLM), "int8" and "int4" (``QuantizedKVCache``, KIVI)
and "h2o" and "snapkv" (``EvictingCache``). ``functools.partial`` sets a
cache's own knobs (``partial(CACHES["h2o"], budget=64)``). Which layer gets
which is decided in one place, ``attnlab.cache.ModelCache.build``, which
calls these with :class:`FactoryArgs`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypedDict

import torch

from attnlab.cache.base import Cache
from attnlab.cache.evicting import EvictingCache
from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.cache.paged import BlockTable, PagedKVCache
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.cache.sink import SinkCache


class FactoryArgs(TypedDict):
    """What ``ModelCache.build`` passes every cache factory: the layer's shape, and what some caches need."""

    batch_size: int
    num_kv_heads: int
    head_dim: int
    value_dim: int  # a value head's size: head_dim, or its own (MiMo-V2-Flash)
    max_len: int  # the most tokens one sequence will hold (prompt and new ones)
    window: int | None  # the layer's sliding window
    dtype: torch.dtype
    device: torch.device | str | None
    rotary: Any  # the layer's RotaryEmbedding, or None (a sink cache rotates its sinks with it)
    context_length: int | None  # what the model was trained on, when a model asks (None for a bare layer)


def _no_window(name: str, window: int | None) -> None:
    if window is not None:
        raise ValueError(
            f"the {name} cache does not keep a sliding window's ring; a layer with window={window} needs "
            "the 'plain' cache (a ring buffer of the window)"
        )


def _same_width(name: str, kw: dict[str, Any]) -> None:
    if kw.get("value_dim", kw["head_dim"]) != kw["head_dim"]:
        raise ValueError(
            f"the {name} cache keeps values as wide as keys; this layer's values are {kw['value_dim']} wide beside "
            f"keys of {kw['head_dim']} (MiMo-V2-Flash's): use the 'plain' or 'paged' cache"
        )


def plain(**kw: Any) -> Cache:
    """The static cache (a ring buffer of ``window`` positions for a windowed layer)."""
    shape = dict(batch_size=kw["batch_size"], num_kv_heads=kw["num_kv_heads"], head_dim=kw["head_dim"])
    shape["value_dim"] = kw.get("value_dim", kw["head_dim"])
    if kw["window"] is not None:
        return SlidingWindowCache(**shape, window=kw["window"], dtype=kw["dtype"], device=kw["device"])
    return KVCache(**shape, max_len=kw["max_len"], dtype=kw["dtype"], device=kw["device"])


def paged(*, num_blocks: int | None = None, table: BlockTable | None = None, **kw: Any) -> Cache:
    """A paged cache, 16 tokens a block, with ``num_blocks`` (default: enough for every sequence to reach max_len),
    writing through ``table`` (the one every paged layer of a model shares; default: a table of its own)."""
    _no_window("paged", kw["window"])
    blocks = kw["batch_size"] * -(-kw["max_len"] // 16) if num_blocks is None else num_blocks
    return PagedKVCache(
        batch_size=kw["batch_size"],
        num_kv_heads=kw["num_kv_heads"],
        head_dim=kw["head_dim"],
        num_blocks=blocks if table is None else table.num_blocks,
        max_len=kw["max_len"],
        table=table,
        dtype=kw["dtype"],
        device=kw["device"],
        value_dim=kw.get("value_dim", kw["head_dim"]),
    )


def prefix(*, num_blocks: int | None = None, **kw: Any) -> Cache:
    """Not a layer's cache: prefix sharing needs the token ids, which a layer never sees. ``ModelCache.build``
    reads the name (and ``num_blocks``: default, room for twice what the rows can hold) and builds a
    ``PrefixCache`` of paged layers."""
    raise ValueError(
        "the 'prefix' cache shares blocks by token ids, which a layer's cache never sees: build the model's cache "
        "with ModelCache.build(..., 'prefix', ...) (GPT.make_caches, GPT.generate(..., cache='prefix'), "
        "generate_many, or attnlab.cache.PrefixCache.for_model(model, ...))"
    )


def sink(*, sinks: int = 4, recent: int | None = None, **kw: Any) -> Cache:
    """StreamingLLM: ``sinks`` first tokens and the latest ``recent`` (default: context_length - sinks for a
    model, so that no distance exceeds what it was trained on; max_len - sinks for a bare layer)."""
    _no_window("sink", kw["window"])
    _same_width("sink", kw)
    span = kw["context_length"] if kw["context_length"] is not None else kw["max_len"]
    recent = recent if recent is not None else max(1, span - sinks)
    return SinkCache(
        batch_size=kw["batch_size"],
        num_kv_heads=kw["num_kv_heads"],
        head_dim=kw["head_dim"],
        sinks=sinks,
        recent=recent,
        rotary=kw["rotary"],
        dtype=kw["dtype"],
        device=kw["device"],
    )


def quantized(*, bits: int = 8, group_size: int = 32, residual: int = 32, spare: int = 0, **kw: Any) -> Cache:
    """KIVI-style: keys per channel and values per token in ``bits`` bits, the latest ``residual`` tokens exact
    (``spare``: exact slots more, so that a speculative pass goes back by that many; ``ModelCache.build`` sets it)."""
    _no_window(f"int{bits}", kw["window"])
    _same_width(f"int{bits}", kw)
    return QuantizedKVCache(
        batch_size=kw["batch_size"],
        num_kv_heads=kw["num_kv_heads"],
        head_dim=kw["head_dim"],
        max_len=kw["max_len"],
        bits=bits,
        group_size=group_size,
        residual=residual,
        spare=spare,
        dtype=kw["dtype"],
        device=kw["device"],
    )


def evicting(*, policy: str = "h2o", budget: int | float = 0.5, **kw: Any) -> Cache:
    """H2O or SnapKV keeping ``budget`` tokens: an int, or a fraction of max_len (default half)."""
    if kw["window"] is not None:  # a band (Mistral's window, gpt-oss's and Gemma 3's local layers)
        raise ValueError(band_refusal(policy, kw["window"]))
    _same_width(policy, kw)
    if isinstance(budget, float):
        if not 0 < budget < 1:
            raise ValueError(f"a fractional budget must lie in (0, 1), got {budget}")
    kept = max(2, round(budget * kw["max_len"])) if isinstance(budget, float) else budget
    return EvictingCache(
        batch_size=kw["batch_size"],
        num_kv_heads=kw["num_kv_heads"],
        head_dim=kw["head_dim"],
        budget=kept,
        policy=policy,
        dtype=kw["dtype"],
        device=kw["device"],
    )


def band_refusal(policy: str, window: int) -> str:
    return (
        f"evicting from a band is refused: a layer with window={window} holds only its last {window} positions "
        f"already, every one of which the model was trained to see, so {policy} could only drop keys inside the "
        "band; give it the 'plain' cache (the ring of its window: a model does so for its sliding layers and evicts "
        "from its full ones)"
    )


CacheFactory = Callable[..., Any]  # keyword arguments: FactoryArgs -> Cache
CACHES: dict[str, CacheFactory] = {
    "plain": plain,
    "paged": paged,
    "prefix": prefix,
    "sink": sink,
    "int8": functools.partial(quantized, bits=8),
    "int4": functools.partial(quantized, bits=4),
    "h2o": functools.partial(evicting, policy="h2o"),
    "snapkv": functools.partial(evicting, policy="snapkv"),
}
LOSSLESS = ("plain", "paged", "prefix")  # token-identical to KVCache, asserted by the benchmark


def cache_name(cache: object) -> str | None:
    """The name in ``CACHES`` of one of attnlab's caches: the name itself, its factory, or its factory with knobs
    set (``functools.partial(CACHES["h2o"], budget=64)`` is "h2o"); None for a factory of the user's own."""
    if isinstance(cache, str):
        return cache
    given, knobs = _root(cache)  # functools.partial flattens a partial of a partial: compare roots and knobs
    for name, factory in CACHES.items():
        root, fixed = _root(factory)
        if given is root and all(knobs.get(k) == v for k, v in fixed.items()):
            return name
    return None


def knobs_of(cache: object) -> dict[str, Any]:
    """The knobs a user set on a named cache (``partial(CACHES["int8"], group_size=8)``: group_size), without
    those its name fixes (int8's bits)."""
    name = cache_name(cache)
    _, knobs = _root(cache)
    fixed = _root(CACHES[name])[1] if name is not None else {}
    return {k: v for k, v in knobs.items() if k not in fixed}


def _root(factory: object) -> tuple[object, dict[str, Any]]:
    if isinstance(factory, functools.partial):
        return factory.func, dict(factory.keywords)
    return factory, {}


def cache_factory(cache: object) -> CacheFactory:
    """A factory by name (``CACHES``), or a factory given as is."""
    if isinstance(cache, str):
        if cache not in CACHES:
            raise ValueError(f"unknown cache {cache!r}; the caches are {list(CACHES)}, or pass a factory")
        return CACHES[cache]
    if not callable(cache):
        raise TypeError(f"cache must be a name among {list(CACHES)} or a factory, got {type(cache).__name__}")
    return cache
