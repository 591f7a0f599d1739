"""attnlab's KV caches as a transformers ``Cache``: ``model.generate(..., cache=attnlab.hf.cache(name, model))``
(``past_key_values=`` before transformers 5.24).

Each full-attention layer gets one of attnlab's caches (``attnlab.cache.CACHES``) behind transformers' layer
contract (:class:`attnlab.hf.layer.AttnlabLayer`). The plain and quantized caches keep position j in slot j, so
``update`` hands over their filled slots alone, which any attention reads as it reads ``DynamicCache``'s
(transformers' sdpa and eager too). An evicting cache keeps the positions it chooses: they travel to the bridge's attention
(``attnlab.hf.bridge``), which builds the call's Visibility from them, and transformers' mask, built over
absolute positions (``get_mask_sizes`` says so), is read at each kept key's position. A sliding layer keeps
transformers' own ring of its window, and a short convolution's layer (LFM's) transformers' own state of its last
inputs (``LinearAttentionLayer``).

Assisted generation (``generate(..., assistant_model=)`` or ``prompt_lookup_num_tokens=``) asks three things of the
target's cache, read from transformers' ``_assisted_decoding``: ``activate_past_recording()`` first, before the
prefill; ``is_croppable`` after it; ``crop(-n)`` after each pass, n the refused guesses (0 included). The plain
cache crops to any token; transformers' ring and convolution layers, once recording, keep a pass's keys or inputs
whole until the crop cuts them back to the window (a ring with room for the pass). A cache that cannot go back is
refused in ``activate_past_recording``, by attnlab's reason for its class, before anything is written; a recurrent
state is refused when the cache is made (:mod:`attnlab.hf.model_states` says why no cache could serve it).

Prefix reuse is refused: a transformers cache never sees token ids, and ``generate`` handed a cache that already
holds n tokens takes them, unread, as the first n of its prompt. A cache is for one ``generate`` call.

Caches that weigh the attention their keys get (H2O, SnapKV) are told it by the bridge after each call; a sink
cache (StreamingLLM) turns its sinks on by the model's own rotation (``attnlab.hf.rotation``) and runs past the
model's context in the memory of its window. All three hand the bridge positions that are not their slots: they
need the model's attention to run through attnlab (``attn_implementation="attnlab"``) and are refused otherwise.

Shapes: B = batch, Hkv = key/value heads, T = new tokens, S = slots returned, D = head_dim.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer, LinearAttentionLayer

from attnlab.cache import CACHES
from attnlab.cache import capabilities_of as capabilities
from attnlab.hf.checks import CheckedCache, watch
from attnlab.hf.layer import AttnlabLayer, positioned
from attnlab.hf.model_states import HELD, check_states, check_widths, field
from attnlab.hf.rotation import ModelRotation

__all__ = ["NOT_HERE", "AttnlabCacheForHF", "AttnlabLayer", "cache"]

# what transformers' generate cannot give a cache, by what the cache declares it needs
NOT_HERE = (
    (
        "shares_prefixes",
        "prefix sharing needs the token ids, which a transformers cache never sees: use attnlab's "
        "GPT.generate(..., cache='prefix') or generate_many",
    ),
    (
        "rows",
        "paged rows are admitted and released by attnlab's own decode loop, which transformers' generate "
        "does not run: use attnlab.models.GPT.from_pretrained(path).generate(..., cache='paged')",
    ),
)
ASSISTED = (
    "the {name} cache cannot serve transformers' assisted generation (assistant_model= or "
    "prompt_lookup_num_tokens=), which writes each pass's guesses into the cache and then cuts the refused ones off "
    "(Cache.crop(-n)): {why}; generate with attnlab.hf.cache('plain', model), or without assistance. Nothing was "
    "written"
)
REUSED = (
    "this {name} cache already holds {held} tokens of an earlier call, and transformers' generate would take them, "
    "unread, as the first {held} tokens of this prompt: a transformers cache never sees token ids, so it cannot "
    "tell a shared beginning from another prompt, and attnlab reuses no prefix through the bridge. Make a new "
    "attnlab.hf.cache(...) for each generate call; to reuse a prompt's beginning, attnlab's own model "
    "(attnlab.models.GPT.from_pretrained(path)) keeps a PrefixCache across calls and matches the token ids"
)


def _rows(layer: Any) -> int | None:
    """The rows a layer holds, once it holds any: an attnlab layer's; transformers' ring's keys (B, Hkv, S, D); a
    convolution's inputs (B, C, L)."""
    if isinstance(layer, AttnlabLayer):
        return layer.batch
    keys = getattr(layer, "keys", None)
    if isinstance(keys, torch.Tensor) and keys.dim() == 4:
        return int(keys.shape[0])
    states = getattr(layer, "conv_states", None)
    held = [state for state in (states or {}).values() if isinstance(state, torch.Tensor)]
    return int(held[0].shape[0]) if held else None


class AttnlabCacheForHF(Cache, CheckedCache):
    """A transformers Cache whose full-attention layers are attnlab caches and whose sliding and convolution layers
    are transformers' own. A call it cannot take is refused before any layer changes: the model's pre-hook asks
    ``check_call`` before its first layer (:mod:`attnlab.hf.checks`); what moves every layer (beam search's
    reordering, a crop) is checked for all of them first; assisted generation on a cache that cannot go back, and a
    second ``generate`` on a cache that holds tokens, are refused before the prefill."""

    def __init__(self, layers: list[Any], name: str) -> None:
        super().__init__(layers=layers)
        self.name = name
        self._given = False
        self._spare = 0  # positions added for prompt lookup's last guesses (activate_past_recording)

    def _ours(self) -> list[AttnlabLayer]:
        return [layer for layer in self.layers if isinstance(layer, AttnlabLayer)]

    def check_call(self, batch: int, tokens: int, attention_mask: torch.Tensor | None) -> None:
        """Whatever a forward of ``batch`` rows and ``tokens`` new tokens would be refused in any layer."""
        for layer in self.layers:
            rows = _rows(layer)
            if rows is not None and rows != batch:
                raise ValueError(
                    f"this {self.name} cache holds {rows} rows and this call brings {batch}: a cache follows the "
                    "batch of its first call (beam search and num_return_sequences repeat its rows): make a new "
                    "one for a new batch, and generate with num_beams=1"
                )
        for ours in self._ours():
            ours.check(tokens, attention_mask)

    def mod_positions(self, tokens: int) -> torch.Tensor | None:
        """The positions the bridge gives the next ``tokens`` queries' mods: a sink or evicting cache's own
        count; None for the others, whose queries sit at transformers' position_ids."""
        ours = self._ours()
        if not positioned(ours[0].caps):
            return None
        inner = ours[0].inner
        return torch.arange(tokens) if inner is None else inner.next_positions(tokens)

    @property
    def _is_user_defined(self) -> bool:
        return self._given

    @_is_user_defined.setter
    def _is_user_defined(self, value: bool) -> None:
        # transformers' generate marks the cache it was handed before its prefill, in _prepare_cache_for_generation,
        # whose generation_config is the call's: the one point where a reused cache and beam search are seen with
        # nothing written
        config = sys._getframe(1).f_locals.get("generation_config")
        beams = getattr(config, "num_beams", 1)
        if isinstance(beams, int) and beams > 1:
            self._ours()[0].reorder_cache(torch.zeros(1, dtype=torch.long))  # type: ignore[arg-type]  # its refusal
        held = self.get_seq_length()
        if held:
            raise ValueError(REUSED.format(name=self.name, held=held))
        self._given = value

    def activate_past_recording(self) -> None:
        """What transformers' assisted decoding calls first, before its prefill: a cache that cannot go back is
        refused here, with nothing written; transformers' ring and convolution layers start keeping each pass whole
        until its crop (their ``record_past``)."""
        ours = self._ours()
        for mine in ours:
            why = mine.why_not_back()
            if why is not None:
                raise ValueError(ASSISTED.format(name=self.name, why=why))
        # prompt lookup checks guesses past the call's max_length (its candidates end at the text's end, not at
        # max_length: PromptLookupCandidateGenerator) and keeps none of them: room for one pass's, in layers not
        # built yet (a second generate on this cache is refused, so here none is)
        config = sys._getframe(1).f_locals.get("generation_config")  # _assisted_decoding's
        guesses = getattr(config, "prompt_lookup_num_tokens", None)
        if isinstance(guesses, int) and guesses > 0 and not self._spare:
            for mine in ours:
                mine.max_len += guesses if mine.inner is None else 0
            self._spare = guesses
        super().activate_past_recording()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._ours()[0].reorder_cache(beam_idx)  # refused before any layer (a sliding one first) moves its rows

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._ours()[0].batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._ours()[0].batch_select_indices(indices)

    def crop(self, tokens_to_remove: int) -> None:
        """Every layer cut back, or none: attnlab's are asked first; transformers' own (a sliding layer past its
        window, or a convolution's, refuses unless it records past states) are put back as they were if one of them
        refuses."""
        ours = self._ours()
        for mine in ours:
            mine.check_crop(tokens_to_remove)
        # a ring never written (Gemma 4's KV-shared layers read an earlier layer's) holds nothing to cut back, and
        # transformers' DynamicSlidingWindowLayer.crop reads keys it does not have
        theirs: list[Any] = [
            layer
            for layer in self.layers
            if not isinstance(layer, AttnlabLayer) and getattr(layer, "is_initialized", True) is not False
        ]
        # they cut by slicing into new tensors (a convolution's into its dict of states): these are the old
        kept = [{k: dict(v) if isinstance(v, dict) else v for k, v in vars(layer).items()} for layer in theirs]
        try:
            for layer in theirs:
                layer.crop(tokens_to_remove)
        except Exception:
            for layer, attributes in zip(theirs, kept, strict=True):
                vars(layer).clear()
                vars(layer).update(attributes)
            raise
        for mine in ours:
            mine.crop(tokens_to_remove)


def cache(name: str, model: torch.nn.Module, *, max_len: int | None = None, **options: Any) -> AttnlabCacheForHF:
    """One of attnlab's caches for ``model.generate(..., cache=...)`` of a transformers model.

    Args:
        name: "plain" (lossless, token-identical to DynamicCache; it goes back, for assisted generation), "int8"
            or "int4" (KIVI), "sink" (StreamingLLM: the first tokens and a window of the latest, past the
            model's context on RoPE), "h2o" or "snapkv" (eviction, by the attention attnlab computed).
        model: the transformers model it is for (its layers, which of them slide, and its attention).
        max_len: positions a sequence may reach, prompt included (default: the model's
            max_position_embeddings, at most 4096); one more is refused by name (prompt lookup's last pass may check
            guesses past it: the cache makes room for them itself). A sink cache's window instead:
            it keeps ``sinks`` first tokens and the latest ``max_len - sinks``, and goes on past any length.
        options: the cache's own knobs (``budget=`` for h2o and snapkv, ``group_size=``/``residual=`` for int8/int4,
            ``sinks=``/``recent=`` for sink).

    Raises:
        ValueError: a name not offered here (with the reason), a model with no full-attention layer, a layer whose
            state is not keys and values nor a short convolution's (Gated DeltaNet, Kimi Delta Attention, DeepSeek's
            latent), a cache that cannot keep the model's values beside its keys (MiMo-V2-Flash's narrower values
            in a quantized cache), a sink or evicting cache on a model that shares keys across layers, or one for
            a model whose attention does not run through attnlab; all before any layer is written.

    The model's decoder gets a forward pre-hook, once (:mod:`attnlab.hf.checks`): each forward asks the cache
    what it would refuse (rows, length, window, pads among a sink cache's sinks) before its first layer writes.
    Assisted generation on a cache that cannot go back (int8, int4, sink, h2o, snapkv), and a second generate on
    a cache that holds tokens (a prefix reused unread), are refused before the prefill.
    """
    if not isinstance(name, str) or name not in CACHES:
        raise ValueError(
            f"unknown cache {name!r}: attnlab.hf.cache takes a name in attnlab.cache.CACHES, {list(CACHES)}"
        )
    caps = capabilities(name)
    for needs, why in NOT_HERE:
        if getattr(caps, needs):
            raise ValueError(f"attnlab.hf.cache({name!r}) is refused: {why}")
    config: Any = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise TypeError(f"attnlab.hf.cache takes a transformers model, got {type(model).__name__}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = [str(kind) for kind in field(text, "layer_types") or []]
    window: Any = field(text, "sliding_window")
    if not kinds:
        kinds = ["sliding_attention" if window else "full_attention"] * text.num_hidden_layers
    check_states(kinds, latent=bool(field(text, "kv_lora_rank")))
    longest = int(getattr(text, "max_position_embeddings", 4096) or 4096)
    span = min(longest, 4096) if max_len is None else max_len
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ValueError(f"max_len must be a whole number of positions >= 1, got {max_len!r}")
    if all(k == "sliding_attention" for k in kinds):
        raise ValueError(
            f"every layer of this model slides (window {window}): each keeps the ring of its window, so the {name} "
            "cache would apply to no layer"
        )
    if all(k != "full_attention" for k in kinds):
        raise ValueError(
            f"this model has no full-attention layer (its layers are {sorted(set(kinds))}): each keeps transformers' "
            f"own state, so the {name} cache would apply to no layer"
        )
    shared = field(text, "num_kv_shared_layers")
    if positioned(caps) and isinstance(shared, int) and shared > 0:
        raise ValueError(
            f"the {name} cache keeps its keys at positions only the layer that wrote them is read at, and this "
            f"model's last {shared} layers read earlier layers' keys and values (KV sharing, Gemma 4's "
            "num_kv_shared_layers): use 'plain', 'int8' or 'int4', or attnlab.models.GPT.from_pretrained(path), "
            "whose caches plan the shared layers"
        )
    if positioned(caps) and config._attn_implementation != "attnlab":
        why = "weighs the attention its keys get, which transformers' own attention never hands a cache"
        if caps.past_context:
            why = "moves its sinks' keys to positions that are not their slots, which only attnlab's attention reads"
        raise ValueError(
            f"the {name} cache {why}, and this model runs {config._attn_implementation!r}: load it with "
            "attn_implementation='attnlab' (or call attnlab.hf.use(model) first)"
        )
    rotary = ModelRotation(model, text) if caps.past_context else None  # a sink cache turns its sinks by it
    states = int(field(text, "number_of_conv_states") or 1)  # a convolution layer's (transformers' own count)
    layers: list[Any] = [
        DynamicSlidingWindowLayer(sliding_window=int(window))
        if kind == "sliding_attention"
        else LinearAttentionLayer(number_of_states=states)
        if kind in HELD
        else AttnlabLayer(name=name, max_len=span, options=options, rotary=rotary)
        for kind in kinds
    ]
    check_widths(text, next(layer for layer in layers if isinstance(layer, AttnlabLayer)))
    watch(model)  # its forwards ask this cache what it refuses before their first layer writes (attnlab.hf.checks)
    return AttnlabCacheForHF(layers, name)
