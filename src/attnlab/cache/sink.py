"""StreamingLLM's cache (Xiao et al., 2023): a few "attention sink" tokens, then a window of the latest.

A model trained on ``context_length`` tokens pours much of its attention on
the first few tokens whatever they say; drop them and it falls apart, keep
them and a window of the latest tokens and it goes on generating long past
its context with flat memory. :class:`SinkCache` keeps the first ``sinks``
tokens for good and the latest ``recent`` in a ring buffer (slot
``(p - sinks) % recent``).

Positions are counted inside the cache, as StreamingLLM's are. With RoPE the
keys arrive rotated at their true positions, so the window keeps its
distances to the query; the sinks are rotated on by ``delta`` (RoPE's
rotations add up) so that they sit just before the oldest token of the
window, at positions ``oldest - sinks .. oldest - 1``, and every distance the
model sees stays within ``sinks + recent``. The positions ``update`` returns
are those the keys are rotated to, so the causal mask and any position-based
score mod agree with the rotation. Without RoPE (GPT-2's learned positions)
nothing is rotated and positions cannot go past ``context_length``: the model
refuses them, and ``GPT.generate`` says so before it starts.

A chunk of several tokens that would push tokens out of the window while its
own first queries still need them is refused; :meth:`room` says how many the
next call may bring, and ``attnlab.models.generation`` feeds a longer prompt in
pieces that fit (then one token at a time, which runs forever).

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, S = slots returned.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities
from attnlab.cache.kv import _CacheBase


@runtime_checkable
class Rotates(Protocol):
    """What turns keys to other positions: the layer's ``RotaryEmbedding``, or the transformers bridge's rotation
    of a model's own RoPE."""

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...


class SinkCache(_CacheBase):
    """``sinks`` first tokens kept for good, then the latest ``recent`` tokens (StreamingLLM).

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores.
        sinks: how many first tokens to keep (4 in StreamingLLM).
        recent: how many of the latest tokens to keep (the window).
        rotary: the layer's ``RotaryEmbedding``, to move the sinks next to the window (None without RoPE).
        dtype, device: of the buffers.
    """

    capabilities = Capabilities(past_context=True)  # with rotary positions; learned ones end at context_length
    why_no_crop = (
        "a refused guess may already have pushed the oldest recent token out of its window, and that token is "
        "gone: speculative decoding needs a cache that keeps every token ('plain')"
    )

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        recent: int,
        sinks: int = 4,
        rotary: Rotates | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("sinks", sinks, limit=2**16)
        check_positive_int("recent", recent, limit=2**27)
        super().__init__(
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=sinks + recent,
            dtype=dtype,
            device=device,
        )
        if rotary is not None and not isinstance(rotary, Rotates):
            raise TypeError(f"rotary must be the layer's RotaryEmbedding or None, got {type(rotary).__name__}")
        self.sinks, self.recent, self.rotary = sinks, recent, rotary
        # k_cache / v_cache: slots [0, sinks) hold the sinks, [sinks, sinks + window) the ring

    def room(self) -> int:
        """The most tokens the next call may bring: what is left of the window, and always one (a decode step)."""
        return max(1, self.sinks + self.recent - self.length)

    def held_positions(self) -> torch.Tensor:
        """The true position of each slot, (sinks + window,), -1 for an empty one."""
        s, w = self.sinks, self.recent
        device = self.k_cache.device
        sink_pos = torch.arange(s, device=device)
        sink_pos = torch.where(sink_pos < self._length, sink_pos, -1)
        slots = torch.arange(w, device=device)
        newest = self._length - 1 - s  # the newest window token, counted from the first after the sinks
        held = newest - (newest - slots) % w
        ring_pos = torch.where(held >= 0, held + s, -1)
        return torch.cat([sink_pos, ring_pos])

    def _shift(self) -> torch.Tensor:
        """How far the sinks move: the oldest window position less ``sinks``, 0 until the window has dropped any."""
        return (self._length - self.sinks - self.recent).clamp(min=0)

    def _returned(self, keys: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys with the sinks rotated next to the window, and the positions they are rotated to."""
        s = self.sinks
        shift = self._shift()
        sink_pos = positions[:s]
        moved = torch.where(sink_pos >= 0, sink_pos + shift, -1)
        if self.rotary is not None:
            sink_keys = self.rotary.rotate(keys[:, :, :s], shift.reshape(1))  # (B, Hkv, sinks, D), moved by `shift`
            keys = torch.cat([sink_keys, keys[:, :, s:]], dim=2)
        return keys, torch.cat([moved, positions[s:]])

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return keys, values (B, Hkv, S, D) and positions (S,), -1 empty.

        S = sinks + window for one token; a chunk is returned after the slots it is about to fill.
        """
        self.check(k, v)
        t, s, w = k.shape[2], self.sinks, self.recent
        length = self.length
        if t > 1 and length + t > s + w:
            raise ValueError(
                f"a chunk of {t} tokens after {length} would push tokens out of the sink cache's window "
                f"(sinks={s} + recent={w}) while its own first queries still need them; give a prompt of at "
                f"most {s + w - length} tokens here, then decode (one token at a time runs past any length)"
            )
        new = self.next_positions(t)
        slot = torch.where(new < s, new, s + (new - s) % w)  # (T,): where each new token goes
        if t == 1:
            self.k_cache.index_copy_(2, slot, k)
            self.v_cache.index_copy_(2, slot, v)
            self._length.add_(1)
            keys, positions = self._returned(self.k_cache, self.held_positions())
            return keys, self.v_cache, positions
        before = self.held_positions()
        keys, positions = self._returned(self.k_cache, before)  # nothing has left the window: no shift
        keys = torch.cat([keys, k], dim=2)  # (B, Hkv, S + T, D): what is held, then the chunk
        values = torch.cat([self.v_cache, v], dim=2)
        self.k_cache.index_copy_(2, slot, k)
        self.v_cache.index_copy_(2, slot, v)
        self._length.add_(t)
        return keys, values, torch.cat([positions, new])
