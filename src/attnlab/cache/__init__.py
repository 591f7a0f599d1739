"""KV caches for incremental decoding, behind one small protocol."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from attnlab.cache.kv import KVCache, SlidingWindowCache


@runtime_checkable
class Cache(Protocol):
    """What ``attnlab.Attention`` asks of a cache, and all it asks.

    ``next_positions(t)``: absolute positions (T,) of the next ``t`` tokens.
    ``update(k, v)``: check k, v (B, Hkv, T, D) and raise before writing
    anything if they do not fit; then store them and return the keys and
    values to attend over, (B, Hkv, S, D), with each one's absolute position
    (S,), -1 for a slot that holds nothing.
    """

    def next_positions(self, t: int) -> torch.Tensor: ...

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


__all__ = ["Cache", "KVCache", "SlidingWindowCache"]
