"""Fewer passes, the same tokens: prompt-lookup and draft-model speculative decoding.

A decode step reads every weight to produce one token. Speculative decoding
(Leviathan et al., 2023; Chen et al., 2023) guesses ``k`` tokens cheaply,
then runs the model once over all of them: the guesses it agrees with are
kept, and the first it does not is replaced by its own choice, so every pass
yields at least one token and up to k + 1.

- ``lookup=k`` (prompt lookup, Saxena 2023): the guess is what followed the
  latest earlier occurrence of the last few tokens (``ngram`` of them, then
  fewer) in the text so far. Free to make; it pays on text that repeats its
  context (code, a quote given again).
- ``draft=model``: a smaller model with the same vocabulary proposes k
  tokens, one at a time, with its own cache.

Exact. Greedy: a guess is kept only if it is the model's argmax, so the
tokens are those of plain greedy decoding (asserted in the tests). Sampling:
a guess x drawn from q is kept with probability min(1, p(x) / q(x)), and on
refusal the token is drawn from (p - q)+ normalised; the token then has
exactly the model's distribution p (tested by drawing). A lookup guess is a
point mass, q(x) = 1: kept with probability p(x), else drawn from p without x.

The model's cache holds every token but the last emitted; a pass feeds what
it lacks plus the guesses, and afterwards is cropped to what was kept
(``KVCache.crop``): so the plain cache, batch 1.

Shapes: V = vocabulary; everything here is one sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.models.generate import Decoder, is_greedy, probabilities


def lookup_guess(tokens: list[int], k: int, ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``ngram`` tokens (or fewer)."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first; not the tail itself
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


def accept(
    p: torch.Tensor, q: torch.Tensor | None, guess: int, generator: torch.Generator | None
) -> tuple[bool, int | None]:
    """One guess against the model's distribution p (V,): kept, or refused with the token drawn instead.

    ``q`` (V,) is the distribution the guess was drawn from; None for a point mass (a lookup guess).
    """
    q_x = 1.0 if q is None else float(q[guess])
    p_x = float(p[guess])
    u = float(torch.rand((), generator=generator))
    if q_x > 0 and u < min(1.0, p_x / q_x):
        return True, None
    if q is None:
        rest = p.clone()
        rest[guess] = 0.0
    else:
        rest = (p - q).clamp(min=0.0)
    if float(rest.sum()) <= 0:  # p == q: a refusal has probability 0; numerically, draw from p
        rest = p
    return False, int(torch.multinomial(rest / rest.sum(), 1, generator=generator))


def check_speculation(model: Any, lookup: object, draft: object, ngram: object, batch: int) -> None:
    """Everything a speculative run needs, checked before anything runs."""
    if lookup is not None and draft is not None:
        raise ValueError("give lookup=K (guesses from the text) or draft=MODEL (guesses from a model), not both")
    if lookup is not None:
        check_positive_int("lookup", lookup, limit=64)
    check_positive_int("ngram", ngram, limit=64)
    if batch != 1:
        raise ValueError(
            f"speculative decoding runs one sequence at a time (its passes accept different numbers of "
            f"tokens per sequence); got a batch of {batch}: call it per prompt"
        )
    if getattr(model.config, "window", None) is not None:
        raise ValueError(
            f"speculative decoding crops the cache after each pass; a sliding window (window={model.config.window}) "
            "keeps a ring that cannot be cropped: decode without lookup or draft"
        )
    if draft is not None:
        vocab = getattr(getattr(draft, "config", None), "vocab_size", None)
        if vocab != model.config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({vocab}) must be the model's ({model.config.vocab_size}): its guesses "
                "are token ids of the model"
            )
        if getattr(getattr(draft, "config", None), "window", None) is not None:
            raise ValueError("the draft model has a sliding window, whose cache cannot be cropped: use another draft")


@torch.no_grad()
def speculate(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    k: int,
    draft: Decoder | None = None,
    ngram: int = 3,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    stats: dict[str, int] | None = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token (1, 1): guesses of ``k`` tokens (from the text, or from ``draft``), checked in one pass.

    ``stats``, if given, counts ``passes`` of the model and ``guessed`` / ``kept`` tokens.
    """
    tokens = idx[0].tolist()
    total = len(tokens) + max_new_tokens + k + 1
    caches = model.make_caches(batch_size=1, max_len=total)
    drafts = draft.make_caches(batch_size=1, max_len=total) if draft is not None else None
    held, draft_held = 0, 0  # tokens each cache holds: a prefix of `tokens`
    greedy = is_greedy(temperature)
    counts = stats if stats is not None else {}
    for key in ("passes", "guessed", "kept"):
        counts.setdefault(key, 0)

    def dist(logits: torch.Tensor) -> torch.Tensor:  # (V,) the distribution a token is drawn from
        return probabilities(logits[None], temperature=temperature, top_k=top_k, top_p=top_p)[0]

    produced = 0
    while produced < max_new_tokens:
        want = min(k, max_new_tokens - produced - 1)  # a pass yields up to want + 1 tokens
        guess: list[int] = []
        q: list[torch.Tensor] = []
        if want > 0 and draft is not None and drafts is not None:
            feed = tokens[draft_held:]
            for _ in range(want):
                logits = draft(torch.tensor([feed]), caches=drafts, last_only=True)[0, -1]
                draft_held += len(feed)
                if greedy:
                    x = int(logits.argmax())
                else:
                    q.append(dist(logits))
                    x = int(torch.multinomial(q[-1], 1, generator=generator))
                guess.append(x)
                feed = [x]
        elif want > 0:
            guess = lookup_guess(tokens, want, ngram)
        feed = tokens[held:] + guess
        logits = model(torch.tensor([feed]), caches=caches)[0, -(len(guess) + 1) :]  # (len(guess) + 1, V)
        counts["passes"] += 1
        counts["guessed"] += len(guess)
        kept: list[int] = []
        extra: int | None = None
        for i, x in enumerate(guess):
            if greedy:
                best = int(logits[i].argmax())
                ok, instead = best == x, best
            else:
                ok, drawn = accept(dist(logits[i]), q[i] if q else None, x, generator)
                instead = drawn if drawn is not None else x
            if not ok:
                extra = instead
                break
            kept.append(x)
        if extra is None:  # every guess kept: the pass also gives the token after them
            last = logits[len(guess)]
            extra = int(last.argmax()) if greedy else int(torch.multinomial(dist(last), 1, generator=generator))
        counts["kept"] += len(kept)
        held = len(tokens) + len(kept)  # the cache keeps what was fed up to the last kept guess
        for cache in caches:
            cache.crop(held)  # type: ignore[attr-defined]
        if drafts is not None:
            draft_held = min(draft_held, held)
            for cache in drafts:
                cache.crop(draft_held)  # type: ignore[attr-defined]
        for token in [*kept, extra]:
            tokens.append(token)
            produced += 1
            yield torch.tensor([[token]])
            if token == eos_id or produced == max_new_tokens:
                return
