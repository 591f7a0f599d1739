"""One layer of an attnlab cache under transformers' layer contract (``CacheLayerMixin``), and what its last
``update`` returned, for the bridge to find by the keys tensor it is handed (:mod:`attnlab.hf.caches` puts the
layers together into a transformers ``Cache``).

Shapes: B = batch, Hkv = key/value heads, T = new tokens, S = slots returned, D = head_dim.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from attnlab.cache import CACHES
from attnlab.cache.base import Cache as AttnlabCache
from attnlab.hf.bridge import sink_padding
from attnlab.hf.returned import _RETURNED, Returned

PREFIX = ("plain", "int8", "int4")  # slot j holds position j: the filled slots are a prefix, handed over alone
EVICTING = ("h2o", "snapkv")  # the keys they keep are theirs to choose, by the attention attnlab computed
POSITIONED = ("sink", *EVICTING)  # their keys' positions are not their slots: only the bridge can read them


class AttnlabLayer(CacheLayerMixin):
    """One layer's attnlab cache under transformers' layer contract."""

    is_compileable = False
    is_sliding = False

    def __init__(self, *, name: str, max_len: int, options: dict[str, Any], rotary: Any = None) -> None:
        super().__init__()
        self.name, self.max_len, self.options, self.rotary = name, max_len, options, rotary
        self.is_croppable = name == "plain"  # assisted generation crops rejected tokens: the plain cache can
        self.inner: AttnlabCache | None = None
        self.batch: int | None = None  # rows, from the first keys
        self.seen = 0
        self._last: Returned | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h_kv, _, d = key_states.shape
        self.batch = b
        factory = CACHES[self.name]
        self.inner = factory(
            batch_size=b,
            num_kv_heads=h_kv,
            head_dim=d,
            max_len=self.max_len,
            window=None,
            dtype=key_states.dtype,
            device=key_states.device,
            rotary=self.rotary,  # a sink cache's: the model's own rotation
            context_length=None,
            **self.options,
        )
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
        if self.name in PREFIX:  # only the filled slots: any attention reads them as it reads DynamicCache's
            return keys[:, :, : self.seen], values[:, :, : self.seen]
        # an evicting cache's keys sit at the positions it chose: they go to the bridge, which also tells it the
        # attention they got (one entry a layer: the last one goes with this one's predecessor)
        self._last = Returned(weakref.ref(keys), q_pos, positions, self.inner)
        _RETURNED[id(keys)] = self._last
        return keys, values

    def check(self, tokens: int, padding: torch.Tensor | None = None) -> None:
        """What ``update`` refuses for ``tokens`` new tokens, and, given the call's 2D attention_mask, pads a sink
        cache would keep for good: refused with nothing written."""
        if self._last is not None and self.name in POSITIONED and not self._last.observed:
            raise ValueError(
                f"the {self.name} cache's keys sit at positions only attnlab's attention reads, and its last keys "
                "were not read by it (the model's attention was switched away): run it with attn_implementation='attnlab'"
            )
        if self.seen + tokens > self.max_len and self.name != "sink":  # a sink cache's window slides on and on
            raise ValueError(
                f"the {self.name} cache holds up to max_len={self.max_len} positions and has {self.seen}; it cannot "
                f"take {tokens} more: make it with attnlab.hf.cache({self.name!r}, model, max_len=...) at least the "
                "prompt's length plus every token to generate"
            )
        if self.name != "sink":
            return
        held = self.inner if self.inner is not None else self._empty()
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

    def _empty(self) -> AttnlabCache:
        """An empty cache of this kind and these settings, one value wide (asked before the first keys, once)."""
        return CACHES[self.name](
            batch_size=1, num_kv_heads=1, head_dim=1, max_len=self.max_len, window=None, dtype=torch.float32,
            device="cpu", rotary=self.rotary, context_length=None, **self.options,
        )  # fmt: skip

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

    def check_crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0 and self.inner is not None and not self.inner.capabilities.crop:
            raise ValueError(
                f"the {self.name} cache cannot be cut back (assisted generation crops rejected tokens): "
                "use 'plain' for assisted generation"
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
