"""``LatentCache``: multi-head latent attention's cache (DeepSeek-V2/V3), one latent per token for every head.

MLA compresses each token's keys and values into a latent c of ``kv_lora_rank`` values and one RoPE key k_pe of
``rope_dim`` values shared by the heads. Decoding in the absorbed form attends over [c, k_pe] as the keys of a
single kv head and over c as its values (``attnlab.nn.latent``), so this cache stores [c, k_pe] once per token:
kv_lora_rank + rope_dim values (576 for DeepSeek-V3, against 32,768 for 128 heads of 128-dimensional keys and
values), and hands back the values as a view of the keys' first kv_lora_rank columns.

Shapes: B = batch, S = capacity, R = kv_lora_rank, P = rope_dim.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache


class LatentCache(LayerCache):
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
                f"{(*k.shape[:3], self.kv_lora_rank)}; got {getattr(v, 'shape', v)}"
            )

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.check(k, v)
        t = k.shape[2]
        if not torch.compiler.is_compiling():
            start = self.length
            if start + t > self.max_len:
                raise ValueError(
                    f"the cache is full: it holds {start} of max_len={self.max_len} positions and cannot take {t} "
                    f"more; build it with max_len >= {start + t}"
                )
        self.latent.index_copy_(2, self.next_positions(t), k)
        self._length.add_(t)
        slots = torch.arange(self.max_len, device=self.latent.device)
        return self.latent, self.latent[..., : self.kv_lora_rank], torch.where(slots < self._length, slots, -1)

    def crop(self, n: int) -> None:
        length = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        self._length.fill_(n)

    def reset(self) -> None:
        self._length.zero_()
