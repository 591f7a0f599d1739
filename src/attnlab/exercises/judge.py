"""The checker's side: what an answer did (``collect``'s data), judged against the book, in findings with hints.

Every expected value is the book's: the numbers chapter 3 prints (``attnlab.book.golden``), or what the
chapter's own classes and functions compute with the book's seeds (``attnlab.book``, tested equal to the book's
package, ``llms-from-scratch``), on the book's inputs and on those ``given`` drew for this check. None comes
from a reference solution. An answer right on the book's input is judged on the drawn one too: the book's
numbers typed in pass only the first (issue 54). A finding is a key into ``text.HINTS`` with the values its
sentence needs; ``ok`` findings say what holds, the others what differs and how to fix it.

Shapes: T = 6 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from attnlab import book
from attnlab.book import golden
from attnlab.exercises.finding import Finding

ATOL = golden.ATOL  # the book prints 4 decimals: half a unit of the last one
DRAWN_ATOL = 1e-5  # float32 answers against float64 references on the drawn inputs


def _t(rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _close(got: object, want: torch.Tensor, atol: float = ATOL) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and bool(torch.allclose(got, want, atol=atol))


def _shape(x: object) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else str(x)


def _common(seen: dict[str, Any]) -> list[Finding] | None:
    """An answer that did not run (its function missing, its code raising), or that is judged on nothing it
    computed (its function attnlab's own, or the collector's code changed under it)."""
    if "missing" in seen:
        return [Finding(False, "missing", {"name": seen["missing"]})]
    if "error" in seen:
        return [Finding(False, "error", seen["error"])]
    if "borrowed" in seen:
        return [Finding(False, "refused.borrowed", seen["borrowed"])]
    if "tampered" in seen:
        return [Finding(False, "tampered", {"names": ", ".join(seen["tampered"])})]
    return None


def _on_drawn(findings: list[Finding], got: object, want: torch.Tensor) -> list[Finding]:
    """``findings`` on the book's input; if they pass, the answer must also be right on the drawn input."""
    if not all(f.ok for f in findings) or _close(got, want, DRAWN_ATOL):
        return findings
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        return [Finding(False, "drawn", {"got": _row(got, 1), "want": _row(want, 1)})]
    return [Finding(False, "shape", {"got": _shape(got), "want": _shape(want)})]


def _nan(got: torch.Tensor) -> list[Finding]:
    """NaN rows named, 1-based as the book counts tokens; none: no finding."""
    rows = [str(i + 1) for i in range(got.shape[0]) if bool(got[i].isnan().any())]
    return [Finding(False, "nan", {"rows": ", ".join(rows)})] if rows else []


def judge_3_1(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    names = ("W_query", "W_key", "W_value")
    before, v1, v2 = seen["v2_before"], seen["v1"], seen["v2"]
    out: list[Finding] = []
    changed = [n for n in names if not (isinstance(v2[n], torch.Tensor) and torch.equal(v2[n], before[n]))]
    if changed:
        out.append(Finding(False, "3.1.direction", {"names": ", ".join(changed)}))
    elif all(_close(v1[n], seen["v1_before"][n], 0.0) for n in names):
        return [Finding(False, "3.1.unchanged", {})]
    for n in names:
        got, want = v1[n], before[n].T  # V1 computes x @ W: V2's (d_out, d_in) weight, transposed
        if _close(got, want, 1e-7):
            continue
        if isinstance(got, torch.Tensor) and got.shape == before[n].shape:
            out.append(Finding(False, "3.1.transpose", {"name": n, "shape": _shape(got), "want": _shape(want)}))
        elif isinstance(got, torch.Tensor) and (other := [m for m in names if _close(got, before[m].T, 1e-7)]):
            out.append(Finding(False, "3.1.swapped", {"name": n, "other": other[0]}))
        elif (
            isinstance(got, torch.Tensor)
            and got.shape == want.shape
            and _close(got.flatten().sort().values, want.flatten().sort().values, 1e-7)
        ):
            out.append(Finding(False, "3.1.reshape", {"name": n}))
        else:
            out.append(Finding(False, "3.1.values", {"name": n, "shape": _shape(got)}))
    book_out = _t(golden.SA_V2_OUTPUT)
    if isinstance(seen["out_v1"], dict):
        out.append(Finding(False, "3.1.runs", seen["out_v1"]))
    elif _close(seen["out_v1"], book_out):
        out.append(Finding(True, "3.1.same", {}))
    elif not out:
        out.append(Finding(False, "3.1.output", {"got": _shape(seen["out_v1"])}))
    drawn = seen["drawn"]["out_v1"]  # the pair built with the drawn seeds
    if all(f.ok for f in out) and isinstance(drawn, dict):
        return [Finding(False, "3.1.runs", drawn)]
    if all(f.ok for f in out) and not _close(drawn, _v2_output(**given["drawn"]), DRAWN_ATOL):
        return [Finding(False, "3.1.drawn", {"seeds": ", ".join(map(str, given["drawn"]["seeds"]))})]
    return out


def _v2_output(seeds: tuple[int, int], inputs: torch.Tensor) -> torch.Tensor:
    """The book's SelfAttention_v2 built with ``seeds[1]``, on ``inputs``: what V1 gives once it holds V2's weights."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seeds[1])
        return book.SelfAttentionV2(3, 2)(inputs).double()


def _wrapper() -> book.MultiHeadAttentionWrapper:
    """The book's MultiHeadAttentionWrapper(3, 1, 6, 0.0, num_heads=2), seed 123."""
    with torch.random.fork_rng(devices=[]):  # the book seeds the global generator: ours is given back
        torch.manual_seed(123)
        return book.MultiHeadAttentionWrapper(3, 1, 6, 0.0, num_heads=2)


def _wrapper_output(batch: torch.Tensor | None = None) -> torch.Tensor:
    """The book's wrapper, seed 123, on ``batch`` (the book's by default): (2, 6, 2)."""
    with torch.no_grad():
        return _wrapper()(book.batched_inputs() if batch is None else batch).double()


def _other_seed(weights: object) -> bool:
    """The book's wrapper's parameters, same names and shapes, other values: made after another seed or draw."""
    want = {name: p.detach().double() for name, p in _wrapper().named_parameters()}
    if not isinstance(weights, dict) or weights.keys() != want.keys():
        return False
    got = [weights[n] for n in want]
    if not all(isinstance(g, torch.Tensor) and g.shape == want[n].shape for g, n in zip(got, want, strict=True)):
        return False
    return not all(torch.equal(g, want[n]) for g, n in zip(got, want, strict=True))


def judge_3_2(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    if seen.get("class") != "MultiHeadAttentionWrapper":
        return [Finding(False, "3.2.class", {"got": seen.get("class")})]
    out: list[Finding] = []
    heads, width = seen.get("heads"), seen.get("head_d_out")
    if heads != 2:
        out.append(Finding(False, "3.2.heads", {"heads": heads}))
    elif width not in (None, 1):
        out.append(Finding(False, "3.2.concat", {"heads": heads, "d_out": width, "width": heads * width}))
    if seen.get("dropout", 0.0) > 0:
        out.append(Finding(False, "3.2.dropout", {"p": seen["dropout"]}))
    got = seen.get("out")
    if isinstance(got, dict):
        out.append(Finding(False, "error", got))
    elif not out and _close(got, _wrapper_output(), 1e-6):
        if isinstance(drawn := seen.get("drawn"), dict):
            return [Finding(False, "error", drawn)]
        if not _close(drawn, _wrapper_output(given["drawn"]["batch"]), DRAWN_ATOL):
            return [Finding(False, "3.2.drawn", {})]
        out.append(Finding(True, "3.2.same", {"shape": _shape(got)}))
    elif not out and _other_seed(seen.get("weights")):
        out.append(Finding(False, "3.2.seed", {}))
    elif not out:
        out.append(Finding(False, "3.2.output", {"shape": _shape(got)}))
    return out


def judge_3_3(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    if seen.get("class") != "MultiHeadAttention":
        return [Finding(False, "3.3.class", {"got": seen.get("class")})]
    out: list[Finding] = []
    if seen.get("d_out") != 768:
        out.append(Finding(False, "3.3.d_out", {"d_out": seen.get("d_out")}))
    if seen.get("heads") != 12:
        out.append(Finding(False, "3.3.heads", {"heads": seen.get("heads"), "head_dim": seen.get("head_dim")}))
    if seen.get("mask") != (1024, 1024):
        out.append(Finding(False, "3.3.context", {"mask": seen.get("mask")}))
    if seen.get("qkv_bias"):
        out.append(Finding(False, "3.3.bias", {"extra": seen.get("parameters", 0) - golden.GPT2_MHA_PARAMETERS}))
    if seen.get("parameters") == golden.GPT2_MHA_PARAMETERS and not out:
        out.append(Finding(True, "3.3.same", {"parameters": golden.GPT2_MHA_PARAMETERS}))
    elif not out:
        out.append(Finding(False, "3.3.parameters", {"got": seen.get("parameters")}))
    if isinstance(seen.get("out"), dict):
        out.append(Finding(False, "error", seen["out"]))
    elif seen.get("out") != (1, 4, 768):
        out.append(Finding(False, "shape", {"got": seen.get("out"), "want": "(1, 4, 768)"}))
    return out


def judge_3_a(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    drawn = book.all_context_vectors(given["drawn"]["inputs"].double())[1]  # the chapter's attn_weights line
    return _on_drawn(_book_3_a(seen["out"]), seen["drawn"], drawn)


def _book_3_a(got: object) -> list[Finding]:
    want, scores = _t(golden.ATTN_WEIGHTS), _t(golden.ATTN_SCORES)
    if _close(got, want):
        return [Finding(True, "3.A.same", {})]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return [Finding(False, "shape", {"got": _shape(got), "want": _shape(want)})]
    if _close(got, scores):
        return [Finding(False, "3.A.no_softmax", {})]
    if _close(got, scores / scores.sum(dim=-1, keepdim=True)):
        return [Finding(False, "3.A.sum_norm", {})]
    if _close(got, torch.softmax(scores, dim=0)):
        return [Finding(False, "3.A.dim0", {})]
    return _nan(got) or [Finding(False, "values", {"got": _row(got, 1), "want": _row(want, 1)})]


def _scaled(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Every query's row, as the book computes query 2's: softmax(q @ k.T / sqrt(d_k)), in float64."""
    queries, keys = queries.double(), keys.double()
    return torch.softmax(queries @ keys.T / keys.shape[-1] ** 0.5, dim=-1)


def judge_3_b(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    return _on_drawn(_book_3_b(seen["out"]), seen["drawn"], _scaled(**given["drawn"]))


def _book_3_b(got: object) -> list[Finding]:
    want_2 = _t(golden.ATTN_WEIGHTS_2_SCALED)
    scores_2 = _t(golden.ATTN_SCORES_2_TRAINABLE)  # query 2's scores, the book's printed row
    if not isinstance(got, torch.Tensor) or got.shape != (6, 6):
        return [Finding(False, "shape", {"got": _shape(got), "want": "(6, 6)"})]
    row = got[1]
    inputs = book.embedded_inputs().double()
    every = _scaled(inputs @ _t(golden.W_QUERY), inputs @ _t(golden.W_KEY))  # the book's W, seed 123, as printed
    if _close(row, want_2) and _close(got, every):
        return [Finding(True, "3.B.same", {})]
    if _close(row, want_2):  # query 2's row right, the others not: the answer computed one query for all
        return [Finding(False, "3.B.one_query", {})]
    if _close(row, torch.softmax(scores_2, dim=0)):
        return [Finding(False, "3.B.no_scale", {"d_k": 2})]
    if _close(row, torch.softmax(scores_2 / 2, dim=0)):
        return [Finding(False, "3.B.scale_d_k", {"d_k": 2, "root": f"{math.sqrt(2):.4f}"})]
    if _close(got.sum(dim=0), torch.ones(6, dtype=torch.float64), 1e-5):
        return [Finding(False, "3.B.dim0", {})]
    return _nan(got) or [Finding(False, "values", {"got": _row(got, 1), "want": _row(want_2.unsqueeze(0), 0)})]


def judge_3_c(seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    drawn = book.causal_weights_masked(given["drawn"]["attn_scores"].double(), d_k=2)  # section 3.5's method (2)
    return _on_drawn(_book_3_c(seen["out"]), seen["drawn"], drawn)


def _book_3_c(got: object) -> list[Finding]:
    want = _t(golden.CAUSAL_WEIGHTS)
    if _close(got, want):
        return [Finding(True, "3.C.same", {})]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return [Finding(False, "shape", {"got": _shape(got), "want": _shape(want)})]
    # no token but the first attends to itself: the diagonal was hidden with the future (row 1, all hidden,
    # is NaN after -inf, or uniform after a large finite fill); not a missing renormalization
    diagonal = got.diagonal()[1:]
    if bool(((diagonal.abs() < 1e-6) | diagonal.isnan()).all()):
        return [Finding(False, "3.C.diagonal", {})]
    if nan := _nan(got):
        return nan
    upper, lower = got.triu(1), got.tril(-1)
    if bool((upper.abs() > 1e-6).any()) and bool((lower.abs() < 1e-9).all()):
        return [Finding(False, "3.C.wrong_side", {})]
    if bool((upper.abs() > 1e-6).any()):
        return [Finding(False, "3.C.future", {"most": f"{float(upper.max()):.4f}"})]
    sums = got.sum(dim=-1)
    if not _close(sums, torch.ones(6, dtype=torch.float64), 1e-4):
        return [Finding(False, "3.C.renormalize", {"sums": _row(sums.unsqueeze(0), 0)})]
    unscaled = torch.softmax(_masked_scores(), dim=-1)  # the book's masked scores without the sqrt(d_k) scale
    if _close(got, unscaled):
        return [Finding(False, "3.C.no_scale", {})]
    return [Finding(False, "values", {"got": _row(got, 1), "want": _row(want, 1)})]


def _masked_scores() -> torch.Tensor:
    rows = golden.CAUSAL_MASKED_SCORES  # None: -inf
    return torch.tensor([[-math.inf if x is None else x for x in r] for r in rows], dtype=torch.float64)


def _row(x: torch.Tensor, i: int) -> str:
    return "[" + ", ".join(f"{float(v):.4f}" for v in x[i]) + "]"


JUDGES: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[Finding]]] = {
    "3.1": judge_3_1,
    "3.2": judge_3_2,
    "3.3": judge_3_3,
    "3.A": judge_3_a,
    "3.B": judge_3_b,
    "3.C": judge_3_c,
}


def judge(exercise: str, seen: dict[str, Any], given: dict[str, Any]) -> list[Finding]:
    """What the answer did (``seen``), judged; ``given`` is what it was handed (the book's and drawn inputs)."""
    return _common(seen) or JUDGES[exercise](seen, given)
