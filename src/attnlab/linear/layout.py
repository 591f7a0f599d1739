"""Where a weight's numbers lie in memory and which routine multiplies by them, chosen by measuring this machine.

A decode step multiplies one token's vector by every weight: it is bound by
how fast the weights stream from memory, and that depends on their layout and
on the routine. :mod:`attnlab.linear.products` holds the six layouts:
"rows" (``nn.Linear``'s own) and "columns" (Hugging Face GPT-2's Conv1D
order) for ``F.linear``; "onednn" (oneDNN's inner product), "gemv" (a loop
torch.compile writes), "packed" (oneDNN over a reordered second copy) and
"prefetch" (attnlab's own C++ loop) keep the rows and change the routine.
None changes a value, a parameter shape or a checkpoint, only speed.

Two ways to choose, both by timing (:func:`stream_rates`: every layout on
copies of a weight that together exceed this machine's caches, as decoding
meets them, the layouts taking turns, :mod:`attnlab.linear.probe`):

- ``"auto"``: the fastest of all six per weight shape, kept for the process
  ("packed", which doubles the weights' memory, only where it streams
  :data:`PACKED_GAIN` times faster than the rest);
- ``"measured"``: what ``generate`` gives a model nobody tuned. Only the
  layouts that hold one copy of each weight (:data:`ONE_COPY`: all but
  "packed"; a training step multiplies the same values through ``F.linear``),
  and one other than "rows" only where it beats "rows" by :data:`MARGIN` in
  the median and in every repeat but one: a choice inside the noise stays
  "rows", so two runs do not flip it. Kept on disk per machine and version
  (:mod:`attnlab.measured`): a second process pays nothing. A measurement
  that was not steady (the passes that decided it spread past
  :data:`attnlab.measured.SETTLED`, as they do while another process takes the
  machine) is used, kept as unsettled, and measured again by the next process,
  up to :data:`attnlab.measured.TRIES` times in all: one disturbed
  measurement is never trusted for good. (A weight small enough to stay in
  the caches is exempt: its choice moves microseconds a step, less than
  measuring it again costs.)

:func:`set_layout` re-stores a module's ``nn.Linear`` weights in place.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn

from attnlab import measured
from attnlab.linear import packed
from attnlab.linear.gemv import why_no_gemv
from attnlab.linear.prefetch import why_no_prefetch
from attnlab.linear.probe import in_cache, interleaved_passes, stream_copies
from attnlab.linear.products import CLASSES, LAYOUTS, ONEDNN_DTYPES, OWN_PRODUCTS, Layout, _product, laid_out, offered

Choice = Literal["auto", "measured"]
_CHOSEN: dict[tuple[int, int, torch.dtype], Layout] = {}
_MEASURED: dict[tuple[Path, str], Layout] = {}  # (store, shape key): what "measured" timed in this process
ONE_COPY: tuple[Layout, ...] = ("rows", "columns", "onednn", "gemv", "prefetch")  # "packed" keeps a second copy
MARGIN = 0.05  # "measured" leaves "rows" only for a layout 5% faster in the median and in all repeats but one
REPEATS = 5


def stream_rates(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32, repeats: int = 5) -> dict[Layout, float]:
    """GB/s at which the product of one vector streams (d_out, d_in) weights here, per layout offered for
    ``dtype``: the median of :func:`stream_passes`."""
    layouts = [layout for layout in LAYOUTS if offered(layout, dtype)]
    return {
        layout: statistics.median(rates)
        for layout, rates in stream_passes(d_in, d_out, dtype, layouts, repeats).items()
    }


def stream_passes(
    d_in: int, d_out: int, dtype: torch.dtype, layouts: list[Layout], repeats: int
) -> dict[Layout, list[float]]:
    """GB/s of each of ``repeats`` passes, per layout, at which the product of one vector streams (d_out, d_in)
    weights: each pass over :func:`~attnlab.linear.probe.stream_copies` copies, each its own memory, that together
    exceed the caches (a weight too small for ``MAX_COPIES`` copies to do so stays in cache), the layouts' passes
    interleaved, so that a machine that slows down or speeds up midway favours none. The layouts that keep rows
    share one set of copies; the columns and the packed copies are a set each (three sets at most)."""
    size, copies = stream_copies(d_in, d_out, dtype)
    x = torch.randn(1, d_in, dtype=dtype)
    with torch.no_grad():
        first = torch.randn(d_out, d_in, dtype=dtype)
        rows = [first, *(first.clone() for _ in range(copies - 1))]  # each its own memory: none read from cache
        columns = [laid_out(w, "columns") for w in rows] if "columns" in layouts else []
        calls: dict[Layout, list[Callable[[], object]]] = {
            layout: [partial(_product(layout), x, w) for w in (columns if layout == "columns" else rows)]
            for layout in layouts
        }
        seconds = interleaved_passes(calls, repeats)
        for w in rows:
            packed.forget(w)
    return {layout: [copies * size / spent / 1e9 for spent in seconds[layout]] for layout in layouts}


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


def measured_layout(d_in: int, d_out: int, *, dtype: torch.dtype = torch.float32) -> Layout:
    """The layout ``generate`` gives a (d_out, d_in) weight by default: among :data:`ONE_COPY` offered for
    ``dtype``, the fastest that beats "rows" by :data:`MARGIN` in the median and in every repeat but one
    (:func:`margin_winner`); "rows" otherwise. Kept on disk per machine and version (:mod:`attnlab.measured`);
    measured where nothing is kept, or what is kept is not offered here any more; "rows" where measuring is off
    (``ATTNLAB_MEASURE=0``)."""
    key = _key(d_in, d_out, dtype)
    here = (measured.store_file(), key)
    if here in _MEASURED:
        return _MEASURED[here]  # measured by this process: once a process, however many weights have the shape
    kept = measured.recall("layout", key)
    usable = kept is not None and kept.get("choice") in ONE_COPY and offered(kept["choice"], dtype)
    if kept is not None and usable and not measured.due(kept):
        return kept["choice"]  # (a loop's toolchain probed only where the loop was chosen)
    if not measured.measuring():
        return "rows"
    layouts = [layout for layout in ONE_COPY if offered(layout, dtype)]
    rates = stream_passes(d_in, d_out, dtype, layouts, REPEATS)
    choice = margin_winner(rates)
    steady = in_cache(d_in, d_out, dtype) or settled(rates, choice)  # a weight the caches hold: its calls decide
    entry = {"choice": choice, "gb_s": rates, "margin": MARGIN, "settled": steady}
    measured.keep("layout", key, entry, read=kept, usable=usable)
    _MEASURED[here] = choice
    return choice


def settled(rates: dict[Layout, list[float]], choice: Layout) -> bool:
    """Whether the passes that decided ``choice`` were steady (:func:`attnlab.measured.steady`): those of
    ``choice`` and of "rows", and, where "rows" was kept, of the fastest other layout in the median. (A faster
    layout in the median that lost more than one repeat to "rows" is not counted: its losses decided it out.)"""
    deciding = {"rows", choice}
    if choice == "rows" and len(rates) > 1:
        deciding.add(max((name for name in rates if name != "rows"), key=lambda name: statistics.median(rates[name])))
    return measured.steady(rates, deciding)


def _key(d_in: int, d_out: int, dtype: torch.dtype) -> str:
    return f"{d_in}x{d_out} {str(dtype).removeprefix('torch.')}"


def margin_winner(rates: dict[Layout, list[float]]) -> Layout:
    """The fastest layout in the median among those that beat "rows" by :data:`MARGIN` in the median and in every
    repeat but one (the passes were interleaved, so repeat i of each ran side by side); "rows" where none does.

    One repeat may lose: a moment another process takes (the machine of docs/benchmarks.md saw one) slows the
    layouts that ran in it, and asking for every repeat sent a loop 33% faster in the median back to "rows",
    bfloat16's slowest, kept on disk for every later process. Two lost repeats, or a median inside the margin,
    still keep "rows". A fastest layout that fails this leaves the next fastest that passes."""
    rows = rates["rows"]
    floor = (1 + MARGIN) * statistics.median(rows)
    for layout in sorted(rates, key=lambda name: statistics.median(rates[name]), reverse=True):
        if layout == "rows" or statistics.median(rates[layout]) <= floor:
            continue
        lost = sum(a <= b for a, b in zip(rates[layout], rows, strict=True))
        if lost <= 1:
            return layout
    return "rows"


def set_layout(module: nn.Module, layout: Layout | Choice) -> dict[str, Layout]:
    """Re-store every ``nn.Linear`` weight of ``module`` in ``layout`` ("auto": the fastest here, per shape
    and dtype; "measured": :func:`measured_layout`) and give it that layout's product; the same values and
    shapes. Returns the layout each weight got, by name."""
    if layout not in (*LAYOUTS, "auto", "measured"):
        raise ValueError(f"layout must be one of {(*LAYOUTS, 'auto', 'measured')}, got {layout!r}")
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
    if layout == "measured" and measured.measuring():
        shapes = {(*s.weight.shape, s.weight.dtype) for _, s in linears if s.weight.dtype in ONEDNN_DTYPES}
        keys = [_key(d_in, d_out, dtype) for d_out, d_in, dtype in shapes]
        kept = [measured.recall("layout", key) for key in keys]
        here = measured.store_file()
        todo = [
            e for k, e in zip(keys, kept, strict=True) if (here, k) not in _MEASURED and (e is None or measured.due(e))
        ]
        if todo:  # "again" where every one to measure was measured before, not steadily
            count = f"{len(todo)} weight shape" + ("s" if len(todo) > 1 else "")
            measured.announce(f"the layout of {count}", again=all(entry is not None for entry in todo))
    chosen: dict[str, Layout] = {}
    with torch.no_grad():
        for name, sub in linears:
            out_f, in_f = sub.weight.shape
            pick = _pick(layout, in_f, out_f, sub.weight.dtype)
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


def _pick(layout: Layout | Choice, d_in: int, d_out: int, dtype: torch.dtype) -> Layout:
    if layout == "auto":
        return fastest_layout(d_in, d_out, dtype=dtype)
    if layout == "measured":
        return measured_layout(d_in, d_out, dtype=dtype) if dtype in ONEDNN_DTYPES else "rows"
    return layout
