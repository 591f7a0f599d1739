"""Attention as functions: one ``attention()`` call, backends from a registry, one answer to who may attend.

True = may attend, everywhere. See docs/backends.md.
"""

from attnlab.functional.attention import attention, flash_attention, run_kernel
from attnlab.functional.eager import dead_rows, repeat_kv
from attnlab.functional.flash import Flash
from attnlab.functional.masks import (
    causal_mask,
    from_torch_mha_masks,
    padding_mask,
    sliding_window_mask,
)
from attnlab.functional.registry import BACKENDS, KERNELS, Backend, Kernel, KernelInfo
from attnlab.functional.visibility import EMPTY, FULL, PARTIAL, Visibility

__all__ = [
    "BACKENDS",
    "EMPTY",
    "FULL",
    "KERNELS",
    "PARTIAL",
    "Backend",
    "Flash",
    "Kernel",
    "KernelInfo",
    "Visibility",
    "attention",
    "causal_mask",
    "dead_rows",
    "flash_attention",
    "from_torch_mha_masks",
    "padding_mask",
    "repeat_kv",
    "run_kernel",
    "sliding_window_mask",
]
