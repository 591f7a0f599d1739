"""KV caches for incremental decoding, behind one small protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.cache.paged import PagedKVCache


@runtime_checkable
class Cache(Protocol):
    """What ``attnlab.Attention`` asks of a cache, and all it asks.

    ``next_positions(t)``: absolute positions (T,) of the next ``t`` tokens,
    or (B, T) for a cache whose sequences have lengths of their own.
    ``update(k, v)``: check k, v (B, Hkv, T, D) and raise before writing
    anything if they do not fit; then store them and return the keys and
    values to attend over, (B, Hkv, S, D), with each one's absolute position
    (S,) or (B, S), -1 for a slot that holds nothing.
    """

    def next_positions(self, t: int) -> torch.Tensor: ...

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def plain(
    *,
    batch_size: int,
    num_kv_heads: int,
    head_dim: int,
    max_len: int,
    window: int | None,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> Cache:
    """The static cache (a ring buffer of ``window`` positions for a windowed layer)."""
    if window is not None:
        return SlidingWindowCache(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            window=window,
            dtype=dtype,
            device=device,
        )
    return KVCache(
        batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, max_len=max_len, dtype=dtype, device=device
    )


def paged(
    *,
    batch_size: int,
    num_kv_heads: int,
    head_dim: int,
    max_len: int,
    window: int | None,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> Cache:
    """A paged cache with blocks enough for every sequence to reach ``max_len`` (16 tokens a block)."""
    if window is not None:
        raise ValueError(
            f"the paged cache keeps every token; a layer with window={window} needs the 'plain' cache (a ring buffer)"
        )
    blocks = batch_size * -(-max_len // 16)
    return PagedKVCache(
        batch_size=batch_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_blocks=blocks,
        max_len=max_len,
        dtype=dtype,
        device=device,
    )


CacheFactory = Callable[..., Any]  # (batch_size, num_kv_heads, head_dim, max_len, window, dtype, device) -> Cache
CACHES: dict[str, CacheFactory] = {"plain": plain, "paged": paged}


def cache_factory(cache: object) -> CacheFactory:
    """A factory by name ("plain", "paged"), or a factory given as is."""
    if isinstance(cache, str):
        if cache not in CACHES:
            raise ValueError(f"unknown cache {cache!r}; the caches are {list(CACHES)}, or pass a factory")
        return CACHES[cache]
    if not callable(cache):
        raise TypeError(f"cache must be a name among {list(CACHES)} or a factory, got {type(cache).__name__}")
    return cache


__all__ = ["CACHES", "Cache", "CacheFactory", "KVCache", "PagedKVCache", "SlidingWindowCache", "cache_factory"]
