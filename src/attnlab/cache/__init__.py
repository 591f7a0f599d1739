"""KV caches for incremental decoding, behind one small protocol: the cache lab.

``CACHES`` names them: "plain" (``KVCache``, the default), "paged"
(``PagedKVCache``), "prefix" (``PrefixCache``: paged blocks shared by a radix
tree over token ids, at the generation loop), "sink" (``SinkCache``,
StreamingLLM), "int8" and "int4" (``QuantizedKVCache``, KIVI) and "h2o" and
"snapkv" (``EvictingCache``); ``functools.partial`` sets a cache's own knobs
(``partial(CACHES["h2o"], budget=64)``). ``ModelCache.build`` is the one place
that gives each layer its cache, from what the layer declares (``LayerState``:
``attention.layer_state()``) and the name or factory chosen; ``ModelCache.plan``
says what that cache can do before anything is built.
"""

from __future__ import annotations

import torch

from attnlab.cache.base import Cache, Capabilities, LayerCache
from attnlab.cache.evicting import EvictingCache
from attnlab.cache.factories import CACHES, LOSSLESS, CacheFactory, FactoryArgs, cache_factory, cache_name
from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.cache.latent import LatentCache
from attnlab.cache.model import ModelCache, PrefixCache
from attnlab.cache.paged import BlockTable, PagedKVCache
from attnlab.cache.plan import LayerState
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.cache.sink import SinkCache


def stored_bytes(caches: object) -> int:
    """Bytes a cache (a layer's, a list of them, or a model's) holds in its tensors: codes, scales, positions,
    and a block table once however many layers share it."""
    if isinstance(caches, ModelCache):
        return stored_bytes(caches.layers) + (caches.table.nbytes() if caches.table is not None else 0)
    if isinstance(caches, (list, tuple)):
        return sum(stored_bytes(c) for c in caches)
    if isinstance(caches, torch.nn.Module):
        own = caches.table.nbytes() if isinstance(caches, PagedKVCache) and caches.table.layers == 1 else 0
        return own + sum(b.numel() * b.element_size() for b in caches.buffers())
    raise TypeError(f"stored_bytes counts the buffers of attnlab's caches, got {type(caches).__name__}")


def capabilities_of(cache: object) -> Capabilities:
    """What the caches a name or factory makes can do on a layer of keys and values, read off the classes'
    declarations (``ModelCache.plan`` for a model's layers); a factory of one's own declares nothing."""
    return ModelCache.plan([LayerState(kind="full", kv_heads=1, head_dim=1)], cache)  # type: ignore[arg-type]


__all__ = [
    "CACHES",
    "LOSSLESS",
    "BlockTable",
    "Cache",
    "CacheFactory",
    "Capabilities",
    "EvictingCache",
    "FactoryArgs",
    "KVCache",
    "LatentCache",
    "LayerCache",
    "LayerState",
    "ModelCache",
    "PagedKVCache",
    "PrefixCache",
    "QuantizedKVCache",
    "SinkCache",
    "SlidingWindowCache",
    "cache_factory",
    "cache_name",
    "capabilities_of",
    "stored_bytes",
]
