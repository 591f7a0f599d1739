"""The default path made fast: what the first generation does to a model nobody tuned.

``GPT.generate``, ``stream``, ``generate_many`` and ``attnlab generate``, on a
model whose linear weights nobody laid out or quantized (:func:`settle`):

1. lay its weights out as this machine measured (``set_layout("measured")``,
   :mod:`attnlab.linear.layout`): the same values and parameters, no second
   copy, a training step still through ``F.linear``; measured once per
   machine and version, kept on disk (:mod:`attnlab.measured`);
2. compile the decode step (as ``compile=True`` does) where, measured once per
   machine and model shape and kept on disk, a compiled decode beats the eager
   one by ``MARGIN`` in the median and in every repeat, with the same greedy
   tokens; and only where this call repays the compile: this process compiled
   the model already, or its new tokens times the time a token saves exceed
   the seconds the last compile took here. Not where the call names
   ``compile=``, where it cannot compile (another cache, padding, speculation,
   another device) or where torch.compile cannot build here.

What was decided and why is kept in ``model.tuning`` (a :class:`Tuning`).
``ATTNLAB_MEASURE=0`` skips measuring; what is kept is still used.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import weakref
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn as nn

from attnlab import measured
from attnlab.cache import CACHES, ModelCache, cache_factory
from attnlab.linear.gemv import why_no_gemv
from attnlab.linear.layout import MARGIN
from attnlab.linear.quantized import Int8Linear
from attnlab.models.generation.decode import decode
from attnlab.models.generation.request import Request, Stop

PROBE_TOKENS = 32  # new tokens of one timed decode
REPEATS = 5
_COMPILED_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # compiled in this process: nothing left to repay


@dataclass(frozen=True)
class Tuning:
    """What the default path did to a model: its weights' layouts (a count each), whether this call's decode step
    was compiled, and why, in a sentence."""

    layouts: dict[str, int]
    compiled: bool
    why: str


def settle(model: Any, request: Request, *, compile_named: bool) -> Request:
    """``request`` as the default path runs it on ``model``: the model's weights laid out as measured, the request
    compiled where that wins and repays (module docstring). A model someone laid out or quantized, or a call that
    names ``compile=``, is left as it is. The request is checked first: a refused call changes nothing."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if model.layout is None and linears and all(type(m) is nn.Linear for m in linears):
        if _cache_name(request) is not None:
            request.check(model)  # a refused call leaves the weights as they were too
        if next(model.parameters()).device.type == "cpu":
            model.set_layout("measured")
    layouts = _counted(model)
    if compile_named or request.compile is not None:
        return _noted(model, request, layouts, "compile= was named by the call")
    why_not = _cannot_compile(model, request)
    if why_not:
        return _noted(model, request, layouts, f"eager: {why_not}")
    key = _signature(model)
    kept = measured.recall("compile", key)
    if kept is not None and not _whole(kept):
        kept = None  # an entry of another shape (an older attnlab, a hand edit): measured again
    if kept is None and not measured.measuring():
        return _noted(model, request, layouts, f"eager: nothing measured and {measured.ENV_MEASURE}=0")
    if kept is not None and not kept["wins"]:
        return _noted(model, request, layouts, f"eager: {kept['why']}")
    toolchain = why_no_gemv()  # torch.compile's C++ build, probed once a process: only where compile may follow
    if toolchain:
        return _noted(model, request, layouts, f"eager: {toolchain}")
    if kept is None:
        measured.announce("whether a compiled decode step beats the eager one for this model's shape")
        kept = _measure(model)
        measured.remember("compile", key, kept)
        if not kept["wins"]:
            return _noted(model, request, layouts, f"eager: {kept['why']}")
    saving = kept["eager_s"] - kept["compiled_s"]  # seconds a step, which decodes every row of the batch
    repaid = request.stop.max_new_tokens * saving
    if model not in _COMPILED_MODELS and repaid < kept["compile_s"]:
        tokens = int(kept["compile_s"] / saving) + 1
        return _noted(
            model,
            request,
            layouts,
            f"eager: compiling takes {kept['compile_s']:.1f} s here and saves {1e3 * saving:.2f} ms a token, "
            f"so it repays after {tokens} new tokens, more than this call's",
        )
    _COMPILED_MODELS.add(model)
    why = f"compiled: {kept['eager_s'] / kept['compiled_s']:.2f}x the eager step here ({kept['why']})"
    return _noted(model, replace(request, compile="inductor"), layouts, why, compiled=True)


def _whole(kept: dict[str, Any]) -> bool:
    """Whether a kept compile entry has what the choice reads: a verdict and, where it won, its seconds."""
    if not isinstance(kept.get("wins"), bool) or not isinstance(kept.get("why"), str):
        return False
    numbers = ("eager_s", "compiled_s", "compile_s")
    return not kept["wins"] or all(isinstance(kept.get(n), float) and kept[n] >= 0 for n in numbers)


def _noted(model: Any, request: Request, layouts: dict[str, int], why: str, *, compiled: bool = False) -> Request:
    model.tuning = Tuning(layouts=layouts, compiled=compiled, why=why)
    return request


def _counted(model: Any) -> dict[str, int]:
    """How many linear weights each layout or kernel serves (by class: nn.Linear is "rows")."""
    names: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, (nn.Linear, Int8Linear)):
            name = type(m).__name__.removesuffix("Linear").lower() or "rows"
            names[name] = names.get(name, 0) + 1
    return names


def _cache_name(request: Request) -> str | None:
    cache = request.cache
    return cache if isinstance(cache, str) else None


def _cannot_compile(model: Any, request: Request) -> str | None:
    """Why this request does not compile by default (None: it may)."""
    cache = request.cache
    if cache is None or isinstance(cache, ModelCache) or cache_factory(cache) is not CACHES["plain"]:
        return f"a compiled step decodes with the plain cache, this call keeps {cache!r}"
    if request.proposer is not None or request.slots is not None or request.padded:
        return "a compiled step decodes one token of unpadded rows a step (no speculation, padding or slots)"
    if next(model.parameters()).device.type != "cpu":
        return "the compile choice is measured on the CPU"
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        return "int8 weights are compiled by name only (quantize(kernel='gemv'), then compile=True)"
    return None


def _signature(model: Any) -> str:
    """The model's shape, dtype and weight layouts: what a compiled step's speed depends on (not its values)."""
    config = {k: repr(v) for k, v in asdict(model.config).items()}
    described = {"config": config, "dtype": str(next(model.parameters()).dtype), "layouts": _counted(model)}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _measure(model: Any) -> dict[str, Any]:
    """Eager against compiled decodes of :data:`PROBE_TOKENS` tokens, taking turns :data:`REPEATS` times after the
    compile; the compile's own seconds (the first here, and again with Inductor's caches warm, as a later process
    compiles); and whether both drew the same greedy tokens."""
    vocab, new = model.config.vocab_size, min(PROBE_TOKENS, model.config.context_length - 8)
    if new < 4:
        return {
            "wins": False,
            "why": f"a context of {model.config.context_length} tokens is too short to time a decode",
        }
    prompt = [(7919 * i + 11) % vocab for i in range(8)]
    eager = Request(prompts=[prompt], stop=Stop(max_new_tokens=new))
    compiled = replace(eager, compile="inductor")
    start = time.perf_counter()
    try:
        first = _tokens(model, compiled)
    except Exception as error:  # a backend that fails to build or trace: never the default
        return {"wins": False, "why": f"torch.compile failed here ({type(error).__name__})"}
    cold = time.perf_counter() - start
    if first != _tokens(model, eager):
        return {"wins": False, "why": "the compiled step drew other greedy tokens than the eager one"}
    torch._dynamo.reset()  # compiled again: what a later process pays, its Inductor caches on disk warm
    start = time.perf_counter()
    _tokens(model, compiled)
    warm = time.perf_counter() - start
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(REPEATS):
        for name, request in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            _tokens(model, request)
            times[name].append((time.perf_counter() - start) / new)
    eager_s, compiled_s = (statistics.median(times[name]) for name in ("eager", "compiled"))
    every = all(c < e for c, e in zip(times["compiled"], times["eager"], strict=True))
    wins = compiled_s * (1 + MARGIN) < eager_s and every
    why = f"{eager_s / compiled_s:.2f}x the eager step, {'' if wins else 'not '}a win by {MARGIN:.0%} in every repeat"
    entry = {"eager_s": eager_s, "compiled_s": compiled_s, "times": times, "wins": wins, "why": why}
    return {**entry, "compile_s": max(0.0, warm - new * compiled_s), "first_compile_s": cold}


@torch.no_grad()
def _tokens(model: Any, request: Request) -> list[int]:
    return [token for drawn in decode(model, request) for _, token in drawn]
