"""A compressed layer's state (attnlab.cache.compressed), planned through the TABLE: what it is built as, what it
refuses before anything changes, how it goes back to an earlier token, and its bytes a token."""

from __future__ import annotations

import pytest
import torch

from attnlab.cache import LayerState, ModelCache
from attnlab.cache.compressed import CompressedCache
from test_compressed import inputs, layer, margin


def built(attn: object, **sizes: object) -> CompressedCache:
    cache = ModelCache.build([attn.layer_state()], **{"rows": 2, "capacity": 32, **sizes})[0]  # type: ignore[attr-defined, arg-type]
    assert isinstance(cache, CompressedCache)
    return cache


@pytest.mark.parametrize("name", ["plain", "int8", "sink", "h2o"])
def test_every_named_cache_keeps_a_compressed_layers_own_state(name: str) -> None:
    """Beside a full layer (which the name is for): a compressed layer keeps its own, whatever is named."""
    full = LayerState(kind="full", kv_heads=1, head_dim=4)
    assert type(ModelCache.build([full, layer(2).layer_state()], name, rows=1, capacity=8)[1]) is CompressedCache


@pytest.mark.parametrize("name", ["paged", "prefix"])
def test_paged_caches_refuse_a_block_that_does_not_line_up_with_the_pages(name: str) -> None:
    """(Blocks that line up are paged: tests/test_compressed_paged.py.)"""
    with pytest.raises(ValueError, match="its block of 6 tokens must divide the page of 16 tokens"):
        ModelCache.build([layer(2, block=6).layer_state()], name, rows=1, capacity=8)


def test_what_a_cache_cannot_take_is_refused_before_anything_changes() -> None:
    attn, x = layer(2, seed=2), inputs()
    cache = built(attn, capacity=12)
    with torch.no_grad():
        attn(x[:, :10], cache=cache)
        saved = [t.clone() for t in (cache.entries, cache.rows, cache.ring.k_cache)]
        with pytest.raises(ValueError, match="the cache is full: it holds 10 of max_len=12 tokens and cannot take 3"):
            attn(x[:, 10:13], cache=cache)
        with pytest.raises(TypeError, match="this CompressedCache holds blocks of 4"):
            layer(2, block=8)(x[:, 10:11], cache=cache)  # a layer of blocks of 8
        with pytest.raises(ValueError, match="this cache holds batch_size=2, got a batch of 1"):
            attn(x[:1, 10:11], cache=cache)
    assert cache.length == 10
    assert all(torch.equal(a, b) for a, b in zip(saved, (cache.entries, cache.rows, cache.ring.k_cache), strict=True))


@pytest.mark.parametrize("index_topk", [2, None])
def test_it_goes_back_to_an_earlier_token_as_speculation_does(index_topk: int | None) -> None:
    """A pass of 3 guesses closes a block and opens the next; cropped back to where it began (reach), the state
    runs on other tokens as a cache that never saw the guesses: the closed entry, the open block's tokens and the
    overlap of the block before are all as they were. And a failed pass (begin, undo) leaves it bitwise."""
    attn, x = layer(index_topk, seed=2), inputs()
    other = x.clone()
    other[:, 10:] = inputs(seed=7)[:, 10:]
    if index_topk is not None:
        assert margin(attn, x) > 1e-4 and margin(attn, other) > 1e-4
    cache = built(attn, spare=3)
    with torch.no_grad():
        attn(x[:, :10], cache=cache)
        attn(x[:, 10:13], cache=cache)  # the guesses: block 2 (8..11) closes, block 3 opens
        assert cache.reach(10) == 10
        cache.crop(10)
        resumed = torch.cat([attn(other[:, 10:11], cache=cache), attn(other[:, 11:], cache=cache)], dim=1)
        want = attn.readable(other)[:, 10:]
    assert torch.allclose(resumed, want, atol=1e-5)
    with pytest.raises(ValueError, match="room for 3 refused ones"):
        cache.reach(cache.length - 4)
    before = [t.clone() for t in (cache.entries, cache.rows, cache.ring.k_cache)]
    length = cache.length
    assert cache.begin()
    with torch.no_grad():
        cache.write(*_closing_write(attn, cache))
    cache.undo()
    assert cache.length == length
    assert all(torch.equal(a, b) for a, b in zip(before[1:], (cache.rows, cache.ring.k_cache), strict=True))


def _closing_write(attn: torch.nn.Module, cache: CompressedCache) -> tuple[torch.Tensor, ...]:
    """Arguments of a write of one token, random, with the entry it closes if it closes one."""
    closes = (cache.length + 1) // cache.block - cache.length // cache.block
    keys = torch.randn(2, 1, 1, cache.head_dim)
    rows = torch.randn(2, 1, cache.rows.shape[-1])
    entries = torch.randn(2, closes, cache.head_dim)
    index = None if cache.index is None else torch.randn(2, closes, cache.index.shape[-1])
    return keys, rows, entries, index  # type: ignore[return-value]


def test_bytes_a_token() -> None:
    """Past the window a token adds its share of an entry: (D + Di) / m elements; float32 here. V4's in bfloat16:
    (512 + 128) x 2 / 4 = 320 (compressed-sparse) and 512 x 2 / 128 = 8 (heavily compressed)."""
    assert built(layer(2)).bytes_a_token() == (16 + 8) * 4 / 4
    assert built(layer(None, block=8)).bytes_a_token() == 16 * 4 / 8
    v4 = CompressedCache(
        batch_size=1, head_dim=512, window=128, block=4, row_width=8, max_len=8, index_dim=128, dtype=torch.bfloat16
    )
    assert v4.bytes_a_token() == 320
