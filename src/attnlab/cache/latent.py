"""``LatentCache``: multi-head latent attention's cache (DeepSeek-V2/V3), one latent per token for every head.

MLA compresses each token's keys and values into a latent c of ``kv_lora_rank`` values and one RoPE key k_pe of
``rope_dim`` values shared by the heads. Decoding in the absorbed form attends over [c, k_pe] as the keys of a
single kv head and over c as its values (``attnlab.nn.latent``), so this cache stores [c, k_pe] once per token:
kv_lora_rank + rope_dim values (576 for DeepSeek-V3, against 32,768 for 128 heads of 128-dimensional keys and
values), and hands back the values as a view of the keys' first kv_lora_rank columns.

:class:`QuantizedLatentCache` stores each latent in 8 or 4 bits instead (``cache="int8"`` or ``"int4"`` on a
latent layer): per token, in groups of ``group_size`` values, each group with a float16 scale and zero (min-max,
as ``attnlab.cache.quantized`` codes). A latent is both key and value, so it is coded once; a token's groups
are whole when it is written, so no token waits in full precision. What attention reads: the dequantized
store (its filled slots only), and the latents of the current call exact (a prefill attends exactly, each
later step reads the past quantized). Bytes per token and layer: (R + P) * bits / 8 + 4 (R + P) / group_size (DeepSeek-V3, int8, groups
of 32: 648, against 1,152 in bfloat16).

Shapes: B = batch, S = capacity, R = kv_lora_rank, P = rope_dim, G = group_size.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache
from attnlab.cache.kv import first_positions
from attnlab.cache.quantized import BITS, dequantize, pack, quantize, unpack
from attnlab.cache.undo import ByLength


class LatentCache(ByLength, LayerCache):
    """A static cache of up to ``max_len`` latents [c, k_pe] (B, 1, S, R + P), written in place.

    ``update(keys, values)`` takes the latents (B, 1, T, R + P) as keys and their first R columns as values (what
    the absorbed attention reads), stores the keys only, and returns (keys, their first R columns, positions).
    """

    capabilities = Capabilities(crop=True)

    def __init__(
        self,
        *,
        batch_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("max_len", max_len, limit=2**27)
        check_positive_int("kv_lora_rank", kv_lora_rank, limit=2**16)
        check_positive_int("rope_dim", rope_dim, limit=2**16)
        super().__init__(batch_size=batch_size, num_kv_heads=1, head_dim=kv_lora_rank + rope_dim, dtype=dtype)
        self.kv_lora_rank, self.rope_dim, self.max_len = kv_lora_rank, rope_dim, max_len
        shape = (batch_size, 1, max_len, kv_lora_rank + rope_dim)
        self.register_buffer("latent", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.latent: torch.Tensor
        self._length: torch.Tensor

    @property
    def length(self) -> int:
        return int(self._length)

    def next_positions(self, t: int) -> torch.Tensor:
        return self._length + torch.arange(t, device=self.latent.device)

    def check(self, k: torch.Tensor, v: torch.Tensor, *, batch: int | None = None) -> None:
        super().check(k, k, batch=batch)  # the latents; the values are their first R columns, never stored
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != (*k.shape[:3], self.kv_lora_rank):
            raise ValueError(
                f"a latent cache's values are the latents' first kv_lora_rank={self.kv_lora_rank} columns, shape "
                f"{(*k.shape[:3], self.kv_lora_rank)}; got {tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}"
            )

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append the latents k (B, 1, T, R + P); return those held, their first R values and their positions.

        Eager: the filled slots (B, 1, L, R + P), a view, at positions 0..L-1, so a decode step reads what the
        cache holds and not its whole capacity. Compiled: the whole buffer and positions (max_len,), -1 unfilled,
        so every step has one shape (as :class:`attnlab.cache.KVCache`)."""
        self.check(k, v)
        t = k.shape[2]
        if torch.compiler.is_compiling():
            self.latent.index_copy_(2, self.next_positions(t), k)
            self._length.add_(t)
            slots = torch.arange(self.max_len, device=self.latent.device)
            return self.latent, self.latent[..., : self.kv_lora_rank], torch.where(slots < self._length, slots, -1)
        start = self.length
        if start + t > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                f"more; build it with max_len >= {start + t}"
            )
        latent = self.latent  # read once: a module's attribute lookup is slow on the CPU
        latent.narrow(2, start, t).copy_(k)  # in place: O(T) a step, no copy of the past
        self._length.fill_(start + t)
        held = latent.narrow(2, 0, start + t)  # (B, 1, L, R + P)
        return held, held[..., : self.kv_lora_rank], first_positions(start + t, latent.device)

    def crop(self, n: int) -> None:
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        self._length.fill_(n)

    def reset(self) -> None:
        self._length.zero_()

    def begin(self) -> bool:
        """A call starts: its length is all :meth:`undo` needs (a write goes past it; codes and scales too)."""
        self.keep_length()
        return True


class QuantizedLatentCache(LatentCache):
    """A :class:`LatentCache` whose latents are stored in ``bits`` (8 or 4) bits per value, per token in groups
    of ``group_size`` values, each group with a float16 scale and zero; this call's latents are read exact."""

    def __init__(
        self,
        *,
        batch_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        max_len: int,
        bits: int = 8,
        group_size: int = 32,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        check_positive_int("group_size", group_size, limit=2**16)
        width = kv_lora_rank + rope_dim
        if width % group_size or (bits == 4 and group_size % 2):
            raise ValueError(
                f"a latent of kv_lora_rank + rope_dim = {width} values splits into whole groups only if group_size "
                f"divides it{' and is even (4-bit codes go two a byte)' if bits == 4 else ''}; got "
                f"group_size={group_size}: pass one of {[g for g in (8, 16, 32, 64) if width % g == 0]}"
            )
        # the base class's store stays empty (S = 0): the codes below hold the latents
        super().__init__(batch_size=batch_size, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, max_len=1, dtype=dtype)
        self.max_len, self.bits, self.group_size = max_len, bits, group_size
        groups = width // group_size
        self.latent = torch.zeros((batch_size, 1, 0, width), dtype=dtype, device=device)
        self._length = torch.zeros((), dtype=torch.long, device=device)
        codes = (batch_size, 1, max_len, width * bits // 8)
        self.register_buffer("codes", torch.zeros(codes, dtype=torch.uint8, device=device), persistent=False)
        scales = (batch_size, 1, max_len, groups)
        self.register_buffer("scale", torch.ones(scales, dtype=torch.float16, device=device), persistent=False)
        self.register_buffer("zero", torch.zeros(scales, dtype=torch.float16, device=device), persistent=False)
        self.codes: torch.Tensor
        self.scale: torch.Tensor
        self.zero: torch.Tensor

    def next_positions(self, t: int) -> torch.Tensor:
        return self._length + torch.arange(t, device=self.codes.device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.check(k, v)
        b, _, t, width = k.shape
        start = self.length
        if start + t > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                f"more; build it with max_len >= {start + t}"
            )
        grouped = k.reshape(b, 1, t, width // self.group_size, self.group_size)  # (B, 1, T, groups, G)
        low, high = grouped.amin(dim=-1, keepdim=True), grouped.amax(dim=-1, keepdim=True)
        codes, scale, zero = quantize(grouped, low, high, self.bits)
        where = self.next_positions(t)
        self.codes.index_copy_(2, where, pack(codes.reshape(b, 1, t, width), self.bits))  # (B, 1, T, W bits / 8)
        self.scale.index_copy_(2, where, scale.squeeze(-1))  # (B, 1, T, groups)
        self.zero.index_copy_(2, where, zero.squeeze(-1))
        self._length.add_(t)
        held = start + t  # only the filled slots are decoded: the rest would be work and memory for nothing
        stored = unpack(self.codes[:, :, :held], self.bits).reshape(b, 1, held, -1, self.group_size)  # (B,1,L,n,G)
        latents = dequantize(stored, self.scale[:, :, :held, :, None], self.zero[:, :, :held, :, None], k.dtype)
        latents = latents.reshape(b, 1, held, width)  # (B, 1, L, R + P)
        latents[:, :, start:held] = k  # this call's own latents, exact
        return latents, latents[..., : self.kv_lora_rank], torch.arange(held, device=self.codes.device)
