"""One decode loop over one model cache: every way attnlab generates is this loop.

:func:`decode` takes one checked :class:`~attnlab.models.generation.request.Request`,
admits its prompts into the cache's rows, feeds each running row what its
cache lacks (its prompt first, then its last token, plus any guesses of a
proposer) at the positions it keeps for it, through one model step
(``model.step(ids, positions, cache)``), keeps what ``Sampling`` draws or
accepts, crops the cache to what was kept, and releases finished rows:

- a cache whose rows run together (plain, sink, quantized, evicting) admits
  every prompt at once, left-padded to one length (the padding masked, each
  row positioned as if alone); a finished row is fed its ``eos_id`` until all
  are done;
- a cache with ``rows`` (paged, prefix) admits up to ``slots`` prompts, each at
  its own length; a finished row's blocks go back and the next prompt takes
  its place (continuous batching); a prefix cache starts a prompt where its
  longest cached prefix ends;
- no cache (``None``): every pass runs the whole text again, the reference the
  caches must match.

Iterated, it yields per pass the (prompt index, token) pairs drawn, in order;
its ``counts`` say how many passes it ran and how many guesses it kept. Every
tensor is made on the model's device. ``reference_greedy`` beside it is the
readable form (the book's chapter 4 loop, with a cache); the tests hold the
loop equal to it on every cache and backend.

Shapes: B = rows, T = tokens fed, V = vocabulary.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from attnlab.cache import Cache, ModelCache
from attnlab.cache.model import passing
from attnlab.models.generation.request import Request, Stop
from attnlab.models.generation.sampling import Sampling

Step = Callable[[torch.Tensor, torch.Tensor, ModelCache], torch.Tensor]  # (ids, positions, cache) -> logits
_COMPILED: dict[object, Any] = {}  # _step under torch.compile, per backend (a guard per model)


class Decoder(Protocol):
    def step(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelCache | list[Cache] | None = ...,
        *,
        mask: torch.Tensor | None = ...,
        last_only: bool = ...,
    ) -> torch.Tensor: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...


@dataclass
class Counts:
    """What one decode did: passes of the model, and the guesses a proposer made and the model kept."""

    passes: int = 0
    guessed: int = 0
    kept: int = 0
    rerun: int = 0  # tokens run again: a recurrent state went back to its mark, before guesses it kept


@dataclass
class Row:
    index: int  # the prompt's place in the request
    tokens: list[int]  # the prompt, then what was drawn (then eos_id fed while the others finish)
    prompt: int  # the prompt's length
    held: int = 0  # tokens the cache holds, a prefix of ``tokens``: the next one fed is at this position
    pad: int | None = None  # slots of left padding before position 0 (rows that run together; set when first fed)
    done: bool = False


class Decoding:
    """One decode: iterate it (once) for its passes; ``counts`` fill as it goes."""

    def __init__(self, passes: Iterator[list[tuple[int, int]]], counts: Counts) -> None:
        self.passes, self.counts = passes, counts

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return self.passes


def decode(model: Any, request: Request) -> Decoding:
    """Generate what ``request`` asks; checked against the model and its cache made here, at the call."""
    cache = request.prepare(model)
    step = None
    if request.compile is not None:
        if request.compile not in _COMPILED:  # kept apart from the model, which then still pickles and copies
            _COMPILED[request.compile] = torch.compile(_step, backend=request.compile)
        step = functools.partial(_COMPILED[request.compile], model)
    counts = Counts()
    return Decoding(_passes(model, request, cache, step, counts), counts)


def _step(model: Decoder, ids: torch.Tensor, positions: torch.Tensor, cache: ModelCache) -> torch.Tensor:
    return model.step(ids, positions, cache)


@torch.no_grad()
def _passes(
    model: Decoder, request: Request, cache: ModelCache | None, step: Step | None, counts: Counts
) -> Iterator[list[tuple[int, int]]]:
    stop, sampling, proposer = request.stop, request.sampling, request.proposer
    device = next(model.parameters()).device
    together = cache is None or not cache.capabilities.rows
    waiting = deque(enumerate(request.prompts))
    free = deque(range(len(request.prompts) if request.slots is None else request.slots))
    running: dict[int, Row] = {}
    try:
        while True:
            opened = not (together and running)  # rows that run together are admitted together, once
            one = cache is not None and cache.capabilities.shares_prefixes  # the next may share what this one fills
            while opened and free and waiting and not (one and any(r.held < r.prompt for r in running.values())):
                slot, (index, prompt) = free.popleft(), waiting.popleft()
                total = len(prompt) + stop.max_new_tokens - 1  # the last new token is never fed back
                held = cache.admit(slot, list(prompt), total=total) if cache is not None else 0
                running[slot] = Row(index=index, tokens=list(prompt), prompt=len(prompt), held=held)
            if all(row.done for row in running.values()):
                return
            fed = dict(sorted(running.items()))  # rows that run together are fed, finished or not
            if not together:
                fed = {s: r for s, r in fed.items() if not r.done}
            guesses: dict[int, tuple[list[int], list[torch.Tensor] | None]] = {}
            if proposer is not None:
                slot, row = next(iter(fed.items()))  # one row (checked so)
                left = stop.max_new_tokens - (len(row.tokens) - row.prompt)  # a pass yields up to k + 1 tokens
                guesses[slot] = proposer.propose(row.tokens, min(proposer.k, left - 1), sampling)
                counts.guessed += len(guesses[slot][0])
            said = {s: g for s, (g, _) in guesses.items()}
            with passing(cache):  # a pass that fails halfway leaves every layer as it was before it
                if cache is not None and any(said.values()):  # a pass that guesses nothing goes back nowhere
                    counts.passes += _mark(model, cache, next(iter(fed.values())), device)
                if cache is not None and cache.capabilities.rows:
                    counts.passes += _to_stops(model, cache, fed, device)
                logits = _forward(model, cache, fed, said, step, device)
            counts.passes += 1
            drawn = _draw(sampling, logits, guesses)
            yield _take(request, cache, fed, drawn, counts)
            for slot in [s for s, r in running.items() if r.done and not together]:
                assert cache is not None  # rows of their own: a paged cache
                cache.release(slot)
                del running[slot]
                free.append(slot)
    finally:  # after an error, Ctrl-C or a stream left unfinished too: a write some layers made is undone, and a
        if cache is not None:  # cache kept across calls gets its rows back
            cache.abort()
            for slot in running if not together else ():
                cache.release(slot)


def _mark(model: Decoder, cache: ModelCache, row: Row, device: torch.device) -> int:
    """Mark where a pass of guesses may go back to; the passes this ran (0 or 1). A layer that goes back only to a
    mark (a recurrent state) gets it just before the last token the row holds for certain: the tokens before it
    run first, on their own, so a refused guess sends the state back by at most the pass's guesses and one."""
    if cache.capabilities.marks and len(row.tokens) - row.held > 1:
        ids = torch.tensor([row.tokens[row.held : -1]], device=device)  # (1, T)
        feed(model, cache, ids, torch.arange(row.held, len(row.tokens) - 1, device=device)[None])
        row.held = len(row.tokens) - 1
        cache.mark()
        return 1
    cache.mark()
    return 0


def _to_stops(model: Decoder, cache: ModelCache, fed: dict[int, Row], device: torch.device) -> int:
    """Run each row's tokens up to the last place its cache asks a call to end (a prefix cache keeps a recurrent
    state only where a call ends: at each block's end), a call a piece; the passes this ran."""
    ran = 0
    for slot, row in fed.items():
        start = row.held
        for stop in cache.stops(slot, len(row.tokens) - row.held):
            ids = torch.tensor([row.tokens[row.held : start + stop]], device=device)  # (1, T)
            positions = torch.arange(row.held, start + stop, device=device)[None]  # (1, T)
            model.step(ids, positions, cache.views([slot]), last_only=True)
            row.held, ran = start + stop, ran + 1
    return ran


def _draw(
    sampling: Sampling,
    logits: dict[int, torch.Tensor],
    guesses: dict[int, tuple[list[int], list[torch.Tensor] | None]],
) -> dict[int, list[int]]:
    """Per row, the tokens a pass yields: one drawn (every row's at once), or the guesses kept and one more."""
    if guesses:
        return {s: sampling.verify(logits[s], *guesses[s]) for s in logits}
    tokens = sampling.draw(torch.cat([x[-1:] for x in logits.values()]))[:, 0].tolist()  # (B, V) -> B tokens
    return {s: [t] for s, t in zip(logits, tokens, strict=True)}


def _take(
    request: Request, cache: ModelCache | None, fed: dict[int, Row], drawn: dict[int, list[int]], counts: Counts
) -> list[tuple[int, int]]:
    """Keep what was drawn: each row's tokens and what its cache holds (cropped to the guesses kept)."""
    stop, proposer = request.stop, request.proposer
    out: list[tuple[int, int]] = []
    for slot, row in fed.items():
        fed_to = len(row.tokens)
        kept = len(drawn[slot]) - 1  # guesses kept, before the token of the model's own
        if cache is not None:
            row.held = fed_to + kept
            if proposer is not None:  # back to what was kept, or to the mark before it (those tokens run again)
                counts.kept += kept
                row.held = cache.crop(row.held)
                counts.rerun += fed_to + kept - row.held
                proposer.crop(fed_to + kept)  # the text it may hold: its refused guesses go
            cache.written(slot, row.tokens + drawn[slot][:kept])  # what it holds: what was fed and kept
        if row.done:
            row.tokens.append(stop.eos_id if stop.eos_id is not None else drawn[slot][0])
            continue
        for token in drawn[slot]:
            row.tokens.append(token)
            out.append((row.index, token))
            if token == stop.eos_id or len(row.tokens) - row.prompt == stop.max_new_tokens:
                row.done = True
                break
    return out


def _forward(
    model: Decoder,
    cache: ModelCache | None,
    fed: dict[int, Row],
    guesses: dict[int, list[int]],
    step: Step | None,
    device: torch.device,
) -> dict[int, torch.Tensor]:
    """Run each row's missing tokens (and its guesses) at its positions; per row, the logits (G + 1, V) of its
    last G + 1 positions. Rows with ``rows`` of their own run in groups of one feed length, unpadded."""
    feeds = {s: r.tokens[r.held :] + guesses.get(s, []) for s, r in fed.items()}
    last = 1 + max((len(g) for g in guesses.values()), default=0)
    if cache is not None and cache.capabilities.rows:
        out: dict[int, torch.Tensor] = {}
        for length in sorted({len(f) for f in feeds.values()}):
            group = [s for s, f in feeds.items() if len(f) == length]
            ids = torch.tensor([feeds[s] for s in group], device=device)  # (G, T)
            positions = torch.tensor([list(range(fed[s].held, fed[s].held + length)) for s in group], device=device)
            logits = model.step(ids, positions, cache.views(group), last_only=last == 1)[:, -last:]
            out.update(zip(group, logits, strict=True))
        return out
    width = max(len(f) for f in feeds.values())  # rows that run together: left-padded to one width
    for slot, row in fed.items():
        row.pad = width - len(feeds[slot]) if row.pad is None else row.pad  # the prompts' padding, kept
    pads = [r.pad or 0 for r in fed.values()]
    ids = torch.tensor([[0] * (width - len(f)) + f for f in feeds.values()], device=device)  # (B, T)
    positions = torch.tensor(  # (B, T): a row's real tokens from its own 0 (its padding at 0 too, masked)
        [
            [0] * (width - len(f)) + list(range(r.held, r.held + len(f)))
            for r, f in zip(fed.values(), feeds.values(), strict=True)
        ],
        device=device,
    )
    mask = None
    if any(pads):  # (B, 1, 1, slots held + T): False on each row's padding; every row holds as many slots
        first = next(iter(fed.values()))
        before = first.held + pads[0] if cache is not None and first.held else 0
        slots = torch.arange(before + width, device=device)
        mask = (slots[None, :] >= torch.tensor(pads, device=device)[:, None])[:, None, None, :]
    room = cache.room() if cache is not None else None
    if step is not None and cache is not None and mask is None and width == 1:
        logits = step(ids, positions, cache)
    elif room is None or width <= room:
        logits = model.step(ids, positions, cache, mask=mask, last_only=last == 1)
    else:  # in pieces that fit
        logits = feed(model, cache, ids, positions, mask, last_only=last == 1)
    return dict(zip(fed, logits[:, -last:], strict=True))


def feed(
    model: Decoder,
    cache: ModelCache | None,
    ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    last_only: bool = True,
) -> torch.Tensor:
    """Run ids (B, T) at positions (B, T) into ``cache`` after what it holds (``mask``: (B, 1, 1, held + T), False
    on left padding); the logits (B, T or 1, V). A cache that takes only so many tokens a call (``room()``: a sink
    cache whose window would drop what the prompt's own first queries need) gets them in pieces that fit."""
    room = cache.room() if cache is not None else None
    if room is None or ids.shape[1] <= room:
        return model.step(ids, positions, cache, mask=mask, last_only=last_only)
    held = mask.shape[-1] - ids.shape[1] if mask is not None else 0
    start, pieces = 0, []
    while start < ids.shape[1]:
        end = min(ids.shape[1], start + (cache.room() or ids.shape[1]))  # type: ignore[union-attr]
        part = None if mask is None else mask[..., : held + end]
        pieces.append(model.step(ids[:, start:end], positions[:, start:end], cache, mask=part, last_only=last_only))
        start = end
    return pieces[-1] if last_only else torch.cat(pieces, dim=1)


def _after(ids: torch.Tensor, cache: ModelCache | None) -> torch.Tensor:
    """Positions (B, T) of ids (B, T) after what ``cache`` holds (none: from 0)."""
    t = ids.shape[1]
    return (cache[0].next_positions(t) if cache is not None else torch.arange(t, device=ids.device)).expand(
        ids.shape[0], t
    )


@torch.no_grad()
def reference_greedy(model: Any, prompt: list[int], max_new_tokens: int, cache: Any) -> list[int]:
    """The readable loop (the book's generate_text_simple, with a cache): the prompt once, then a token a step."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    logits = feed(model, cache, ids, _after(ids, cache))[:, -1]  # (1, V)
    new: list[int] = []
    for _ in range(max_new_tokens):
        new.append(int(logits.argmax()))
        if len(new) < max_new_tokens:
            logits = model(torch.tensor([new[-1:]], device=device), caches=cache, last_only=True)[:, -1]
    return new


@torch.no_grad()
def prefill(model: Decoder, idx: torch.Tensor, caches: ModelCache | None) -> torch.Tensor:
    """The last position's logits (B, V) of the prompt idx (B, T) run into ``caches`` (in pieces where needed)."""
    return feed(model, caches, idx, _after(idx, caches))[:, -1]


def by_position(passes: Decoding, rows: int, eos_id: int | None, device: torch.device) -> Iterator[torch.Tensor]:
    """A decode's passes as one token per row at a time, (B, 1); a row that ended gets ``eos_id`` again."""
    pending: list[list[int]] = [[] for _ in range(rows)]
    ended = [False] * rows
    for drawn in passes:
        for index, token in drawn:
            pending[index].append(token)
        while all(pending[r] or ended[r] for r in range(rows)) and not all(ended):
            tokens = [pending[r].pop(0) if pending[r] else eos_id for r in range(rows)]
            ended = [e or t == eos_id for e, t in zip(ended, tokens, strict=True)]
            yield torch.tensor(tokens, device=device)[:, None]


__all__ = ["Counts", "Decoding", "Row", "Stop", "by_position", "decode", "feed", "prefill", "reference_greedy"]
