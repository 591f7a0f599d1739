"""GPT: the book's GPTModel (chapter 4) on attnlab's Attention, with a KV cache and generate(), and every
decoder after it that ``GPTConfig`` describes (Llama 3, Mistral, Qwen2, Qwen3: ``attnlab.models.parts``).

The book's layout and names, in its order: token and position embeddings
(``tok_emb``, ``pos_emb``: none with RoPE), dropout, ``n_layers`` blocks
(``norm1``, ``att``, ``drop_resid``, ``norm2``, ``ff``), ``final_norm`` and
``out_head``. GPT-2's defaults: the book's LayerNorm (scale/shift, biased
variance, eps 1e-5) is ``nn.LayerNorm``, its GELU the tanh approximation. The
attention is ``attnlab.Attention``, so every backend, the cache and the
Recorder work in a whole model, whatever its family.

Shapes: B = batch, T = tokens, V = vocab_size, E = emb_dim, L = n_layers, H = n_heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, CacheFactory, ModelCache, PrefixCache, cache_name, capabilities_of
from attnlab.functional.mods import MaskMod, ScoreMod, chain_scores, check_document_ids, document_positions
from attnlab.functional.visibility import Visibility
from attnlab.models.checkpoints import Checkpoint, fit, read_book, read_checkpoint, save_gpt
from attnlab.models.config import GPTConfig, score_mod_from_name
from attnlab.models.generation import Sampling, Stop, decode, plan
from attnlab.models.parts import TransformerBlock, make_norm
from attnlab.models.tokenizer import CharTokenizer
from attnlab.observe import Recorder


def _decode_step(model: GPT, token: torch.Tensor, caches: ModelCache) -> torch.Tensor:
    return model.decode_step(token, caches)


_COMPILED_STEPS: dict[object, Any] = {}  # _decode_step under torch.compile, per backend (a guard per model)
STEP_CAPACITY = 256  # a compiled step's cache holds a multiple of this: one graph serves many lengths


def positions_and_padding(
    idx: torch.Tensor, attention_mask: torch.Tensor | None, caches: ModelCache | list[Cache] | None, *, layers: int
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
    if ahead is not None and ahead.dim() == 2:  # per sequence (a paged cache): padded, they hold one length
        if bool((ahead != ahead[:1]).any()):
            raise ValueError(
                "attention_mask pads sequences to one length; this cache's sequences hold different lengths "
                f"({ahead[:, 0].tolist()}) (a paged cache): give it the sequences as they are, without padding or "
                "attention_mask"
            )
        ahead = ahead[0]
    start = int(ahead[0]) if ahead is not None else 0
    if tuple(attention_mask.shape) != (b, start + t):
        raise ValueError(
            f"attention_mask must be (batch, cached + new tokens) = {(b, start + t)}, got {tuple(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    positions = (real.long().cumsum(dim=-1) - 1).clamp(min=0)[:, start:]  # (B, T)
    return positions, real[:, None, None, :]  # (B, 1, 1, Tk): key padding


def _by_position(
    passes: Iterator[list[tuple[int, int]]], rows: int, stop: Stop, device: torch.device
) -> Iterator[torch.Tensor]:
    """The loop's passes as one token per row at a time, (B, 1); a row that ended gets ``eos_id`` again."""
    pending: list[list[int]] = [[] for _ in range(rows)]
    ended = [False] * rows
    for drawn in passes:
        for index, token in drawn:
            pending[index].append(token)
        while all(pending[r] or ended[r] for r in range(rows)) and not all(ended):
            tokens = [pending[r].pop(0) if pending[r] else stop.eos_id for r in range(rows)]
            ended = [e or t == stop.eos_id for e, t in zip(ended, tokens, strict=True)]
            yield torch.tensor(tokens, device=device)[:, None]


def count_parameters(config: GPTConfig) -> int:
    """The model's parameters (a tied head counted once), from the model built on the meta device: shapes only,
    so an 8B model costs nothing to count."""
    with torch.device("meta"):
        model = GPT(config)
    return sum(p.numel() for p in model.parameters())


class GPT(nn.Module):
    """A decoder. ``GPT(GPTConfig.preset("gpt2-small"))`` has the book's 163,009,536 parameters (124,412,160 with
    ``tie_weights=True``). ``GPTConfig(n_kv_heads=, rope=True, window=, score_mod=)`` makes the same decoder with
    grouped-query heads, rotary positions (then no ``pos_emb``), a sliding window, ALiBi; ``norm="rmsnorm",
    mlp="swiglu", qk_norm=True, layer_types=...`` and the rest make Llama's and Qwen's (``GPTConfig.preset
    ("qwen3-0.6b")``, or ``GPT.from_pretrained`` on their Hugging Face directories)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.emb_dim)
        self.pos_emb = None if config.rope else nn.Embedding(config.context_length, config.emb_dim)
        self.drop_emb = nn.Dropout(config.drop_rate)
        self.trf_blocks = nn.ModuleList([TransformerBlock(config, layer=n) for n in range(config.n_layers)])
        self.final_norm = make_norm(config)
        self.out_head = nn.Linear(config.emb_dim, config.vocab_size, bias=False)
        if config.tie_weights:
            self.out_head.weight = self.tok_emb.weight
        # every layer's score_mod; a module, so a learned one's parameters are the model's (and its checkpoint's)
        self.score_mod = score_mod_from_name(config.score_mod, config.n_heads) if config.score_mod else None

    @property
    def blocks(self) -> list[TransformerBlock]:
        return [cast(TransformerBlock, block) for block in self.trf_blocks]  # nn.ModuleList yields plain Modules

    def make_caches(self, *, batch_size: int, max_len: int, cache: str | CacheFactory = "plain") -> ModelCache:
        """The model's cache: one per layer, for ``max_len`` positions, from a name in ``attnlab.cache.CACHES`` or
        a factory; its paged layers share one block table. A sliding layer keeps the ring buffer of its window
        whichever of attnlab's caches is named (it never needs more), so a named cache applies to the full
        layers, and one that would apply to none (every layer slides) is refused; a factory of your own gets
        each layer's window and decides."""
        name = cache_name(cache)
        # a layer that keeps its own memory whatever cache is named: a sliding window's ring, a recurrent state
        own = [block.att.window is not None or block.att.visibility_key == "recurrent" for block in self.blocks]
        windows = {block.att.window for block in self.blocks}
        if name not in (None, "plain") and all(own) and None not in windows:
            raise ValueError(
                f"the {name} cache does not keep a sliding window's ring, and every layer "
                f"of this model slides: a layer with window={sorted(windows, key=str)[0]} needs the 'plain' cache "
                "(a ring buffer of the window, the default)"
            )
        if name not in (None, "plain") and all(own):
            kinds = sorted({self.config.layer_type(i) for i in range(len(self.blocks))})
            raise ValueError(
                f"the {name} cache holds keys and values of full softmax layers, and this model has none (its "
                f"layers are {kinds}): each keeps its own memory (a window's ring buffer, a recurrent state); "
                "use the 'plain' cache, the default"
            )
        return ModelCache(
            [
                block.att.make_cache(
                    batch_size=batch_size,
                    max_len=max_len,
                    cache="plain" if keeps and name is not None else cache,
                    context_length=self.config.context_length,
                )
                for block, keeps in zip(self.blocks, own, strict=True)
            ]
        )

    def forward(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        caches: ModelCache | list[Cache] | None = None,
        last_only: bool = False,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T), after the tokens in ``caches`` if given.

        attention_mask: (B, cached + new tokens), 1 on real tokens, 0 on left padding.
        last_only: logits of the last position only, (B, 1, V): what generation needs, and the
        vocabulary projection is the largest matmul of a prefill.
        document_ids: (B, T) ids of packed documents, non-decreasing along a row: each document
        sees only itself and its positions start at 0, exactly as if it ran alone (not with caches
        or an attention_mask).
        mask_mod, score_mod: for every layer (FlexAttention's signatures, ``attnlab.functional.mods``),
        at absolute positions; the score_mod runs after the config's. Who may attend is worked out
        once per call and shared by every layer: a mask_mod is not called more often in a deeper model.
        """
        plan.check_prompt(idx, vocab_size=self.config.vocab_size)
        if document_ids is not None:
            if caches is not None or attention_mask is not None:
                raise ValueError("document_ids pack documents for training; pass them without caches or attention_mask")
            check_document_ids(document_ids, idx.shape[0], idx.shape[1])
            positions, mask = document_positions(document_ids), None  # (B, T): each document from 0
        else:
            positions, mask = positions_and_padding(idx, attention_mask, caches, layers=self.config.n_layers)
        if self.pos_emb is not None:
            last = int(positions.max())
            if last >= self.config.context_length:
                raise ValueError(
                    f"position {last} is past the model's context_length {self.config.context_length}; "
                    "GPT-2's learned position embeddings end there: shorten the input"
                )
        try:
            return self._run(idx, positions, mask, caches, last_only, document_ids, mask_mod, score_mod)
        except BaseException:  # Ctrl-C too
            if isinstance(caches, ModelCache):  # a paged write some layers made is undone
                caches.abort()
            raise

    def _run(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        caches: ModelCache | list[Cache] | None,
        last_only: bool,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
    ) -> torch.Tensor:
        """The forward pass proper, on arguments :meth:`forward` checked: nothing here reads a tensor's value,
        so ``torch.compile`` captures it whole (:meth:`decode_step`)."""
        x = self.tok_emb(idx)  # (B, T, E)
        if self.config.emb_scale is not None:
            x = x * self.config.emb_scale  # Gemma's sqrt(emb_dim)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)  # positions (T,) or (B, T) broadcast
        if self.score_mod is not None:
            score_mod = self.score_mod if score_mod is None else chain_scores(self.score_mod, score_mod)
        visibility: dict[int | str | None, Visibility] = {}  # once per call for the layers of a kind: by window
        for layer, block in enumerate(self.blocks):
            if block.att.visibility_key not in visibility:
                visibility[block.att.visibility_key] = block.att.visibility_for(
                    x,
                    mask=mask,
                    cache=caches[layer] if caches is not None else None,
                    document_ids=document_ids,
                    mask_mod=mask_mod,
                    score_mod=score_mod,
                )
        x = self.drop_emb(x)
        rotary_positions = positions if self.config.rope else None
        for layer, block in enumerate(self.blocks):
            cache = caches[layer] if caches is not None else None
            x = block(x, visibility=visibility[block.att.visibility_key], positions=rotary_positions, cache=cache)
        if last_only:
            x = x[:, -1:]  # (B, 1, E)
        logits = self.out_head(self.final_norm(x))
        cap = self.config.final_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def stream(
        self,
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
        cache: str | CacheFactory | PrefixCache = "plain",
        lookup: int | None = None,
        draft: GPT | None = None,
        draft_tokens: int = 4,
        compile: bool | str | Callable[..., Any] = False,
    ) -> Iterator[torch.Tensor]:
        """Each new token (B, 1) as it is chosen (a row that drew ``eos_id`` gets it again until every row has):
        :meth:`generate`'s arguments, checked here, when it is called, not at the first ``next()``."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        stop = self._stop(max_new_tokens, eos_id)
        prompts = plan.prompt_rows(idx, attention_mask, vocab_size=self.config.vocab_size)
        longest, ahead = max(map(len, prompts)) + max_new_tokens - 1, max(map(len, prompts)) + max_new_tokens
        step = self._compiled_step(compile, lookup, draft, attention_mask, use_cache, cache) if compile else None
        capacity = ahead if step is None else -(-ahead // STEP_CAPACITY) * STEP_CAPACITY  # one graph, many lengths
        plan.check_proposer(self, lookup=lookup, draft=draft, draft_tokens=draft_tokens)
        if not use_cache and cache != "plain":
            raise ValueError(f"use_cache=False runs without a cache; leave out cache={cache!r}")
        caps = plan.capabilities(cache) if use_cache else None
        plan.check_plan(self, prompts, caps, stop, draft=draft, speculating=lookup is not None or draft is not None)
        proposer = plan.proposer_for(self, lookup=lookup, draft=draft, draft_tokens=draft_tokens, capacity=ahead + 64)
        held = plan.cache_for(self, cache, rows=len(prompts), longest=longest, capacity=capacity) if use_cache else None
        plan.check_sinks(held, prompts, stop)
        passes = decode(self, prompts, cache=held, sampling=sampling, stop=stop, proposer=proposer, step=step)
        return _by_position(passes, len(prompts), stop, idx.device)

    def generate(
        self,
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
        cache: str | CacheFactory | PrefixCache = "plain",
        lookup: int | None = None,
        draft: GPT | None = None,
        draft_tokens: int = 4,
        compile: bool | str | Callable[..., Any] = False,
    ) -> torch.Tensor:
        """Greedy by default (temperature 0); returns (B, T + n), n <= max_new_tokens (fewer when every row ended
        at ``eos_id``). Call ``model.eval()`` first: dropout stays as set. ``attention_mask`` (B, T): 1 on real
        tokens, 0 on left padding; each row gets what it would alone.
        ``cache``: which KV cache each layer keeps: a name in ``attnlab.cache.CACHES`` ("plain", "paged", "prefix",
        "sink", "int8", "int4", "h2o", "snapkv"), a factory, or a ``PrefixCache`` kept across calls. With RoPE,
        a "sink" cache generates past context_length.
        ``lookup=k``: guess k tokens from the text so far and check them in one pass (prompt lookup); ``draft=``
        a smaller model with the same vocabulary guesses ``draft_tokens``. The same tokens greedy, the same
        distribution sampled (:mod:`attnlab.models.generation.proposers`); one sequence, the plain cache.
        ``compile=True``: decode with :meth:`decode_step` under ``torch.compile`` (inductor; or a backend's name),
        the plain cache, no attention_mask: one graph per cache capacity, rounded up to a multiple of 256 so that
        calls of similar length share it; the prefill runs uncompiled. The first call compiles (tens of seconds)."""
        new = self.stream(
            idx,
            max_new_tokens,
            attention_mask=attention_mask,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            generator=generator,
            use_cache=use_cache,
            cache=cache,
            lookup=lookup,
            draft=draft,
            draft_tokens=draft_tokens,
            compile=compile,
        )
        return torch.cat([idx, *new], dim=1)

    def generate_many(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        *,
        slots: int = 4,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        cache: str | PrefixCache = "paged",
    ) -> list[list[int]]:
        """Continuous batching: the new tokens of each prompt, in the prompts' order. Up to ``slots`` prompts run
        at once, each at its own length; when one ends (``max_new_tokens``, or ``eos_id``), its blocks go back
        and the next prompt takes its place. Greedy, each prompt gets what it gets alone. ``cache="prefix"`` (or
        a ``PrefixCache`` kept across calls) also shares the blocks of common prompt prefixes."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        stop = self._stop(max_new_tokens, eos_id)
        check_positive_int("slots", slots, limit=4096)
        rows = plan.many_rows(prompts, vocab_size=self.config.vocab_size)
        for n, prompt in enumerate(rows):
            if len(prompt) + max_new_tokens - 1 > self.config.context_length:
                raise ValueError(
                    f"prompt {n} has {len(prompt)} tokens and max_new_tokens is {max_new_tokens}: more than the "
                    f"model's context_length {self.config.context_length}; shorten it or ask for fewer tokens"
                )
        if cache not in ("paged", "prefix") and not isinstance(cache, PrefixCache):
            raise ValueError(
                f"generate_many runs on 'paged' or 'prefix' blocks (or a PrefixCache), got cache={cache!r}"
            )
        width, longest = min(slots, len(rows)), max(map(len, rows)) + max_new_tokens - 1
        held = plan.cache_for(self, cache, rows=width, longest=longest, capacity=longest)
        if not held.capabilities.rows:
            types = {self.config.layer_type(i) for i in range(len(self.blocks))}
            kept = " and ".join(
                what
                for what, kinds in (
                    ("sliding layers keep a ring buffer per row", {"sliding"}),
                    ("recurrent layers keep a state per row", {"linear", "delta"}),
                )
                if kinds & types
            )
            raise ValueError(
                f"generate_many admits and releases rows of paged blocks, and this model's {kept}, which cannot: "
                "call generate per prompt (or in one padded batch)"
            )
        results: list[list[int]] = [[] for _ in rows]
        for drawn in decode(self, rows, cache=held, sampling=sampling, stop=stop, slots=width):
            for index, token in drawn:
                results[index].append(token)
        return results

    def positions_for(self, cache: object) -> int | None:
        """The most positions generation may run: context_length, or no limit for a sink cache with RoPE."""
        return None if self.config.rope and capabilities_of(cache).past_context else self.config.context_length

    def _stop(self, max_new_tokens: int, eos_id: int | None) -> Stop:
        stop = Stop(max_new_tokens=max_new_tokens, eos_id=eos_id)
        if eos_id is not None and eos_id >= self.config.vocab_size:
            raise ValueError(
                f"eos_id {eos_id} is not a token of this model: its ids are 0..{self.config.vocab_size - 1}"
            )
        return stop

    def decode_step(self, token: torch.Tensor, caches: ModelCache) -> torch.Tensor:
        """Logits (B, 1, V) of one new token per row (B, 1) after what ``caches`` hold, unchecked: the step
        ``generate(compile=...)`` compiles. It reads no tensor's value, so it is one graph."""
        return self._run(token, caches[0].next_positions(1), None, caches, True)

    def _compiled_step(self, backend: object, *refused: object) -> Callable[[torch.Tensor, ModelCache], torch.Tensor]:
        """:meth:`decode_step` under ``torch.compile(backend=...)``, made once per backend and kept; ``refused``:
        lookup, draft, attention_mask, use_cache and cache, which a compiled step cannot take but as defaults."""
        lookup, draft, attention_mask, use_cache, cache = refused
        if lookup is not None or draft is not None or attention_mask is not None or not use_cache:
            raise ValueError(
                "compile= decodes one token a step with the KV cache: leave out lookup, draft and "
                "attention_mask, and keep use_cache=True"
            )
        if cache != "plain":
            raise ValueError(f"compile= decodes with the plain cache, whose shapes never change; got cache={cache!r}")
        if any(getattr(m, "kernel", None) == "dynamic" for m in self.modules()):
            raise ValueError(
                "compile= cannot hold int8 weights on the 'dynamic' kernel in one graph (torch.compile breaks "
                "at its packed weight); decode them uncompiled, or quantize(kernel='gemv')"
            )
        if backend is True:
            backend = "inductor"
        if isinstance(backend, bool) or not (isinstance(backend, str) or callable(backend)):
            raise ValueError(f"compile must be True, False or a torch.compile backend, got {backend!r}")
        if isinstance(backend, str) and backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise ValueError(
                f"compile={backend!r} is not a torch.compile backend here; known: {torch._dynamo.list_backends()}"
            )
        if backend not in _COMPILED_STEPS:  # kept apart from the model, which then still pickles and copies
            _COMPILED_STEPS[backend] = torch.compile(_decode_step, backend=backend)
        compiled = _COMPILED_STEPS[backend]
        return lambda token, caches: compiled(self, token, caches)

    def set_layout(self, layout: str = "auto") -> dict[str, str]:
        """Store every linear weight row by row ("rows", nn.Linear's own), column by column ("columns", the
        layout of Hugging Face GPT-2's Conv1D), row by row with oneDNN's product in place of the BLAS's
        ("onednn": inference on the CPU, float32 or bfloat16), row by row with a decode step's product by a
        loop torch.compile writes ("gemv", :mod:`attnlab.linear.gemv`; a prompt's by oneDNN), row by row with a copy
        oneDNN reorders once and reads ("packed", :mod:`attnlab.linear.packed`: twice the weights' memory), row by
        row with a decode step's product by attnlab's C++ loop that asks memory for the next rows ahead
        ("prefetch", :mod:`attnlab.linear.prefetch`; a prompt's by oneDNN), or in
        whichever this machine streams fastest for its shape ("auto", measured once per process): the same
        values, shapes and checkpoints, a faster decode where the measurement says so
        (:mod:`attnlab.linear.layout`). Returns the layout each weight got."""
        from attnlab.linear.layout import set_layout

        return dict(set_layout(self, layout))  # type: ignore[arg-type]

    def quantize(self, kind: str = "int8", *, kernel: str = "auto") -> dict[str, str]:
        """Store every linear weight, the vocabulary projection's too, as int8 with one scale per output channel
        (:mod:`attnlab.linear.quantized`), in place; the embeddings and norms stay float32. ``kernel``: "auto"
        (the fastest here for one row, a decode step, measured once per weight shape), "gemv", "dynamic",
        "int8pack" or "dequantize". "auto" serves one prompt; for many prompts at once (``generate_many``),
        "dynamic"'s int8 x int8 products run faster. For decoding on the CPU; a quantized model is not saved
        (save the float one and quantize after loading).
        Returns the kernel each weight got."""
        from attnlab.linear.quantized import INT8_KERNELS, Int8Kernel, quantize_linears

        if kind != "int8":
            raise ValueError(f"kind must be 'int8' (weight-only, per output channel), got {kind!r}")
        if kernel not in ("auto", *INT8_KERNELS):
            raise ValueError(f"kernel must be one of {('auto', *INT8_KERNELS)}, got {kernel!r}")
        if self.quantized:
            raise ValueError("this model is quantized already; load the float checkpoint again to choose anew")
        dtypes = {p.dtype for p in self.parameters()}
        if dtypes != {torch.float32}:
            raise TypeError(
                f"quantize starts from a float32 model, this one holds {sorted(map(str, dtypes))}; "
                "call model.float() first"
            )
        if any(p.device.type != "cpu" for p in self.parameters()):
            raise ValueError("int8 weights here are for decoding on the CPU; call model.cpu() first")
        # the blocks' linears and out_head: the only nn.Linear a GPT holds
        return dict(quantize_linears(self, cast(Int8Kernel, kernel)))

    @property
    def quantized(self) -> bool:
        """Whether :meth:`quantize` replaced the linear weights with int8 ones."""
        from attnlab.linear.quantized import Int8Linear

        return isinstance(self.out_head, Int8Linear)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer's and head's attention weights from one forward pass: (L, B, H, T, T). With learned sinks
        (gpt-oss) a row sums to less than 1: the rest went to its sink.

        Recorded with :class:`attnlab.Recorder`, so ``backend="auto"`` runs
        eager for this pass; a fused backend asked for by name is refused.
        """
        if self.config.backend not in ("auto", "eager"):
            raise ValueError(
                f"backend {self.config.backend!r} never forms the attention weights; "
                "load the model with backend='auto' (or 'eager') to see them"
            )
        with Recorder(names=["attn_weights"]) as rec:
            self(idx, attention_mask=attention_mask)
        # each (B, H, T, T): what the softmax gave the keys, a row summing to 1 minus its sink's share
        return torch.stack([rec.get("attn_weights", module=f"trf_blocks.{n}.att") for n in range(len(self.blocks))])

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: object) -> GPT:
        """Load a Hugging Face GPT-2 directory, a book GPTModel state dict (.pth) or an attnlab directory.

        ``overrides`` set GPTConfig fields the checkpoint does not fix (``backend``, ``drop_rate``; ``n_heads``
        for a book state dict of a size that is not GPT-2's). The model comes back in eval() mode, as Hugging
        Face's does.
        """
        return cls._filled(read_checkpoint(path, **overrides))

    @classmethod
    def from_book(cls, source: object, cfg: dict[str, Any], **overrides: object) -> GPT:
        """The book's from-scratch Llama 3 or Qwen3 (``llms_from_scratch.llama3.Llama3Model``, ``qwen3.Qwen3Model``
        and their KV-cache versions) as this decoder: ``source`` is the book's model, its state dict or its saved
        file, ``cfg`` the config dict it was built from (``LLAMA32_CONFIG_1B``, ``QWEN_CONFIG_06_B``, ...)."""
        return cls._filled(read_book(source, cfg, **overrides))

    @classmethod
    def _filled(cls, checkpoint: Checkpoint) -> GPT:
        with torch.device("meta"):  # shapes first, on no memory: a config that does not fit its file allocates nothing
            fit(cls(checkpoint.config), checkpoint, check_only=True)
        model = cls(checkpoint.config)
        fit(model, checkpoint)
        return model.eval()

    def save_pretrained(self, directory: str | Path, *, tokenizer: str | CharTokenizer | None = None) -> Path:
        """Write config.json and model.safetensors, which ``transformers.GPT2LMHeadModel.from_pretrained`` reads
        (for a model GPT-2 can hold; attnlab's own names otherwise).

        ``tokenizer="bytes"`` or ``"ascii"`` records a tokenizer that needs no files (see ``load_tokenizer``); a
        ``CharTokenizer`` is saved beside the weights.
        """
        return save_gpt(self, directory, tokenizer=tokenizer)
