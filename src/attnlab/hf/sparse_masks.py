"""What a sparse layer of a transformers model hands the attention backend beside its mask, folded into the mask.

* DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) hands the keys its indexer chose as ``indices=`` (B, Tq, K)
  columns, instead of folding them into the mask as transformers' eager and sdpa paths get them: attending every
  key would be silently wrong, so every key not chosen is hidden here.
* DeepSeek-V4's compressed layers append their entries' bias (an entry's block closed or not, the indexer's
  choice) to the mask, cast to its dtype: a boolean mask inverts it and a mask left out drops it, so such a layer
  is refused unless its mask is a float one (``attnlab.hf.register`` gives such a model eager's).

Shapes: B = batch, Tq = queries, Tk = keys, K = keys chosen a query.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.functional.selection import Selection, chosen_mask

NOT_ADDITIVE = (
    "a DeepSeek-V4 compressed layer hands its entries' closing and the indexer's choice as a float bias appended to "
    "the mask, which a boolean mask (or none) would invert or drop: run it with attn_implementation='attnlab' as "
    "attnlab.hf.use sets it (a float mask), without a 4-D mask of your own"
)


def sparse_mask(module: Any, mask: torch.Tensor | None, indices: object, keys: int) -> torch.Tensor | None:
    """``mask`` with a DSA layer's choice (``indices``) folded in; a V4 compressed layer's mask checked float."""
    if getattr(module, "compressor", None) is not None and not _is_additive(mask):
        raise ValueError(f"layer {getattr(module, 'layer_idx', '?')}: {NOT_ADDITIVE}")
    if isinstance(indices, torch.Tensor):
        return with_selection(mask, indices, keys)
    return mask


def _is_additive(mask: object) -> bool:
    return isinstance(mask, torch.Tensor) and mask.is_floating_point()


def with_selection(mask: torch.Tensor | None, indices: torch.Tensor, keys: int) -> torch.Tensor:
    """transformers' mask with every key its indexer did not choose hidden (what its eager and sdpa paths do)."""
    picked = chosen_mask(Selection(indices.long(), indices.shape[-1]), keys)  # (B, 1, Tq, Tk)
    if mask is None:
        return picked
    if mask.dtype == torch.bool:
        return mask & picked
    return mask.masked_fill(~picked, torch.finfo(mask.dtype).min)
