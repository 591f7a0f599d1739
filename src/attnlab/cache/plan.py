"""Which cache each layer keeps: one table, read by ``ModelCache.build`` and ``ModelCache.plan`` alone.

Each attention kind declares the state it needs, a :class:`LayerState`
(``Attention.layer_state()``, ``LatentAttention``'s, the recurrent layers'),
and the user names a cache (a name in ``CACHES``, with its knobs, or a factory
of their own). :data:`TABLE` maps (kind, name) to a :class:`Choice` (the
class a layer gets, whose declared capabilities the plan reads, and how it is
made) or to a refusal with its reason. A name applies to the layers that hold
keys and values; a sliding layer keeps the ring of its window and a recurrent
layer its state whatever is named (but 'paged' and 'prefix', whose rows run on
their own: a window in blocks, a state per row), and a name that would then
apply to no layer is refused (:func:`choose`). The makers and the declared
:class:`LayerState` live in ``attnlab.cache.makers``.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlab.cache.base import LayerCache
from attnlab.cache.compressed import CompressedCache
from attnlab.cache.compressed_paged import PagedCompressedCache, check_aligned, make_paged_compressed
from attnlab.cache.evicting import EvictingCache
from attnlab.cache.factories import CACHES, band_refusal, cache_factory, cache_name, knobs_of
from attnlab.cache.indexed import IndexedCache, PagedIndexedCache
from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.cache.latent import LatentCache, QuantizedLatentCache
from attnlab.cache.makers import (
    KINDS,
    Choice,
    LayerState,
    Sizes,
    make_compressed,
    make_convolution,
    make_indexed,
    make_latent,
    make_named,
    make_paged,
    make_paged_indexed,
    make_paged_latent,
    make_paged_window,
    make_quantized,
    make_ring,
    make_row_convolution,
    make_row_state,
    make_shared,
    make_state,
)
from attnlab.cache.paged import BlockTable, PagedKVCache, PagedLatentCache
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.cache.row_states import PagedConvolutionCache, PagedStateCache
from attnlab.cache.shared import SharedCache
from attnlab.cache.sink import SinkCache
from attnlab.cache.state import ConvolutionCache, StateCache

__all__ = ["KINDS", "TABLE", "Choice", "LayerState", "Sizes", "choose", "sizes_for"]

ROWS = ("paged", "prefix")  # the caches whose rows are admitted, run and released on their own

NOT_LATENT = (
    "a latent attention layer keeps its latent cache (kv_lora_rank + qk_rope_head_dim values a token), plain or "
    "quantized, or in paged blocks: the {name} cache is not built for latents; use 'plain', 'int8', 'int4', 'paged' "
    "or 'prefix'"
)
NOT_INDEXED = (
    "an indexed layer (DeepSeek Sparse Attention) keeps its indexer keys beside each latent, which the {name} cache "
    "cannot hold (its indexer scores every earlier token, from those keys, exact); use 'plain', 'paged' or 'prefix'"
)
NOT_COMPRESSED = (
    "a compressed layer (DeepSeek-V4) keeps its window, its closed blocks' entries and its open block's tokens, "
    "which a cache factory ({factory}) does not build: name a cache ('plain', 'paged' or 'prefix')"
)
NOT_BLOCKS = (
    "a block-sparse layer (MoBA, NSA) reads blocks of each row's positions from every key it has seen, at "
    "consecutive slots: the {name} cache drops, moves or rounds keys, or builds them its own way; use 'plain', "
    "'paged' or 'prefix'"
)
FULL: dict[str, Choice] = {  # what a named cache is on a layer of keys and values
    "plain": Choice(KVCache, make_named),
    "paged": Choice(PagedKVCache, make_paged, pages=True),
    "prefix": Choice(PagedKVCache, make_paged, pages=True),  # under the tree of ModelCache.build's PrefixCache
    "sink": Choice(SinkCache, make_named),
    "int8": Choice(QuantizedKVCache, make_quantized),
    "int4": Choice(QuantizedKVCache, make_quantized),
    "h2o": Choice(EvictingCache, make_named),
    "snapkv": Choice(EvictingCache, make_named),
}
# (kind, name) -> the layer's cache, or why not; name None: a factory of the user's own
TABLE: dict[tuple[str, str | None], Choice | str] = {
    **{("full", name): choice for name, choice in FULL.items()},
    ("full", None): Choice(LayerCache, make_named),  # the user's factory, which declares nothing to plan with
    **{("sliding", name): Choice(SlidingWindowCache, make_ring) for name in CACHES},  # its ring, whatever is named
    ("sliding", None): Choice(LayerCache, make_named),  # the user's factory gets the window and decides
    **{("recurrent", name): Choice(StateCache, make_state) for name in CACHES},  # its state, whatever is named
    **{("shared", name): Choice(SharedCache, make_shared) for name in (*CACHES, None)},  # its source's, whatever
    **{("convolution", name): Choice(ConvolutionCache, make_convolution) for name in CACHES},  # its last inputs
    # paged rows come and go, each at its own length: a window in blocks, a state per row (kept at block ends)
    **{("sliding", name): Choice(PagedKVCache, make_paged_window, pages=True) for name in ROWS},
    **{("recurrent", name): Choice(PagedStateCache, make_row_state, pages=True) for name in ROWS},
    **{("convolution", name): Choice(PagedConvolutionCache, make_row_convolution, pages=True) for name in ROWS},
    ("convolution", None): "a convolution layer keeps its own last inputs; a cache factory ({factory}) builds keys "
    "and values, which it has none of: name a cache, or build the model's caches with make_caches()",
    ("recurrent", None): "a recurrent layer keeps its own state; a cache factory ({factory}) builds keys and "
    "values, which it has none of: name a cache, or build the model's caches with make_caches()",
    **{("latent", name): NOT_LATENT for name in (*CACHES, None)},
    ("latent", "plain"): Choice(LatentCache, make_latent(None)),
    ("latent", "int8"): Choice(QuantizedLatentCache, make_latent(8)),
    ("latent", "int4"): Choice(QuantizedLatentCache, make_latent(4)),
    **{("latent", name): Choice(PagedLatentCache, make_paged_latent, pages=True) for name in ROWS},
    **{("indexed", name): NOT_INDEXED for name in (*CACHES, None)},
    ("indexed", "plain"): Choice(IndexedCache, make_indexed),
    **{("indexed", name): Choice(PagedIndexedCache, make_paged_indexed, pages=True) for name in ROWS},
    **{("compressed", name): Choice(CompressedCache, make_compressed) for name in CACHES},  # its own, whatever
    **{("compressed", name): Choice(PagedCompressedCache, make_paged_compressed, pages=True) for name in ROWS},
    ("compressed", None): NOT_COMPRESSED,
    **{("blocks", name): NOT_BLOCKS for name in (*CACHES, None)},
    ("blocks", "plain"): Choice(KVCache, make_named),
    **{("blocks", name): Choice(PagedKVCache, make_paged, pages=True) for name in ROWS},
}
KEEPS_ITS_OWN = (
    "sliding",
    "recurrent",
    "shared",
    "convolution",
    "compressed",
)  # kinds whose memory no named cache changes
# but for the paged ones, whose rows each run at their own length


def choose(layers: Sequence[LayerState], cache: object) -> list[Choice]:
    """Each layer's choice for ``cache`` (a name or factory), read off :data:`TABLE`; refused, with the reason,
    before anything is made."""
    cache_factory(cache)  # an unknown name or a thing that is not a factory: refused by name
    if not layers or not all(isinstance(s, LayerState) for s in layers):
        raise TypeError("layers must be a non-empty sequence of LayerState, one per layer (attention.layer_state())")
    name = cache_name(cache)
    if name not in (None, "plain", *ROWS) and all(s.kind in KEEPS_ITS_OWN for s in layers):
        raise ValueError(_applies_to_none(name, layers))
    chosen = []
    for state in layers:
        entry = TABLE.get((state.kind, name))
        if entry is None:
            raise ValueError(f"attnlab has no cache for a {state.kind} layer yet (the {name or 'given'} cache)")
        if isinstance(entry, str):
            raise ValueError(
                entry.format(name=name or "given", window=state.window, factory=type(cache).__name__, block=state.block)
            )
        if entry.cls is PagedCompressedCache:  # its entries live in the pages: its block must line up with them
            assert state.block is not None  # LayerState checks a compressed layer declares it
            check_aligned(state.block, 16)  # the page of the block table sizes_for builds (BlockTable's default)
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
    return Sizes(rows, capacity, context, cache_factory(cache), knobs, table, [], spare, cache_name(cache) == "prefix")
