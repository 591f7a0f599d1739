"""KV caches: keep past keys and values so a decode step computes only the new token's.

:class:`KVCache` preallocates (B, Hkv, max_len, D) buffers and writes each
step in place: no torch.cat, so a step costs the same at position 10 and
10,000 (the book's cache concatenates, copying everything every step).
:class:`SlidingWindowCache` keeps only the last ``window`` positions in a
ring buffer, for sliding-window attention.

Both are used through ``attnlab.Attention(..., cache=cache)``; ``update``
returns the keys and values attention should see, in position order, and
their absolute positions. Caches are for inference: use them under
``torch.no_grad()`` (or ``torch.inference_mode()``).

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, L = cached length.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.book._checks import check_positive_int


class _CacheBase(nn.Module):
    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str | None,
    ) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        if not dtype.is_floating_point:
            raise TypeError(f"cache dtype must be floating point, got {dtype}")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.k_cache: torch.Tensor
        self.v_cache: torch.Tensor
        self.length = 0  # positions seen so far

    def check(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Refuse keys/values that do not fit this cache, naming both sides."""
        for name, t in (("keys", k), ("values", v)):
            if t.dim() != 4:
                raise ValueError(f"{name} must be (batch, kv_heads, T, head_dim), got shape {tuple(t.shape)}")
            if t.shape[0] != self.batch_size:
                raise ValueError(
                    f"this cache was built for batch_size={self.batch_size}, got {name} for a batch of {t.shape[0]}; "
                    "a cache holds one batch (reset() keeps its size): build a new cache for this batch"
                )
            if (t.shape[1], t.shape[3]) != (self.num_kv_heads, self.head_dim):
                raise ValueError(
                    f"this cache holds num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}; got {name} with "
                    f"{t.shape[1]} heads of head_dim {t.shape[3]}; build it with the model's make_cache()"
                )
            if t.dtype != self.k_cache.dtype:
                raise TypeError(
                    f"{name} are {t.dtype} but the cache holds {self.k_cache.dtype}; build it with dtype={t.dtype}"
                )
            if t.device != self.k_cache.device:
                raise ValueError(
                    f"{name} are on {t.device} but the cache is on {self.k_cache.device}; use cache.to({t.device})"
                )

    def next_positions(self, t: int) -> torch.Tensor:
        """Absolute positions of the next ``t`` tokens: L, L+1, ..., L+t-1."""
        return torch.arange(self.length, self.length + t, device=self.k_cache.device)

    def reset(self) -> None:
        """Forget everything; the buffers are kept (and overwritten)."""
        self.length = 0


class KVCache(_CacheBase):
    """A static cache of up to ``max_len`` positions, written in place.

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores (kv heads only under GQA).
        max_len: positions it can hold; one more raises.
        dtype, device: of the buffers; follow the model.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("max_len", max_len)
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=max_len,
            dtype=dtype,
            device=device,
        )
        self.max_len = max_len

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return all keys, values (B, Hkv, L+T, D) and their positions (L+T,)."""
        self.check(k, v)
        start, t = self.length, k.shape[2]
        if start + t > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} more; "
                f"build it with max_len >= {start + t}, or crop()/reset() it"
            )
        self.k_cache.narrow(2, start, t).copy_(k)  # in place: O(T) per step, no copy of the past
        self.v_cache.narrow(2, start, t).copy_(v)
        self.length = start + t
        positions = torch.arange(self.length, device=k.device)
        return self.k_cache[:, :, : self.length], self.v_cache[:, :, : self.length], positions

    def crop(self, n: int) -> None:
        """Keep only the first ``n`` positions (e.g. to reject speculative tokens)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({self.length}), got {n!r}")
        self.length = n


class SlidingWindowCache(_CacheBase):
    """The last ``window`` positions in a ring buffer, for sliding-window attention.

    Position p lives in slot p % window. ``update`` returns the keys the new
    queries can still see (the last window - 1 cached ones, then the new ones),
    in position order, with their positions.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        window: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("window", window)
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=window,
            dtype=dtype,
            device=device,
        )
        self.window = window

    def positions(self) -> torch.Tensor:
        """Absolute positions held, in slot order (-1 for an empty slot)."""
        slots = torch.arange(self.window, device=self.k_cache.device)
        newest = self.length - 1
        held = newest - (newest - slots) % self.window  # the latest position p <= newest with p % W == slot
        return torch.where(held >= 0, held, torch.full_like(held, -1))

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return keys, values (B, Hkv, K, D) with K <= window - 1 + T, and positions (K,)."""
        self.check(k, v)
        start, t, w = self.length, k.shape[2], self.window
        keep = min(start, w - 1)  # cached positions the first new query can still see
        old = torch.arange(start - keep, start, device=k.device)  # their positions, oldest first
        k_all = torch.cat([self.k_cache[:, :, old % w], k], dim=2)  # (B, Hkv, keep + T, D)
        v_all = torch.cat([self.v_cache[:, :, old % w], v], dim=2)
        new = torch.arange(start, start + t, device=k.device)
        last = new[-w:]  # only the last W new positions survive in the ring
        self.k_cache[:, :, last % w] = k[:, :, -last.numel() :]
        self.v_cache[:, :, last % w] = v[:, :, -last.numel() :]
        self.length = start + t
        return k_all, v_all, torch.cat([old, new])
