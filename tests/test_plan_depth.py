"""Issue 55's structural targets for generation: the key write is at most 8 frames of attnlab's own code below
``GPT.generate``; ``temperature`` is declared in two places (the front doors' shared options and ``Sampling``);
no front door or step takes more than 8 parameters, ``*args`` and ``**kwargs`` counted."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cache import KVCache, PagedKVCache
from attnlab.models import GPT, GPTConfig

SRC = Path(attnlab.__file__).resolve().parent


def own_frames_at_the_write(model: GPT, cls: type, monkeypatch: pytest.MonkeyPatch, **options: object) -> list[str]:
    """The frames of attnlab's code from ``GPT.generate`` down to the cache's ``update`` (itself included), at
    the first key write of a generation."""
    seen: list[list[str]] = []
    update = cls.update

    def recording(self: object, k: torch.Tensor, v: torch.Tensor) -> object:
        if not seen:
            stack = [f for f in inspect.stack(context=0) if Path(f.filename).resolve().is_relative_to(SRC)]
            names = [f.function for f in reversed(stack)]  # outermost first
            seen.append([*names[names.index("generate") :], "update"])
        return update(self, k, v)

    monkeypatch.setattr(cls, "update", recording)
    model.generate(torch.tensor([[1, 2, 3, 4]]), 3, **options)  # type: ignore[arg-type]
    assert seen, f"no {cls.__name__}.update was called"
    return seen[0]


@pytest.mark.parametrize(("cache", "cls"), [("plain", KVCache), ("paged", PagedKVCache)])
def test_the_key_write_is_at_most_eight_frames_below_generate(
    cache: str, cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, context_length=32, emb_dim=16, n_heads=2, n_layers=2)).eval()
    frames = own_frames_at_the_write(model, cls, monkeypatch, cache=cache)
    assert frames[0] == "generate" and "step" in frames, frames
    assert len(frames) <= 8, f"{len(frames)} frames: {' -> '.join(frames)}"


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_temperature_is_declared_in_two_places() -> None:
    """A parameter is passed on once: a function's parameter or a class's field named ``temperature`` is a
    declaration; the front doors' shared options and ``Sampling`` are the two."""
    declared = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                if any(x.arg == "temperature" for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)):
                    declared.append(f"{where}:{node.name}()")
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == "temperature":
                        declared.append(f"{where}:{node.name}")
    assert sorted(declared) == ["models/generation/request.py:Options", "models/generation/sampling.py:Sampling"]


def test_no_front_door_or_step_takes_more_than_eight_parameters() -> None:
    """Every function under models/ (front doors, the model's step, the loop, the request's checks), ``self``
    aside and ``*args`` / ``**kwargs`` counted."""
    models = SRC / "models"
    wide, read = [], []
    for path in sorted(models.rglob("*.py")):
        read.append(path.relative_to(models).as_posix())
        for node in _functions(path):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
            names = [n for n in names if n not in ("self", "cls")]
            if len(names) > 8:
                wide.append(f"{path.relative_to(models).as_posix()}:{node.name} ({len(names)})")
    assert {"gpt.py", "generation/decode.py", "generation/request.py"} <= set(read)
    assert wide == []
    for door in (GPT.generate, GPT.stream, GPT.generate_many, GPT.step):
        assert len(inspect.signature(door).parameters) - 1 <= 8, door.__name__
