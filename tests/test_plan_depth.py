"""Issue 55's structural targets for generation: the key write is at most 8 frames of attnlab's own code below
``GPT.generate``; ``temperature`` is declared in two places (the front doors' shared options and ``Sampling``);
no front door or step takes more than 8 parameters, ``*args`` and ``**kwargs`` counted; no capability probed by
name; gpt.py at most 320 lines. The measures are benchmarks/structure.py's, which prints them all."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import attnlab
from attnlab.models import GPT
from benchmark_scripts import load

SRC = Path(attnlab.__file__).resolve().parent
structure = load("structure")  # benchmarks/structure.py: the same figures, printed for the targets


@pytest.mark.parametrize("cache", ["plain", "paged"])
def test_the_key_write_is_at_most_eight_frames_below_generate(cache: str) -> None:
    frames = structure.depth(cache)
    assert frames[0] == "generate" and "step" in frames and frames[-1] == "update", frames
    assert len(frames) <= 8, f"{len(frames)} frames: {' -> '.join(frames)}"


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_temperature_is_declared_in_two_places() -> None:
    """A parameter is passed on once: a function's parameter or a class's field named ``temperature`` is a
    declaration; the front doors' shared options and ``Sampling`` are the two."""
    declared = structure.temperature_declarations()
    assert declared == ["models/generation/request.py:Options", "models/generation/sampling.py:Sampling"]


def test_no_capability_is_probed_by_name_and_gpt_py_reads_in_one_sitting() -> None:
    """What a cache or a module can do is declared (a class attribute, an isinstance), never asked with
    getattr/hasattr in models/ or cache/; models/gpt.py stays at most 320 lines."""
    assert structure.probes() == []
    assert structure.source_lines()["models/gpt.py"] <= 320


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_the_probe_scan_sees_a_probe() -> None:
    """The scan that finds none finds one put in a copy of the tree (a test that cannot fail proves nothing)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "attnlab"
        shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
        path = copy / "cache" / "model.py"
        path.write_text(path.read_text(encoding="utf-8") + "\nROWS = getattr(object(), 'rows', None)\n")
        assert [p.split(" ", 1)[1] for p in structure.probes(copy)] == ["getattr(object(), 'rows', None)"]
        observe = copy / "observe.py"  # floor 0, which the model imports: an arrow up and a circle
        observe.write_text(observe.read_text(encoding="utf-8") + "\nfrom attnlab.models.gpt import GPT\n")
        assert structure.arrows_up(copy) == ["attnlab.observe imports attnlab.models.gpt (floor 4 > 0)"]
        assert "attnlab.observe" in structure.circles(copy) and "observe" in structure.circles(copy, folders=True)


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
