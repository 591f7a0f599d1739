"""Observe attention's intermediate tensors without copying any model code.

Attention code calls :func:`record` at each step (``attn_scores``,
``attn_weights``, ``context_vec`` ...). Outside a :class:`Recorder` that call
returns at once; inside one, the recorder keeps a detached copy under the
step's name. One implementation, observed (STYLE principle 5).

>>> import torch
>>> with Recorder() as rec:
...     record("attn_scores", torch.ones(2, 2))
>>> rec.names()
['attn_scores']
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

_ACTIVE: ContextVar[Recorder | None] = ContextVar("attnlab_recorder", default=None)


@dataclass(frozen=True)
class TraceStep:
    """One recorded tensor: which module recorded it, under which name."""

    source: str
    name: str
    tensor: torch.Tensor


@dataclass
class Recorder:
    """Collect the tensors that attention code passes to :func:`record`."""

    steps: list[TraceStep] = field(default_factory=list)
    _token: object = field(default=None, repr=False)

    def __enter__(self) -> Recorder:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)  # type: ignore[arg-type]

    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    def get(self, name: str, *, source: str | None = None) -> torch.Tensor:
        """The last tensor recorded under ``name`` (and ``source``, if given)."""
        for step in reversed(self.steps):
            if step.name == name and (source is None or step.source == source):
                return step.tensor
        known = sorted({s.name for s in self.steps})
        raise KeyError(f"no step named {name!r} was recorded; recorded: {known}")


def is_recording() -> bool:
    return _ACTIVE.get() is not None


def record(name: str, tensor: torch.Tensor, *, source: str = "") -> None:
    """Hand ``tensor`` to the active recorder, if any. Costs nothing otherwise."""
    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.steps.append(TraceStep(source, name, tensor.detach().clone()))
