"""GPT: the book's GPTModel (chapter 4) on attnlab's Attention, with a KV cache and generate(), and every
decoder after it that ``GPTConfig`` describes (Llama 3, Mistral, Qwen2, Qwen3: ``attnlab.models.parts``).

The book's layout and names, in its order: token and position embeddings (``tok_emb``, ``pos_emb``: none with
RoPE), dropout, ``n_layers`` blocks (``norm1``, ``att``, ``drop_resid``, ``norm2``, ``ff``), ``final_norm`` and
``out_head``. GPT-2's defaults: the book's LayerNorm (scale/shift, biased variance, eps 1e-5) is ``nn.LayerNorm``,
its GELU the tanh approximation. The attention is ``attnlab.Attention``, so every backend, the cache and the
Recorder work in a whole model, whatever its family.

Shapes: B = batch, T = tokens, V = vocab_size, E = emb_dim, L = n_layers, H = n_heads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, CacheFactory, ModelCache
from attnlab.cache.undo import passing
from attnlab.functional.mods import MaskMod, ScoreMod, chain_scores, check_document_ids, document_positions
from attnlab.functional.visibility import Visibility
from attnlab.models.checkpoints import read_book, read_checkpoint, save_gpt
from attnlab.models.config import GPTConfig, score_mod_from_name
from attnlab.models.generation import GenerateOptions, ManyOptions, decode, request_for
from attnlab.models.generation.decode import by_position
from attnlab.models.generation.prompts import check_prompt, positions_and_padding
from attnlab.models.generation.tuned import Tuning, settle
from attnlab.models.parts import TransformerBlock, make_norm, make_ple
from attnlab.models.tokenizer import CharTokenizer
from attnlab.models.weights import Checkpoint, fit
from attnlab.nn.attention import SharedKV
from attnlab.nn.indexed_shared import link_indexers
from attnlab.nn.selection_record import token_weights
from attnlab.observe import Recorder

if TYPE_CHECKING:
    from typing_extensions import Unpack


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
        self.tuning: Tuning | None = None  # what generate's default path chose here, and why
        self.layout: str | None = None  # set_layout's choice, which generate then keeps
        self.tok_emb = nn.Embedding(config.vocab_size, config.emb_dim)
        self.pos_emb = None if config.rope or config.nope else nn.Embedding(config.context_length, config.emb_dim)
        self.drop_emb = nn.Dropout(config.drop_rate)
        self.ple = make_ple(config)  # Gemma 4's per-layer embeddings, or None
        self.trf_blocks = nn.ModuleList([TransformerBlock(config, layer=n) for n in range(config.n_layers)])
        link_indexers([block.att for block in self.blocks])  # GLM-5's shared layers read an earlier one's choice
        self.final_norm = make_norm(config)
        self.out_head = nn.Linear(config.emb_dim, config.vocab_size, bias=False)
        if config.tie_weights:
            self.out_head.weight = self.tok_emb.weight
        # every layer's score_mod; a module, so a learned one's parameters are the model's (and its checkpoint's)
        self.score_mod = score_mod_from_name(config.score_mod, config.n_heads) if config.score_mod else None

    @property
    def blocks(self) -> list[TransformerBlock]:
        return [cast(TransformerBlock, block) for block in self.trf_blocks]  # nn.ModuleList yields plain Modules

    def make_caches(
        self, *, batch_size: int, max_len: int, cache: str | CacheFactory = "plain", spare: int = 0
    ) -> ModelCache:
        """The model's cache for ``batch_size`` rows of up to ``max_len`` tokens (``spare``: the most a speculative
        pass goes back by), from a name in ``attnlab.cache.CACHES`` or a factory: ``ModelCache.build`` over each
        layer's declared state (a sliding layer keeps its ring, a recurrent layer its state, whatever is named)."""
        check_positive_int("batch_size", batch_size, limit=2**20)
        check_positive_int("max_len", max_len, limit=2**27)
        layers, context = [block.att.layer_state() for block in self.blocks], self.config.context_length
        return ModelCache.build(layers, cache, rows=batch_size, capacity=max_len, context_length=context, spare=spare)

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
        check_prompt(idx, vocab_size=self.config.vocab_size)
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
        with passing(caches):  # a call that fails (Ctrl-C too) leaves every layer's cache as it was
            return self.step(
                idx,
                positions,
                caches,
                mask=mask,
                last_only=last_only,
                document_ids=document_ids,
                mask_mod=mask_mod,
                score_mod=score_mod,
            )

    def step(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelCache | list[Cache] | None = None,
        *,
        mask: torch.Tensor | None = None,
        last_only: bool = True,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
    ) -> torch.Tensor:
        """Logits (B, T or 1, V) of ids (B, T) at ``positions`` (T,) or (B, T) after what ``cache`` holds, unchecked: the
        forward pass proper, what ``decode`` calls and ``generate(compile=...)`` compiles. ``mask``: the key padding
        (B, 1, 1, held + T); the rest as :meth:`forward`. Nothing here reads a tensor's value, so ``torch.compile``
        captures it whole."""
        x = self.tok_emb(ids)  # (B, T, E)
        if self.config.emb_scale is not None:
            x = x * self.config.emb_scale  # Gemma's sqrt(emb_dim)
        ple = None if self.ple is None else self.ple(ids, x)  # (B, T, L, P): Gemma 4's per-layer inputs
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
                    cache=cache[layer] if cache is not None else None,
                    document_ids=document_ids,
                    mask_mod=mask_mod,
                    score_mod=score_mod,
                )
        x = self.drop_emb(x)
        rotary_positions = positions if self.config.rope else None
        shared: dict[int | None, SharedKV] | None = {} if self.config.kv_shared_layers else None  # KV sharing
        for layer, block in enumerate(self.blocks):
            held = cache[layer] if cache is not None else None
            seen = visibility[block.att.visibility_key]
            x = block(x, visibility=seen, positions=rotary_positions, cache=held, shared=shared, per_layer=ple)
        if last_only:
            x = x[:, -1:]  # (B, 1, E)
        logits = self.out_head(self.final_norm(x))
        cap = self.config.final_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def stream(
        self, idx: torch.Tensor, max_new_tokens: int, **options: Unpack[GenerateOptions]
    ) -> Iterator[torch.Tensor]:
        """Each new token (B, 1) as it is chosen (a row that drew ``eos_id`` gets it again until every row has):
        :meth:`generate`'s arguments, checked here, when it is called, not at the first ``next()``."""
        request = settle(self, request_for(self, idx, max_new_tokens, options), compile_named="compile" in options)
        return by_position(decode(self, request), len(request.prompts), request.stop.eos_id, idx.device)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **options: Unpack[GenerateOptions]) -> torch.Tensor:
        """The prompt idx (B, T) and what follows, (B, T + n), n <= max_new_tokens (fewer when every row ended at
        ``eos_id``); greedy by default. The options (``GenerateOptions``): sampling, a padded batch, the cache,
        speculation, compile. Call ``model.eval()`` first. The first call lays the weights out, and compiles, as this
        machine measured fastest (``attnlab.models.generation.tuned``; why: ``self.tuning``)."""
        request = settle(self, request_for(self, idx, max_new_tokens, options), compile_named="compile" in options)
        rows: list[list[int]] = [[] for _ in request.prompts]
        for drawn in decode(self, request):
            for index, token in drawn:
                rows[index].append(token)
        n, eos = max(map(len, rows)), request.stop.eos_id  # a row shorter than n ended at eos_id: eos_id again
        return torch.cat([idx, torch.tensor([row + [eos] * (n - len(row)) for row in rows], device=idx.device)], dim=1)

    def generate_many(
        self, prompts: list[list[int]], max_new_tokens: int, **options: Unpack[ManyOptions]
    ) -> list[list[int]]:
        """Continuous batching: the new tokens of each prompt, in the prompts' order; up to ``slots`` (4) prompts run
        at once, each at its own length, the next taking a finished one's place (``ManyOptions``). Greedy, each
        prompt gets what it gets alone."""
        request = settle(self, request_for(self, prompts, max_new_tokens, options, many=True), compile_named=False)
        rows: list[list[int]] = [[] for _ in request.prompts]
        for drawn in decode(self, request):
            for index, token in drawn:
                rows[index].append(token)
        return rows

    def set_layout(self, layout: str = "auto") -> dict[str, str]:
        """Store every linear weight in ``layout`` ("rows", "columns", "onednn", "gemv", "packed", "prefetch"; "auto",
        the fastest here; "measured", what generate does by default: :mod:`attnlab.linear.layout`): the same values,
        shapes and checkpoints, a faster decode. Returns the layout each weight got; generate then keeps it."""
        from attnlab.linear.layout import set_layout

        chosen: dict[str, str] = dict(set_layout(self, layout))  # type: ignore[arg-type]
        self.layout = layout  # after: a refused layout leaves the model's choice as it was
        return chosen

    def quantize(self, kind: str = "int8", *, kernel: str = "auto") -> dict[str, str]:
        """Store every linear weight, the vocabulary projection's too, as int8 with one scale per output channel
        (:mod:`attnlab.linear.quantized`), in place; the embeddings and norms stay float32. ``kernel``: "auto"
        (the fastest here for one row, a decode step, measured once per weight shape and kept on disk), "gemv",
        "dynamic", "int8pack" or "dequantize". Under "auto" a prompt's rows take "dynamic"'s int8 x int8 products;
        for many prompts at once (``generate_many``) name "dynamic". For decoding on the CPU; a quantized model is
        not saved (save the float one and quantize after loading). Returns the kernel each weight got."""
        from attnlab.linear.int8_choice import INT8_KERNELS, Int8Kernel, quantize_linears

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
        with Recorder(names=["attn_weights", "read_slots"]) as rec:
            self(idx, attention_mask=attention_mask)
        # each (B, H, T, T), a row summing to 1 minus its sink's share; a convolution's one map in every head's
        # place; a sparse layer's gathered weights spread back onto its tokens (attnlab.nn.selection_record)
        maps = [token_weights(rec, f"trf_blocks.{n}.att", idx.shape[-1]) for n in range(len(self.blocks))]
        return torch.stack([w.expand(-1, self.config.n_heads, -1, -1) for w in maps])

    @classmethod
    def from_pretrained(cls, path: str | Path, *, revision: str | None = None, **overrides: object) -> GPT:
        """Load a Hugging Face directory of a family attnlab reads, a book GPTModel state dict (.pth), an attnlab
        directory, or a Hugging Face Hub name (``"Qwen/Qwen3-0.6B"``, at ``revision``; ``attnlab.models.hub``).

        ``overrides`` set GPTConfig fields the checkpoint does not fix (``backend``, ``drop_rate``; ``n_heads``
        for a book state dict of a size that is not GPT-2's). The model comes back in eval() mode, as Hugging
        Face's does.
        """
        return cls._filled(read_checkpoint(path, revision=revision, **overrides))

    @classmethod
    def from_book(cls, source: object, cfg: dict[str, Any], **overrides: object) -> GPT:
        """The book's own model as this decoder: chapter 4's ``GPTModel``, or the from-scratch Llama 3 or Qwen3
        (``llms_from_scratch.llama3.Llama3Model``, ``qwen3.Qwen3Model`` and their KV-cache versions). ``source`` is
        the book's model, its state dict or its saved file, ``cfg`` the config dict it was built from
        (``GPT_CONFIG_124M``, ``LLAMA32_CONFIG_1B``, ``QWEN_CONFIG_06_B``, ...)."""
        return cls._filled(read_book(source, cfg, **overrides))

    @classmethod
    def _filled(cls, checkpoint: Checkpoint) -> GPT:
        with torch.device("meta"):  # shapes first, on no memory: a config that does not fit its file allocates nothing
            fit(cls(checkpoint.config), checkpoint, check_only=True)
        model = cls(checkpoint.config)
        fit(model, checkpoint)
        return model.eval()

    def save_pretrained(self, directory: str | Path, *, tokenizer: str | CharTokenizer | None = None) -> Path:
        """Write config.json and model.safetensors (GPT-2's names, which transformers reads, where GPT-2 holds the
        model; attnlab's otherwise); ``tokenizer="bytes"``/``"ascii"`` or a ``CharTokenizer`` is kept beside."""
        return save_gpt(self, directory, tokenizer=tokenizer)
