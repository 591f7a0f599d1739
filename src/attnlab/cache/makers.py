"""What a layer keeps, declared (:class:`LayerState`), and how each cache is made for it: the makers
:data:`attnlab.cache.plan.TABLE` points at, each taking the layer's state and the :class:`Sizes` of one build.

Shapes are per sequence; a maker's cache holds ``Sizes.rows`` sequences of ``Sizes.capacity`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from attnlab.cache.base import Cache, LayerCache
from attnlab.cache.blocks import BlockTable
from attnlab.cache.compressed import CompressedCache
from attnlab.cache.factories import FactoryArgs, paged
from attnlab.cache.indexed import IndexedCache, PagedIndexedCache
from attnlab.cache.kv import SlidingWindowCache
from attnlab.cache.latent import LatentCache, QuantizedLatentCache
from attnlab.cache.paged import PagedLatentCache
from attnlab.cache.row_states import PagedConvolutionCache, PagedStateCache
from attnlab.cache.shared import SharedCache
from attnlab.cache.state import ConvolutionCache, StateCache

# full: keys and values of every position; sliding: a ring of the window; latent: MLA's [c, k_pe] per token;
# recurrent: a state of fixed size (with its short convolution's last inputs); shared: nothing, it reads an
# earlier layer's keys (KV sharing); convolution: a layer of short convolutions alone (LFM), its last inputs;
# indexed: MLA's latent with DSA's indexer key beside it (cache/indexed.py); compressed: DeepSeek-V4's window,
# entries of closed blocks and the last tokens' projections (cache/compressed.py); blocks: every position's keys
# and values at consecutive slots, read by blocks (MoBA, NSA: nn/moba.py, nn/nsa.py).
Kind = Literal["full", "sliding", "latent", "recurrent", "shared", "indexed", "compressed", "convolution", "blocks"]
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
        index_dim: an "indexed" layer's: the width of its indexer's key, kept beside each latent (DSA); a
            "compressed" layer's: its indexer's entries (compressed-sparse), or None (heavily compressed).
        block, row_width: a "compressed" layer's tokens a block and projections a token (cache/compressed.py).
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
    index_dim: int | None = None
    block: int | None = None
    row_width: int | None = None
    dtype: torch.dtype = torch.float32
    device: torch.device | str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a layer's state is of one kind among {list(KINDS)}, got {self.kind!r}")
        if (self.kind == "compressed") != (self.block is not None and self.row_width is not None):
            raise ValueError(
                f"block and row_width are a compressed layer's: set both on a 'compressed' layer only "
                f"(kind={self.kind!r}, block={self.block!r}, row_width={self.row_width!r})"
            )
        if self.kind == "compressed" and self.window is None:
            raise ValueError("a compressed layer reads a sliding window of its tokens: declare its window")
        if self.kind != "compressed" and (self.kind == "indexed") != (self.index_dim is not None):
            raise ValueError(
                f"index_dim is the width of an indexed layer's indexer keys: set it on an 'indexed' layer only "
                f"(kind={self.kind!r}, index_dim={self.index_dim!r})"
            )


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
    shares: bool = False  # a prefix cache: a recurrent or convolution layer keeps its state at each block's end


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


def make_named(state: LayerState, sizes: Sizes) -> Cache:
    made: Cache = sizes.factory(**factory_args(state, sizes))
    return made


def make_quantized(state: LayerState, sizes: Sizes) -> Cache:
    """int8 / int4: the named factory, with exact slots for a speculative pass's guesses (``spare``)."""
    made: Cache = sizes.factory(**factory_args(state, sizes), spare=sizes.spare)
    return made


def make_paged(state: LayerState, sizes: Sizes) -> Cache:
    return paged(**factory_args(state, sizes), table=sizes.table)


def make_paged_window(state: LayerState, sizes: Sizes) -> Cache:
    """A sliding layer in paged blocks: every key kept, the window applied by its visibility (the keys' positions),
    so a row resumes at any block's end with its window there (continuous batching, prefix reuse)."""
    args: dict[str, Any] = {**factory_args(state, sizes), "window": None}
    return paged(**args, table=sizes.table)


def make_row_state(state: LayerState, sizes: Sizes) -> Cache:
    assert sizes.table is not None  # a row-state layer writes through the model's block table
    return PagedStateCache(table=sizes.table, keeps_ends=sizes.shares, **state_shape(state, sizes))


def make_row_convolution(state: LayerState, sizes: Sizes) -> Cache:
    assert sizes.table is not None  # a row-state layer writes through the model's block table
    return PagedConvolutionCache(table=sizes.table, keeps_ends=sizes.shares, **convolution_shape(state, sizes))


def make_paged_latent(state: LayerState, sizes: Sizes) -> Cache:
    assert sizes.table is not None  # a paged layer writes through the model's block table
    rank = state.value_dim or state.head_dim
    return PagedLatentCache(
        kv_lora_rank=rank,
        rope_dim=state.head_dim - rank,
        batch_size=sizes.rows,
        num_blocks=sizes.table.num_blocks,
        max_len=sizes.capacity,
        table=sizes.table,
        dtype=state.dtype,
        device=state.device,
    )


def make_ring(state: LayerState, sizes: Sizes) -> Cache:
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


def state_shape(state: LayerState, sizes: Sizes) -> dict[str, Any]:
    """A recurrent layer's state cache's shape, as its state declares it (the plain and the paged one's)."""
    return {
        "batch_size": sizes.rows,
        "num_heads": state.kv_heads,
        "key_dim": state.head_dim,
        "value_dim": state.value_dim or state.head_dim,
        "normalizer": state.normalizer,
        "conv": state.conv,
        "dtype": state.dtype,
        "device": state.device,
    }


def convolution_shape(state: LayerState, sizes: Sizes) -> dict[str, Any]:
    """A convolution layer's cache's shape: its (channels, kernel - 1) declared."""
    assert state.conv is not None  # a convolution layer declares its (channels, kernel - 1)
    channels, held = state.conv
    return {
        "batch_size": sizes.rows,
        "channels": channels,
        "kernel": held + 1,
        "dtype": state.dtype,
        "device": state.device,
    }


def make_state(state: LayerState, sizes: Sizes) -> Cache:
    return StateCache(**state_shape(state, sizes), spare=sizes.spare)  # "each": the states of a pass's last spare


def make_convolution(state: LayerState, sizes: Sizes) -> Cache:
    return ConvolutionCache(**convolution_shape(state, sizes), spare=sizes.spare)


def make_shared(state: LayerState, sizes: Sizes) -> Cache:
    if state.source is None or not 0 <= state.source < len(sizes.made):
        raise ValueError(f"a shared layer reads an earlier layer's keys: source={state.source!r} names none")
    return SharedCache(source=state.source, of=sizes.made[state.source])


def make_latent(bits: int | None) -> Callable[[LayerState, Sizes], Cache]:
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


def make_indexed(state: LayerState, sizes: Sizes) -> Cache:
    """An indexed layer's rows [c, k_pe | k_index] (cache/indexed.py), exact: its one cache on a plain build."""
    assert state.index_dim is not None  # LayerState checks an indexed layer declares it
    rank = state.value_dim or state.head_dim
    return IndexedCache(
        batch_size=sizes.rows,
        kv_lora_rank=rank,
        rope_dim=state.head_dim - rank,
        index_dim=state.index_dim,
        max_len=sizes.capacity,
        dtype=state.dtype,
        device=state.device,
    )


def make_paged_indexed(state: LayerState, sizes: Sizes) -> Cache:
    """The same rows in the model's paged blocks ('paged', 'prefix')."""
    assert sizes.table is not None and state.index_dim is not None  # a paged layer writes through the table
    rank = state.value_dim or state.head_dim
    return PagedIndexedCache(
        kv_lora_rank=rank,
        rope_dim=state.head_dim - rank,
        index_dim=state.index_dim,
        batch_size=sizes.rows,
        num_blocks=sizes.table.num_blocks,
        max_len=sizes.capacity,
        table=sizes.table,
        dtype=state.dtype,
        device=state.device,
    )


def make_compressed(state: LayerState, sizes: Sizes) -> Cache:
    """A compressed layer's window, entries and last rows (cache/compressed.py), with ``spare`` to go back by."""
    assert state.block is not None and state.row_width is not None and state.window is not None  # LayerState checks
    return CompressedCache(
        batch_size=sizes.rows,
        head_dim=state.head_dim,
        window=state.window,
        block=state.block,
        row_width=state.row_width,
        max_len=sizes.capacity,
        index_dim=state.index_dim,
        spare=sizes.spare,
        dtype=state.dtype,
        device=state.device,
    )
