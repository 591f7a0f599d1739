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
of tokens held lives in a tensor. Under ``torch.compile``, ``update`` returns
whole buffers, so the shapes of a decode step never change: a compiled decode
loop makes one graph for the prefill and one for the steps, not one per step,
at the price of attending over all ``max_len`` slots (the empty ones masked),
as Hugging Face's static cache does. Eager, :class:`KVCache` returns only its
filled slots (views, no copy): a decode step reads what it holds, and no mask
is built for its one query.

``update`` checks everything before it writes, so a call that raises leaves
the cache exactly as it was. Caches are for inference: keys that require
grad are refused (run under ``torch.no_grad()`` or ``torch.inference_mode()``).

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, S = slots returned.
"""

from __future__ import annotations

import math

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache
from attnlab.cache.undo import ByLength
from attnlab.functional.finite import vouch, vouched

_POSITIONS: dict[torch.device, torch.Tensor] = {}  # 0, 1, 2, ... per device, grown as asked; read-only


def first_positions(n: int, device: torch.device) -> torch.Tensor:
    """Positions 0..n-1, (n,): a view of one tensor per device, shared by every cache and never written. It is
    an inference tensor, so a write to it outside inference mode is refused instead of changing every cache's
    answer; and it is no cache's buffer, so no cache's bytes count it."""
    held = _POSITIONS.get(device)
    if held is None or held.numel() < n:
        with torch.inference_mode():
            held = _POSITIONS[device] = torch.arange(max(2 * n, 4096), device=device)
    return held.narrow(0, 0, n)


class _CacheBase(ByLength, LayerCache):
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
        value_dim: int | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, value_dim=value_dim
        )
        elements = batch_size * num_kv_heads * capacity * head_dim
        if elements > 2**34:
            raise ValueError(
                f"this cache would hold 2 x {elements:,} elements (batch {batch_size} x {num_kv_heads} heads x "
                f"{capacity} positions x head_dim {head_dim}); that is beyond any device: check the sizes"
            )
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        values = (*shape[:3], self.value_dim)
        self.register_buffer("v_cache", torch.zeros(values, dtype=dtype, device=device), persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.k_cache: torch.Tensor
        self.v_cache: torch.Tensor
        self._length: torch.Tensor

    def _held(self) -> torch.Tensor:
        return self.k_cache

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

    def begin(self) -> bool:
        """Here (sink, quantized): the length, to tell whether a failed call wrote; their writes reshape what they
        hold (a window's sinks, a group coded), so they cannot undo. KVCache and the ring can."""
        self.keep_length()
        return False


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
        value_dim: int | None = None,
    ) -> None:
        check_positive_int("max_len", max_len, limit=2**27)
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=max_len,
            dtype=dtype,
            device=device,
            value_dim=value_dim,
        )
        self.max_len = max_len
        vouch(self.k_cache)  # zeros: finite (attnlab.functional.finite); each write keeps or drops this
        vouch(self.v_cache)

    def begin(self) -> bool:
        self.keep_length()
        return True

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return the keys and values held, with their positions.

        Eager: the filled slots, (B, Hkv, L, D) views of the buffers, at positions 0..L-1 (L = length), so a
        decode step attends over what it holds and nothing hides a key from its one query; the positions are
        shared by every cache and read-only (an inference tensor: copy them to change them). Compiled: the whole
        buffers (B, Hkv, max_len, D) and positions (max_len,), -1 unfilled, so every step has one shape.
        """
        self.check(k, v)
        t = k.shape[2]
        if torch.compiler.is_compiling():  # compiled code meets the same limit as an index error
            new = self.next_positions(t)
            self.k_cache.index_copy_(2, new, k)  # in place: O(T) per step, no copy of the past
            self.v_cache.index_copy_(2, new, v)
            self._length.add_(t)
            slots = torch.arange(self.max_len, device=self.k_cache.device)
            return self.k_cache, self.v_cache, torch.where(slots < self._length, slots, -1)
        start = self.length
        end = start + t
        if end > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                f"more; build it with max_len >= {end}, or crop()/reset() it"
            )
        keys, values = self.k_cache, self.v_cache  # each buffer read once: a module's attribute lookup is slow
        # on the CPU, where the check's sync costs microseconds (on an accelerator clean() keeps its one sync a
        # layer); a view of a vouched buffer is vouched for with it (attnlab.functional.finite)
        checked = k.device.type == "cpu" and vouched(keys) and vouched(values)
        keys.narrow(2, start, t).copy_(k)  # in place: O(T) per step, no copy of the past
        values.narrow(2, start, t).copy_(v)
        self._length.fill_(end)
        if checked and math.isfinite(float(k.sum(dtype=torch.float32) + v.sum(dtype=torch.float32))):
            vouch(keys)  # finite before and in what was written: attention need not sum them again
            vouch(values)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end), first_positions(end, keys.device)

    def crop(self, n: int) -> None:
        """Keep only the first ``n`` positions (e.g. to reject speculative tokens)."""
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        self._length.fill_(n)


class SlidingWindowCache(_CacheBase):
    """The last ``window`` positions in a ring buffer, for sliding-window attention, and room for ``spare`` more.

    Position p lives in slot p % C, C = window + spare. A decode step (one token) writes its slot in place and
    returns the ring itself; a chunk of T > 1 tokens returns the ring followed by the chunk (its first queries
    still need the keys the chunk overwrites), then writes the chunk's last C positions. The attention's window
    (by positions) hides every slot older than the window.

    The spare slots are what lets it go back (speculative decoding): a pass of guesses writes at most ``spare``
    tokens past what will be kept, so after :meth:`crop` to any of the last ``spare`` tokens, the window before
    it is still whole. A slot a refused guess wrote then reads as a position older than any window that follows.
    """

    capabilities = Capabilities(crop=True)
    keeps_its_own = True  # whatever cache is named; its ring runs on past any length

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        window: int,
        spare: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        value_dim: int | None = None,
    ) -> None:
        check_positive_int("window", window, limit=2**27)
        if isinstance(spare, bool) or not isinstance(spare, int) or not 0 <= spare <= 2**16:
            raise ValueError(f"spare must be an int in [0, 65536], the most guesses a pass refuses; got {spare!r}")
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=window + spare,
            dtype=dtype,
            device=device,
            value_dim=value_dim,
        )
        self.window, self.spare, self.slots = window, spare, window + spare

    def positions(self) -> torch.Tensor:
        """Absolute positions held, in slot order (-1 for an empty slot), (C,)."""
        slots = torch.arange(self.slots, device=self.k_cache.device)
        newest = self._length - 1
        held = newest - (newest - slots) % self.slots  # the latest position p <= newest with p % C == slot
        return torch.where(held >= 0, held, -1)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return keys, values (B, Hkv, S, D) and their positions (S,), -1 empty.

        S = C for one token, C + T for a chunk.
        """
        self.check(k, v)
        t, c = k.shape[2], self.slots
        new = self.next_positions(t)
        if self._overwritten is not None:  # a pass began: what this write overwrites is kept for undo
            slots = new[-c:] % c
            self._overwritten.append((slots, self.k_cache.index_select(2, slots), self.v_cache.index_select(2, slots)))
        if t == 1:  # a decode step: in place, no concatenation
            self.k_cache.index_copy_(2, new % c, k)
            self.v_cache.index_copy_(2, new % c, v)
            self._length.add_(1)
            return self.k_cache, self.v_cache, self.positions()
        k_all = torch.cat([self.k_cache, k], dim=2)  # (B, Hkv, C + T, D): the ring as it was, then the chunk
        v_all = torch.cat([self.v_cache, v], dim=2)
        positions = torch.cat([self.positions(), new])
        last = new[-c:]  # only the chunk's last C positions survive in the ring
        self.k_cache.index_copy_(2, last % c, k[:, :, -last.numel() :])
        self.v_cache.index_copy_(2, last % c, v[:, :, -last.numel() :])
        self._length.add_(t)
        return k_all, v_all, positions

    _overwritten: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None  # (slots, keys, values)

    def begin(self) -> bool:
        self.keep_length()
        self._overwritten = []
        return True

    def undo(self) -> None:
        for slots, keys, values in reversed(self._overwritten or []):  # the slots as they were, latest write first
            self.k_cache.index_copy_(2, slots, keys)
            self.v_cache.index_copy_(2, slots, values)
        super().undo()

    def commit(self) -> None:
        super().commit()
        self._overwritten = None

    def reach(self, n: int) -> int:
        """``n`` itself, for any of the last ``spare`` tokens (what a pass may refuse); further back is refused."""
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not max(0, length - self.spare) <= n <= length:
            raise ValueError(
                f"this ring holds {length} tokens and room for {self.spare} refused ones: it can go back to "
                f"{max(0, length - self.spare)}..{length}, not {n!r}; build it with spare >= the guesses of a pass "
                "(ModelCache.build(..., spare=k))"
            )
        return n

    def crop(self, n: int) -> None:
        """Hold the first ``n`` tokens again: the window before ``n`` is whole (``reach`` says how far back)."""
        self._length.fill_(self.reach(n))
