"""What the checker hands an answer, built in the checker's process: the book's inputs, and inputs of the same
shapes that it draws afresh for every check (issue 54: an answer judged on one fixed input passes with the
book's numbers typed in).

The collector's process receives these as data on its stdin, so it needs neither the book nor its printed
numbers to run 3.A to 3.C. Shapes match the book's, so an answer that writes the book's 6 tokens or d_k = 2
as numbers still passes: the draw tests computing, not generality.

Shapes: T = 6 tokens, d_in = 3, d_k = d_out = 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnlab import book
from attnlab.book import golden

Given = dict[str, Any]  # {"book": {argument: value}, "drawn": {argument: value}}


def _seed(generator: torch.Generator) -> int:
    return int(torch.randint(1_000, 2**31 - 1, (), generator=generator))


def _3_1(generator: torch.Generator) -> Given:
    """Seeds for SelfAttention_v1 and _v2 (the book's, then two drawn), and the inputs both run on."""
    drawn = torch.rand(6, 3, generator=generator)  # (T, d_in), the book's range [0, 1)
    return {
        "book": {"seeds": (123, 789), "inputs": book.embedded_inputs()},
        "drawn": {"seeds": (_seed(generator), _seed(generator)), "inputs": drawn},
    }


def _3_2(generator: torch.Generator) -> Given:
    return {"book": {"batch": book.batched_inputs()}, "drawn": {"batch": torch.rand(2, 6, 3, generator=generator)}}


def _3_a(generator: torch.Generator) -> Given:
    return {"book": {"inputs": book.embedded_inputs()}, "drawn": {"inputs": torch.rand(6, 3, generator=generator)}}


def _3_b(generator: torch.Generator) -> Given:
    inputs = book.embedded_inputs()
    queries = inputs @ torch.tensor(golden.W_QUERY)  # (6, 2): the book's W_query, seed 123
    keys = inputs @ torch.tensor(golden.W_KEY)  # (6, 2)
    drawn = {name: torch.randn(6, 2, generator=generator) for name in ("queries", "keys")}
    return {"book": {"queries": queries, "keys": keys}, "drawn": drawn}


def _3_c(generator: torch.Generator) -> Given:
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # the book seeds the global generator: ours is kept
        torch.manual_seed(789)
        sa_v2 = book.SelfAttentionV2(3, 2)
        inputs = book.embedded_inputs()
        scores = sa_v2.W_query(inputs) @ sa_v2.W_key(inputs).T  # (6, 6), as section 3.5.1 computes them
    return {"book": {"attn_scores": scores}, "drawn": {"attn_scores": torch.randn(6, 6, generator=generator)}}


GIVEN: dict[str, Callable[[torch.Generator], Given]] = {
    "3.1": _3_1,
    "3.2": _3_2,
    "3.3": lambda generator: {},  # judged on what build() returns: its class, sizes and parameter count
    "3.A": _3_a,
    "3.B": _3_b,
    "3.C": _3_c,
}


def given(exercise: str, generator: torch.Generator) -> Given:
    """The inputs for ``exercise``: the book's, and fresh ones drawn from ``generator``."""
    return GIVEN[exercise](generator)
