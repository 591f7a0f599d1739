"""attnlab's KV caches as a transformers ``Cache``: ``model.generate(..., cache=attnlab.hf.cache(name, model))``
(``past_key_values=`` before transformers 5.24).

Each full-attention layer gets one of attnlab's caches (``attnlab.cache.CACHES``, made by
``ModelCache.build``) behind transformers' layer contract (:class:`AttnlabLayer`), which reads what it may do off
the cache's declared ``Capabilities``, never its name. The plain and quantized caches keep position j in slot
j, so ``update`` hands over their filled slots alone, which any attention reads as it reads ``DynamicCache``'s
(transformers' sdpa and eager too). An evicting cache keeps the positions it chooses: they travel to the bridge's attention
(``attnlab.hf.bridge``), which builds the call's Visibility from them, and transformers' mask, built over
absolute positions (``get_mask_sizes`` says so), is read at each kept key's position. A sliding layer keeps
transformers' own ring of its window.

Caches that weigh the attention their keys get (H2O, SnapKV) are told it by the bridge after each call; a sink
cache (StreamingLLM) turns its sinks on by the model's own rotation (``attnlab.hf.rotation``) and runs past the
model's context in the memory of its window. All three hand the bridge positions that are not their slots: they
need the model's attention to run through attnlab (``attn_implementation="attnlab"``) and are refused otherwise.

Shapes: B = batch, Hkv = key/value heads, T = new tokens, S = slots returned, D = head_dim.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from attnlab.cache import CACHES, Capabilities, LayerState, ModelCache
from attnlab.cache import capabilities_of as capabilities
from attnlab.cache.base import Cache as AttnlabCache
from attnlab.hf.rotation import ModelRotation

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


def positioned(caps: Capabilities) -> bool:
    """Whether a cache's keys sit at positions that are not their slots (a sink cache moves its sinks' keys, an
    evicting one keeps the keys it chooses): only the bridge's attention reads them. The others keep position j
    in slot j, so their filled slots, handed over alone, read as DynamicCache's do."""
    return caps.past_context or caps.observes


@dataclass
class Returned:
    """What one layer's last ``update`` returned: the bridge finds it by the keys tensor it is handed."""

    keys: weakref.ref[torch.Tensor]
    q_pos: torch.Tensor  # (T,) the new tokens' positions
    k_pos: torch.Tensor  # (S,) or (B, S): each slot's position, -1 for an empty one
    cache: AttnlabCache
    observed: bool = False


# id(keys) -> what came with them. Held by its layer alone: an entry goes when its cache does (no cache is kept
# alive from here), and one whose keys were freed and whose id was reused fails the weakref check.
_RETURNED: weakref.WeakValueDictionary[int, Returned] = weakref.WeakValueDictionary()


def returned_with(keys: torch.Tensor) -> Returned | None:
    """The positions (and cache) that came with ``keys``, if an attnlab cache layer just returned them."""
    found = _RETURNED.get(id(keys))
    return found if found is not None and found.keys() is keys else None


class AttnlabLayer(CacheLayerMixin):
    """One layer's attnlab cache under transformers' layer contract."""

    is_compileable = False
    is_sliding = False

    def __init__(self, *, name: str, max_len: int, options: dict[str, Any], rotary: Any = None) -> None:
        super().__init__()
        self.name, self.max_len, self.rotary = name, max_len, rotary
        self.factory = functools.partial(CACHES[name], **options)
        self.caps = capabilities(self.factory)
        self.is_croppable = self.caps.crop  # assisted generation crops rejected tokens: a cache that can
        self.inner: AttnlabCache | None = None
        self.seen = 0
        self._last: Returned | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h_kv, _, d = key_states.shape
        state = LayerState(
            kind="full",
            kv_heads=h_kv,
            head_dim=d,
            rotary=self.rotary,  # a sink cache's: the model's own rotation
            dtype=key_states.dtype,
            device=key_states.device,
        )
        self.inner = ModelCache.build([state], self.factory, rows=b, capacity=self.max_len)[0]
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._last is not None and positioned(self.caps) and not self._last.observed:
            raise ValueError(
                f"the {self.name} cache's keys sit at positions only attnlab's attention reads, and its last keys "
                "were not read by it (the model's attention was switched away): run it with attn_implementation='attnlab'"
            )
        if self.inner is None:
            self.lazy_initialization(key_states, value_states)
        assert self.inner is not None
        t = key_states.shape[2]
        if self.seen + t > self.max_len and not self.caps.past_context:  # a sink cache's window slides on
            raise ValueError(
                f"the {self.name} cache holds up to max_len={self.max_len} positions and has {self.seen}; it cannot "
                f"take {t} more: make it with attnlab.hf.cache({self.name!r}, model, max_len=...) at least the "
                "prompt's length plus every token to generate"
            )
        q_pos = self.inner.next_positions(t)
        limit = self.inner.room()
        if t > 1 and limit is not None and t > limit:  # a sink cache's chunk would push out what it still needs
            raise ValueError(
                f"the sink cache's window holds {limit} more of these {t} tokens at once: a longer prompt goes "
                "through it one token at a time, generate(..., prefill_chunk_size=1), or make the window longer "
                "(max_len=, recent=)"
            )
        keys, values, positions = self.inner.update(key_states, value_states)
        self.seen += t
        if not positioned(self.caps):  # only the filled slots: any attention reads them as it reads DynamicCache's
            return keys[:, :, : self.seen], values[:, :, : self.seen]
        # an evicting cache's keys sit at the positions it chose: they go to the bridge, which also tells it the
        # attention they got (one entry a layer: the last one goes with this one's predecessor)
        self._last = Returned(weakref.ref(keys), q_pos, positions, self.inner)
        _RETURNED[id(keys)] = self._last
        return keys, values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask is built over absolute positions 0 .. seen + query_length - 1; the bridge reads it at each
        slot's position."""
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return self.max_len

    def reset(self) -> None:
        self.inner, self.seen, self._last, self.is_initialized = None, 0, None, False

    def crop(self, tokens_to_remove: int) -> None:
        crop = getattr(self.inner, "crop", None)
        if tokens_to_remove == 0 or self.inner is None:
            return
        if not self.inner.capabilities.crop or crop is None:
            raise ValueError(
                f"the {self.name} cache cannot be cut back (assisted generation crops rejected tokens): "
                "use 'plain' for assisted generation"
            )
        keep = self.seen + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove
        crop(keep)
        self.seen = keep

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise ValueError(
            f"beam search reorders a cache's rows, which the {self.name} cache does not do: use num_beams=1"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise ValueError(
            f"the {self.name} cache cannot repeat its rows: make one per prompt, or num_return_sequences=1"
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise ValueError(f"the {self.name} cache cannot select rows: make one per prompt")


class AttnlabCacheForHF(Cache):
    """A transformers Cache whose full-attention layers are attnlab caches and whose sliding layers keep the ring
    of their window (transformers' own)."""

    def __init__(self, layers: list[Any], name: str) -> None:
        super().__init__(layers=layers)
        self.name = name


def cache(name: str, model: torch.nn.Module, *, max_len: int | None = None, **options: Any) -> AttnlabCacheForHF:
    """One of attnlab's caches for ``model.generate(..., cache=...)`` of a transformers model.

    Args:
        name: "plain" (lossless, token-identical to DynamicCache; it crops, for assisted generation), "int8"
            or "int4" (KIVI), "sink" (StreamingLLM: the first tokens and a window of the latest, past the
            model's context on RoPE), "h2o" or "snapkv" (eviction, by the attention attnlab computed).
        model: the transformers model it is for (its layers, which of them slide, and its attention).
        max_len: positions a sequence may reach, prompt included (default: the model's
            max_position_embeddings, at most 4096); one more is refused by name. A sink cache's window instead:
            it keeps ``sinks`` first tokens and the latest ``max_len - sinks``, and goes on past any length.
        options: the cache's own knobs (``budget=`` for h2o and snapkv, ``group_size=``/``residual=`` for int8/int4,
            ``sinks=``/``recent=`` for sink).

    Raises:
        ValueError: a name not offered here (with the reason), a model whose every layer slides, or an evicting
            cache for a model whose attention does not run through attnlab.
    """
    caps = capabilities(name)
    for needs, why in NOT_HERE:
        if getattr(caps, needs):
            raise ValueError(f"attnlab.hf.cache({name!r}) is refused: {why}")
    config: Any = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise TypeError(f"attnlab.hf.cache takes a transformers model, got {type(model).__name__}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "kv_lora_rank", None):
        raise ValueError(
            "this model's latent attention (DeepSeek's MLA) hands transformers' cache full keys and values of "
            "different widths, not the latent: load it with attnlab.models.GPT.from_pretrained(path), whose latent "
            "cache keeps kv_lora_rank + rope values a token (int8 and int4 too)"
        )
    longest = int(getattr(text, "max_position_embeddings", 4096) or 4096)
    span = min(longest, 4096) if max_len is None else max_len
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ValueError(f"max_len must be a whole number of positions >= 1, got {max_len!r}")
    kinds = list(getattr(text, "layer_types", None) or [])
    window: Any = getattr(text, "sliding_window", None)
    if not kinds:
        kinds = ["sliding_attention" if window else "full_attention"] * text.num_hidden_layers
    if all(k != "full_attention" for k in kinds):
        raise ValueError(
            f"every layer of this model slides (window {window}): each keeps the ring of its window, so the {name} "
            "cache would apply to no layer"
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
    layers: list[Any] = []
    for kind in kinds:
        if kind == "sliding_attention":
            layers.append(DynamicSlidingWindowLayer(sliding_window=int(window)))
        elif kind == "full_attention":
            layers.append(AttnlabLayer(name=name, max_len=span, options=options, rotary=rotary))
        else:
            raise ValueError(f"a {kind!r} layer has no KV cache attnlab.hf.cache can give it")
    return AttnlabCacheForHF(layers, name)
