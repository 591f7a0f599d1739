"""The layouts' products: where a weight's numbers lie and which routine multiplies by them.

Each layout (:mod:`attnlab.linear.layout` says how one is chosen) keeps the
same values and parameter shapes: "rows" and "columns" store the weight either
way for ``F.linear``; "onednn", "gemv", "packed" and "prefetch" keep the rows
and give the module another product, which serves plain inference on the CPU
(:func:`plain_inference`) and hands every other call (a gradient, autocast,
torch.func, another dtype or device) to ``F.linear``. Each ``nn.Linear``
subclass here is what :func:`attnlab.linear.layout.set_layout` swaps a module's
class to, in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.linear import packed, prefetch
from attnlab.linear.gemv import FLOAT_ROWS, _exporting, compiled_gemv, gemv, traced, why_no_gemv
from attnlab.linear.prefetch import prefetch_applies, why_no_prefetch

Layout = Literal["rows", "columns", "onednn", "gemv", "packed", "prefetch"]
STORAGES: tuple[Layout, ...] = ("rows", "columns")  # F.linear, the weight stored either way
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)  # what oneDNN's CPU inner product takes


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")  # asked often


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's inner product as an op (the "onednn" layout)."""
    return _ONEDNN


LAYOUTS: tuple[Layout, ...] = (
    (*STORAGES, *(("onednn",) if onednn_available() else ()), "gemv")
    + (("packed",) if onednn_available() and packed.packing_available() else ())
    + ("prefetch",)
)


def laid_out(weight: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``weight`` (out, in) with its numbers stored row by row, or column by column."""
    if layout in ("rows", "onednn", "gemv", "packed", "prefetch"):
        return weight.contiguous()
    return weight.t().contiguous().t()  # (out, in), strides (1, out)


def onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN's product may serve ``F.linear(x, weight, bias)``: this build has it, and the call is
    :func:`plain_inference`."""
    return onednn_available() and plain_inference(x, weight, bias)


def plain_inference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``F.linear(x, weight, bias)`` is plain inference on the CPU, float32 or bfloat16 throughout, which
    a product without a backward (oneDNN's, the loops') may serve. Anything that needs more than the forward
    values goes through ``F.linear``: a gradient to any of the three, forward-mode AD and torch.func transforms
    (their tensors are wrapped or carry tangents), autocast (which would cast the inputs first), torch.compile
    (whose CPU backend lowers oneDNN's op only for frozen weights; the layouts put their own ops in its graphs),
    tensor subclasses, an empty inner dimension, and a bias that is not one number a row (F.linear broadcasts a
    bias of shape () or (1,); oneDNN's product read it as (out,) and gave other numbers)."""
    if torch.compiler.is_compiling() or type(x) is not torch.Tensor or x.device.type != "cpu":
        return False
    if weight.dim() != 2 or x.shape[-1] != weight.shape[-1]:
        return False  # F.linear's own error names mismatched shapes; oneDNN's does not
    if bias is not None and bias.shape != weight.shape[:1]:
        return False
    if x.dtype not in ONEDNN_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return False
    if x.shape[-1] == 0 or _autocast() or _transformed(x, weight, bias):
        return False
    needs = [x, weight, *([bias] if bias is not None else [])]
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in needs))


def _autocast() -> bool:
    return bool(torch.is_autocast_enabled("cpu"))


def _transformed(*tensors: torch.Tensor | None) -> bool:
    """Whether a tensor is under torch.func (vmap, grad, jvp) or carries a forward-mode tangent."""
    import torch.autograd.forward_ad as fwAD

    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is not None:
        for t in tensors:  # a loop, not a generator: asked at every product of a decode step
            if t is not None and wrapped(t):
                return True
    if getattr(fwAD, "_current_level", 0) < 0:  # no dual_level open, so no tangents: unpack_dual's
        return False  # microseconds, for three tensors at every product of a step, are saved
    return any(t is not None and fwAD.unpack_dual(t).tangent is not None for t in tensors)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed by oneDNN's inner product where it applies (see
    :func:`onednn_applies`), by ``F.linear`` elsewhere."""
    if onednn_applies(x, weight, bias):
        dense = None if bias is None else bias.contiguous()  # the op reads a bias as dense: a strided one reads wrong
        return torch.ops.mkldnn._linear_pointwise(x, weight, dense, "none", [], "")
    return F.linear(x, weight, bias)


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` in the "onednn" layout: the same parameters, its product by :func:`onednn_linear`.
    :func:`set_layout` turns an ``nn.Linear`` into one in place (its class swapped, as
    ``torch.nn.utils.parametrize`` does), so hooks, tied weights and references to the module stay."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return onednn_linear(input, self.weight, self.bias)


def gemv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: up to :data:`attnlab.linear.gemv.FLOAT_ROWS` rows (a decode step) by the
    compiled loop of :func:`attnlab.linear.gemv.gemv` where it applies (inference on the CPU, one dtype throughout,
    a row-major weight; under torch.compile, the op ``attnlab::gemv`` in the graph), other calls by
    :func:`onednn_linear`."""
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # (B, T, in) -> (N, in); N given: in may be 0
    if torch.compiler.is_compiling():
        same = weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype) and weight.is_contiguous()
        if same and x.dtype in ONEDNN_DTYPES and flat.shape[0] <= FLOAT_ROWS and not torch.is_grad_enabled():
            out = gemv(flat, weight, None, bias)  # (N, out): the op attnlab::gemv in the graph
            return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
    elif _loop_serves(x, flat, weight, bias):
        out = compiled_gemv(flat, weight, None, bias)  # (N, out)
        return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
    return onednn_linear(x, weight, bias)


def _loop_serves(x: torch.Tensor, flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether gemv's compiled loop may serve ``F.linear(x, weight, bias)`` outside torch.compile:
    :func:`plain_inference` and :func:`attnlab.linear.gemv.gemv_applies` (``flat``: x's rows) with one dtype
    throughout and a row-major weight, each asked once (the loop needs no oneDNN). A decode step asks it 49
    times (gpt2-small), so it reads what is cheapest first; tests/test_gemv.py holds it to the two it joins."""
    if type(x) is not torch.Tensor or x.device.type != "cpu" or weight.device.type != "cpu":
        return False
    dtype = x.dtype
    if dtype not in ONEDNN_DTYPES or weight.dtype != dtype or weight.dim() != 2 or not weight.is_contiguous():
        return False
    rows, inner = flat.shape
    if inner != weight.shape[1] or inner == 0 or not 0 < rows <= FLOAT_ROWS:
        return False
    if bias is not None and (bias.dtype != dtype or bias.shape != weight.shape[:1]):
        return False
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return False
    return not (_autocast() or traced() or _transformed(x, weight, bias) or why_no_gemv())


class GemvLinear(nn.Linear):
    """An ``nn.Linear`` in the "gemv" layout: the same parameters, its product by :func:`gemv_linear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gemv_linear(input, self.weight, self.bias)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by oneDNN's inner product over the weight's packed copy
    (:mod:`attnlab.linear.packed`) where oneDNN serves it (:func:`onednn_applies`; under torch.compile on the CPU
    without a gradient, the op ``attnlab::packed_linear`` in the graph), by ``F.linear`` elsewhere. Under a
    tracer, the weight itself, so that what is recorded reads the parameter and never a copy of it."""
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # (B, T, in) -> (N, in); N given: in may be 0
    same = weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype) and x.dtype in ONEDNN_DTYPES
    if torch.compiler.is_compiling():
        fits = same and weight.dim() == 2 and x.shape[-1] == weight.shape[-1] > 0 and packed.packing_available(x.dtype)
        fits = fits and x.device.type == "cpu" and weight.device.type == "cpu"
        if fits and not torch.is_grad_enabled() and not _autocast() and not _exporting():
            out = torch.ops.attnlab.packed_linear(flat, weight, bias)  # (N, out)
            return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
        return F.linear(x, weight, bias)
    if traced() or not packed.packing_available(x.dtype) or not onednn_applies(x, weight, bias):
        return onednn_linear(x, weight, bias)
    if x.dim() == 2:
        return packed.product(x, weight, bias)
    out = packed.product(flat, weight, bias)  # (N, out)
    return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` in the "packed" layout: the same parameters, its product by :func:`packed_linear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return packed_linear(input, self.weight, self.bias)

    def _apply(self, fn: Callable[..., object], recurse: bool = True) -> PackedLinear:
        """``.to()``, ``.half()``, ``.cpu()``...: the copy of the weight as it was is freed first (the weight's
        next product packs it anew), not held beside the converted weight until then."""
        packed.forget(self.weight)
        return super()._apply(fn, recurse)


def prefetch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: up to :data:`attnlab.linear.prefetch.ROWS` rows (a decode step) by the loop of
    :func:`attnlab.linear.prefetch.gemv` where it applies (inference on the CPU, one dtype throughout, a row-major
    weight; under torch.compile, the op ``attnlab::prefetch_gemv`` in the graph), other calls by
    :func:`onednn_linear`."""
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # (B, T, in) -> (N, in); N given: in may be 0
    same = weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype) and x.dtype in ONEDNN_DTYPES
    if torch.compiler.is_compiling():
        fits = same and weight.dim() == 2 and x.shape[-1] == weight.shape[-1] > 0 and weight.is_contiguous()
        fits = fits and 1 <= flat.shape[0] <= prefetch.ROWS and x.device.type == weight.device.type == "cpu"
        if fits and not torch.is_grad_enabled() and not _autocast() and not _exporting():
            out = torch.ops.attnlab.prefetch_gemv(flat, weight, bias)  # (N, out)
            return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
        return F.linear(x, weight, bias)
    if same and plain_inference(x, weight, bias) and prefetch_applies(flat, weight, bias):
        out = prefetch.product(flat, weight, bias)  # (N, out)
        return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
    return onednn_linear(x, weight, bias)


class PrefetchLinear(nn.Linear):
    """An ``nn.Linear`` in the "prefetch" layout: the same parameters, its product by :func:`prefetch_linear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return prefetch_linear(input, self.weight, self.bias)


CLASSES: dict[Layout, type[nn.Linear]] = {"rows": nn.Linear, "columns": nn.Linear, "onednn": OneDNNLinear}
CLASSES["gemv"], CLASSES["packed"], CLASSES["prefetch"] = GemvLinear, PackedLinear, PrefetchLinear
OWN_PRODUCTS: tuple[Layout, ...] = ("onednn", "gemv", "packed", "prefetch")  # their own product: ONEDNN_DTYPES only


def _product(layout: Layout) -> Callable[..., torch.Tensor]:
    products = {"onednn": onednn_linear, "gemv": gemv_linear, "packed": packed_linear, "prefetch": prefetch_linear}
    return products.get(layout, F.linear)


def offered(layout: Layout, dtype: torch.dtype) -> bool:
    """Whether ``layout`` can serve ``dtype`` weights here: "onednn", "gemv", "packed" and "prefetch" float32 and
    bfloat16 only, "gemv" and "prefetch" where their loops build, "packed" where oneDNN reorders that dtype."""
    if layout in OWN_PRODUCTS and dtype not in ONEDNN_DTYPES:
        return False
    if layout == "gemv":
        return not why_no_gemv()
    if layout == "prefetch":
        return not why_no_prefetch()
    return layout != "packed" or packed.packing_available(dtype)
