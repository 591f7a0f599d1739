"""Which int8 kernel each weight gets: ``quantize("int8")``'s "auto", measured on this machine and kept on disk.

:func:`int8_stream_passes` times every kernel this build has (:mod:`attnlab.linear.quantized`) on copies of a
weight that together exceed the caches, as a decode step meets them, the kernels taking turns pass by pass;
:func:`fastest_int8_kernel` picks the fastest in the median per weight shape and keeps it twice: for the process,
and on disk per machine and version (:mod:`attnlab.measured`, section ``"int8"``), so a later process quantizes
without timing anything. A kept kernel this machine can no longer run (a loop whose toolchain went away) is
measured again, and so is one whose deciding passes were not steady, as a measured layout is. An explicit
``quantize("int8")`` asks for the fastest kernel, so it times them where nothing is kept whatever
``ATTNLAB_MEASURE`` says (that switch governs what ``generate`` does on its own).

:func:`quantize_linears` swaps a module's ``nn.Linear`` layers for :class:`~attnlab.linear.quantized.Int8Linear`.
"""

from __future__ import annotations

import statistics
from functools import partial
from typing import Literal

import torch
import torch.nn as nn

from attnlab import measured
from attnlab.linear import packed
from attnlab.linear.gemv import why_no_gemv
from attnlab.linear.probe import in_cache, interleaved_passes
from attnlab.linear.quantized import (
    INT8_KERNELS,
    Int8Kernel,
    Int8Linear,
    PromptPath,
    _built_in,
    _check_kernel,
    available_kernels,
)

_CHOSEN: dict[tuple[int, int], Int8Kernel] = {}
STREAM_BYTES = 128 * 2**20  # int8 weights that together exceed the caches, as a decode step meets them


def int8_stream_passes(d_in: int, d_out: int, *, repeats: int = 5) -> dict[Int8Kernel, list[float]]:
    """GB/s of int8 weight each available kernel streamed in each of ``repeats`` passes, one float32 vector through
    (d_out, d_in) weights: each pass over copies that together exceed the caches (at most 32 copies), the kernels'
    passes interleaved (:func:`~attnlab.linear.probe.interleaved_passes`), so that a machine that slows down midway
    favours none."""
    size = d_in * d_out
    copies = min(32, max(1, -(-STREAM_BYTES // size)))
    x = torch.randn(1, d_in)
    with torch.no_grad():
        layers = {
            kernel: [Int8Linear(linear=nn.Linear(d_in, d_out, bias=False), kernel=kernel) for _ in range(copies)]
            for kernel in available_kernels()
        }
        seconds = interleaved_passes({k: [partial(m, x) for m in made] for k, made in layers.items()}, repeats)
        del layers
    return {kernel: [copies * size / spent / 1e9 for spent in passes] for kernel, passes in seconds.items()}


def int8_stream_rates(d_in: int, d_out: int, *, repeats: int = 5) -> dict[Int8Kernel, float]:
    """The median of :func:`int8_stream_passes`, per kernel."""
    return {k: statistics.median(passes) for k, passes in int8_stream_passes(d_in, d_out, repeats=repeats).items()}


def fastest_int8_kernel(d_in: int, d_out: int) -> Int8Kernel:
    """The kernel that streams a (d_out, d_in) int8 weight fastest here, in the median of its passes: kept for the
    process and on disk; measured where neither holds one this machine can still run, and again (where measuring
    is on) where the kept one's deciding passes were not steady (:func:`attnlab.measured.unsettled`)."""
    key = (d_in, d_out)
    if key not in _CHOSEN:
        name = f"{d_in}x{d_out}"
        kept = measured.recall("int8", name)
        usable = kept is not None and _runs_here(kept.get("kernel"))
        if kept is not None and usable and not measured.due(kept):
            _CHOSEN[key] = kept["kernel"]
        else:
            measured.announce(f"the int8 kernels on a ({d_out}, {d_in}) weight", again=kept is not None and usable)
            passes = int8_stream_passes(d_in, d_out)
            by_median = sorted(passes, key=lambda k: statistics.median(passes[k]), reverse=True)
            _CHOSEN[key] = by_median[0]
            entry = {
                "kernel": by_median[0],
                "gb_s": {k: statistics.median(rates) for k, rates in passes.items()},
                "passes": passes,
                # the winner's and the runner-up's passes decided it; a weight the caches hold, its calls
                "settled": in_cache(d_in, d_out, torch.int8) or measured.steady(passes, by_median[:2]),
            }
            measured.keep("int8", name, entry, read=kept, usable=usable)
    return _CHOSEN[key]


def _runs_here(kernel: object) -> bool:
    """Whether a kept kernel can run in this build and on this machine (gemv's toolchain probed only for it)."""
    if kernel == "gemv":
        return not why_no_gemv()
    return kernel == "dequantize" or kernel in _built_in()


def quantize_linears(module: nn.Module, kernel: Int8Kernel | Literal["auto"] = "auto") -> dict[str, Int8Kernel]:
    """Replace every ``nn.Linear`` inside ``module`` by an :class:`Int8Linear`, in place; the kernel each got.
    "auto": each weight's one-row kernel the fastest here, and a prompt's rows by the dynamic kernel's int8 x
    int8 products where the build has them; a named kernel: its own numbers for every call."""
    if kernel != "auto":
        _check_kernel(kernel)
    prompt: PromptPath = "dynamic" if kernel == "auto" and "dynamic" in _built_in() else "dequantized"
    chosen: dict[str, Int8Kernel] = {}
    for name, sub in list(module.named_modules()):
        for child_name, child in list(sub.named_children()):
            if isinstance(child, nn.Linear):
                pick = fastest_int8_kernel(child.in_features, child.out_features) if kernel == "auto" else kernel
                setattr(sub, child_name, Int8Linear(linear=child, kernel=pick, prompt=prompt))
                packed.forget(child.weight)  # a copy kept for the "packed" layout goes with the layer it served
                chosen[f"{name}.{child_name}" if name else child_name] = pick
    return chosen


__all__ = [
    "INT8_KERNELS",
    "Int8Kernel",
    "fastest_int8_kernel",
    "int8_stream_passes",
    "int8_stream_rates",
    "quantize_linears",
]
