"""KV caches: keep past keys and values so a decode step computes only the new token's.

Both caches speak one small protocol (:class:`attnlab.cache.Cache`), which is
all ``attnlab.Attention`` knows of them:

* ``next_positions(t)``: the absolute positions of the next ``t`` tokens;
* ``update(k, v)``: check, then write, then return the keys and values to
  attend over with the absolute position of each (-1 for a slot that holds
  nothing yet). Attention builds its causal and window masks from positions,
  so it never asks which kind of cache it holds.

:class:`KVCache` preallocates (B, Hkv, max_len, D) buffers and writes each
step in place. :class:`SlidingWindowCache` keeps the last ``window`` positions
in a ring buffer, written in place at slot ``position % window``. The number
of tokens held lives in a tensor and ``update`` returns whole buffers, so the
shapes of a decode step never change: ``torch.compile`` of a decode loop
makes one graph for the prefill and one for the steps, not one per step. The
price: a decode step attends over all ``max_len`` slots (the empty ones
masked), as Hugging Face's static cache does; size ``max_len`` to the job.

``update`` checks everything before it writes, so a call that raises leaves
the cache exactly as it was. Caches are for inference: keys that require
grad are refused (run under ``torch.no_grad()`` or ``torch.inference_mode()``).

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, S = slots returned.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache
from attnlab.functional.finite import vouch, vouched


class _CacheBase(LayerCache):
    """A layer's cache with (B, Hkv, capacity, D) key and value buffers and a length, all in tensors."""

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
        super().__init__(batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
        elements = batch_size * num_kv_heads * capacity * head_dim
        if elements > 2**34:
            raise ValueError(
                f"this cache would hold 2 x {elements:,} elements (batch {batch_size} x {num_kv_heads} heads x "
                f"{capacity} positions x head_dim {head_dim}); that is beyond any device: check the sizes"
            )
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.k_cache: torch.Tensor
        self.v_cache: torch.Tensor
        self._length: torch.Tensor

    @property
    def length(self) -> int:
        """Positions seen so far (a Python int: reading it syncs with the device)."""
        return int(self._length)

    def next_positions(self, t: int) -> torch.Tensor:
        """Absolute positions of the next ``t`` tokens, (T,): L, L+1, ..., L+t-1."""
        return self._length + torch.arange(t, device=self.k_cache.device)

    def reset(self) -> None:
        """Forget everything; the buffers are kept (and overwritten)."""
        self._length.zero_()


class KVCache(_CacheBase):
    """A static cache of up to ``max_len`` positions, written in place.

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores (kv heads only under GQA).
        max_len: positions it can hold; one more raises.
        dtype, device: of the buffers; follow the model.
    """

    capabilities = Capabilities(crop=True)

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
        check_positive_int("max_len", max_len, limit=2**27)
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=max_len,
            dtype=dtype,
            device=device,
        )
        self.max_len = max_len
        vouch(self.k_cache)  # zeros: finite (attnlab.functional.finite); each write keeps or drops this
        vouch(self.v_cache)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return the buffers (B, Hkv, max_len, D) and positions (max_len,), -1 unfilled."""
        self.check(k, v)
        t = k.shape[2]
        if not torch.compiler.is_compiling():  # compiled code meets the same limit as an index error
            start = self.length
            if start + t > self.max_len:
                raise ValueError(
                    f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                    f"more; build it with max_len >= {start + t}, or crop()/reset() it"
                )
        new = self.next_positions(t)
        # on the CPU, where the check's sync costs microseconds (on an accelerator clean() keeps its one sync a
        # layer), and never in a compiled graph, which has no data-dependent branch
        eager_cpu = k.device.type == "cpu" and not torch.compiler.is_compiling()
        checked = eager_cpu and vouched(self.k_cache) and vouched(self.v_cache)
        self.k_cache.index_copy_(2, new, k)  # in place: O(T) per step, no copy of the past
        self.v_cache.index_copy_(2, new, v)
        self._length.add_(t)
        if checked and bool(torch.isfinite(k.sum(dtype=torch.float32) + v.sum(dtype=torch.float32))):
            vouch(self.k_cache)  # finite before and in what was written: attention need not sum them again
            vouch(self.v_cache)
        slots = torch.arange(self.max_len, device=self.k_cache.device)
        return self.k_cache, self.v_cache, torch.where(slots < self._length, slots, -1)

    def crop(self, n: int) -> None:
        """Keep only the first ``n`` positions (e.g. to reject speculative tokens)."""
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        self._length.fill_(n)


class SlidingWindowCache(_CacheBase):
    """The last ``window`` positions in a ring buffer, for sliding-window attention.

    Position p lives in slot p % window. A decode step (one token) writes its
    slot in place and returns the ring itself; a chunk of T > 1 tokens returns
    the ring followed by the chunk (its first queries still need the keys the
    chunk overwrites), then writes the chunk's last ``window`` positions.
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
        check_positive_int("window", window, limit=2**27)
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
        """Absolute positions held, in slot order (-1 for an empty slot), (window,)."""
        slots = torch.arange(self.window, device=self.k_cache.device)
        newest = self._length - 1
        held = newest - (newest - slots) % self.window  # the latest position p <= newest with p % W == slot
        return torch.where(held >= 0, held, -1)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return keys, values (B, Hkv, S, D) and their positions (S,), -1 empty.

        S = window for one token, window + T for a chunk.
        """
        self.check(k, v)
        t, w = k.shape[2], self.window
        new = self.next_positions(t)
        if t == 1:  # a decode step: in place, no concatenation
            self.k_cache.index_copy_(2, new % w, k)
            self.v_cache.index_copy_(2, new % w, v)
            self._length.add_(1)
            return self.k_cache, self.v_cache, self.positions()
        k_all = torch.cat([self.k_cache, k], dim=2)  # (B, Hkv, W + T, D): the ring as it was, then the chunk
        v_all = torch.cat([self.v_cache, v], dim=2)
        positions = torch.cat([self.positions(), new])
        last = new[-w:]  # only the chunk's last W positions survive in the ring
        self.k_cache.index_copy_(2, last % w, k[:, :, -last.numel() :])
        self.v_cache.index_copy_(2, last % w, v[:, :, -last.numel() :])
        self._length.add_(t)
        return k_all, v_all, positions
