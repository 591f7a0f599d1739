"""Where a weight's numbers lie in memory, chosen by measuring this machine: the layout decode streams fastest.

A decode step multiplies one token's vector by every weight: it is bound by
how fast the weights stream from memory, and that depends on their layout.
``nn.Linear`` keeps (out, in) row by row ("rows"); Hugging Face GPT-2's
Conv1D keeps (in, out), which is the same matrix stored column by column
("columns"). ``F.linear`` takes either (a column-major weight is its
transpose's contiguous storage), so the choice changes no value, no
parameter shape and no checkpoint, only speed.

A third choice keeps the rows and changes the routine: "onednn" computes the
product with oneDNN's inner-product primitive (the one torch.compile's CPU
backend calls) instead of ``F.linear``'s BLAS. On CPUs where the BLAS takes
a generic path (MKL on AMD processors) it streams weights much faster; the
values agree with ``F.linear``'s to float rounding. It serves inference on
the CPU in float32 and bfloat16; a product that needs a gradient, runs under
torch.compile or has another dtype or device goes through ``F.linear``.

A fourth also keeps the rows: "gemv" multiplies a decode step's few rows by
a loop that torch.compile writes for the product (:mod:`attnlab.linear.gemv`:
each weight read once, widened to float32 in registers), and more rows, a
prompt's, by oneDNN. It needs torch.compile to work here (a C++ compiler).

A fifth keeps the rows and a second copy: "packed" multiplies by oneDNN's
inner product over a copy of the weight reordered once into oneDNN's own
blocked format (:mod:`attnlab.linear.packed`), which the CPU's bfloat16
dot-product instructions read directly; it costs a second copy of the
weights' memory.

A sixth keeps the rows and changes the routine again: "prefetch" multiplies a
decode step's few rows by a loop of attnlab's own in C++
(:mod:`attnlab.linear.prefetch`) that asks memory for the next rows of the
weight before it reads them, and more rows, a prompt's, by oneDNN. It
needs torch.compile's C++ toolchain here.

:func:`fastest_layout` times every layout on copies of a weight that together
exceed this machine's caches (256 MiB, or twice the last-level cache the OS
reports, cycled), as decoding meets them, the layouts taking turns, and keeps
the answer for the process. :func:`set_layout` re-stores a
module's ``nn.Linear`` weights in place.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.linear import packed, prefetch
from attnlab.linear.gemv import FLOAT_ROWS, _exporting, gemv, gemv_applies, traced, why_no_gemv
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
_CHOSEN: dict[tuple[int, int, torch.dtype], Layout] = {}
Name = TypeVar("Name", bound=str)  # what interleaved_seconds' callers name their calls by: a layout, a kernel
STREAM_BYTES = 256 * 2**20  # the least a stream probe cycles through; twice the last-level cache where that is more
MAX_COPIES = 1024  # of one weight in a probe: a weight smaller than stream_bytes() / 1024 is timed in cache,
SMALL_COPIES = 64  # and then through this many copies (more would add calls, not bytes from memory)


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
    tensor subclasses, and an empty inner dimension."""
    if torch.compiler.is_compiling() or type(x) is not torch.Tensor or x.device.type != "cpu":
        return False
    if weight.dim() != 2 or x.shape[-1] != weight.shape[-1]:
        return False  # F.linear's own error names mismatched shapes; oneDNN's does not
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

    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
    if any(t is not None and wrapped(t) for t in tensors):
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
    flat = x.reshape(-1, x.shape[-1])  # (B, T, in) -> (N, in)
    same = weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype) and weight.is_contiguous()
    if torch.compiler.is_compiling():
        fits = same and x.dtype in ONEDNN_DTYPES and flat.shape[0] <= FLOAT_ROWS and not torch.is_grad_enabled()
    else:
        fits = same and onednn_applies(x, weight, bias) and gemv_applies(flat, weight)
    if fits:
        out = gemv(flat, weight, None, bias)  # (N, out)
        return out.reshape(*x.shape[:-1], weight.shape[0])  # (N, out) -> (B, T, out)
    return onednn_linear(x, weight, bias)


class GemvLinear(nn.Linear):
    """An ``nn.Linear`` in the "gemv" layout: the same parameters, its product by :func:`gemv_linear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gemv_linear(input, self.weight, self.bias)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by oneDNN's inner product over the weight's packed copy
    (:mod:`attnlab.linear.packed`) where oneDNN serves it (:func:`onednn_applies`; under torch.compile on the CPU
    without a gradient, the op ``attnlab::packed_linear`` in the graph), by ``F.linear`` elsewhere. Under a
    tracer, the weight itself, so that what is recorded reads the parameter and never a copy of it."""
    flat = x.reshape(-1, x.shape[-1])  # (B, T, in) -> (N, in)
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
    flat = x.reshape(-1, x.shape[-1])  # (B, T, in) -> (N, in)
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


def stream_rates(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32, repeats: int = 5) -> dict[Layout, float]:
    """GB/s at which the product of one vector streams (d_out, d_in) weights here, per layout offered for
    ``dtype``: the median of ``repeats`` passes over :func:`stream_copies` copies, each its own memory, that
    together exceed the caches (a weight too small for :data:`MAX_COPIES` copies to do so stays in cache), the
    layouts' passes interleaved, so that a machine that slows down or speeds up midway favours none. The layouts
    that keep rows share one set of copies; the columns and the packed copies are a set each (three sets at
    most)."""
    size, copies = stream_copies(d_in, d_out, dtype)
    x = torch.randn(1, d_in, dtype=dtype)
    layouts = [layout for layout in LAYOUTS if offered(layout, dtype)]
    with torch.no_grad():
        first = torch.randn(d_out, d_in, dtype=dtype)
        rows = [first, *(first.clone() for _ in range(copies - 1))]  # each its own memory: none read from cache
        columns = [laid_out(w, "columns") for w in rows] if "columns" in layouts else []
        calls: dict[Layout, list[Callable[[], object]]] = {
            layout: [partial(_product(layout), x, w) for w in (columns if layout == "columns" else rows)]
            for layout in layouts
        }
        seconds = interleaved_seconds(calls, repeats)
        for w in rows:
            packed.forget(w)
    return {layout: copies * size / seconds[layout] / 1e9 for layout in layouts}


def stream_copies(d_in: int, d_out: int, dtype: torch.dtype) -> tuple[int, int]:
    """A (d_out, d_in) ``dtype`` weight's bytes, and how many copies of it a stream probe cycles through: enough
    to reach :func:`stream_bytes`, where :data:`MAX_COPIES` do; a weight smaller than that stays in cache
    however many copies there are (the calls, not memory, bound it), and is timed through :data:`SMALL_COPIES`."""
    size = d_in * d_out * torch.finfo(dtype).bits // 8
    needed = max(1, -(-stream_bytes() // size))
    return size, needed if needed <= MAX_COPIES else SMALL_COPIES


@functools.cache
def stream_bytes() -> int:
    """The bytes a stream probe cycles through: :data:`STREAM_BYTES`, or twice this machine's last-level cache
    where that is more (a machine of docs/benchmarks.md has 480 MiB of L3), so that no weight is read from it."""
    return max(STREAM_BYTES, 2 * last_level_cache_bytes())


def last_level_cache_bytes() -> int:
    """The outermost CPU cache's bytes as Linux reports them (sysfs), summed over its instances (one per group
    of cores that share it); 0 where the OS reports none."""
    sizes: dict[tuple[int, str], int] = {}  # (level, the cores sharing it) -> bytes
    for entry in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level, size, shared = (entry.joinpath(f).read_text().strip() for f in ("level", "size", "shared_cpu_list"))
            kind = entry.joinpath("type").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if kind != "Instruction" and size[:-1].isdigit() and size[-1] in units:
            sizes[(int(level), shared)] = int(size[:-1]) * units[size[-1]]
    top = max((level for level, _ in sizes), default=0)
    return sum(size for (level, _), size in sizes.items() if level == top)


def interleaved_seconds(calls: dict[Name, list[Callable[[], object]]], repeats: int) -> dict[Name, float]:
    """Each name's median seconds of ``repeats`` passes through its calls, the names taking turns pass by pass,
    after one pass each that warms up (and packs the "packed" layout's copies)."""
    times: dict[Name, list[float]] = {name: [] for name in calls}
    for _ in range(repeats + 1):
        for name, each in calls.items():
            times[name].append(pass_seconds(each, 0))
    return {name: statistics.median(spent[1:]) for name, spent in times.items()}


def pass_seconds(calls: Sequence[Callable[[], object]], repeats: int) -> float:
    """The median seconds of ``repeats`` passes through ``calls``, after one pass that warms up: how fast a
    list of weights that together exceed the caches streams, one product each (the probes here and in
    ``attnlab.linear.quantized``). With ``repeats=0``, the seconds of one pass."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for call in calls:
            call()
        times.append(time.perf_counter() - start)
    return times[0] if repeats == 0 else statistics.median(times[1:])


PACKED_GAIN = 1.1  # "packed" doubles the weights' memory: chosen only where it streams 10% faster than the rest


def fastest_layout(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32) -> Layout:
    """The layout in which the product of one vector streams a (d_out, d_in) weight fastest here (kept per
    shape), among those :func:`offered` for ``dtype``; "packed", whose copy doubles the weights' memory, only
    where it streams more than :data:`PACKED_GAIN` times faster than every other layout."""
    key = (d_in, d_out, dtype)
    if key not in _CHOSEN:
        rates = stream_rates(d_in, d_out, dtype=dtype)
        others = {layout: rate for layout, rate in rates.items() if layout != "packed"}
        best = max(others, key=others.__getitem__)
        _CHOSEN[key] = "packed" if rates.get("packed", 0.0) > PACKED_GAIN * others[best] else best
    return _CHOSEN[key]


def set_layout(module: nn.Module, layout: Layout | Literal["auto"]) -> dict[str, Layout]:
    """Re-store every ``nn.Linear`` weight of ``module`` in ``layout`` ("auto": the fastest here, per shape
    and dtype) and give it that layout's product; the same values and shapes. Returns the layout each weight
    got, by name."""
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {(*LAYOUTS, 'auto')}, got {layout!r}")
    linears = [(name, sub) for name, sub in module.named_modules() if isinstance(sub, nn.Linear)]
    if layout in OWN_PRODUCTS:
        dtypes = sorted({str(sub.weight.dtype) for _, sub in linears} - {str(d) for d in ONEDNN_DTYPES})
        if dtypes:
            raise TypeError(
                f"the {layout} layout takes float32 or bfloat16 weights, this module holds {dtypes}: convert it "
                "first (module.float() or module.to(torch.bfloat16)), or use layout='rows' or 'auto'"
            )
    if layout == "packed":
        refused = sorted({str(s.weight.dtype) for _, s in linears if not packed.packing_available(s.weight.dtype)})
        if refused:
            raise RuntimeError(
                f"oneDNN cannot reorder {refused} weights here (bfloat16 needs a CPU with AVX-512 BW, VL and DQ, "
                "and oneDNN built in); use layout='onednn' or 'auto'"
            )
    if layout == "gemv" and why_no_gemv():
        raise RuntimeError(f"the gemv layout cannot run here: {why_no_gemv()}; use layout='onednn' or 'auto'")
    if layout == "prefetch" and why_no_prefetch():
        raise RuntimeError(f"the prefetch layout cannot run here: {why_no_prefetch()}; use layout='onednn' or 'auto'")
    chosen: dict[str, Layout] = {}
    with torch.no_grad():
        for name, sub in linears:
            out_f, in_f = sub.weight.shape
            pick: Layout = fastest_layout(in_f, out_f, dtype=sub.weight.dtype) if layout == "auto" else layout
            sub.weight.data = laid_out(sub.weight.data, pick)  # a new storage; the Parameter object stays
            if type(sub) in set(CLASSES.values()):  # another class's forward is its own: rows, as it was
                sub.__class__ = CLASSES[pick]
            elif pick in OWN_PRODUCTS:
                pick = "rows"
            packed.forget(sub.weight)  # a copy kept before is never kept on: even a write no version saw is read
            if pick == "packed":
                packed.packed_copy(sub.weight)  # now, so that a decode step never waits for it
            chosen[f"{name}.weight"] = pick
    return chosen
