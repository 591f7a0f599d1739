"""KV caches for incremental decoding."""

from attnlab.cache.kv import KVCache, SlidingWindowCache

__all__ = ["KVCache", "SlidingWindowCache"]
