"""One layer of an attnlab cache under transformers' layer contract (``CacheLayerMixin``); the keys its ``update``
returns carry their positions to the bridge (:mod:`attnlab.hf.caches` puts the layers together into a
transformers ``Cache``).

Shapes: B = batch, Hkv = key/value heads, T = new tokens, S = slots returned, D = head_dim.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from attnlab.cache import CACHES, Capabilities, LayerState, ModelCache
from attnlab.cache import capabilities_of as capabilities
from attnlab.cache.base import Cache as AttnlabCache
from attnlab.cache.model import why_no_crop
from attnlab.cache.plan import choose
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.hf.bridge import RETURNED, sink_padding


@dataclass
class Returned:
    """What a layer's last ``update`` returned beside the keys, which carry it to the bridge (``bridge.RETURNED``)."""

    q_pos: torch.Tensor  # (T,) the new tokens' positions
    k_pos: torch.Tensor  # (S,) or (B, S): each slot's position, -1 for an empty one
    cache: AttnlabCache
    observed: bool = False  # the bridge's attention read these keys (and told an evicting cache what they got)


def positioned(caps: Capabilities) -> bool:
    """Whether a cache's keys sit at positions that are not their slots (a sink cache moves its sinks' keys, an
    evicting one keeps the keys it chooses): only the bridge's attention reads them. The others keep position j
    in slot j, so their filled slots, handed over alone, read as DynamicCache's do."""
    return caps.past_context or caps.observes


class AttnlabLayer(CacheLayerMixin):
    """One layer's attnlab cache under transformers' layer contract."""

    is_compileable = False
    is_sliding = False

    def __init__(self, *, name: str, max_len: int, options: dict[str, Any], rotary: Any = None) -> None:
        super().__init__()
        self.name, self.max_len, self.rotary = name, max_len, rotary
        self.factory = functools.partial(CACHES[name], **options)
        self.caps = capabilities(self.factory)  # what the cache declares, read off its class
        self.is_croppable = self.caps.crop  # assisted generation crops rejected tokens: a cache that can
        self.inner: AttnlabCache | None = None
        self.batch: int | None = None  # rows, from the first keys
        self.seen = 0
        self._last: Returned | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The layer's cache, shaped by this layer's own first keys and values: a model's layer types may differ
        in key/value heads, head size and value size (MiMo-V2-Flash's values are narrower than its keys, Gemma 4's
        full layers wider than its sliding ones), so nothing is read from another layer or the config."""
        b, h_kv, _, d = key_states.shape  # (B, Hkv, T, D)
        dv = value_states.shape[-1]  # (B, Hkv, T, Dv)
        self.batch = b
        self.inner = self._made(b, h_kv, d, key_states.dtype, key_states.device, value_dim=dv)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = key_states.shape[2]
        self.check(t)  # asked for every layer by the model's pre-hook already; here for a call that came another way
        if self.inner is None:
            self.lazy_initialization(key_states, value_states)
        assert self.inner is not None
        q_pos = self.inner.next_positions(t)
        keys, values, positions = self.inner.update(key_states, value_states)
        self.seen += t
        if not positioned(self.caps):  # only the filled slots: any attention reads them as it reads DynamicCache's
            return keys[:, :, : self.seen], values[:, :, : self.seen]
        # an evicting cache's keys sit at the positions it chose: they take them to the bridge, which also tells it
        # the attention they got. Held here alone (the keys hold a weakref; an evicting cache's keys are its own
        # buffer, which a strong one would tie to the cache in a cycle), replaced by the next update's
        self._last = Returned(q_pos, positions, self.inner)
        setattr(keys, RETURNED, weakref.ref(self._last))
        return keys, values

    def check(self, tokens: int, padding: torch.Tensor | None = None) -> None:
        """What ``update`` refuses for ``tokens`` new tokens, and, given the call's 2D attention_mask, pads a sink
        cache would keep for good: refused with nothing written."""
        if self._last is not None and positioned(self.caps) and not self._last.observed:
            raise ValueError(
                f"the {self.name} cache's keys sit at positions only attnlab's attention reads, and its last keys "
                "were not read by it (the model's attention was switched away): run it with attn_implementation='attnlab'"
            )
        if self.seen + tokens > self.max_len and not self.caps.past_context:  # a sink cache's window slides on
            raise ValueError(
                f"the {self.name} cache holds up to max_len={self.max_len} positions and has {self.seen}; it cannot "
                f"take {tokens} more: make it with attnlab.hf.cache({self.name!r}, model, max_len=...) at least the "
                "prompt's length plus every token to generate"
            )
        if not self.caps.past_context:  # what follows is a sink cache's: its window and its sinks
            return
        held = self.inner if self.inner is not None else self._made(1, 1, 1, torch.float32, torch.device("cpu"))
        limit = held.room()
        if tokens > 1 and limit is not None and tokens > limit:  # the chunk would push out what it still needs
            raise ValueError(
                f"the sink cache's window holds {limit} more of these {tokens} tokens at once: a longer prompt goes "
                "through it one token at a time, generate(..., prefill_chunk_size=1), or make the window longer "
                "(max_len=, recent=)"
            )
        first = int(getattr(held, "sinks", 0))
        if padding is not None and not bool(padding[:, :first].all()):  # columns: positions 0, 1, ...
            raise ValueError(sink_padding(first))

    def _made(
        self,
        rows: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        value_dim: int | None = None,
    ) -> AttnlabCache:
        """This layer's cache, made where every cache is made (``ModelCache.build``); one value wide and empty, it
        answers what the cache would refuse before the first keys arrive."""
        # a full layer's state; value_dim: where its values are not as wide as its keys; rotary: a sink cache's,
        # the model's own rotation
        state = LayerState(
            kind="full",
            kv_heads=kv_heads,
            head_dim=head_dim,
            value_dim=value_dim,
            rotary=self.rotary,
            dtype=dtype,
            device=device,
        )
        return ModelCache.build([state], self.factory, rows=rows, capacity=self.max_len)[0]

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask is built over absolute positions 0 .. seen + query_length - 1; the bridge reads it at each
        slot's position."""
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return self.max_len

    def reset(self) -> None:
        self.inner, self.batch, self.seen, self._last, self.is_initialized = None, None, 0, None, False

    def why_not_back(self) -> str | None:
        """Why this layer's cache cannot go back to an earlier token, by attnlab's own reason for its class
        (``attnlab.cache.model.why_no_crop``, which speculation in attnlab's own loop names too); None where it can.
        Read off the class the cache is made of, so it answers before the first keys arrive."""
        state = LayerState(kind="full", kv_heads=1, head_dim=1)  # a full layer's, as _made builds it
        chosen = [choice.cls for choice in choose([state], self.factory)]
        if self.caps.crop and any(issubclass(cls, QuantizedKVCache) for cls in chosen):
            return (
                "a QuantizedKVCache goes back only as far as the spare exact slots it is built with, and transformers' "
                "assisted generation changes its number of guesses from pass to pass: use the 'plain' cache (attnlab's "
                "own generate(..., lookup=) sizes them)"
            )
        return None if self.caps.crop else why_no_crop(chosen)

    def check_crop(self, tokens_to_remove: int) -> None:
        why = self.why_not_back() if tokens_to_remove != 0 and self.inner is not None else None
        if why is not None:
            raise ValueError(
                f"the {self.name} cache cannot be cut back (assisted generation crops a pass's refused guesses): {why}"
            )

    def crop(self, tokens_to_remove: int) -> None:
        self.check_crop(tokens_to_remove)
        crop = getattr(self.inner, "crop", None)
        if tokens_to_remove == 0 or crop is None:
            return
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
