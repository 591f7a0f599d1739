"""One decode loop over one model cache: every way attnlab generates is this loop.

:func:`decode` takes one checked :class:`~attnlab.models.generation.request.Request`,
admits its prompts into the cache's rows, feeds each running row what its
cache lacks (its prompt first, then its last token, plus any guesses of a
proposer) at the positions it keeps for it, through one model step
(``model.step(ids, positions, cache)``), keeps what ``Sampling`` draws or
accepts, and releases finished rows. A pass of guesses is planned, checked
and taken back to what every row kept by
:mod:`~attnlab.models.generation.speculation` (a padded batch too). Rows, by
cache:

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
from typing import Any, Protocol

import torch

from attnlab.cache import Cache, ModelCache
from attnlab.models.generation import speculation
from attnlab.models.generation.request import Request, Stop
from attnlab.models.generation.sampling import Sampling
from attnlab.models.generation.speculation import Counts, Row

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
            if proposer is None or cache is None:  # (a proposer is checked to come with a cache that goes back)
                if cache is not None and cache.capabilities.rows:
                    counts.passes += _to_stops(model, cache, fed, device)
                feeds = {s: r.tokens[r.held :] for s, r in fed.items()}
                logits = _forward(model, cache, fed, feeds, 1, step, device)
                drawn = _draw(sampling, logits)
                _hold(cache, fed)
            else:
                if not together:  # a prefix cache's states at the block ends the certain tokens reach
                    counts.passes += _to_stops(model, cache, fed, device)
                spec = speculation.plan(fed, proposer, stop.max_new_tokens, stop.eos_id, sampling, together=together)
                counts.guessed += sum(len(g) for g, _ in spec.checks.values())
                if spec.guessing:  # a pass that guesses nothing goes back nowhere
                    certain = min(spec.certain.values())
                    if cache.capabilities.marks and certain > 1:  # a state's mark: before the last certain slot
                        early = spec.split(certain - 1)
                        _forward(model, cache, fed, early, 1, None, device)
                        for s, row in fed.items():
                            row.held += len(early[s])
                        counts.passes += 1
                    cache.mark()
                logits = _forward(model, cache, fed, spec.feeds, spec.last, None, device)
                drawn = speculation.verify(sampling, logits, spec)
                speculation.settle(cache, fed, spec, drawn, proposer, counts)
            counts.passes += 1
            yield _take(stop, fed, drawn, fill=proposer is None)
            for slot in [s for s, r in running.items() if r.done and not together]:
                assert cache is not None  # rows of their own: a paged cache
                cache.release(slot)
                del running[slot]
                free.append(slot)
    finally:  # after an error, Ctrl-C or a stream left unfinished too: a write some layers made is undone, and a
        # cache kept across calls (a PrefixCache) gets its rows back, their states zeroed: a failed pass leaves it
        # whole (its tree takes blocks only after a pass ends), so no pass here pays for an undo
        if cache is not None:
            cache.abort()
            for slot in running if not together else ():
                cache.release(slot)


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


def _draw(sampling: Sampling, logits: dict[int, torch.Tensor]) -> dict[int, list[int]]:
    """Per row, the one token a pass yields (every row's drawn at once)."""
    tokens = sampling.draw(torch.cat([x[-1:] for x in logits.values()]))[:, 0].tolist()  # (B, V) -> B tokens
    return {s: [t] for s, t in zip(logits, tokens, strict=True)}


def _hold(cache: ModelCache | None, fed: dict[int, Row]) -> None:
    """After a pass without guesses: each row's cache holds every token it was fed."""
    if cache is not None:
        for slot, row in fed.items():
            row.held = len(row.tokens)
            cache.written(slot, row.tokens)  # what it holds (a prefix cache remembers its full blocks)


def _take(stop: Stop, fed: dict[int, Row], drawn: dict[int, list[int]], *, fill: bool) -> list[tuple[int, int]]:
    """Keep what was drawn: each row's new tokens, up to its stop; a finished row's next feed is ``eos_id`` (or
    what it drew) where it is ``fill``ed (without a proposer; with one, the pass feeds it eos_id itself)."""
    out: list[tuple[int, int]] = []
    for slot, row in fed.items():
        if row.done:
            if fill:
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
    feeds: dict[int, list[int]],
    last: int,
    step: Step | None,
    device: torch.device,
) -> dict[int, torch.Tensor]:
    """Run each row's ``feeds`` at its positions from what its cache holds; per row, the logits (last, V) of its
    last ``last`` positions. Rows with ``rows`` of their own run in groups of one feed length, unpadded; rows
    that run together are left-padded to one width (a row's first feed by its padding: it keeps that many)."""
    if cache is not None and cache.capabilities.rows:
        out: dict[int, torch.Tensor] = {}
        for length in sorted({len(f) for f in feeds.values()}):
            group = [s for s, f in feeds.items() if len(f) == length]
            ids = torch.tensor([feeds[s] for s in group], device=device)  # (G, T)
            positions = torch.tensor([list(range(fed[s].held, fed[s].held + length)) for s in group], device=device)
            logits = model.step(ids, positions, cache.views(group), last_only=last == 1)[:, -last:]
            out.update(zip(group, logits, strict=True))
        return out
    first = next(iter(fed.values()))  # every row holds as many slots: its padding, then its tokens
    before = first.held + first.pad if cache is not None and first.pad is not None else 0
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
    if any(pads):  # (B, 1, 1, slots held + T): False on each row's padding
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
