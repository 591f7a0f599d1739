"""Which cache each layer keeps: one table, read by ``ModelCache.build`` and ``ModelCache.plan`` alone.

Each attention kind declares the state it needs, a :class:`LayerState`
(``Attention.layer_state()``, ``LatentAttention``'s, the recurrent layers'),
and the user names a cache (a name in ``CACHES``, with its knobs, or a factory
of their own). :data:`TABLE` maps (kind, name) to a :class:`Choice` (the
class a layer gets, whose declared capabilities the plan reads, and how it is
made) or to a refusal with its reason. A name applies to the layers that hold
keys and values; a sliding layer keeps the ring of its window and a recurrent
layer its state whatever is named, and a name that would then apply to no
layer is refused (:func:`choose`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from attnlab.cache.base import Cache, LayerCache
from attnlab.cache.evicting import EvictingCache
from attnlab.cache.factories import CACHES, FactoryArgs, band_refusal, cache_factory, cache_name, knobs_of, paged
from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.cache.latent import LatentCache, QuantizedLatentCache
from attnlab.cache.paged import BlockTable, PagedKVCache
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.cache.shared import SharedCache
from attnlab.cache.sink import SinkCache
from attnlab.cache.state import ConvolutionCache, StateCache

# full: keys and values of every position; sliding: a ring of the window; latent: MLA's [c, k_pe] per token;
# recurrent: a state of fixed size (with its short convolution's last inputs); shared: nothing, it reads an
# earlier layer's keys (KV sharing); convolution: a layer of short convolutions alone (LFM), its last inputs. The
# rest have no cache yet: keys beside indexer keys (indexed), entries of closed blocks (compressed).
Kind = Literal["full", "sliding", "latent", "recurrent", "shared", "indexed", "compressed", "convolution"]
KINDS: tuple[str, ...] = get_args(Kind)


@dataclass(frozen=True, kw_only=True)
class LayerState:
    """What one layer keeps between calls, declared by its attention module; sizes are per sequence.

    Args:
        kind: one of ``KINDS``.
        kv_heads: key/value heads (a latent layer: 1; a recurrent layer: its heads).
        head_dim: the width of a key (a latent layer: kv_lora_rank + rope_dim; a recurrent state's Dk).
        value_dim: the width of a value where it differs (a latent layer's kv_lora_rank, a state's Dv).
        window: the sliding window, or None.
        rotary: the layer's RotaryEmbedding, or None (a sink cache turns its sinks with it).
        normalizer: a recurrent state with linear attention's (Dk,) normalizer.
        conv: (channels, kernel - 1) of a short causal convolution before the recurrence (Qwen3.5), or None.
        source: a "shared" layer's: the layer whose keys and values it reads (KV sharing, Gemma 4).
        dtype, device: of what it keeps.
    """

    kind: Kind
    kv_heads: int
    head_dim: int
    value_dim: int | None = None
    window: int | None = None
    rotary: Any = None
    normalizer: bool = False
    conv: tuple[int, int] | None = None
    source: int | None = None
    dtype: torch.dtype = torch.float32
    device: torch.device | str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a layer's state is of one kind among {list(KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class Sizes:
    """What every layer's cache of one build shares: the rows, each row's capacity, and the user's choice."""

    rows: int
    capacity: int
    context_length: int | None
    factory: Callable[..., Any]  # the user's, knobs included
    knobs: dict[str, Any]  # the knobs set on a named cache
    table: BlockTable | None  # the one block table of the paged layers
    made: list[Cache]  # the layers' caches made so far, in order: a shared layer's reads its source's
    spare: int = 0  # the most tokens a speculative pass goes back by: a ring keeps as many slots more


@dataclass(frozen=True)
class Choice:
    """What a layer gets: ``cls``, whose capabilities it declares, made by ``make``."""

    cls: type[LayerCache]
    make: Callable[[LayerState, Sizes], Cache]
    pages: bool = False  # writes through the model's one block table


def factory_args(state: LayerState, sizes: Sizes) -> FactoryArgs:
    return {
        "batch_size": sizes.rows,
        "num_kv_heads": state.kv_heads,
        "head_dim": state.head_dim,
        "value_dim": state.value_dim or state.head_dim,
        "max_len": sizes.capacity,
        "window": state.window,
        "dtype": state.dtype,
        "device": state.device,
        "rotary": state.rotary,
        "context_length": sizes.context_length,
    }


def _named(state: LayerState, sizes: Sizes) -> Cache:
    made: Cache = sizes.factory(**factory_args(state, sizes))
    return made


def _paged(state: LayerState, sizes: Sizes) -> Cache:
    return paged(**factory_args(state, sizes), table=sizes.table)


def _ring(state: LayerState, sizes: Sizes) -> Cache:
    assert state.window is not None  # a sliding layer declares its window
    return SlidingWindowCache(
        batch_size=sizes.rows,
        num_kv_heads=state.kv_heads,
        head_dim=state.head_dim,
        value_dim=state.value_dim or state.head_dim,
        window=state.window,
        spare=sizes.spare,
        dtype=state.dtype,
        device=state.device,
    )


def _state(state: LayerState, sizes: Sizes) -> Cache:
    return StateCache(
        batch_size=sizes.rows,
        num_heads=state.kv_heads,
        key_dim=state.head_dim,
        value_dim=state.value_dim or state.head_dim,
        normalizer=state.normalizer,
        conv=state.conv,
        dtype=state.dtype,
        device=state.device,
        spare=sizes.spare,  # "each": the states after a pass's last spare tokens
    )


def _convolution(state: LayerState, sizes: Sizes) -> Cache:
    assert state.conv is not None  # a convolution layer declares its (channels, kernel - 1)
    channels, held = state.conv
    return ConvolutionCache(
        batch_size=sizes.rows,
        channels=channels,
        kernel=held + 1,
        dtype=state.dtype,
        device=state.device,
        spare=sizes.spare,
    )


def _shared(state: LayerState, sizes: Sizes) -> Cache:
    if state.source is None or not 0 <= state.source < len(sizes.made):
        raise ValueError(f"a shared layer reads an earlier layer's keys: source={state.source!r} names none")
    return SharedCache(source=state.source, of=sizes.made[state.source])


def _latent(bits: int | None) -> Callable[[LayerState, Sizes], Cache]:
    """MLA's latent cache, exact (``bits`` None) or coded in ``bits`` bits (its one knob: group_size)."""

    def make(state: LayerState, sizes: Sizes) -> Cache:
        rank = state.value_dim or state.head_dim
        shape: dict[str, Any] = dict(batch_size=sizes.rows, kv_lora_rank=rank, rope_dim=state.head_dim - rank)
        shape.update(max_len=sizes.capacity, dtype=state.dtype, device=state.device)
        if bits is None:
            return LatentCache(**shape)
        unknown = sorted(set(sizes.knobs) - {"group_size"})
        if unknown:
            raise ValueError(
                f"a latent layer's int{bits} cache codes each token's latent whole (no residual ring): it takes "
                f"group_size only, got {unknown}"
            )
        return QuantizedLatentCache(**shape, bits=bits, **sizes.knobs)

    return make


NOT_LATENT = (
    "a latent attention layer keeps its latent cache (kv_lora_rank + qk_rope_head_dim values a token), plain or "
    "quantized: the {name} cache is not built for latents; use 'plain', 'int8' or 'int4'"
)
FULL: dict[str, Choice] = {  # what a named cache is on a layer of keys and values
    "plain": Choice(KVCache, _named),
    "paged": Choice(PagedKVCache, _paged, pages=True),
    "prefix": Choice(PagedKVCache, _paged, pages=True),  # under the tree of ModelCache.build's PrefixCache
    "sink": Choice(SinkCache, _named),
    "int8": Choice(QuantizedKVCache, _named),
    "int4": Choice(QuantizedKVCache, _named),
    "h2o": Choice(EvictingCache, _named),
    "snapkv": Choice(EvictingCache, _named),
}
# (kind, name) -> the layer's cache, or why not; name None: a factory of the user's own
TABLE: dict[tuple[str, str | None], Choice | str] = {
    **{("full", name): choice for name, choice in FULL.items()},
    ("full", None): Choice(LayerCache, _named),  # the user's factory, which declares nothing to plan with
    **{("sliding", name): Choice(SlidingWindowCache, _ring) for name in CACHES},  # its ring, whatever is named
    ("sliding", "prefix"): "the prefix cache does not keep a sliding window's ring; a layer with window={window} "
    "needs the 'plain' cache (a ring buffer of the window): prefix sharing needs paged blocks in every layer",
    ("sliding", None): Choice(LayerCache, _named),  # the user's factory gets the window and decides
    **{("recurrent", name): Choice(StateCache, _state) for name in CACHES},  # its state, whatever is named
    ("recurrent", "prefix"): "the prefix cache shares paged blocks of keys and values between prompts, and a "
    "recurrent layer keeps a state instead, which no prompt can take from another: use the 'plain' cache",
    **{("shared", name): Choice(SharedCache, _shared) for name in (*CACHES, None)},  # its source's, whatever
    **{("convolution", name): Choice(ConvolutionCache, _convolution) for name in CACHES},  # its last inputs
    ("convolution", "prefix"): "the prefix cache shares paged blocks of keys and values between prompts, and a "
    "convolution layer keeps its last inputs instead, which no prompt can take from another: use the 'plain' cache",
    ("convolution", None): "a convolution layer keeps its own last inputs; a cache factory ({factory}) builds keys "
    "and values, which it has none of: name a cache, or build the model's caches with make_caches()",
    ("recurrent", None): "a recurrent layer keeps its own state; a cache factory ({factory}) builds keys and "
    "values, which it has none of: name a cache, or build the model's caches with make_caches()",
    **{("latent", name): NOT_LATENT for name in (*CACHES, None)},
    ("latent", "plain"): Choice(LatentCache, _latent(None)),
    ("latent", "int8"): Choice(QuantizedLatentCache, _latent(8)),
    ("latent", "int4"): Choice(QuantizedLatentCache, _latent(4)),
}
KEEPS_ITS_OWN = ("sliding", "recurrent", "shared", "convolution")  # kinds whose memory no named cache changes


def choose(layers: Sequence[LayerState], cache: object) -> list[Choice]:
    """Each layer's choice for ``cache`` (a name or factory), read off :data:`TABLE`; refused, with the reason,
    before anything is made."""
    cache_factory(cache)  # an unknown name or a thing that is not a factory: refused by name
    if not layers or not all(isinstance(s, LayerState) for s in layers):
        raise TypeError("layers must be a non-empty sequence of LayerState, one per layer (attention.layer_state())")
    name = cache_name(cache)
    if name not in (None, "plain") and all(s.kind in KEEPS_ITS_OWN for s in layers):
        raise ValueError(_applies_to_none(name, layers))
    chosen = []
    for state in layers:
        entry = TABLE.get((state.kind, name))
        if entry is None:
            raise ValueError(f"attnlab has no cache for a {state.kind} layer yet (the {name or 'given'} cache)")
        if isinstance(entry, str):
            raise ValueError(entry.format(name=name or "given", window=state.window, factory=type(cache).__name__))
        chosen.append(entry)
    return chosen


def _applies_to_none(name: str, layers: Sequence[LayerState]) -> str:
    windows = sorted({s.window for s in layers if s.window is not None})
    if all(s.kind == "sliding" for s in layers):
        why = f": {band_refusal(name, windows[0])}" if FULL[name].cls is EvictingCache else ""
        return (
            f"the {name} cache does not keep a sliding window's ring, and every layer of this model slides: a "
            f"layer with window={windows[0]} needs the 'plain' cache (a ring buffer of the window, the default){why}"
        )
    kinds = sorted({s.kind for s in layers})
    return (
        f"the {name} cache holds keys and values of full softmax layers, and this model has none (its layers are "
        f"{kinds}): each keeps its own memory (a window's ring buffer, a recurrent state); use the 'plain' cache, "
        "the default"
    )


def sizes_for(
    layers: Sequence[LayerState],
    chosen: list[Choice],
    cache: object,
    *,
    rows: int,
    capacity: int,
    context: int | None,
    spare: int = 0,
) -> Sizes:
    """The sizes of one build, with the one block table its paged layers write through (None without any)."""
    knobs, table = knobs_of(cache), None
    paging = [s for s, c in zip(layers, chosen, strict=True) if c.pages]
    if paging:
        share = 2 if cache_name(cache) == "prefix" else 1  # a prefix tree keeps what finished rows leave
        blocks = knobs["num_blocks"] if "num_blocks" in knobs else share * rows * -(-capacity // 16)
        table = BlockTable(batch_size=rows, num_blocks=blocks, max_len=capacity, device=paging[0].device)
    if isinstance(spare, bool) or not isinstance(spare, int) or not 0 <= spare <= 2**16:
        raise ValueError(f"spare must be an int in [0, 65536], the most tokens a pass goes back by; got {spare!r}")
    return Sizes(rows, capacity, context, cache_factory(cache), knobs, table, [], spare)
