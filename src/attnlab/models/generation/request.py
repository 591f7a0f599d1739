"""One checked request: what a generation is, checked once against the model before anything is made.

A :class:`Request` holds the prompts (token j of a prompt at position j), the
stop rule, the ``Sampling``, the cache choice, the proposer, the slots and the
compile backend. The front doors (``GPT.generate``, ``stream``,
``generate_many``) and ``attnlab generate`` turn their flat options into one
(:func:`request_for`: the :class:`Options` they share); ``decode`` checks it
against the model (:meth:`Request.check`) and only then makes its cache
(:meth:`Request.prepare`). Each check names the value and the fix; a refused
call changes nothing (a prefix cache kept across calls is checked before it is
bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

import torch

from attnlab._checks import check_positive_int
from attnlab.cache import (
    CACHES,
    CacheFactory,
    Capabilities,
    ModelCache,
    PrefixCache,
    SinkCache,
    cache_factory,
    cache_name,
    capabilities_of,
)
from attnlab.cache.model import why_no_crop
from attnlab.cache.plan import choose
from attnlab.linear.quantized import Int8Linear
from attnlab.models.generation.prompts import many_rows, prompt_rows
from attnlab.models.generation.proposers import Draft, Lookup, Proposer
from attnlab.models.generation.sampling import Sampling

STEP_CAPACITY = 256  # a compiled step's cache holds a multiple of this: one graph serves many lengths
CacheChoice = str | CacheFactory | ModelCache | None  # a name, a factory, a model cache (kept, or built); None: none


class Options(TypedDict, total=False):
    """What every front door takes beside the prompts and ``max_new_tokens``."""

    temperature: float  # 0 (the default): greedy; then top_k, top_p and generator (``Sampling``)
    top_k: int | None
    top_p: float | None
    generator: torch.Generator | None
    eos_id: int | None  # a row that draws it is done
    cache: str | CacheFactory | PrefixCache  # a name in attnlab.cache.CACHES, a factory, a PrefixCache kept


class GenerateOptions(Options, total=False):
    """``generate`` and ``stream`` (cache "plain" by default; with RoPE, "sink" runs past context_length)."""

    attention_mask: torch.Tensor | None  # (B, T): 1 on real tokens, 0 on left padding; rows as if alone
    use_cache: bool  # False: the whole text again each step, the reference the caches match
    lookup: int | None  # guess k tokens from the text (prompt lookup), checked in one pass
    draft: Any  # a smaller GPT of the same vocabulary guesses draft_tokens (4): greedy's tokens, p's distribution
    draft_tokens: int
    # True or a backend: GPT.step under torch.compile, the plain cache sized to a multiple of STEP_CAPACITY (one
    # graph for similar lengths); the prefill runs eager, the first call compiles (tens of seconds)
    compile: bool | str | Callable[..., Any]


class ManyOptions(Options, total=False):
    """``generate_many`` (cache "paged" by default; "prefix" or a PrefixCache shares common prompt prefixes)."""

    slots: int  # prompts run at once (4)


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


@dataclass(frozen=True, kw_only=True, eq=False)
class Request:
    """One generation. ``slots``: rows run at once, each at its own length (continuous batching; None: every
    prompt at once); ``compile``: the ``torch.compile`` backend of the decode step (None: eager)."""

    prompts: Sequence[Sequence[int]]  # each a row's tokens, token j at position j (a tuple of tuples once made)
    stop: Stop
    sampling: Sampling = field(default_factory=Sampling)
    cache: CacheChoice = "plain"
    proposer: Proposer | None = None
    slots: int | None = None
    compile: str | Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompts", tuple(tuple(p) for p in self.prompts))
        if not self.prompts or not all(self.prompts):
            raise ValueError("a request needs at least one prompt, each of at least one token")
        if self.slots is not None:
            check_positive_int("slots", self.slots, limit=4096)

    @property
    def padded(self) -> bool:
        """Prompts of different lengths: rows that run together are left-padded to the longest."""
        return len({len(p) for p in self.prompts}) > 1

    @property
    def longest(self) -> int:
        """The most tokens a row's cache is written: its prompt and every new token but the last."""
        return max(map(len, self.prompts)) + self.stop.max_new_tokens - 1

    @property
    def capacity(self) -> int:
        """Slots each row's cache is made with (a compiled step's rounded up: one graph, many lengths)."""
        ahead = self.longest + 1
        return ahead if self.compile is None else -(-ahead // STEP_CAPACITY) * STEP_CAPACITY

    def check(self, model: Any) -> Capabilities | None:
        """Everything the model refuses about this request, before anything is made; what its cache can do
        (None: no cache)."""
        config = model.config
        if self.stop.eos_id is not None and self.stop.eos_id >= config.vocab_size:
            raise ValueError(
                f"eos_id {self.stop.eos_id} is not a token of this model: its ids are 0..{config.vocab_size - 1}"
            )
        if self.compile is not None:
            _check_compile(model, self)
        if self.proposer is not None:
            _check_proposer(model, self.proposer)
        if self.slots is not None:
            return _check_many(model, self)
        caps = planned(model, self.cache)
        draft = self.proposer.model if isinstance(self.proposer, Draft) else None
        if self.proposer is not None and (caps is None or not caps.crop):
            why = (
                "use_cache=False keeps no cache to go back on: leave it out"
                if caps is None
                else _no_crop(model, self.cache)
            )
            raise ValueError(f"speculative decoding (lookup=, draft=) goes back after a refused guess; {why}")
        short = self.cache.room_back() if self.proposer is not None and isinstance(self.cache, ModelCache) else None
        if short is not None and self.proposer is not None and short < self.proposer.k + 1:
            raise ValueError(
                f"speculative decoding (lookup=, draft=) goes back by a pass's {self.proposer.k} guesses and one; this "
                f"cache's layers keep room to go back by {short} (a ring's or a quantized cache's spare slots): name "
                "the cache instead of making it, and generate sizes them"
            )
        limit = config.context_length if draft is None else min(config.context_length, draft.config.context_length)
        if not (config.rope and caps is not None and caps.past_context) and self.longest > limit:
            hint = (
                "; a sink cache runs past context_length only with rotary positions (GPTConfig(rope=True)): learned "
                "positions such as GPT-2's end at context_length"
                if caps is not None and caps.past_context
                else ""
            )
            whose = " (the smaller of the model's and the draft's)" if draft is not None else ""
            raise ValueError(
                f"the prompt has {max(map(len, self.prompts))} tokens and max_new_tokens is "
                f"{self.stop.max_new_tokens}: {self.longest} positions to run, more than the model's context_length "
                f"{limit}{whose}; shorten the prompt or ask for fewer tokens{hint}"
            )
        return caps

    def prepare(self, model: Any) -> ModelCache | None:
        """Check, then make the cache (bind one kept across calls); refused with nothing made or changed."""
        cache = self.cache
        rows = len(self.prompts) if self.slots is None else min(self.slots, len(self.prompts))
        if cache is not None and not isinstance(cache, ModelCache) and cache_name(cache) is None:
            # a factory of the user's own declares nothing: its caches are made first (fresh, no one's state yet)
            # and the request checked against what they can do
            made = model.make_caches(batch_size=rows, max_len=self.capacity, cache=cache)
            return replace(self, cache=made).prepare(model)
        caps = self.check(model)
        if isinstance(cache, PrefixCache):
            cache.check_fits(rows, self.longest)
        elif cache is not None and not isinstance(cache, ModelCache):
            shared = self.slots is not None or (caps is not None and caps.shares_prefixes)  # sized to the tokens
            capacity = self.longest if shared else self.capacity
            spare = 0 if self.proposer is None else self.proposer.k + 1  # a pass goes back by its guesses + 1
            cache = model.make_caches(batch_size=rows, max_len=capacity, cache=cache, spare=spare)
        if isinstance(cache, PrefixCache):
            cache.bind(model)
        sink = cache[0] if cache is not None else None
        if isinstance(sink, SinkCache) and self.padded and self.longest > sink.sinks + sink.recent:
            raise ValueError(  # left padding fills the sink slots with pads, which the window would keep as sinks
                f"a sink cache keeps each row's first {sink.sinks} slots as sinks, and left padding puts pads "
                f"there: {self.longest} tokens run past its {sink.sinks} + {sink.recent} slots, where the pads "
                "would take the sinks' place; generate the rows one at a time without attention_mask, or use another "
                "cache"
            )
        return cache


def _no_crop(model: Any, cache: CacheChoice) -> str:
    """Why the first layer of ``cache`` (made, or as the plan would make it) that cannot go back cannot."""
    if isinstance(cache, ModelCache):
        return why_no_crop(cache.layers)
    return why_no_crop([c.cls for c in choose([block.att.layer_state() for block in model.blocks], cache)])


def planned(model: Any, cache: CacheChoice) -> Capabilities | None:
    """What ``cache`` can do on this model's layers, refused (with the reason) if a layer cannot keep it; nothing
    is made. None: no cache."""
    if cache is None:
        return None
    if isinstance(cache, ModelCache):
        return cache.capabilities
    return ModelCache.plan([block.att.layer_state() for block in model.blocks], cache)


def context_for(model: Any, cache: CacheChoice) -> int | None:
    """The most positions generation may run: context_length, or no limit for a sink cache on its layers, with RoPE."""
    caps = planned(model, cache)
    return None if model.config.rope and caps is not None and caps.past_context else model.config.context_length


def _check_compile(model: Any, request: Request) -> None:
    cache = request.cache
    if cache is None or isinstance(cache, ModelCache) or cache_factory(cache) is not CACHES["plain"]:
        raise ValueError(
            f"compile= decodes with the plain cache, whose shapes never change; got cache={request.cache!r}"
        )
    if any(isinstance(m, Int8Linear) and m.kernel == "dynamic" for m in model.modules()):
        raise ValueError(
            "compile= cannot hold int8 weights on the 'dynamic' kernel in one graph (torch.compile breaks "
            "at its packed weight); decode them uncompiled, or quantize(kernel='gemv')"
        )
    backend = request.compile
    if isinstance(backend, str) and backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ValueError(
            f"compile={backend!r} is not a torch.compile backend here; known: {torch._dynamo.list_backends()}"
        )


def _check_proposer(model: Any, proposer: Proposer) -> None:
    """What a proposer asks of the model (and a draft of itself), before anything is made. Every kind of layer
    goes back after a refused guess (a ring to any of its spare slots, a recurrent state to its mark); the
    caches that cannot say why when the request is checked against them."""
    draft = proposer.model if isinstance(proposer, Draft) else None
    if draft is not None and not isinstance(draft, type(model)):
        raise TypeError(f"draft must be a GPT (a smaller model with the same vocabulary), got {type(draft).__name__}")
    if draft is not None and draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft.config.vocab_size}) must be the model's ({model.config.vocab_size}):"
            " its guesses are token ids of the model"
        )


def _check_many(model: Any, request: Request) -> Capabilities:
    """Continuous batching: each prompt within the context, on a cache whose rows come and go."""
    for n, prompt in enumerate(request.prompts):
        if len(prompt) + request.stop.max_new_tokens - 1 > model.config.context_length:
            raise ValueError(
                f"prompt {n} has {len(prompt)} tokens and max_new_tokens is {request.stop.max_new_tokens}: more "
                f"than the model's context_length {model.config.context_length}; shorten it or ask for fewer tokens"
            )
    cache = request.cache
    if cache is None or not (cache.capabilities if isinstance(cache, ModelCache) else capabilities_of(cache)).rows:
        raise ValueError(f"generate_many runs on 'paged' or 'prefix' blocks (or a PrefixCache), got cache={cache!r}")
    caps = planned(model, cache)
    assert caps is not None
    if not caps.rows:  # every layer kind has rows under 'paged' and 'prefix' (a ring's window in blocks, a state
        raise ValueError(  # per row); a cache of one's own declares nothing
            f"generate_many admits and releases rows on their own, which this cache cannot: {cache!r}"
        )
    return caps


def request_for(model: Any, prompts: Any, max_new_tokens: int, options: Any, *, many: bool = False) -> Request:
    """A front door's flat options as one Request: ``prompts`` (B, T) token ids (``generate``, ``stream``: with
    :class:`GenerateOptions`), or, ``many``, lists of token ids (``generate_many``: :class:`ManyOptions`)."""
    known = (ManyOptions if many else GenerateOptions).__optional_keys__
    unknown = sorted(set(options) - known)
    if unknown:
        door = "generate_many" if many else "generate"
        raise TypeError(f"{door}() got an unexpected keyword argument {unknown[0]!r}; it takes {sorted(known)}")
    sampling = Sampling(
        temperature=options.get("temperature", 0.0),
        top_k=options.get("top_k"),
        top_p=options.get("top_p"),
        generator=options.get("generator"),
    )
    stop = Stop(max_new_tokens=max_new_tokens, eos_id=options.get("eos_id"))
    cache = options.get("cache", "paged" if many else "plain")
    if cache is None:  # not "no cache": that is use_cache=False, which says so
        raise TypeError(
            "cache=None is not a cache: give a name in attnlab.cache.CACHES or a factory (use_cache=False "
            "runs without a cache, recomputing the whole text at every step)"
        )
    if isinstance(cache, ModelCache) and not cache.capabilities.shares_prefixes:
        raise TypeError("a model cache kept across calls is a PrefixCache; give other caches by name or factory")
    if many:
        rows = many_rows(prompts, vocab_size=model.config.vocab_size)
        return Request(prompts=rows, stop=stop, sampling=sampling, cache=cache, slots=options.get("slots", 4))
    mask, use_cache, backend = options.get("attention_mask"), options.get("use_cache", True), options.get("compile")
    if backend is not None and backend is not False:
        backend = "inductor" if backend is True else backend
        if isinstance(backend, bool) or not (isinstance(backend, str) or callable(backend)):
            raise ValueError(f"compile must be True, False or a torch.compile backend, got {backend!r}")
        if options.get("lookup") is not None or options.get("draft") is not None or mask is not None or not use_cache:
            raise ValueError(
                "compile= decodes one token a step with the KV cache: leave out lookup, draft and "
                "attention_mask, and keep use_cache=True"
            )
    rows = prompt_rows(prompts, mask, vocab_size=model.config.vocab_size)
    if not use_cache and cache != "plain":  # the default, named or not, is what use_cache=False leaves out
        raise ValueError(f"use_cache=False runs without a cache; leave out cache={cache!r}")
    return Request(
        prompts=rows,
        stop=stop,
        sampling=sampling,
        cache=cache if use_cache else None,
        proposer=proposer_for(options, capacity=max(map(len, rows)) + max_new_tokens + 64),
        compile=backend or None,
    )


def proposer_for(options: Any, *, capacity: int) -> Proposer | None:
    """The proposer ``lookup=`` or ``draft=`` asks for (None for neither); its draft's cache of ``capacity``."""
    lookup, draft = options.get("lookup"), options.get("draft")
    if lookup is not None and draft is not None:
        raise ValueError("give lookup=K (guesses from the text) or draft=MODEL (guesses from a model), not both")
    if lookup is not None:
        return Lookup(k=lookup)
    return None if draft is None else Draft(draft, k=options.get("draft_tokens", 4), capacity=capacity)
