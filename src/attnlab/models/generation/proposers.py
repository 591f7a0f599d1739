"""Guesses for speculative decoding: prompt lookup and a draft model, two proposers for the one decode loop.

A decode step reads every weight to produce one token. Speculative decoding
(Leviathan et al., 2023; Chen et al., 2023) guesses tokens cheaply, then runs
the model once over all of them; ``Sampling.verify`` keeps the guesses the
model agrees with (exactly: greedy gives greedy's tokens, sampling the
model's distribution), so a pass yields at least one token and up to k + 1.

- :class:`Lookup` (prompt lookup, Saxena 2023): what followed the latest
  earlier occurrence of the last few tokens in the text so far. Free to make;
  it pays on text that repeats its context (code, a quote given again).
- :class:`Draft`: a smaller model with the same vocabulary proposes k tokens,
  one at a time, with its own cache per row of a batch, taken back to what the
  model kept (of any kind of layer: its rings keep room for its guesses, its
  states a mark).

A proposer is anything with ``k``, ``propose`` and ``crop`` (:class:`Proposer`),
each told which row (the prompt's index) it guesses for; the loop counts its
passes and guesses (``decode(...).counts``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from attnlab._checks import check_positive_int
from attnlab.models.generation.sampling import Sampling


class Proposer(Protocol):
    """Guesses for the decode loop: up to ``k`` a pass."""

    k: int

    def propose(
        self, tokens: list[int], want: int, sampling: Sampling, *, row: int = 0
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """Up to ``want`` guesses after ``tokens`` (the text of prompt ``row``), and the distributions they were
        drawn from (None: point masses, or greedy)."""
        ...

    def crop(self, held: int, *, row: int = 0) -> None:
        """The first ``held`` tokens of prompt ``row``'s text are settled (the guesses after them were refused)."""
        ...


def lookup_guess(tokens: list[int], k: int, ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``ngram`` tokens (or fewer)."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first; not the tail itself
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


class Lookup:
    """Guess ``k`` tokens from the text itself (the last ``ngram`` tokens, then fewer, seen before)."""

    def __init__(self, *, k: int, ngram: int = 3) -> None:
        check_positive_int("lookup", k, limit=64)
        check_positive_int("ngram", ngram, limit=64)
        self.k, self.ngram = k, ngram

    def propose(
        self, tokens: list[int], want: int, sampling: Sampling, *, row: int = 0
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """Up to ``want`` guesses after ``tokens``, and None: a lookup guess is a point mass."""
        return lookup_guess(tokens, want, self.ngram), None

    def crop(self, held: int, *, row: int = 0) -> None:
        """The text's first ``held`` tokens are settled (a lookup holds nothing of its own)."""


class Draft:
    """Guess ``k`` tokens with a smaller ``model`` of the same vocabulary, a cache of ``capacity`` tokens per row
    (made at its first guess: the request is checked first)."""

    def __init__(self, model: Any, *, k: int, capacity: int) -> None:
        check_positive_int("draft_tokens", k, limit=64)
        self.model, self.k, self.capacity = model, k, capacity
        self.caches: dict[int, Any] = {}  # per row: the draft's own cache, its rows guessing at their own lengths
        self.held: dict[int, int] = {}  # per row: tokens its cache holds, a prefix of the row's text

    def propose(
        self, tokens: list[int], want: int, sampling: Sampling, *, row: int = 0
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """``want`` guesses, one draft step each, and the distributions they were drawn from (None: greedy)."""
        guesses: list[int] = []
        qs: list[torch.Tensor] = []
        if row not in self.caches:  # its rings keep room for the guesses it feeds, which the model may refuse
            self.caches[row] = self.model.make_caches(batch_size=1, max_len=self.capacity, spare=self.k)
            self.held[row] = 0
        cache, feed = self.caches[row], tokens[self.held[row] :]
        device = next(self.model.parameters()).device
        for step in range(want):
            if step == 1:  # what it holds now is the text: a refused guess sends a recurrent state back here
                cache.mark()
            logits = self.model(torch.tensor([feed], device=device), caches=cache, last_only=True)[0, -1]
            self.held[row] += len(feed)
            x, q = sampling.guess(logits)
            guesses.append(x)
            qs += [q] if q is not None else []
            feed = [x]
        return guesses, qs or None

    def crop(self, held: int, *, row: int = 0) -> None:
        """The first ``held`` tokens of row ``row``'s text are settled: the draft's cache keeps no more (or goes back
        to its mark, the text at the pass's start; the next guesses feed it the rest)."""
        if row in self.caches:
            self.held[row] = self.caches[row].crop(min(self.held[row], held))
