"""Attention as functions: one ``attention()`` call, three backends, one mask convention.

True = may attend, everywhere. See docs/backends.md.
"""

from attnlab.functional.attention import BACKENDS, Backend, attention, flash_attention
from attnlab.functional.eager import dead_rows, repeat_kv
from attnlab.functional.masks import (
    MaskSpec,
    causal_mask,
    from_torch_mha_masks,
    padding_mask,
    sliding_window_mask,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "MaskSpec",
    "attention",
    "causal_mask",
    "dead_rows",
    "flash_attention",
    "from_torch_mha_masks",
    "padding_mask",
    "repeat_kv",
    "sliding_window_mask",
]
