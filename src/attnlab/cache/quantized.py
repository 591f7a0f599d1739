"""A quantized KV cache: keys per channel, values per token, the latest tokens kept exact (KIVI).

Liu et al., 2024 (KIVI) found that keys have a few channels of large
magnitude, so they quantize well per channel (one scale per channel for a
group of ``group_size`` tokens), while values are best quantized per token.
:class:`QuantizedKVCache` stores codes of ``bits`` = 8 or 4 bits (two codes
a byte) with a float16 scale and zero point (asymmetric, min-max), and keeps
the latest ``residual`` tokens at full precision as well, in a ring of
``residual + group_size`` slots, so that a key group is quantized only when
all its tokens are there.

How a token's key gets its codes: once it is ``residual`` tokens old, its
group is (re)quantized from the exact keys of the group's tokens that are old
enough; when the group's last token gets there, the group is final. The
state after a prefill of T tokens in one call is exactly the state after the
same T tokens one at a time (tested): no group is quantized from a part of
its tokens and then kept, the silent failure of a one-shot prefill that
Hugging Face's quantized cache had (transformers#35185).

What attention reads: the dequantized store, with the tokens of the latest
``residual`` positions, and all the tokens of the current call, exact. So a
prefill attends exactly (as Hugging Face's does), and each later step reads
the past quantized.

A decode step (T = 1) is branch-free tensor code with fixed shapes (the
number of tokens held lives in a tensor), so ``torch.compile`` of a decode
step captures it whole (tested with ``fullgraph=True``).

Bytes per token and kv head (D = head_dim, G = group_size): keys D * bits / 8
+ 4 D / G (the scale and zero of each channel, shared by G tokens), values
D * bits / 8 + 4; plus the ring's (residual + G) exact tokens, a constant.

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, C = capacity
(max_len rounded up to a whole group), N = C / G groups, W = ring slots.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities
from attnlab.cache.kv import _CacheBase

BITS = (8, 4)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (.., D) -> bytes: as they are for 8 bits, two a byte (.., D / 2) for 4."""
    if bits == 8:
        return codes
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(stored: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack`: uint8 codes (.., D)."""
    if bits == 8:
        return stored
    low, high = stored & 15, stored >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)  # (.., D / 2, 2) -> (.., D)


def quantize(
    x: torch.Tensor, low: torch.Tensor, high: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes of x between ``low`` and ``high`` (broadcast), with the float16 scale and zero they decode with."""
    levels = 2**bits - 1
    scale = ((high - low) / levels).clamp(min=2**-14).to(torch.float16)  # a float16 normal: never 0
    zero = low.to(torch.float16)
    codes = ((x - zero.to(x.dtype)) / scale.to(x.dtype)).round().clamp(0, levels).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return codes.to(dtype) * scale.to(dtype) + zero.to(dtype)


class QuantizedKVCache(_CacheBase):
    """A cache of up to ``max_len`` tokens stored in ``bits`` = 8 or 4 bits, the latest ``residual`` exact.

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores (head_dim even for 4 bits).
        max_len: tokens it can hold.
        bits: 8 or 4.
        group_size: tokens that share a key channel's scale (32).
        residual: the latest tokens kept at full precision (32); a multiple of group_size.
        dtype, device: of the exact tokens and of what ``update`` returns.
    """

    # a guess ages an older token out of the exact window into codes: with ``spare`` exact slots more, the ring still
    # holds it exact after going back, and the groups a refused guess re-quantized are quantized again by the next
    # call from the same exact keys (a group's codes depend on its tokens alone, not on the calls that wrote them)
    capabilities = Capabilities(crop=True)

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        bits: int = 8,
        group_size: int = 32,
        residual: int = 32,
        spare: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if isinstance(spare, bool) or not isinstance(spare, int) or not 0 <= spare <= 2**16:
            raise ValueError(f"spare must be an int in [0, 65536], the most tokens a pass goes back by; got {spare!r}")
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        check_positive_int("max_len", max_len, limit=2**27)
        check_positive_int("group_size", group_size, limit=2**16)
        check_positive_int("residual", residual, limit=2**16)
        if residual % group_size:
            raise ValueError(
                f"residual ({residual}) must be a multiple of group_size ({group_size}), so that a key group is "
                f"quantized whole; use residual={-(-residual // group_size) * group_size}"
            )
        if bits == 4 and head_dim % 2:
            raise ValueError(f"4-bit codes go two a byte: head_dim must be even, got {head_dim}")
        ring = residual + group_size + spare
        super().__init__(  # the exact ring: k_cache / v_cache (B, Hkv, W, D), slot p % W
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            capacity=ring,
            dtype=dtype,
            device=device,
        )
        self.max_len, self.bits, self.group_size, self.residual, self.ring = max_len, bits, group_size, residual, ring
        self.spare = spare
        groups = -(-max_len // group_size)
        self.capacity = groups * group_size
        width = head_dim if bits == 8 else head_dim // 2
        codes = (batch_size, num_kv_heads, self.capacity, width)
        u8: dict[str, Any] = dict(dtype=torch.uint8, device=device)
        f16: dict[str, Any] = dict(dtype=torch.float16, device=device)
        self.register_buffer("k_codes", torch.zeros(codes, **u8), persistent=False)
        self.register_buffer("v_codes", torch.zeros(codes, **u8), persistent=False)
        per_channel = (batch_size, num_kv_heads, groups, head_dim)  # keys: a scale per channel and group
        self.register_buffer("k_scale", torch.ones(per_channel, **f16), persistent=False)
        self.register_buffer("k_zero", torch.zeros(per_channel, **f16), persistent=False)
        per_token = (batch_size, num_kv_heads, self.capacity, 1)  # values: a scale per token
        self.register_buffer("v_scale", torch.ones(per_token, **f16), persistent=False)
        self.register_buffer("v_zero", torch.zeros(per_token, **f16), persistent=False)

        self.k_codes: torch.Tensor
        self.v_codes: torch.Tensor
        self.k_scale: torch.Tensor
        self.k_zero: torch.Tensor
        self.v_scale: torch.Tensor
        self.v_zero: torch.Tensor

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return keys, values (B, Hkv, C, D) and positions (C,), -1 unfilled."""
        self.check(k, v)
        t = k.shape[2]
        if not torch.compiler.is_compiling():  # compiled code meets the same limit as an index error
            start = self.length
            if start + t > self.max_len:
                raise ValueError(
                    f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                    f"more; build it with max_len >= {start + t}"
                )
        new = self.next_positions(t)  # (T,)
        self._store_values(new, v)
        self._store_keys(new, k)
        ring_slots = new[-self.ring :] % self.ring  # only the chunk's last W tokens stay in the ring
        self.k_cache.index_copy_(2, ring_slots, k[:, :, -ring_slots.numel() :])
        self.v_cache.index_copy_(2, ring_slots, v[:, :, -ring_slots.numel() :])
        self._length.add_(t)
        return self._read(new, k, v)

    def _store_values(self, new: torch.Tensor, v: torch.Tensor) -> None:
        """Values per token: each new token's own scale, over its channels."""
        codes, scale, zero = quantize(v, v.amin(-1, keepdim=True), v.amax(-1, keepdim=True), self.bits)
        self.v_codes.index_copy_(2, new, pack(codes, self.bits))
        self.v_scale.index_copy_(2, new, scale)
        self.v_zero.index_copy_(2, new, zero)

    def _store_keys(self, new: torch.Tensor, k: torch.Tensor) -> None:
        """Keys per channel: (re)quantize every group holding a token that is now ``residual`` tokens old."""
        t, g, w = k.shape[2], self.group_size, self.ring
        start = new[0]  # L, a tensor: no sync, and a compiled step does not depend on its value
        due = start + t - 1 - self.residual  # the newest position that is read quantized after this call
        # exact keys of positions L - W .. L + T - 1: the ring in order of position, then the chunk
        ring_order = (start - w + torch.arange(w, device=new.device)) % w
        source = torch.cat([self.k_cache.index_select(2, ring_order), k], dim=2)  # (B, Hkv, W + T, D)
        first = torch.div(start - self.residual, g, rounding_mode="floor")
        count = (t - 1) // g + 2  # groups that can hold positions L - R .. L + T - 1 - R
        groups = (first + torch.arange(count, device=new.device)).clamp(0, self.k_scale.shape[2] - 1)  # (n,)
        members = groups[:, None] * g + torch.arange(g, device=new.device)  # (n, G) positions
        index = (members - (start - w)).clamp(0, w + t - 1)  # where each member is in `source`
        x = source.index_select(2, index.flatten()).unflatten(2, (count, g))  # (B, Hkv, n, G, D)
        old_enough = (members <= due)[None, None, :, :, None]  # (1, 1, n, G, 1): quantized from these only
        low = torch.where(old_enough, x, torch.inf).amin(3)  # (B, Hkv, n, D)
        high = torch.where(old_enough, x, -torch.inf).amax(3)
        some = old_enough.any(3)  # a group with none old enough yet gets a harmless scale; it is redone later
        low, high = torch.where(some, low, 0.0), torch.where(some, high, 0.0)
        codes, scale, zero = quantize(x, low[:, :, :, None], high[:, :, :, None], self.bits)  # codes (B,Hkv,n,G,D)
        self.k_codes.index_copy_(2, members.flatten(), pack(codes.flatten(2, 3), self.bits))
        self.k_scale.index_copy_(2, groups, scale[:, :, :, 0])
        self.k_zero.index_copy_(2, groups, zero[:, :, :, 0])

    def reach(self, n: int) -> int:
        """``n`` itself, for any of the last ``spare`` tokens (a pass's refused guesses); further back is refused."""
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not max(0, length - self.spare) <= n <= length:
            raise ValueError(
                f"this quantized cache holds {length} tokens and {self.spare} spare exact slots: it can go back to "
                f"{max(0, length - self.spare)}..{length}, not {n!r}; build it with spare >= the guesses of a pass "
                "(ModelCache.build(..., spare=k))"
            )
        return n

    def crop(self, n: int) -> None:
        """Hold the first ``n`` tokens again: the latest ``residual`` of them are still exact in the ring."""
        self._length.fill_(self.reach(n))

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, Hkv, C, D) as the next decode step reads the past: dequantized, the latest
        ``residual`` exact (slots at or past ``length`` hold nothing); writes nothing."""
        dtype, g = self.k_cache.dtype, self.group_size
        k_scale = self.k_scale.repeat_interleave(g, dim=2)  # (B, Hkv, C, D): each group's scale for its tokens
        k_zero = self.k_zero.repeat_interleave(g, dim=2)
        keys = dequantize(unpack(self.k_codes, self.bits), k_scale, k_zero, dtype)  # (B, Hkv, C, D)
        values = dequantize(unpack(self.v_codes, self.bits), self.v_scale, self.v_zero, dtype)
        newest = self._length - 1
        recent = (newest - torch.arange(self.residual, device=newest.device)).clamp(min=0)  # (R,): repeats at 0
        keys.index_copy_(2, recent, self.k_cache.index_select(2, recent % self.ring))
        values.index_copy_(2, recent, self.v_cache.index_select(2, recent % self.ring))
        return keys, values

    def _read(
        self, new: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :meth:`read` gives, with this call's own tokens exact, and every slot's position."""
        keys, values = self.read()
        keys.index_copy_(2, new, k)  # this call's own tokens, exact
        values.index_copy_(2, new, v)
        slots = torch.arange(self.capacity, device=new.device)
        return keys, values, torch.where(slots < self._length, slots, -1)
