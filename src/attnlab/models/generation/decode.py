"""One decode loop over one model cache: every way attnlab generates is this loop.

:func:`decode` admits prompts into the cache's rows, feeds each running row
what its cache lacks (its prompt first, then its last token, plus any
guesses of a proposer), keeps what ``Sampling`` draws or accepts, crops the
cache to what was kept, and releases finished rows:

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

It yields, per pass, the (prompt index, token) pairs drawn, in order. Every
tensor is made on the model's device. ``reference_greedy`` beside it is the
readable form (the book's chapter 4 loop, with a cache); the tests hold the
loop equal to it on every cache and backend.

Shapes: B = rows, T = tokens fed, V = vocabulary.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from attnlab._checks import check_positive_int
from attnlab.cache import ModelCache
from attnlab.models.generation.proposers import Proposer
from attnlab.models.generation.sampling import Sampling

Step = Callable[[torch.Tensor, ModelCache], torch.Tensor]  # (tokens (B, 1), cache) -> logits (B, 1, V)


class Decoder(Protocol):
    def __call__(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = ...,
        caches: Any = ...,
        last_only: bool = ...,
    ) -> torch.Tensor: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...


@dataclass(frozen=True, kw_only=True)
class Stop:
    """When a row is done: after ``max_new_tokens``, or once it drew ``eos_id``."""

    max_new_tokens: int
    eos_id: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("max_new_tokens", self.max_new_tokens)
        eos = self.eos_id
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or eos < 0):
            raise ValueError(f"eos_id must be a token id, an int >= 0, got {eos!r}")


@dataclass
class Row:
    index: int  # the prompt's place in the call
    tokens: list[int]  # the prompt, then what was drawn (then eos_id fed while the others finish)
    prompt: int  # the prompt's length
    held: int = 0  # tokens the cache holds, a prefix of ``tokens``; the rest is fed next
    pad: int | None = None  # slots of left padding before it (rows that run together; set when first fed)
    done: bool = False


@torch.no_grad()
def decode(
    model: Decoder,
    prompts: list[list[int]],
    *,
    cache: ModelCache | None,
    sampling: Sampling,
    stop: Stop,
    proposer: Proposer | None = None,
    slots: int | None = None,
    step: Step | None = None,
) -> Iterator[list[tuple[int, int]]]:
    """Generate after each of ``prompts`` (lists of token ids); per pass, the (prompt index, token) pairs drawn.

    ``slots``: rows run at once (default: every prompt); ``proposer``: guesses checked in one pass (one row,
    a cache that crops); ``step``: the decode step to call instead of the model (a compiled one).
    """
    device = next(model.parameters()).device
    together = cache is None or not cache.capabilities.rows
    waiting = deque(enumerate(prompts))
    free = deque(range(len(prompts) if slots is None else slots))
    running: dict[int, Row] = {}
    try:
        while True:
            opened = not (together and running)  # rows that run together are admitted together, once
            one = cache is not None and cache.capabilities.shares_prefixes  # the next may share what this one fills
            while opened and free and waiting and not (one and any(r.held < r.prompt for r in running.values())):
                slot, (index, prompt) = free.popleft(), waiting.popleft()
                total = len(prompt) + stop.max_new_tokens - 1  # the last new token is never fed back
                held = cache.admit(slot, prompt, total=total) if cache is not None else 0
                running[slot] = Row(index=index, tokens=list(prompt), prompt=len(prompt), held=held)
            if all(row.done for row in running.values()):
                return
            fed = dict(sorted(running.items()))  # rows that run together are fed, finished or not
            if not together:
                fed = {s: r for s, r in fed.items() if not r.done}
            guesses: dict[int, tuple[list[int], list[torch.Tensor] | None]] = {}
            if proposer is not None:
                slot, row = next(iter(fed.items()))  # one row (planned so)
                left = stop.max_new_tokens - (len(row.tokens) - row.prompt)  # a pass yields up to k + 1 tokens
                guesses[slot] = proposer.propose(row.tokens, min(proposer.k, left - 1), sampling)
                proposer.guessed += len(guesses[slot][0])
            said = {s: g for s, (g, _) in guesses.items()}
            logits = forward(model, cache, fed, guesses=said, step=step, device=device)
            drawn = _draw(sampling, logits, guesses)
            yield _take(cache, fed, drawn, stop, proposer)
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
    cache: ModelCache | None,
    fed: dict[int, Row],
    drawn: dict[int, list[int]],
    stop: Stop,
    proposer: Proposer | None,
) -> list[tuple[int, int]]:
    """Keep what was drawn: each row's tokens and what its cache holds (cropped to the guesses kept)."""
    out: list[tuple[int, int]] = []
    for slot, row in fed.items():
        fed_to = len(row.tokens)
        kept = len(drawn[slot]) - 1  # guesses kept, before the token of the model's own
        if cache is not None:
            row.held = fed_to + kept
            if proposer is not None:
                proposer.passes, proposer.kept = proposer.passes + 1, proposer.kept + kept
                cache.crop(row.held)
                proposer.crop(row.held)
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


def forward(
    model: Decoder,
    cache: ModelCache | None,
    fed: dict[int, Row],
    *,
    guesses: dict[int, list[int]],
    step: Step | None,
    device: torch.device,
) -> dict[int, torch.Tensor]:
    """Run each row's missing tokens (and its guesses) through the model; per row, the logits (G + 1, V) of its
    last G + 1 positions. Rows with ``rows`` of their own run in groups of one feed length."""
    feeds = {s: r.tokens[r.held :] + guesses.get(s, []) for s, r in fed.items()}
    last = 1 + max((len(g) for g in guesses.values()), default=0)
    if cache is not None and cache.capabilities.rows:
        out: dict[int, torch.Tensor] = {}
        for length in sorted({len(f) for f in feeds.values()}):
            group = [s for s, f in feeds.items() if len(f) == length]
            ids = torch.tensor([feeds[s] for s in group], device=device)  # (G, T)
            logits = model(ids, caches=cache.views(group), last_only=last == 1)[:, -last:]
            out.update(zip(group, logits, strict=True))
        return out
    width = max(len(f) for f in feeds.values())
    for slot, row in fed.items():
        row.pad = width - len(feeds[slot]) if row.pad is None else row.pad  # the prompts' padding, kept
    ids = torch.tensor([[0] * (width - len(f)) + f for f in feeds.values()], device=device)  # (B, T) left-padded
    pads = [r.pad or 0 for r in fed.values()]
    mask = None
    if any(pads):  # (B, held + T): 0 on each row's padding; every row holds as many slots
        first = next(iter(fed.values()))
        before = first.held + pads[0] if cache is not None and first.held else 0  # slots the cache holds
        slots = torch.arange(before + width, device=device)
        mask = (slots[None, :] >= torch.tensor(pads, device=device)[:, None]).long()
    if step is not None and cache is not None and mask is None and width == 1:
        logits = step(ids, cache)
    else:
        logits = feed(model, cache, ids, mask, last_only=last == 1)
    return dict(zip(fed, logits[:, -last:], strict=True))


def feed(
    model: Decoder, cache: ModelCache | None, ids: torch.Tensor, mask: torch.Tensor | None, *, last_only: bool = True
) -> torch.Tensor:
    """Run ids (B, T) into ``cache`` after what it holds (``mask``: (B, held + T), 0 on left padding); the logits
    (B, T or 1, V). A cache that takes only so many tokens a call (``room()``: a sink cache whose window would
    drop what the prompt's own first queries need) gets them in pieces that fit."""
    room = cache.room() if cache is not None else None
    if room is None or ids.shape[1] <= room:
        return model(ids, attention_mask=mask, caches=cache, last_only=last_only)
    held = mask.shape[1] - ids.shape[1] if mask is not None else 0
    start, pieces = 0, []
    while start < ids.shape[1]:
        end = min(ids.shape[1], start + (cache.room() or ids.shape[1]))  # type: ignore[union-attr]
        part = None if mask is None else mask[:, : held + end]
        pieces.append(model(ids[:, start:end], attention_mask=part, caches=cache, last_only=last_only))
        start = end
    return pieces[-1] if last_only else torch.cat(pieces, dim=1)


@torch.no_grad()
def reference_greedy(model: Any, prompt: list[int], max_new_tokens: int, cache: Any) -> list[int]:
    """The readable loop (the book's generate_text_simple, with a cache): the prompt once, then a token a step."""
    device = next(model.parameters()).device
    logits = feed(model, cache, torch.tensor([prompt], device=device), None)[:, -1]  # (1, V)
    new: list[int] = []
    for _ in range(max_new_tokens):
        new.append(int(logits.argmax()))
        if len(new) < max_new_tokens:
            logits = model(torch.tensor([new[-1:]], device=device), caches=cache, last_only=True)[:, -1]
    return new


@torch.no_grad()
def prefill(model: Decoder, idx: torch.Tensor, caches: ModelCache | None) -> torch.Tensor:
    """The last position's logits (B, V) of the prompt idx (B, T) run into ``caches`` (in pieces where needed)."""
    return feed(model, caches, idx, None)[:, -1]
