"""Speculation in the decode loop: a pass's guesses for every row of a batch, and what each row keeps after it.

Rows that run together (one cache, left-padded) hold one length, in slots
(a row's padding, then its tokens), and :meth:`ModelCache.crop` cuts every
row to one length. So a pass feeds every row the same number of slots, its
``width``: first what its cache lacks (its backlog: the prompt at the first
pass, its last token after, and the tokens it kept beyond what the others
kept), then guesses, more for a row with less backlog. A guess may be any
token: greedy only refuses a wrong one, and under sampling a guess made
without a distribution (a lookup's, or a filler when a lookup finds fewer
guesses than its row has room for) is a point mass, so rejection sampling
stays exact (``Sampling.verify``); a draft's guesses carry the q they were
drawn from.

After the pass each row keeps its backlog and the guesses it agrees with;
the cache goes back to the least any running row kept, and what a row kept
beyond that stays in its tokens, unheld, and is fed again the next pass
(``Counts.rerun``). A layer that goes back only to a mark (a recurrent state)
gets it just before the last slot every running row holds for certain: the
slots before run first, on their own (:meth:`Pass.split`).

Where a guess may sit: a row guesses at most ``k`` tokens and never past the
last new token it may be fed (its ``max_new_tokens`` less one), so no slot
lies past the cache's capacity and no position past the model's context.
Backlogs then differ by at most ``k`` (a pass keeps at most ``k`` guesses more
in one row than in another), so every row's backlog fits in the width, and a
pass goes back by at most its guesses: a ring with ``k + 1`` spare slots
keeps its window whole. A finished row is fed ``eos_id`` (or its last token)
and never holds the others back.

Shapes: G = guesses of a row, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab.models.generation.proposers import Proposer
from attnlab.models.generation.sampling import Sampling

Guesses = tuple[list[int], list[torch.Tensor] | None]  # the guesses of a row, and the q each was drawn from


@dataclass
class Counts:
    """What one decode did: passes of the model, and the guesses a proposer made and the model kept."""

    passes: int = 0
    guessed: int = 0  # guesses fed to the model (a lookup's fillers too): what it checked
    kept: int = 0
    rerun: int = 0  # kept tokens fed again: a state went back to its mark, or another row kept fewer
    kept_each_pass: list[dict[int, int]] = field(default_factory=list)  # per pass that guessed: prompt -> kept


@dataclass
class Row:
    """One prompt's progress in the loop."""

    index: int  # the prompt's place in the request
    tokens: list[int]  # the prompt, then what was drawn (then eos_id fed while the others finish, without a proposer)
    prompt: int  # the prompt's length
    held: int = 0  # tokens the cache holds: the next one fed is at this position (a finished row's may outrun tokens)
    pad: int | None = None  # slots of left padding before position 0 (rows that run together; set when first fed)
    done: bool = False


@dataclass
class Pass:
    """One pass of rows that run together: ``width`` slots each, from ``start`` (the slots every row holds)."""

    start: int
    width: int
    feeds: dict[int, list[int]]  # per row (by slot), the tokens fed after its pads: backlog, then guesses
    pads: dict[int, int]  # per row, the slots of padding this pass still feeds first (its first pass only)
    certain: dict[int, int]  # per running row, the slots of its feed it holds for certain (its backlog)
    checks: dict[int, Guesses]  # per running row, its guesses (none: it draws its next token)

    @property
    def guessing(self) -> bool:
        """Whether a running row guesses: the pass may be refused in part, and the cache go back."""
        return any(g for g, _ in self.checks.values())

    @property
    def last(self) -> int:
        """Positions at the end of each row whose logits the pass needs: its guesses and one more."""
        return 1 + max((len(g) for g, _ in self.checks.values()), default=0)

    def split(self, n: int) -> dict[int, list[int]]:
        """The tokens of the first ``n`` slots (every row holds them for certain), taken out of this pass: they
        run first, on their own, so a mark after them sends a state back by no more than the pass's guesses and
        one."""
        assert n <= min(self.certain.values()) and all(p <= n for p in self.pads.values())
        early = {}
        for s, tokens in self.feeds.items():
            real = n - self.pads[s]
            early[s], self.feeds[s] = tokens[:real], tokens[real:]
            self.pads[s] = 0
        self.certain = {s: c - n for s, c in self.certain.items()}
        self.start, self.width = self.start + n, self.width - n
        return early


def plan(
    fed: dict[int, Row],
    proposer: Proposer,
    max_new_tokens: int,
    eos_id: int | None,
    sampling: Sampling,
    *,
    together: bool = True,
) -> Pass:
    """The pass for ``fed`` (by slot): each running row's backlog and guesses, one width for rows that run
    together; rows of their own (a paged cache: each its length, each cut back alone) guess as many as they may."""
    if not together:
        return _own_rows(fed, proposer, max_new_tokens, sampling)
    running = {s: r for s, r in fed.items() if not r.done}
    longest = max(r.prompt for r in fed.values())
    pads = {s: longest - r.prompt if r.pad is None else 0 for s, r in fed.items()}  # fed at the first pass
    backlog = {s: pads[s] + len(r.tokens) - r.held for s, r in running.items()}  # slots its cache lacks
    room = {s: min(proposer.k, max_new_tokens - (len(r.tokens) - r.prompt) - 1) for s, r in running.items()}
    width = min(backlog[s] + room[s] for s in running)  # no row guesses past its last token fed
    # Every backlog fits: backlogs differ by at most k, and one longer than another row's backlog and room cut by
    # that row's end belongs to a row that has drawn all its max_new_tokens (it has ended).
    assert all(backlog[s] <= width for s in running), (backlog, width)
    checks: dict[int, Guesses] = {}
    for s, row in running.items():
        want = width - backlog[s]
        checks[s] = proposer.propose(row.tokens, want, sampling, row=row.index) if want else ([], None)
    width = max(backlog[s] + len(g) for s, (g, _) in checks.items())  # the longest guesses found set the width
    feeds: dict[int, list[int]] = {}
    for s, row in fed.items():
        if s in checks:  # a lookup that found fewer: fillers, point masses (a draft guesses as many as asked)
            guesses, qs = checks[s]
            filler = [guesses[-1] if guesses else row.tokens[-1]] * (width - backlog[s] - len(guesses))
            assert qs is None or not filler, "a draft makes every guess asked of it"
            checks[s] = (guesses + filler, qs)
            feeds[s] = row.tokens[row.held :] + checks[s][0]
        else:  # finished: eos_id (or its last token) in each slot it holds nothing real for, never holding back
            end = eos_id if eos_id is not None else row.tokens[-1]
            feeds[s] = (row.tokens[row.held :] + [end] * width)[:width]
    start = next((r.held + r.pad for r in fed.values() if r.pad is not None), 0)
    return Pass(start=start, width=width, feeds=feeds, pads=pads, certain=backlog, checks=checks)


def _own_rows(fed: dict[int, Row], proposer: Proposer, max_new_tokens: int, sampling: Sampling) -> Pass:
    """Rows of their own (none finished: they are released): each its backlog, then up to ``k`` guesses, never
    past its last token fed; they run in groups of one feed length."""
    checks: dict[int, Guesses] = {}
    for s, row in fed.items():
        room = min(proposer.k, max_new_tokens - (len(row.tokens) - row.prompt) - 1)
        checks[s] = proposer.propose(row.tokens, room, sampling, row=row.index) if room > 0 else ([], None)
    feeds = {s: row.tokens[row.held :] + checks[s][0] for s, row in fed.items()}
    certain = {s: len(row.tokens) - row.held for s, row in fed.items()}
    width = max(len(f) for f in feeds.values())
    return Pass(start=0, width=width, feeds=feeds, pads=dict.fromkeys(fed, 0), certain=certain, checks=checks)


def verify(sampling: Sampling, logits: dict[int, torch.Tensor], spec: Pass) -> dict[int, list[int]]:
    """Per row, what the pass yields: the guesses kept and one token of the model's own for a running row
    (``logits`` (last, V) per row: ``Pass.last``), nothing for a finished one."""
    drawn: dict[int, list[int]] = {s: [] for s in logits}
    for s, (guesses, qs) in spec.checks.items():
        drawn[s] = sampling.verify(logits[s][logits[s].shape[0] - len(guesses) - 1 :], guesses, qs)  # (G + 1, V)
    return drawn


def settle(
    cache: Any, fed: dict[int, Row], spec: Pass, drawn: dict[int, list[int]], proposer: Proposer, counts: Counts
) -> None:
    """After the pass: the cache goes back to the least any running row kept (or its mark before that), every
    row holds that many slots, and each proposer forgets its row's refused guesses. Rows of their own go back
    one by one, each to what it kept (``ModelCache.crop_row``)."""
    if cache.capabilities.rows:
        _settle_own_rows(cache, fed, spec, drawn, proposer, counts)
        return
    kept = {s: len(drawn[s]) - 1 for s in spec.checks}  # guesses kept, before the token of the model's own
    keeps = {s: spec.certain[s] + kept[s] for s in spec.checks}  # slots of the pass each running row keeps
    to = spec.start + min(keeps.values())
    held = cache.crop(to) if spec.guessing else to  # a pass without guesses keeps every slot it fed
    counts.kept += sum(kept.values())
    counts.rerun += sum(spec.start + k - held for k in keeps.values())
    if spec.guessing:
        counts.kept_each_pass.append({fed[s].index: n for s, n in kept.items() if spec.checks[s][0]})
    for s, row in fed.items():
        if s in spec.checks and spec.checks[s][0]:
            proposer.crop(len(row.tokens) + kept[s], row=row.index)  # the text it may hold: its refused guesses go
        assert row.pad is not None  # set by the pass
        row.held = held - row.pad


def _settle_own_rows(
    cache: Any, fed: dict[int, Row], spec: Pass, drawn: dict[int, list[int]], proposer: Proposer, counts: Counts
) -> None:
    """Each row of its own back to what it kept (or its mark before that); what it holds then is written (a
    prefix cache remembers its full blocks)."""
    kept_now: dict[int, int] = {}
    for s, row in fed.items():
        guesses = spec.checks[s][0]
        kept = len(drawn[s]) - 1
        keeps = len(row.tokens) + kept  # its backlog, then the guesses it agrees with
        held = cache.crop_row(s, keeps) if guesses else keeps
        counts.kept += kept
        counts.rerun += keeps - held
        if guesses:
            kept_now[row.index] = kept
            proposer.crop(keeps, row=row.index)
        row.held = held
        cache.written(s, (row.tokens + drawn[s][:kept])[:held])
    if kept_now:
        counts.kept_each_pass.append(kept_now)
