"""Where a weight's numbers lie in memory, chosen by measuring this machine: the layout decode streams fastest.

A decode step multiplies one token's vector by every weight: it is bound by
how fast the weights stream from memory, and that depends on their layout.
``nn.Linear`` keeps (out, in) row by row ("rows"); Hugging Face GPT-2's
Conv1D keeps (in, out), which is the same matrix stored column by column
("columns"). ``F.linear`` takes either (a column-major weight is its
transpose's contiguous storage), so the choice changes no value, no
parameter shape and no checkpoint, only speed.

:func:`fastest_layout` times both on weights that together exceed the
caches (256 MB, cycled), as decoding meets them, and keeps the answer for
the process. :func:`set_layout` re-stores a module's ``nn.Linear`` weights
in place.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

Layout = Literal["rows", "columns"]
LAYOUTS: tuple[Layout, ...] = ("rows", "columns")
_CHOSEN: dict[tuple[int, int, torch.dtype], Layout] = {}
STREAM_BYTES = 256 * 2**20  # more than any CPU cache: the weights stream from memory, as a decode step's do


def laid_out(weight: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``weight`` (out, in) with its numbers stored row by row, or column by column."""
    if layout == "rows":
        return weight.contiguous()
    return weight.t().contiguous().t()  # (out, in), strides (1, out)


def stream_rates(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32, repeats: int = 5) -> dict[Layout, float]:
    """GB/s at which ``F.linear`` of one vector streams (d_out, d_in) weights here, per layout: median of
    ``repeats`` passes over copies that together exceed the caches (at most 64 copies: a small weight stays in
    cache, as it does decoding)."""
    size = d_in * d_out * torch.finfo(dtype).bits // 8
    copies = min(64, max(1, -(-STREAM_BYTES // size)))
    x = torch.randn(1, d_in, dtype=dtype)
    rates: dict[Layout, float] = {}
    with torch.no_grad():
        for layout in LAYOUTS:
            weights = [laid_out(torch.randn(d_out, d_in, dtype=dtype), layout) for _ in range(copies)]
            rates[layout] = copies * size / pass_seconds([partial(F.linear, x, w) for w in weights], repeats) / 1e9
            del weights
    return rates


def pass_seconds(calls: Sequence[Callable[[], object]], repeats: int) -> float:
    """The median seconds of ``repeats`` passes through ``calls``, after one pass that warms up: how fast a
    list of weights that together exceed the caches streams, one product each (the probes here and in
    ``attnlab.nn.quantized``)."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for call in calls:
            call()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def fastest_layout(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32) -> Layout:
    """The layout in which ``F.linear`` of one vector streams a (d_out, d_in) weight faster here (kept per shape)."""
    key = (d_in, d_out, dtype)
    if key not in _CHOSEN:
        rates = stream_rates(d_in, d_out, dtype=dtype)
        _CHOSEN[key] = max(rates, key=rates.__getitem__)
    return _CHOSEN[key]


def set_layout(module: nn.Module, layout: Layout | Literal["auto"]) -> dict[str, Layout]:
    """Re-store every ``nn.Linear`` weight of ``module`` in ``layout`` ("auto": the faster here, per shape);
    the same values and shapes. Returns the layout each weight got, by name."""
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {(*LAYOUTS, 'auto')}, got {layout!r}")
    chosen: dict[str, Layout] = {}
    with torch.no_grad():
        for name, sub in module.named_modules():
            if isinstance(sub, nn.Linear):
                out_f, in_f = sub.weight.shape
                pick: Layout = fastest_layout(in_f, out_f, dtype=sub.weight.dtype) if layout == "auto" else layout
                sub.weight.data = laid_out(sub.weight.data, pick)  # a new storage; the Parameter object stays
                chosen[f"{name}.weight"] = pick
    return chosen
