"""Everything a generation call is checked for, once, before the loop runs: the prompts, the cache the model
builds for them, and what the cache, a proposer and the model's context allow together.

Each check names the value and the fix; a refused call changes nothing (a
prefix cache kept across calls is checked before it is bound).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.cache import Capabilities, ModelCache, PrefixCache, SinkCache, capabilities_of
from attnlab.models.generation.decode import Stop
from attnlab.models.generation.proposers import Draft, Lookup, Proposer


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


def prompt_rows(idx: torch.Tensor, attention_mask: torch.Tensor | None, *, vocab_size: int) -> list[list[int]]:
    """Each row's real tokens: idx (B, T) without its left padding (``attention_mask`` (B, T), 0 on padding)."""
    check_prompt(idx, vocab_size=vocab_size)
    if attention_mask is None:
        return [row.tolist() for row in idx]
    b, t = idx.shape
    if tuple(attention_mask.shape) != (b, t):
        raise ValueError(f"attention_mask must match the prompt's shape {(b, t)}, got {tuple(attention_mask.shape)}")
    real = attention_mask.bool()
    if t > 1 and bool((real[:, 1:] < real[:, :-1]).any()):
        raise ValueError(
            "attention_mask must pad on the left (zeros first, then ones), as generation appends on the right; "
            "a row has a 0 after a 1: left-pad the batch"
        )
    if not bool(real[:, -1].all()):
        raise ValueError("a row of attention_mask is all padding: give every row at least one real token")
    return [row[keep].tolist() for row, keep in zip(idx, real, strict=True)]


def many_rows(prompts: object, *, vocab_size: int) -> list[list[int]]:
    """generate_many's prompts (a list of lists of token ids), each checked, the error naming which."""
    if not isinstance(prompts, list) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts, each a list of token ids")
    for n, prompt in enumerate(prompts):
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt {n} must be a non-empty list of int token ids, got {prompt!r:.60}")
        bad = [(i, t) for i, t in enumerate(prompt) if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompt {n} has token id {bad[0][1]} at position {bad[0][0]}: this model's ids are 0..{vocab_size - 1}"
            )
    return prompts


def check_proposer(model: Any, *, lookup: object, draft: Any, draft_tokens: object) -> None:
    """What ``lookup=`` or ``draft=`` asks for, checked before anything is made."""
    if lookup is not None and draft is not None:
        raise ValueError("give lookup=K (guesses from the text) or draft=MODEL (guesses from a model), not both")
    if lookup is None and draft is None:
        return
    if model.config.window is not None:
        raise ValueError(
            f"speculative decoding crops the cache after each pass; a sliding window (window={model.config.window}) "
            "keeps a ring that cannot be cropped: decode without lookup or draft"
        )
    for who, m in (("the model", model), ("the draft model", draft)):
        recurrent = sorted(
            {t for t in (m.config.layer_types or ()) if t in ("linear", "delta")} if m is not None else ()
        )
        if recurrent:
            raise ValueError(
                f"speculative decoding crops the cache after each pass; {who} has {recurrent} layers, whose "
                "recurrent state cannot be cut back to an earlier token: decode without lookup or draft"
            )
    if lookup is not None:
        check_positive_int("lookup", lookup, limit=64)
        return
    check_positive_int("draft_tokens", draft_tokens, limit=64)
    if not isinstance(draft, type(model)):
        raise TypeError(f"draft must be a GPT (a smaller model with the same vocabulary), got {type(draft).__name__}")
    if draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft.config.vocab_size}) must be the model's ({model.config.vocab_size}):"
            " its guesses are token ids of the model"
        )
    if draft.config.window is not None:
        raise ValueError("the draft model has a sliding window, whose cache cannot be cropped: use another draft")


def proposer_for(model: Any, *, lookup: int | None, draft: Any, draft_tokens: int, capacity: int) -> Proposer | None:
    """The proposer ``lookup=`` or ``draft=`` asks for (None for neither), once :func:`check_proposer` passed."""
    if lookup is not None:
        return Lookup(k=lookup)
    return None if draft is None else Draft(draft, k=draft_tokens, capacity=capacity)


def capabilities(cache: object) -> Capabilities:
    """What the cache a call asks for can do, known before it is made."""
    return cache.capabilities if isinstance(cache, ModelCache) else capabilities_of(cache)


def cache_for(model: Any, cache: object, *, rows: int, longest: int, capacity: int) -> ModelCache:
    """The model cache for ``rows`` sequences of up to ``longest`` tokens written (``capacity`` slots for a cache
    sized ahead): a name or factory the model builds, or a PrefixCache kept across calls (checked, then bound)."""
    if isinstance(cache, PrefixCache):
        cache.check_fits(rows, longest)
    elif cache == "prefix":  # a tree for this call; the rows of a batch share their common prefix
        cache = PrefixCache.for_model(model, batch_size=rows, max_len=longest)
    elif isinstance(cache, ModelCache):
        raise TypeError("a model cache kept across calls is a PrefixCache; give other caches by name or factory")
    else:
        cache = model.make_caches(batch_size=rows, max_len=capacity, cache=cache)
    assert isinstance(cache, ModelCache)
    if isinstance(cache, PrefixCache):
        cache.bind(model)
    return cache


def check_plan(
    model: Any, prompts: list[list[int]], caps: Capabilities | None, stop: Stop, *, draft: Any, speculating: bool
) -> None:
    """What the cache (``caps``: None for no cache), a proposer and the context allow together, before either
    is made."""
    padded = len({len(p) for p in prompts}) > 1  # rows with rows of their own run each at its length, unpadded
    if speculating and (len(prompts) != 1 or caps is None or not caps.crop or padded):
        if len(prompts) != 1:
            raise ValueError(
                f"speculative decoding runs one sequence at a time (its passes accept different numbers of "
                f"tokens per sequence); got a batch of {len(prompts)}: call it per prompt"
            )
        raise ValueError(
            "speculative decoding (lookup=, draft=) runs one unpadded sequence on the plain cache, which it crops "
            "after each pass: drop attention_mask, use_cache=False and cache="
        )
    written = max(len(p) for p in prompts) + stop.max_new_tokens - 1  # the last new token is never fed back
    past = model.config.rope and caps is not None and caps.past_context
    limit = model.config.context_length
    if draft is not None:  # the draft runs the same positions
        limit = min(limit, draft.config.context_length)
    if not past and written > limit:
        sink = caps is not None and caps.past_context
        hint = (
            "; a sink cache runs past context_length only with rotary positions (GPTConfig(rope=True)): learned "
            "positions such as GPT-2's end at context_length"
            if sink
            else ""
        )
        whose = " (the smaller of the model's and the draft's)" if draft is not None else ""
        raise ValueError(
            f"the prompt has {max(len(p) for p in prompts)} tokens and max_new_tokens is {stop.max_new_tokens}: "
            f"{written} positions to run, more than the model's context_length {limit}{whose}; shorten the prompt "
            f"or ask for fewer tokens{hint}"
        )


def check_sinks(cache: ModelCache | None, prompts: list[list[int]], stop: Stop) -> None:
    """Left padding on a sink cache: refused once the window would keep pads in the sinks' place."""
    padded = len({len(p) for p in prompts}) > 1
    written = max(len(p) for p in prompts) + stop.max_new_tokens - 1
    sink_cache = cache[0] if cache is not None else None
    if isinstance(sink_cache, SinkCache) and padded and written > sink_cache.sinks + sink_cache.recent:
        raise ValueError(  # left padding fills the sink slots with pads, which the window would then keep as sinks
            f"a sink cache keeps each row's first {sink_cache.sinks} slots as sinks, and left padding puts pads "
            f"there: {written} tokens run past its {sink_cache.sinks} + {sink_cache.recent} slots, where the pads "
            "would take the sinks' place; generate the rows one at a time without attention_mask, or use another cache"
        )
