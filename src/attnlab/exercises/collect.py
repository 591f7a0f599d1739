"""The reader's side of a check: run the reader's code, in its own process, and write down what it did.

``python -m attnlab.exercises.collect OUT ID=ANSWER.py [ID=ANSWER.py ...]`` imports each answer file as a
module of its own, gives its function the inputs the book gives (with the book's seeds), and saves what came
out (tensors, shapes, counts, an error's type and message) to OUT with ``torch.save``. The checker reads that
file back with ``weights_only=True`` and judges it in its own process: the reader's code never runs there, and
what it reports is only data, never a verdict.

Shapes: T = 6 tokens of the book's sentence, d_in = 3, d_out as the exercise says.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from attnlab import book
from attnlab.book import golden

Observed = dict[str, Any]


def load(path: Path, name: str) -> ModuleType:
    """The answer file as a module of its own name (two answers never share one)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class MissingFunction(Exception):
    """The answer file defines no function of the name the exercise asks for."""


def function(module: ModuleType, name: str) -> Callable[..., Any]:
    found = getattr(module, name, None)
    if not callable(found):
        raise MissingFunction(name)
    return found


def tensor(x: object) -> object:
    """A tensor as a detached float64 copy, a plain tensor whatever its subclass; anything else by its type's name."""
    if isinstance(x, torch.Tensor):
        return x.detach().as_subclass(torch.Tensor).to(torch.float64).cpu().clone()
    return f"<{type(x).__name__}>"


def error_of(err: BaseException) -> dict[str, str]:
    """The error's type, and its message without the type's name before it (the hint names the type)."""
    line = traceback.format_exception_only(type(err), err)[-1].strip()
    return {"type": type(err).__name__, "message": line.removeprefix(f"{type(err).__name__}: ")[:500]}


def ex_3_1(answer: ModuleType) -> Observed:
    """Exercise 3.1: ``transfer(sa_v1, sa_v2)`` moves V2's weights into V1."""
    torch.manual_seed(123)
    sa_v1 = book.SelfAttentionV1(3, 2)
    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    names = ("W_query", "W_key", "W_value")
    before = {n: getattr(sa_v2, n).weight.detach().clone() for n in names}
    seen: Observed = {"v2_before": {n: tensor(w) for n, w in before.items()}}
    seen["v1_before"] = {n: tensor(getattr(sa_v1, n)) for n in names}
    with torch.no_grad():
        function(answer, "transfer")(sa_v1, sa_v2)
    seen["v1"] = {n: tensor(getattr(sa_v1, n, None)) for n in names}
    seen["v2"] = {n: tensor(getattr(getattr(sa_v2, n, None), "weight", None)) for n in names}
    inputs = book.embedded_inputs()
    with torch.no_grad():
        for key, module in (("out_v1", sa_v1), ("out_v2", sa_v2)):
            try:
                seen[key] = tensor(module(inputs))
            except Exception as err:  # the reader's weights may not fit: say how, as data
                seen[key] = error_of(err)
    return seen


def _module_facts(module: object) -> Observed:
    if not isinstance(module, nn.Module):
        return {"class": type(module).__name__}
    heads = getattr(module, "heads", None)
    first = heads[0] if isinstance(heads, nn.ModuleList) and len(heads) else module
    query = getattr(first, "W_query", None)
    mask = getattr(first, "mask", None)
    return {
        "class": type(module).__name__,
        "parameters": sum(p.numel() for p in module.parameters()),
        "heads": len(heads) if isinstance(heads, nn.ModuleList) else getattr(module, "num_heads", None),
        "head_d_out": query.weight.shape[0] if isinstance(query, nn.Linear) else None,
        "d_out": getattr(module, "d_out", None),
        "head_dim": getattr(module, "head_dim", None),
        "qkv_bias": isinstance(query, nn.Linear) and query.bias is not None,
        "mask": tuple(mask.shape) if isinstance(mask, torch.Tensor) else None,
        "dropout": max([m.p for m in module.modules() if isinstance(m, nn.Dropout)], default=0.0),
    }


def ex_3_2(answer: ModuleType) -> Observed:
    """Exercise 3.2: ``build(d_in, context_length)`` returns two heads whose context vectors are 2-wide."""
    batch = book.batched_inputs()  # (2, 6, 3)
    torch.manual_seed(123)
    module = function(answer, "build")(batch.shape[2], batch.shape[1])
    seen = _module_facts(module)
    if isinstance(module, nn.Module):
        module.eval() if seen["dropout"] == 0.0 else module.train()  # as the book runs it: dropout acts if set
        with torch.no_grad():
            try:
                seen["out"] = tensor(module(batch))
            except Exception as err:
                seen["out"] = error_of(err)
    return seen


def ex_3_3(answer: ModuleType) -> Observed:
    """Exercise 3.3: ``build()`` returns a GPT-2-sized MultiHeadAttention."""
    module = function(answer, "build")()
    seen = _module_facts(module)
    if isinstance(module, nn.Module):
        x = torch.randn(1, 4, 768, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            try:
                seen["out"] = tuple(module.eval()(x).shape)
            except Exception as err:
                seen["out"] = error_of(err)
    return seen


def ex_3_a(answer: ModuleType) -> Observed:
    """attnlab 3.A: ``attention_weights(inputs)``, simplified self-attention's weights."""
    return {"out": tensor(function(answer, "attention_weights")(book.embedded_inputs()))}


def ex_3_b(answer: ModuleType) -> Observed:
    """attnlab 3.B: ``scaled_weights(queries, keys)``, scaled dot-product attention's weights."""
    inputs = book.embedded_inputs()
    queries = inputs @ torch.tensor(golden.W_QUERY)  # (6, 2): the book's W_query, seed 123
    keys = inputs @ torch.tensor(golden.W_KEY)  # (6, 2)
    return {"out": tensor(function(answer, "scaled_weights")(queries, keys))}


def ex_3_c(answer: ModuleType) -> Observed:
    """attnlab 3.C: ``causal_weights(attn_scores)``, SelfAttention_v2's (seed 789) scores masked and normalized."""
    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    inputs = book.embedded_inputs()
    with torch.no_grad():
        scores = sa_v2.W_query(inputs) @ sa_v2.W_key(inputs).T  # (6, 6), as section 3.5.1 computes them
    return {"out": tensor(function(answer, "causal_weights")(scores))}


COLLECT: dict[str, Callable[[ModuleType], Observed]] = {
    "3.1": ex_3_1,
    "3.2": ex_3_2,
    "3.3": ex_3_3,
    "3.A": ex_3_a,
    "3.B": ex_3_b,
    "3.C": ex_3_c,
}


def observe(exercise: str, path: Path, name: str) -> Observed:
    """What the answer at ``path`` did for ``exercise``; an error in its code becomes data, with its type."""
    try:
        return COLLECT[exercise](load(path, name))
    except MissingFunction as err:
        return {"missing": str(err)}
    except BaseException as err:  # anything the reader's code raises (SystemExit too) is part of the answer
        return {"error": error_of(err)}


def main(argv: list[str]) -> int:
    out, items = Path(argv[0]), argv[1:]
    results = []
    for n, item in enumerate(items):
        exercise, _, path = item.partition("=")
        results.append(observe(exercise, Path(path), f"attnlab_answer_{n}"))
    torch.save(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
