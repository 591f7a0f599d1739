"""KV caches: cached == uncached, exactly the same tokens, clear refusals."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention
from attnlab.cache import KVCache, ModelCache, SlidingWindowCache
from attnlab.models import GPT
from conftest import small

BACKENDS = ["eager", "sdpa", "flash"]
TOL = dict(atol=1e-5, rtol=1e-5)


def module(backend: str, window: int | None = None) -> Attention:
    torch.manual_seed(0)
    return Attention(d_in=32, num_heads=4, num_kv_heads=2, rope=True, window=window, backend=backend).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("chunks", [[5, 1, 1, 1, 1, 1, 1, 1], [3, 4, 2, 1, 2], [1] * 12])
def test_prefill_then_decode_equals_one_full_pass(backend: str, window: int | None, chunks: list[int]) -> None:
    attn = module(backend, window)
    x = torch.randn(2, sum(chunks), 32)
    expected = attn(x)
    cache = ModelCache.build([attn.layer_state()], rows=2, capacity=sum(chunks))[0]
    assert isinstance(cache, SlidingWindowCache if window else KVCache)
    pieces, start = [], 0
    with torch.no_grad():
        for size in chunks:
            pieces.append(attn(x[:, start : start + size], cache=cache))
            start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, **TOL)
    assert cache.length == sum(chunks)


def test_cache_appends_in_place_and_stores_only_kv_heads() -> None:
    attn = module("sdpa")
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=16)[0]
    assert isinstance(cache, KVCache)
    assert cache.k_cache.shape == (1, 2, 16, 8)  # 2 kv heads, not the 4 query heads
    buffer = cache.k_cache.data_ptr()
    with torch.no_grad():
        for _ in range(3):
            attn(torch.randn(1, 1, 32), cache=cache)
    new = torch.randn(1, 2, 1, 8)
    k, _, positions = cache.update(new, new)
    assert k.data_ptr() == buffer and cache.k_cache.data_ptr() == buffer  # the buffer itself: no copy
    assert k._base is cache.k_cache  # a view of it, no copy
    assert positions.tolist() == [0, 1, 2, 3]  # eager: the filled slots only, never the 12 empty ones
    assert torch.equal(k[:, :, 3:4], new)  # written at slot 3, in place


def test_a_decode_step_attends_over_the_filled_slots_alone_with_no_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of 4096 slots holding 6 tokens: each decode step hands SDPA its 6 (then 7) keys and no mask, not
    4096 keys with a mask that hides 4090 of them; and the tokens are the uncached model's."""
    torch.manual_seed(0)
    m = GPT(small(context_length=4096, backend="sdpa")).eval()
    seen: list[tuple[int, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
        seen.append((k.shape[2], kwargs.get("attn_mask") is not None))
        return sdpa(q, k, v, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    prompt = torch.randint(0, 50, (1, 5))
    caches = m.make_caches(batch_size=1, max_len=4096)
    with torch.no_grad():
        m(prompt, caches=caches)
        seen.clear()
        logits = [m(torch.tensor([[t]]), caches=caches)[0, -1] for t in (7, 8)]
    layers = len(caches)
    assert seen == [(6, False)] * layers + [(7, False)] * layers
    monkeypatch.undo()
    with torch.no_grad():
        whole = m(torch.cat([prompt, torch.tensor([[7, 8]])], dim=1))[0, -2:]
    torch.testing.assert_close(torch.stack(logits), whole, **TOL)


def test_sliding_window_cache_ring_positions() -> None:
    cache = SlidingWindowCache(batch_size=1, num_kv_heads=1, head_dim=2, window=3)
    k = torch.arange(5.0).view(1, 1, 5, 1).expand(1, 1, 5, 2).contiguous()  # key value == its position
    keys, _, positions = cache.update(k[:, :, :4], k[:, :, :4])  # a chunk: the (empty) ring, then the chunk
    assert positions.tolist() == [-1, -1, -1, 0, 1, 2, 3]
    assert cache.positions().tolist() == [3, 1, 2]  # slot p % 3
    buffer = cache.k_cache.data_ptr()
    keys, _, positions = cache.update(k[:, :, 4:], k[:, :, 4:])  # one token: written in place, the ring returned
    assert keys.data_ptr() == buffer
    assert positions.tolist() == [3, 4, 2]  # slot order; the new query (4) sees 2, 3 and itself
    assert keys[0, 0, :, 0].tolist() == [3.0, 4.0, 2.0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [None, 6])
def test_generate_same_tokens_with_and_without_cache(backend: str, window: int | None) -> None:
    torch.manual_seed(1)
    model = GPT(small(backend=backend, window=window)).eval()
    idx = torch.randint(0, 256, (3, 9))
    greedy = model.generate(idx, 24, use_cache=True)
    assert torch.equal(greedy, model.generate(idx, 24, use_cache=False))
    sampled = [
        model.generate(idx, 24, temperature=0.8, top_k=20, use_cache=cached, generator=torch.Generator().manual_seed(5))
        for cached in (True, False)
    ]
    assert torch.equal(sampled[0], sampled[1])
    assert not torch.equal(sampled[0], greedy)


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padded_batch_generates_what_each_sequence_generates_alone(backend: str) -> None:
    torch.manual_seed(2)
    model = GPT(small(backend=backend)).eval()
    long, short = torch.randint(1, 256, (1, 8)), torch.randint(1, 256, (1, 5))
    batch = torch.cat([long, torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1)])  # left padding
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    for use_cache in (True, False):
        out = model.generate(batch, 12, attention_mask=mask, use_cache=use_cache)
        assert torch.equal(out[0], model.generate(long, 12)[0])
        assert torch.equal(out[1, 3:], model.generate(short, 12)[0])
    logits = model(batch, attention_mask=mask)
    assert torch.isfinite(logits).all()  # pad queries see nothing and give zeros, not NaN


def test_overflow_names_max_len() -> None:
    attn = module("sdpa")
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=4)[0]
    with torch.no_grad():
        attn(torch.randn(1, 3, 32), cache=cache)
        with pytest.raises(ValueError, match=r"holds 3 of max_len=4 positions and cannot take 2 more.*max_len >= 5"):
            attn(torch.randn(1, 2, 32), cache=cache)


def test_reset_and_crop_reuse_the_cache_correctly() -> None:
    attn = module("sdpa")
    x = torch.randn(1, 6, 32)
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=8)[0]
    with torch.no_grad():
        attn(torch.randn(1, 7, 32), cache=cache)
        cache.reset()
        torch.testing.assert_close(attn(x, cache=cache), attn(x), **TOL)
        cache.crop(4)  # forget positions 4, 5 and decode them again
        torch.testing.assert_close(attn(x[:, 4:], cache=cache), attn(x)[:, 4:], **TOL)
    with pytest.raises(ValueError, match=r"crop\(n\) needs 0 <= n <= length \(6\), got 7"):
        cache.crop(7)


def test_cache_refuses_other_batch_heads_head_dim_and_dtype() -> None:
    attn = module("sdpa")
    cache = ModelCache.build([attn.layer_state()], rows=2, capacity=8)[0]
    with pytest.raises(ValueError, match=r"built for batch_size=2, got keys for a batch of 3.*build a new cache"):
        attn(torch.randn(3, 1, 32), cache=cache)
    other_heads = KVCache(batch_size=2, num_kv_heads=4, head_dim=8, max_len=8)
    with pytest.raises(ValueError, match=r"holds num_kv_heads=4, head_dim=8; got keys with 2 heads of head_dim 8"):
        attn(torch.randn(2, 1, 32), cache=other_heads)
    other_dim = KVCache(batch_size=2, num_kv_heads=2, head_dim=16, max_len=8)
    with pytest.raises(ValueError, match=r"head_dim=16; got keys with 2 heads of head_dim 8"):
        attn(torch.randn(2, 1, 32), cache=other_dim)
    half = KVCache(batch_size=2, num_kv_heads=2, head_dim=8, max_len=8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"keys are torch.float32 but the cache holds torch.bfloat16"):
        attn(torch.randn(2, 1, 32), cache=half)
    with pytest.raises(
        ValueError, match=r"this cache keeps only the last 3 positions, but Attention\(window=None\) needs more"
    ):
        attn(torch.randn(2, 1, 32), cache=SlidingWindowCache(batch_size=2, num_kv_heads=2, head_dim=8, window=3))
    with pytest.raises(
        TypeError, match=r"cache must provide next_positions\(t\) and update\(k, v\) \(attnlab.cache.Cache\), got dict"
    ):
        attn(torch.randn(2, 1, 32), cache={})
    assert cache.length == 0  # nothing was written by the refused calls


def test_bad_positions_and_sizes() -> None:
    attn = module("sdpa")
    with pytest.raises(ValueError, match=r"positions must be \(T,\) or \(B, T\) with T=3, got shape \(4,\)"):
        attn(torch.randn(1, 3, 32), positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must be >= 0"):
        attn(torch.randn(1, 3, 32), positions=torch.tensor([-1, 0, 1]))
    with pytest.raises(ValueError, match=r"max_len must be >= 1, got 0"):
        KVCache(batch_size=1, num_kv_heads=1, head_dim=2, max_len=0)
    model = GPT(small())
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 256\), got \[0, 300\]"):
        model(torch.tensor([[0, 300]]))
    with pytest.raises(
        ValueError, match=r"attention_mask must be \(batch, cached \+ new tokens\) = \(1, 2\), got \(1, 3\)"
    ):
        model(torch.tensor([[0, 1]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0"):
        model.generate(torch.tensor([[0, 1]]), 2, temperature=-1.0)


def test_flex_pads_a_growing_cache_to_few_key_counts() -> None:
    """Eager, a cache returns one more key each step; flex pads the keys to a power of two of its 128 blocks, so a
    long generation compiles a handful of shapes, not one per 128 tokens."""
    from attnlab.functional.flex import _round_keys

    counts = {_round_keys(n) for n in range(1, 4097)}
    assert counts == {128, 256, 512, 1024, 2048, 4096}
    assert [_round_keys(n) for n in (1, 128, 129, 257, 513)] == [128, 128, 256, 512, 1024]
