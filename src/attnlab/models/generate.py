"""Generation for any attnlab decoder: greedy or sampled (temperature, top-k, top-p), with the KV cache.

One loop serves every model here (``GPT`` and any decoder like it): a model is
called as ``model(idx, attention_mask=..., caches=...)`` and makes its caches
with ``make_caches(batch_size=..., max_len=...)``. :func:`stream` yields each
new token as it is chosen (the CLI prints them as they come); :func:`generate`
collects them.

Batches are left-padded: ``attention_mask`` (B, T) has 1 on real tokens and 0
on padding, and positions count real tokens only, so each row generates what
it would alone. A row that emits ``eos_id`` is finished and keeps receiving
``eos_id`` until every row is done.

Shapes: B = batch, T = prompt tokens, V = vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, CacheFactory, PrefixCache, SinkCache, cache_factory, runs_past_context


class Decoder(Protocol):
    def __call__(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = ...,
        caches: list[Cache] | None = ...,
        last_only: bool = ...,
    ) -> torch.Tensor: ...

    def make_caches(self, *, batch_size: int, max_len: int, cache: str | CacheFactory = ...) -> list[Cache]: ...


Step = Callable[[torch.Tensor, list[Cache]], torch.Tensor]  # (token (B, 1), caches) -> logits (B, 1, V)
STEP_CAPACITY = 256  # a compiled step's caches hold a multiple of this: one graph serves many lengths


def check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    """temperature >= 0 (0 = greedy), top_k >= 1, top_p in (0, 1]: each named when wrong."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p!r}")


def check_prompt(idx: object, *, vocab_size: int | None = None) -> None:
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"token ids must be a torch.Tensor (batch, tokens), got {type(idx).__name__}")
    if idx.dim() != 2 or idx.dtype != torch.long:
        hint = "; for one sequence use idx.unsqueeze(0)" if idx.dim() == 1 else ""
        raise ValueError(
            f"token ids must be (batch, tokens) of dtype torch.long, got {idx.dtype} {tuple(idx.shape)}{hint}"
        )
    if idx.shape[1] == 0:
        raise ValueError(f"the prompt is empty (shape {tuple(idx.shape)}); give at least one token to start from")
    if vocab_size is not None and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got [{int(idx.min())}, {int(idx.max())}]")


def positions_and_padding(
    idx: torch.Tensor, attention_mask: torch.Tensor | None, caches: list[Cache] | None, *, layers: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions of the new tokens (T,) or (B, T), and the key padding mask (B, 1, 1, Tk) or None.

    ``attention_mask`` (B, Tk) covers cached and new tokens, 1 on real tokens
    and 0 on left padding. Positions count real tokens only, so a left-padded
    row gets the positions it would have alone.
    """
    b, t = idx.shape
    if caches is not None and len(caches) != layers:
        raise ValueError(f"expected {layers} caches (one per layer), got {len(caches)}")
    if attention_mask is None:  # the cache's own positions: (T,), or (B, T) for a cache whose sequences differ
        return caches[0].next_positions(t) if caches else torch.arange(t, device=idx.device), None
    ahead = caches[0].next_positions(1) if caches else None
    if ahead is not None and ahead.dim() == 2:
        raise ValueError(
            "attention_mask pads sequences to one length; this cache keeps each sequence's own length "
            "(a paged cache): give it the sequences as they are, without padding or attention_mask"
        )
    start = int(ahead[0]) if ahead is not None else 0
    if tuple(attention_mask.shape) != (b, start + t):
        raise ValueError(
            f"attention_mask must be (batch, cached + new tokens) = {(b, start + t)}, got {tuple(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    positions = (real.long().cumsum(dim=-1) - 1).clamp(min=0)[:, start:]  # (B, T)
    return positions, real[:, None, None, :]  # (B, 1, 1, Tk): key padding


def probabilities(
    logits: torch.Tensor, *, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution (B, V) that sampling at ``temperature`` (> 0) with top-k and top-p draws from."""
    # Subtract the max before dividing: a tiny temperature then gives -inf (never NaN) to all but the best.
    logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # keeps the smallest set reaching top_p, and always the first
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def is_greedy(temperature: float) -> bool:
    """0, or so small that float32 holds it as 0: the limit is greedy."""
    return temperature == 0.0 or temperature < torch.finfo(torch.float32).smallest_normal * 2**-23


def pick(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token (B, 1) from the last position's logits (B, V)."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1, keepdim=True)
    probs = probabilities(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator)


def stream(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    max_positions: int | None = None,
    cache: str | CacheFactory | PrefixCache = "plain",
    step: Step | None = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token (B, 1) as it is chosen; stops after ``max_new_tokens`` or when every row hit ``eos_id``.

    ``cache``: a name in ``attnlab.cache.CACHES``, a factory, or a ``PrefixCache`` kept across calls ("prefix"
    makes one for this call). ``step(token, caches)``: the decode step to use instead of calling the model (a
    compiled one, ``GPT.generate(compile=True)``); its caches' capacity is then rounded up to a multiple of
    STEP_CAPACITY, so that calls of similar length give it the same shapes. Every argument is checked here,
    when it is called, not at the first ``next()``.
    """
    check_prompt(idx)
    check_positive_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    b, t = idx.shape
    if attention_mask is not None and tuple(attention_mask.shape) != (b, t):
        raise ValueError(f"attention_mask must match the prompt's shape {(b, t)}, got {tuple(attention_mask.shape)}")
    if max_positions is not None and t + max_new_tokens - 1 > max_positions:  # the last new token is not fed back
        hint = (
            "; a sink cache runs past context_length only with rotary positions (GPTConfig(rope=True)): learned "
            "positions such as GPT-2's end at context_length"
            if runs_past_context(cache)
            else ""
        )
        raise ValueError(
            f"the prompt has {t} tokens and max_new_tokens is {max_new_tokens}: {t + max_new_tokens - 1} positions "
            f"to run, more than the model's context_length {max_positions}; shorten the prompt or ask for fewer "
            f"tokens{hint}"
        )
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0):
        raise ValueError(f"eos_id must be a token id, an int >= 0, got {eos_id!r}")
    if attention_mask is not None:
        real = attention_mask.bool()
        if t > 1 and bool((real[:, 1:] < real[:, :-1]).any()):
            raise ValueError(
                "attention_mask must pad on the left (zeros first, then ones), as generation appends on the right; "
                "a row has a 0 after a 1: left-pad the batch"
            )
    if cache == "prefix" or isinstance(cache, PrefixCache):
        if attention_mask is not None or not use_cache:
            raise ValueError(
                "the prefix cache shares blocks between sequences as they are: give it prompts without padding "
                "or attention_mask, with use_cache=True"
            )
        if isinstance(cache, PrefixCache):
            cache.check_fits(b, t + max_new_tokens - 1)  # the last new token is never fed back, nor held
        else:  # a tree for this call (its pools made now, so that a model they do not fit is refused now)
            cache = PrefixCache.for_model(model, batch_size=b, max_len=t + max_new_tokens - 1)
        cache.bind(model)
        caches = None
    else:
        capacity = t + max_new_tokens
        capacity = capacity if step is None else -(-capacity // STEP_CAPACITY) * STEP_CAPACITY
        cache_factory(cache)  # a name that is not one, refused now
        caches = model.make_caches(batch_size=b, max_len=capacity, cache=cache) if use_cache else None
        _check_sinks(caches, attention_mask, t + max_new_tokens - 1)
    return _stream(
        model, idx, max_new_tokens, attention_mask, temperature, top_k, top_p, eos_id, generator, caches, cache, step
    )


def _check_sinks(caches: list[Cache] | None, attention_mask: torch.Tensor | None, written: int) -> None:
    """A sink cache keeps the first slots of every row, which left padding fills with pads: once the window
    drops tokens, the pads would stand as sinks, and the padding mask, by slot, would no longer find them."""
    sink = caches[0] if caches else None
    if not isinstance(sink, SinkCache) or attention_mask is None or bool(attention_mask.bool().all()):
        return
    if written > sink.sinks + sink.recent:
        raise ValueError(
            f"a sink cache keeps each row's first {sink.sinks} slots as sinks, and left padding puts pads there: "
            f"{written} tokens run past its {sink.sinks} + {sink.recent} slots, where the pads would take the "
            "sinks' place; generate the rows one at a time without attention_mask, or use another cache"
        )


@torch.no_grad()
def _stream(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    eos_id: int | None,
    generator: torch.Generator | None,
    caches: list[Any] | None,
    cache: str | CacheFactory | PrefixCache,
    step: Step | None = None,
) -> Iterator[torch.Tensor]:
    b, t = idx.shape
    mask = attention_mask
    out = idx
    store = cache if isinstance(cache, PrefixCache) else None
    try:
        if store is not None:
            caches = [pool.rows(list(range(b))) for pool in store.pools]
            logits = torch.cat(
                [_prefill_shared(model, store, row, idx[row].tolist(), t + max_new_tokens - 1) for row in range(b)]
            )
        else:
            logits = prefill(model, idx, caches, attention_mask=mask)
        finished = torch.zeros(b, 1, dtype=torch.bool, device=idx.device)
        for made in range(max_new_tokens):
            token = pick(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (B, 1)
            if eos_id is not None:
                token = token.masked_fill(finished, eos_id)
                finished = finished | (token == eos_id)
            yield token
            if made == max_new_tokens - 1 or (eos_id is not None and bool(finished.all())):
                return
            out = torch.cat([out, token], dim=1)
            if store is not None and (out.shape[1] - 1) % store.block_size == 0:  # a block just filled: share it
                for row in range(b):
                    store.remember(row, out[row, :-1].tolist())
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if step is not None and caches is not None:
                logits = step(token, caches)[:, -1]
            elif caches is not None:
                logits = model(token, attention_mask=mask, caches=caches, last_only=True)[:, -1]  # the cache: the rest
            else:
                logits = model(out, attention_mask=mask, last_only=True)[:, -1]  # all again: what the cache must match
    finally:  # the rows' blocks go back to the pool and the tree keeps what it shares: a store kept across calls
        if store is not None:  # starts the next call with room, also after an error or a stream left unfinished
            for row in range(b):
                store.release(row)


def prefill(
    model: Decoder, idx: torch.Tensor, caches: list[Cache] | None, *, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Run the prompt idx (B, T) into ``caches``; the last position's logits (B, V). A cache that takes only so
    many tokens a call (``room()``: a sink cache whose window would drop what the prompt's own first queries
    need) gets the prompt in pieces that fit."""
    room = getattr(caches[0], "room", None) if caches else None
    if room is None:
        return model(idx, attention_mask=attention_mask, caches=caches, last_only=True)[:, -1]
    start = 0
    while start < idx.shape[1]:
        end = min(idx.shape[1], start + room())
        mask = None if attention_mask is None else attention_mask[:, :end]
        logits = model(idx[:, start:end], attention_mask=mask, caches=caches, last_only=True)[:, -1]
        start = end
    return logits


def _prefill_shared(model: Decoder, store: PrefixCache, row: int, prompt: list[int], total: int) -> torch.Tensor:
    """Prefill sequence ``row`` of ``store`` with ``prompt``, from the end of its longest cached prefix; the last
    position's logits (1, V). ``total``: the tokens it will hold, which the store makes room for."""
    done = store.attach(row, prompt, total=total)  # what the row held goes back, then it takes its prefix
    ids = torch.tensor([prompt[done:]], device=store.pools[0].lengths.device)  # (1, T - done): the rest
    logits = model(ids, caches=[pool.sequence(row) for pool in store.pools], last_only=True)[:, -1]
    store.remember(row, prompt)
    return logits


def generate(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    max_positions: int | None = None,
    cache: str | CacheFactory | PrefixCache = "plain",
    step: Step | None = None,
) -> torch.Tensor:
    """The prompt with its new tokens, (B, T + n), n <= max_new_tokens (fewer when every row ended at eos_id)."""
    new = stream(
        model,
        idx,
        max_new_tokens,
        attention_mask=attention_mask,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        generator=generator,
        use_cache=use_cache,
        max_positions=max_positions,
        cache=cache,
        step=step,
    )
    return torch.cat([idx, *new], dim=1)


@torch.no_grad()
def generate_many(
    model: Decoder,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    slots: int = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    max_positions: int | None = None,
    vocab_size: int | None = None,
    cache: str | PrefixCache = "paged",
) -> list[list[int]]:
    """Continuous batching over a paged cache: the new tokens of each prompt, in the prompts' order.

    Up to ``slots`` prompts run at once, each at its own length; when one ends (``max_new_tokens``, or
    ``eos_id``), its blocks go back to the pool and the next waiting prompt takes its place, without the
    others waiting for it. Greedy, each prompt gets what it gets alone. ``cache="prefix"`` (or a
    ``PrefixCache`` kept across calls, with at least ``slots`` rows) also shares the blocks of common
    prompt prefixes: a prompt runs only from where its longest cached prefix ends.
    """
    check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("slots", slots, limit=4096)
    check_sampling(temperature, top_k, top_p)
    if not isinstance(prompts, list) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts, each a list of token ids")
    for n, prompt in enumerate(prompts):
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt {n} must be a non-empty list of int token ids, got {prompt!r:.60}")
        bad = [(i, t) for i, t in enumerate(prompt) if vocab_size is not None and not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompt {n} has token id {bad[0][1]} at position {bad[0][0]}: this model's ids are "
                f"0..{vocab_size - 1 if vocab_size else 0}"
            )
        if max_positions is not None and len(prompt) + max_new_tokens - 1 > max_positions:
            raise ValueError(
                f"prompt {n} has {len(prompt)} tokens and max_new_tokens is {max_new_tokens}: more than the "
                f"model's context_length {max_positions}; shorten it or ask for fewer tokens"
            )
    if cache not in ("paged", "prefix") and not isinstance(cache, PrefixCache):
        raise ValueError(f"generate_many runs on 'paged' or 'prefix' blocks (or a PrefixCache), got cache={cache!r}")
    longest = max(len(p) for p in prompts) + max_new_tokens - 1  # the last new token is never fed back
    rows_needed = min(slots, len(prompts))
    store: PrefixCache | None = None
    if isinstance(cache, PrefixCache):
        store = cache
        store.check_fits(rows_needed, longest)
        store.bind(model)
    elif cache == "prefix":
        store = PrefixCache.for_model(model, batch_size=rows_needed, max_len=longest)
    pools: list[Any] = (  # PagedKVCache: rows(), sequence(), release()
        store.pools if store is not None else model.make_caches(batch_size=rows_needed, max_len=longest, cache="paged")
    )
    waiting = list(enumerate(prompts))
    running: dict[int, tuple[int, list[int]]] = {}  # row -> (prompt's index, its new tokens)
    free_rows = list(range(rows_needed))
    results: list[list[int]] = [[] for _ in prompts]

    def release(row: int) -> None:
        for pool in [store] if store is not None else pools:
            pool.release(row)

    def choose(logits: torch.Tensor) -> list[int]:
        return pick(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)[:, 0].tolist()

    def take(row: int, token: int) -> None:
        index, tokens = running[row]
        tokens.append(token)
        if len(tokens) == max_new_tokens or token == eos_id:  # done: its blocks go back to the pool
            results[index] = tokens
            release(row)
            del running[row]
            free_rows.append(row)

    try:
        while waiting or running:
            while free_rows and waiting:  # a free row takes the next prompt: prefilled alone, the others keep theirs
                row = free_rows.pop(0)
                index, prompt = waiting.pop(0)
                running[row] = (index, [])
                if store is not None:
                    logits = _prefill_shared(model, store, row, prompt, len(prompt) + max_new_tokens - 1)
                else:
                    ids = torch.tensor([prompt])
                    logits = model(ids, caches=[c.sequence(row) for c in pools], last_only=True)[:, -1]
                take(row, choose(logits)[0])
            if not running:
                continue
            rows = sorted(running)
            last = torch.tensor([[running[r][1][-1]] for r in rows])  # (R, 1): each at its own position
            logits = model(last, caches=[c.rows(rows) for c in pools], last_only=True)[:, -1]
            for row, token in zip(rows, choose(logits), strict=True):
                take(row, token)
    finally:  # after an error too: a store kept across calls gets its rows back
        for row in list(running):
            release(row)
    return results
