"""One or two tokens' product with a weight that asks memory for the next rows before it reads them: the
"prefetch" layout (issue 37).

A decode step reads every weight once, so it runs at the rate the weights
stream from memory. On the machine of ``docs/benchmarks.md`` the library
kernels read a float32 weight at nearly memory's rate, but a bfloat16 one well
below it (``benchmarks/stream_rates.py``, the run pasted there): widening bfloat16 to float32
costs instructions for every cache line, fewer of the weight's lines are in
flight at a time, and on rows of 768 numbers the CPU's own prefetchers do
not make up for it. bfloat16 then decodes little faster than float32 though
it reads half the bytes.

``prefetch.cpp`` is the product written with the cure: it sums the weight
four rows at a time, and while it sums a block it asks for the matching
cache line of the next block into the first-level cache and of a block
further on into the outer ones (``__builtin_prefetch``), so memory works
on the next lines whatever the arithmetic costs. It widens to float32 and
sums in float32 as :func:`attnlab.linear.gemv.readable_gemv`, the readable path it is
tested against, does; the two differ by float rounding, the order of the
sum. A row's numbers never depend on the other row of the call (tested
bitwise). ``ahead=0`` asks for nothing ahead: the same numbers, for the
benchmark that measures what the prefetch gives.

The file is built on first use in a process by torch.compile's own C++
toolchain (Inductor's code cache, which keeps the library on disk for later
processes) with the vector instructions Inductor picks for this CPU, and
called through ctypes, a few microseconds a call. :func:`why_no_prefetch`
says why it cannot be built or trusted here (no C++ compiler, a torch
without that toolchain), or nothing; where it cannot, ``set_layout("auto")``
never chooses the layout and asking for it by name is refused with the
reason. Under torch.compile the product is the op ``attnlab::prefetch_gemv``,
which the graph calls without looking inside.

Shapes: N = rows (tokens), in / out = the weight's features.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.linear.gemv import readable_gemv, traced
from attnlab.linear.inductor import define_cpu_op, refuse_gradient

ROWS = 2  # the most rows one call serves (the file's kernels are built for 1 and 2): a decode step's
AHEAD = 1  # blocks of 4 rows ahead that a block asks for: on the machine of docs/benchmarks.md, 1 streamed every
# gpt2-small shape at least as fast as 2 and 3 did (a sweep run once while writing the loop, not kept; 1, 2 and 4
# again once the loop also asked kFar blocks further into the outer caches)
PREFETCH_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the weights it reads, by the code the file takes
SOURCE = Path(__file__).with_name("prefetch.cpp")


@functools.cache
def _library() -> ctypes.CDLL:
    """prefetch.cpp built and loaded, once a process (Inductor keeps the build on disk)."""
    from torch._inductor.codecache import CppCodeCache

    library = CppCodeCache.load(SOURCE.read_text())
    function = library.attnlab_prefetch_gemv
    function.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 4, ctypes.c_int]
    function.restype = ctypes.c_int
    return library


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, ahead: int = AHEAD
) -> torch.Tensor:
    """(N, in) x (out, in) -> (N, out), N at most :data:`ROWS`: :func:`readable_gemv`'s numbers to float
    rounding, by prefetch.cpp. For inference on the CPU: x, weight and bias in one dtype of
    :data:`PREFETCH_DTYPES`, the weight row-major. ``ahead``: blocks of rows ahead to ask for (0: none)."""
    _check(x, weight, bias, ahead)
    refuse_gradient("prefetch_gemv", x, weight, bias)
    return product(x, weight, bias, ahead=ahead)


def product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, ahead: int = AHEAD
) -> torch.Tensor:
    """:func:`gemv` without its checks, for a caller that has made them (:func:`prefetch_applies` and one dtype
    throughout): the C++ trusts shapes, dtypes, strides and devices, and reads memory by them."""
    if x.is_neg() or weight.is_neg() or (bias is not None and bias.is_neg()):  # a negative view's memory holds
        x, weight = x.resolve_neg(), weight.resolve_neg()  # its values unnegated: the values, copied (rare)
        bias = None if bias is None else bias.resolve_neg()
    x = x.contiguous()
    dense = None if bias is None else bias.contiguous()
    out = x.new_empty(x.shape[0], weight.shape[0])  # (N, out)
    code = _library().attnlab_prefetch_gemv(
        PREFETCH_DTYPES[weight.dtype],
        x.data_ptr(),
        weight.data_ptr(),
        None if dense is None else dense.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        weight.shape[0],
        weight.shape[1],
        ahead,
        torch.get_num_threads(),
    )
    if code != 0:  # the checks refuse what the file does not serve: this is a file out of step with them
        raise RuntimeError(f"prefetch.cpp refused a call that was checked (code {code}): {SOURCE} is out of date")
    return out


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ahead: int) -> None:
    """Refuse, by name, what the C++ would read wrongly: it trusts shapes, dtypes, strides and devices."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"prefetch gemv multiplies x (N, in) by a weight (out, in), got x {tuple(x.shape)} and weight "
            f"{tuple(weight.shape)}: reshape x to (-1, {weight.shape[-1]})"
        )
    if not 1 <= x.shape[0] <= ROWS:
        raise ValueError(f"prefetch gemv serves 1 to {ROWS} rows (a decode step), got {x.shape[0]}: use F.linear")
    given = (x, weight) if bias is None else (x, weight, bias)  # named only in a message (x, weight, bias)
    dtype = weight.dtype
    if dtype not in PREFETCH_DTYPES or x.dtype != dtype or (bias is not None and bias.dtype != dtype):
        dtypes = {name: t.dtype for name, t in zip(("x", "weight", "bias"), given, strict=False)}
        raise TypeError(
            f"prefetch gemv takes x, weight and bias all float32 or all bfloat16, got {dtypes}: convert them"
        )
    if any(t.device.type != "cpu" for t in given):
        devices = {name: t.device.type for name, t in zip(("x", "weight", "bias"), given, strict=False)}
        raise ValueError(f"prefetch gemv runs on the CPU, got {devices}: call .cpu() first, or use F.linear")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"prefetch gemv's bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    if not weight.is_contiguous():
        raise ValueError(
            f"prefetch gemv reads a row-major weight, got strides {weight.stride()} for {tuple(weight.shape)}: "
            "set_layout('prefetch') stores it so (or pass weight.contiguous())"
        )
    if not 0 <= ahead <= weight.shape[0]:
        raise ValueError(
            f"ahead counts blocks of 4 rows to ask for ahead, from 0 to the weight's {weight.shape[0]} rows, got "
            f"{ahead}"
        )


def prefetch_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`product` may serve ``x`` (N, in) times ``weight`` plus ``bias``: at most :data:`ROWS` rows
    and none empty, a row-major weight of a dtype it reads, a bias (out,), all on the CPU, no gradient wanted,
    no tracer recording (it would not see the C++ run), and the file built here. The caller checks that the
    dtypes agree."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return False  # F.linear's own error, as for any linear
    if not 1 <= x.shape[0] <= ROWS or x.shape[1] == 0 or weight.shape[0] == 0:
        return False
    if weight.dtype not in PREFETCH_DTYPES or not weight.is_contiguous() or traced():
        return False
    if x.device.type != "cpu" or weight.device.type != "cpu" or type(x) is not torch.Tensor:
        return False
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0] or bias.device.type != "cpu"):
        return False
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return False
    return not why_no_prefetch()


@functools.cache
def why_no_prefetch() -> str:
    """Why prefetch.cpp cannot serve here, in one line; "" where it builds and agrees with :func:`readable_gemv`
    on tiny products of both dtypes, 1 and 2 rows, with a bias and without. Tried once a process, on the CPU,
    outside the caller's autocast and dispatch modes (a fake-tensor mode, a profiler of ops)."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        _library()
    except Exception as error:  # no C++ compiler, a torch without Inductor's code cache: the reason, in one line
        return f"the prefetch loop cannot be built here ({_one_line(error)})"
    try:
        with _disable_current_modes(), torch.autocast("cpu", enabled=False), torch.no_grad():
            return _disagreement()
    except Exception as error:  # a build that loads but cannot run
        return f"the prefetch loop built here fails on a tiny product ({_one_line(error)})"


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def _disagreement() -> str:
    """The first tiny product on which :func:`gemv` and :func:`readable_gemv` disagree, in words; "" for none."""
    generator = torch.Generator().manual_seed(0)
    for dtype in PREFETCH_DTYPES:
        weight = torch.randn(13, 37, generator=generator, device="cpu").to(dtype)  # the vector and block tails
        bias = torch.randn(13, generator=generator, device="cpu").to(dtype)
        for rows in range(1, ROWS + 1):
            x = torch.randn(rows, 37, generator=generator, device="cpu").to(dtype)
            for given in (None, bias):
                got, want = gemv(x, weight, given), readable_gemv(x, weight, None, given)
                if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
                    with_bias = "with a bias" if given is not None else "no bias"
                    return f"the prefetch loop built here disagrees with the readable product ({dtype}, rows: {rows}, {with_bias})"
    return ""


def _prefetch_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if why_no_prefetch():  # a layer given the layout before the verdict, or unpickled: never the loop set aside
        return F.linear(x, weight, bias)
    return gemv(x, weight, bias)  # checked: a bad call would read memory wrongly


def _prefetch_op_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # (N, out)


# :func:`gemv` as an op of a torch.compile graph (inference only)
define_cpu_op("prefetch_gemv", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _prefetch_op, _prefetch_op_shape)
