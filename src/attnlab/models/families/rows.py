"""``Rows``: tensors of a file stacked as the rows of one of attnlab's, copied in place when the model is filled."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rows:
    """Tensors from the file stacked as rows of one of attnlab's (q, k and v into the fused qkv), not yet copied:
    the loader copies each part into its rows, so no stacked copy is ever held beside the model."""

    parts: tuple[torch.Tensor, ...]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.shape[0] for p in self.parts), *self.parts[0].shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    def is_floating_point(self) -> bool:
        return all(p.is_floating_point() for p in self.parts)

    def element_size(self) -> int:
        return min(p.element_size() for p in self.parts)

    def copy_into(self, target: torch.Tensor) -> None:
        start = 0
        for part in self.parts:  # (rows of this part, ...) into its slice of the target
            target[start : start + part.shape[0]].copy_(part)
            start += part.shape[0]
