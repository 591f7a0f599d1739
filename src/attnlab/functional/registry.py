"""The kernel contract and the small registry that picks a backend by name.

Every backend is a function with one signature and one return shape:

    kernel(q, k, v, vis, *, scale, dropout_p) -> (out, lse or None)

on checked arguments: q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a
multiple of Hkv, the call's :class:`Visibility` (who may attend, and what
each score becomes), the resolved scale and the dropout rate. ``out`` is
(B, H, Tq, Dv) in q's dtype; ``lse`` is each row's log-sum-exp (B, H, Tq),
+inf on a row that may see nothing, or None for a backend that does not
expose it. A row that may see nothing gets 0.

>>> sorted(KERNELS)
['eager', 'flash', 'flex', 'sdpa']
>>> KERNELS["flash"].has_lse, KERNELS["sdpa"].has_lse
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from attnlab.functional.eager import eager_attention
from attnlab.functional.flash import Flash, flash_attention_kernel
from attnlab.functional.flex import flex_attention_kernel
from attnlab.functional.mods import is_bias
from attnlab.functional.sdpa import sdpa_attention
from attnlab.functional.visibility import Visibility
from attnlab.observe import is_recording

BackendName = Literal["auto", "eager", "sdpa", "flash", "flex"]
Backend = BackendName | Flash  # a name, or the flash backend with its own tile sizes


class Kernel(Protocol):
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, *, scale: float, dropout_p: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class KernelInfo:
    """A backend and what it can do."""

    kernel: Kernel
    forms_weights: bool  # records attn_weights (and every other step) to the Recorder
    has_lse: bool  # returns the row log-sum-exp
    float_mask_grad: bool  # gradients flow into a float mask


KERNELS: dict[str, KernelInfo] = {
    "eager": KernelInfo(eager_attention, forms_weights=True, has_lse=True, float_mask_grad=True),
    "sdpa": KernelInfo(sdpa_attention, forms_weights=False, has_lse=False, float_mask_grad=True),
    "flash": KernelInfo(flash_attention_kernel, forms_weights=False, has_lse=True, float_mask_grad=False),
    "flex": KernelInfo(flex_attention_kernel, forms_weights=False, has_lse=False, float_mask_grad=False),
}
BACKENDS: tuple[str, ...] = ("auto", *KERNELS)


def check_backend(backend: object) -> None:
    if not isinstance(backend, Flash) and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)} or a configured Flash(...), got {backend!r}")


def resolve(backend: Backend, *, need_weights: bool = False, vis: Visibility | None = None) -> tuple[str, Kernel]:
    """(name, kernel) for ``backend``. "auto": eager under a Recorder (the backend that forms the weights), flash
    for a score_mod that is not a bias (sdpa cannot take it), else sdpa (the fastest on every device)."""
    check_backend(backend)
    if isinstance(backend, Flash):
        name: str = "flash"
    elif backend != "auto":
        name = backend
    elif need_weights or is_recording():
        name = "eager"
    elif vis is not None and vis.score_mod is not None and not is_bias(vis.score_mod):
        name = "flash"
    else:
        name = "sdpa"
    if need_weights and not KERNELS[name].forms_weights:
        raise ValueError(
            f"return_weights=True needs the eager backend; backend={backend!r} never forms the weights. "
            "Use backend='eager' (or 'auto')"
        )
    kernel: Kernel = backend if isinstance(backend, Flash) else KERNELS[name].kernel
    return name, kernel
