"""The reader's side of a check: run the reader's code, in its own process, and write down what it did.

``python -m attnlab.exercises.collect OUT ID=ANSWER.py [ID=ANSWER.py ...]``, with the checker's payload on stdin
(a nonce, and the inputs from ``given``: the book's and freshly drawn ones), imports each answer file as a module
of its own, gives its function those inputs, and saves what came out (tensors, shapes, counts, an error's type
and message) with the nonce to OUT. The checker reads that file back with ``weights_only=True`` and judges it in
its own process: the reader's code never runs there, and what it reports is only data, never a verdict.

What an answer can reach here is kept small (issue 54): this process holds neither the book's printed numbers,
the judge nor the reference solutions (:class:`Barrier` keeps them from being imported), and 3.A to 3.C run
before any answer that needs the book's classes loads them. The nonce lives in ``main``'s locals only, so a
record the answer's code writes itself (torch.save, an atexit hook) lacks it; an answer that changes this
module's functions or ``torch.save`` is reported as such, and the change undone before the next answer.

Shapes: T = 6 tokens of the book's sentence, d_in = 3, d_out as the exercise says.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import io
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

Observed = dict[str, Any]
CLOSED = ("attnlab.exercises.", "attnlab.book.golden")  # the judge, the solutions, the book's printed numbers
BOOK_FREE = ("3.A", "3.B", "3.C")  # their answers run first, before anything loads attnlab.book


class Barrier(importlib.abc.MetaPathFinder):
    """An import of a closed module fails while answers run (the checker refuses those it sees in the source)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(CLOSED):
            raise ImportError(f"{fullname} cannot be imported by an answer being checked: write the function yourself")
        return None


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


class Borrowed(Exception):
    """The answer's function is attnlab's own, not one written in its file."""

    def __init__(self, function: str, name: str) -> None:
        super().__init__(function, name)
        self.function, self.name = function, name


def function(module: ModuleType, name: str) -> Callable[..., Any]:
    found = getattr(module, name, None)
    if not callable(found):
        raise MissingFunction(name)
    home = getattr(found, "__module__", None) or ""
    if home == "attnlab" or home.startswith("attnlab."):  # e.g. transfer = <the book's transfer_v2_to_v1>
        raise Borrowed(name, f"{home}.{getattr(found, '__qualname__', name)}")
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


def _fresh(arguments: dict[str, Any]) -> dict[str, Any]:
    """Copies of the inputs: an answer that changes its arguments in place cannot change the next call's."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}


def _pair(transfer: Callable[..., Any], seeds: tuple[int, int], inputs: torch.Tensor) -> Observed:
    """SelfAttention_v1 and _v2 built with ``seeds``, ``transfer`` run on them, and what each holds and gives."""
    from attnlab.book.trainable import SelfAttentionV1, SelfAttentionV2  # the classes the answer is handed

    torch.manual_seed(seeds[0])
    sa_v1 = SelfAttentionV1(3, 2)
    torch.manual_seed(seeds[1])
    sa_v2 = SelfAttentionV2(3, 2)
    names = ("W_query", "W_key", "W_value")
    seen: Observed = {"v2_before": {n: tensor(getattr(sa_v2, n).weight) for n in names}}
    seen["v1_before"] = {n: tensor(getattr(sa_v1, n)) for n in names}
    with torch.no_grad():
        transfer(sa_v1, sa_v2)
    seen["v1"] = {n: tensor(getattr(sa_v1, n, None)) for n in names}
    seen["v2"] = {n: tensor(getattr(getattr(sa_v2, n, None), "weight", None)) for n in names}
    with torch.no_grad():
        for key, module in (("out_v1", sa_v1), ("out_v2", sa_v2)):
            try:
                seen[key] = tensor(module(inputs.clone()))
            except Exception as err:  # the reader's weights may not fit: say how, as data
                seen[key] = error_of(err)
    return seen


def ex_3_1(answer: ModuleType, given: dict[str, Any]) -> Observed:
    """Exercise 3.1: ``transfer(sa_v1, sa_v2)`` moves V2's weights into V1, for the book's seeds and drawn ones."""
    transfer = function(answer, "transfer")
    seen = _pair(transfer, given["book"]["seeds"], given["book"]["inputs"])
    seen["drawn"] = _pair(transfer, given["drawn"]["seeds"], given["drawn"]["inputs"])
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


def ex_3_2(answer: ModuleType, given: dict[str, Any]) -> Observed:
    """Exercise 3.2: ``build(d_in, context_length)`` returns two heads whose context vectors are 2-wide."""
    batch = given["book"]["batch"]  # (2, 6, 3)
    torch.manual_seed(123)
    module = function(answer, "build")(batch.shape[2], batch.shape[1])
    seen = _module_facts(module)
    if isinstance(module, nn.Module):
        seen["weights"] = {name: tensor(p) for name, p in module.named_parameters()}  # which seed made them
        module.eval() if seen["dropout"] == 0.0 else module.train()  # as the book runs it: dropout acts if set
        with torch.no_grad():
            for key, case in (("out", "book"), ("drawn", "drawn")):
                try:
                    seen[key] = tensor(module(given[case]["batch"].clone()))
                except Exception as err:
                    seen[key] = error_of(err)
    return seen


def ex_3_3(answer: ModuleType, given: dict[str, Any]) -> Observed:
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


def _weights(name: str) -> Callable[[ModuleType, dict[str, Any]], Observed]:
    """3.A to 3.C: the answer's function ``name`` on the book's inputs (``out``) and on drawn ones (``drawn``)."""

    def collect(answer: ModuleType, given: dict[str, Any]) -> Observed:
        computed = function(answer, name)
        cases = (("out", "book"), ("drawn", "drawn"))  # positional: the reader names the parameters
        return {key: tensor(computed(*_fresh(given[case]).values())) for key, case in cases}

    return collect


COLLECT: dict[str, Callable[[ModuleType, dict[str, Any]], Observed]] = {
    "3.1": ex_3_1,
    "3.2": ex_3_2,
    "3.3": ex_3_3,
    "3.A": _weights("attention_weights"),  # attention_weights(inputs): simplified self-attention's weights
    "3.B": _weights("scaled_weights"),  # scaled_weights(queries, keys): scaled dot-product weights
    "3.C": _weights("causal_weights"),  # causal_weights(attn_scores): SelfAttention_v2's, masked, normalized
}


def observe(exercise: str, path: Path, name: str, given: dict[str, Any]) -> Observed:
    """What the answer at ``path`` did for ``exercise``; an error in its code becomes data, with its type."""
    try:
        return COLLECT[exercise](load(path, name), given)
    except MissingFunction as err:
        return {"missing": str(err)}
    except Borrowed as err:
        return {"borrowed": {"function": err.function, "name": err.name}}
    except BaseException as err:  # anything the reader's code raises (SystemExit too) is part of the answer
        return {"error": error_of(err)}


def _observe_alone(exercise: str, path: Path, name: str, given: dict[str, Any]) -> Observed:
    """``observe``, and whether the answer changed this module's code or torch.save; a change is undone, so the
    next answer runs against this module as it was."""
    own, save = dict(globals()), torch.save
    seen = observe(exercise, path, name, given)
    now = globals()
    changed = sorted(k for k in own.keys() | now.keys() if not k.startswith("__") and own.get(k) is not now.get(k))
    changed += ["torch.save"] if torch.save is not save else []
    for k in own.keys() | now.keys():
        if k in own:
            now[k] = own[k]
        elif not k.startswith("__"):
            del now[k]
    torch.save = save
    return {"tampered": changed} if changed else seen


def main(argv: list[str]) -> int:
    out, items = Path(argv[0]), argv[1:]
    payload = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)  # to its end: stdin is empty now
    nonce, given = payload["nonce"], payload["given"]  # locals, out of an answer's reach
    save = torch.save  # held before any answer runs: one that replaces torch.save does not write the record
    sys.meta_path.insert(0, Barrier())
    results: list[Observed] = [{} for _ in items]
    order = sorted(range(len(items)), key=lambda n: items[n].partition("=")[0] not in BOOK_FREE)
    for n in order:
        exercise, _, path = items[n].partition("=")
        results[n] = _observe_alone(exercise, Path(path), f"attnlab_answer_{n}", given[exercise])
    save({"nonce": nonce, "results": results}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
