"""Observe attention's intermediate tensors without copying any model code: floor 0.

Attention code calls :func:`record` at each step (``attn_scores``,
``attn_weights``, ``context_vec`` ...). Outside a :class:`Recorder` that call
returns at once; inside one, the recorder keeps a detached copy, keyed by the
step's name and by the dotted name of the module that was running
(``blocks.3.attn``), so a 12-layer model gives 12 distinct maps. One
implementation, observed (STYLE principle 5).

>>> import torch
>>> with Recorder() as rec:
...     record("attn_scores", torch.ones(2, 2))
>>> rec.names()
['attn_scores']

Module names come from the outermost module called inside the recorder (the
model): its ``named_modules()`` give the dotted names, exactly as in its
state dict. A step recorded outside any module has the module name "".

Recording is off under ``torch.compile`` (a compiled graph does not call back
into Python), so compiled code carries no recorder guard.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

_ACTIVE: list[Recorder] = []  # the recorders entered and not yet left, innermost last


@dataclass(frozen=True)
class TraceStep:
    """One recorded tensor: the module that was running, what recorded it, under which name."""

    module: str  # dotted name in the model ("blocks.3.attn"); "" for the model itself or no module
    source: str  # the class or function that recorded it ("MultiHeadAttention", "attention")
    name: str
    tensor: torch.Tensor
    heads: tuple[int, ...] | None = None  # which heads dim 1 holds, when only some were recomputed
    layer: int | None = None  # the layer's index, when the attention knows it (a Hugging Face layer)


class Recorder:
    """Collect the tensors that attention code passes to :func:`record`.

    Args:
        names: keep only these step names (``fnmatch`` patterns); all by default.
        modules: keep only steps recorded inside these modules (dotted-name
            patterns such as ``"blocks.*.attn"``); all by default.
        heads: ``[(layer, head), ...]``: recompute exactly these heads' weights
            and no others, while the model runs its fused path. Attention that
            runs through ``attnlab.hf`` forms them from q, k and the kernel's
            row log-sum-exp (:func:`attnlab.functional.eager.head_weights`);
            read them with :meth:`head`.
        on_step: hand each step to this function as it is recorded,
            instead of keeping it: a consumer that packs or writes each
            layer as it comes (``attnlab.explain.hf_view`` builds a view
            so) holds one layer's tensors at a time, not the whole model's.
            The step's tensor is the one recorded, detached but not copied
            (a copy would double the layer's bytes): read it, never write
            to it (the model may still use it), and copy what you keep past
            the call.

    While a recorder is active, ``attnlab.attention(backend="auto")`` runs the
    eager backend, the one that forms the weights. A fused backend asked for
    by name records nothing; the recorder notes it, and :meth:`get` says so.

    With learned sinks (gpt-oss) every path records one truth: "attn_weights"
    are what the softmax gave the keys (a row sums to 1 minus the sink's
    share), and "sink_weight" (B, H, Tq) is that share, recorded just before
    its layer's weights (``attnlab.functional.sinks``).
    """

    def __init__(
        self,
        *,
        names: Iterable[str] | None = None,
        modules: Iterable[str] | None = None,
        heads: Iterable[tuple[int, int]] | None = None,
        on_step: Callable[[TraceStep], None] | None = None,
    ) -> None:
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be a function of one TraceStep, got {type(on_step).__name__}")
        self.steps: list[TraceStep] = []
        self.notes: list[str] = []  # why something could not be recorded
        self._names = None if names is None else tuple(names)
        self._modules = None if modules is None else tuple(modules)
        self.heads: dict[int, tuple[int, ...]] | None = None if heads is None else _heads_by_layer(heads)
        self.on_step = on_step
        self.handed = 0  # steps handed to on_step (none kept)
        self._stack: list[str] = []  # dotted names of the modules running now, innermost last
        self._roots: dict[int, dict[int, str]] = {}  # id(root) -> {id(module): dotted name}

    def __enter__(self) -> Recorder:
        if not _ACTIVE:
            _install_hooks()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _remove_hooks()

    # -- what the hooks and record() call ------------------------------------------------------------------------
    def _enter_module(self, module: nn.Module) -> None:
        for table in self._roots.values():
            if id(module) in table:
                self._stack.append(table[id(module)])
                return
        # a module no known model contains: it becomes a root, its children named from it
        self._roots[id(module)] = {id(m): name for name, m in module.named_modules()}
        self._stack.append("")

    def _leave_module(self) -> None:
        if self._stack:
            self._stack.pop()

    def _wants(self, name: str, module: str) -> bool:
        if self._names is not None and not any(fnmatch.fnmatchcase(name, p) for p in self._names):
            return False
        return self._modules is None or any(fnmatch.fnmatchcase(module, p) for p in self._modules)

    def _keep(
        self, name: str, tensor: torch.Tensor, source: str, heads: tuple[int, ...] | None, layer: int | None
    ) -> None:
        module = self._stack[-1] if self._stack else ""
        if not self._wants(name, module):
            return
        if heads is not None and self.heads is None:  # some heads alone, which another recorder chose
            self._note(
                "the layer ran a fused backend and formed only the heads a Recorder(heads=...) chose; for every "
                "head name them all, or run the eager backend"
            )
            return
        if heads is not None and layer is not None and self.heads is not None:  # only the heads this one chose
            mine = self.heads.get(layer, ())
            if not mine:
                return
            if mine != heads:
                tensor = tensor[:, [heads.index(h) for h in mine]]  # (B, h, ...): this recorder's heads, in order
            heads = mine
        if self.on_step is not None:  # handed over as it is, no copy: the consumer copies what it keeps
            self.on_step(TraceStep(module, source, name, tensor.detach(), heads, layer))
            self.handed += 1
            return
        self.steps.append(TraceStep(module, source, name, tensor.detach().clone(), heads, layer))

    def _note(self, reason: str) -> None:
        module = self._stack[-1] if self._stack else ""
        text = f"{reason} (in module {module!r})" if module else reason
        if text not in self.notes:
            self.notes.append(text)

    # -- reading -----------------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Step names in the order they were recorded (repeats included)."""
        return [step.name for step in self.steps]

    def modules(self, name: str | None = None) -> list[str]:
        """Dotted names of the modules that recorded ``name`` (any step if None), first seen first."""
        return list(dict.fromkeys(s.module for s in self.steps if name is None or s.name == name))

    def get(self, name: str, *, module: str | None = None) -> torch.Tensor:
        """The last tensor recorded under ``name`` (inside ``module``, if given).

        Raises:
            KeyError: naming what was recorded, and why ``name`` was not (a
                fused backend, a filter, or no attention run at all).
        """
        for step in reversed(self.steps):
            if step.name == name and (module is None or step.module == module):
                return step.tensor
        raise KeyError(self._why_missing(name, module))

    def head(self, layer: int, head: int, name: str = "attn_weights") -> torch.Tensor:
        """The (B, Tq, Tk) weights of one head chosen with ``heads=``, from its layer's last call.

        Tk counts the keys the layer attended over: through an attnlab cache (``attnlab.hf.cache``) its slots, in
        the cache's order (an empty one weighs 0). With learned sinks (gpt-oss) each weight is what the softmax
        gave the key, as transformers' eager attention returns it: a row sums to 1 minus the sink's share, which is
        recorded beside, as "sink_weight" (B, H, Tq) (``attnlab.functional.sinks``).

        Raises:
            KeyError: naming the heads that were recorded, when this one was not.
        """
        for step in reversed(self.steps):
            if step.name == name and step.layer == layer and step.heads is not None and head in step.heads:
                return step.tensor[:, step.heads.index(head)]
        recorded = sorted({(s.layer, h) for s in self.steps if s.layer is not None for h in s.heads or ()})
        why = "" if self.heads is None or head in self.heads.get(layer, ()) else "; it is not among heads= "
        hint = "; heads are recomputed where attention runs through attnlab.hf.use(model)"
        raise KeyError(
            f"no {name!r} of layer {layer}, head {head} was recorded{why}; recorded (layer, head): {recorded}"
            + ("; " + "; ".join(self.notes) if self.notes else "")
            + (f"; {self.handed} steps went to on_step and none was kept" if self.handed else "")
            + ("" if recorded or self.handed else hint)
        )

    def all(self, name: str) -> dict[str, torch.Tensor]:
        """{module: tensor} for every module that recorded ``name``, the last call of each."""
        return {step.module: step.tensor for step in self.steps if step.name == name}

    def _why_missing(self, name: str, module: str | None) -> str:
        where = f" in module {module!r}" if module is not None else ""
        recorded = sorted({s.name for s in self.steps})
        parts = [f"no step named {name!r} was recorded{where}; recorded: {recorded}"]
        if module is not None and any(s.name == name for s in self.steps):
            parts.append(f"modules that recorded it: {self.modules(name)}")
        if self._names is not None and not any(fnmatch.fnmatchcase(name, p) for p in self._names):
            parts.append(f"this recorder keeps only names matching {list(self._names)}")
        parts.extend(self.notes)
        if self.handed:
            parts.append(f"{self.handed} steps went to on_step as they were recorded; this recorder kept none")
        elif not self.steps and not self.notes:
            parts.append("no attnlab attention ran inside the recorder (nothing called record())")
        return "; ".join(parts)


def is_recording() -> bool:
    """True inside a Recorder, outside torch.compile."""
    return bool(_ACTIVE) and not torch.compiler.is_compiling()


def record(
    name: str,
    tensor: torch.Tensor,
    *,
    source: str = "",
    heads: tuple[int, ...] | None = None,
    layer: int | None = None,
) -> None:
    """Hand ``tensor`` to every active recorder. Costs one list check otherwise. ``heads``: dim 1 holds only
    these heads of layer ``layer`` (each recorder keeps the ones it chose)."""
    if _ACTIVE and not torch.compiler.is_compiling():
        for recorder in _ACTIVE:
            recorder._keep(name, tensor, source, heads, layer)


def chosen_heads(layer: int) -> tuple[int, ...]:
    """The heads of ``layer`` that any active recorder chose with ``heads=`` (sorted; empty when none did)."""
    return tuple(sorted({h for r in _ACTIVE for h in (r.heads or {}).get(layer, ())})) if is_recording() else ()


def wants_every_head() -> bool:
    """True when an active recorder chose no heads: it takes every weight the eager backend forms."""
    return bool(_ACTIVE) and not torch.compiler.is_compiling() and any(r.heads is None for r in _ACTIVE)


def _heads_by_layer(heads: Iterable[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    """{layer: sorted heads} from (layer, head) pairs, each checked."""
    by_layer: dict[int, set[int]] = {}
    for pair in heads:
        ints = isinstance(pair, tuple) and all(not isinstance(x, bool) and isinstance(x, int) and x >= 0 for x in pair)
        if not ints or len(pair) != 2:
            raise ValueError(f"heads must be (layer, head) pairs of ints >= 0, such as [(0, 3)], got {pair!r}")
        by_layer.setdefault(pair[0], set()).add(pair[1])
    if not by_layer:
        raise ValueError("heads=[] chooses no head: leave heads out to record every head, or name (layer, head) pairs")
    return {layer: tuple(sorted(hs)) for layer, hs in by_layer.items()}


def note_unobserved(reason: str) -> None:
    """Tell the active recorders why a step they may want was not formed (e.g. a fused kernel ran)."""
    if _ACTIVE and not torch.compiler.is_compiling():
        for recorder in _ACTIVE:
            recorder._note(reason)


# Global module hooks, installed only while a recorder is active, tell it which module is running.
_HOOKS: list[RemovableHandle] = []


def _pre_hook(module: nn.Module, args: Any) -> None:
    for recorder in _ACTIVE:
        recorder._enter_module(module)


def _post_hook(module: nn.Module, args: Any, output: Any) -> None:
    for recorder in _ACTIVE:
        recorder._leave_module()


def _install_hooks() -> None:
    _HOOKS.append(register_module_forward_pre_hook(_pre_hook))
    _HOOKS.append(register_module_forward_hook(_post_hook, always_call=True))  # pops even when forward raises


def _remove_hooks() -> None:
    while _HOOKS:
        _HOOKS.pop().remove()
