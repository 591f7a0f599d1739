"""DeepSeek Sparse Attention's kernel (issue 59, step 1): the lightning indexer and top-k selection over MLA.

The fast form (each query over its gathered keys) equals the readable one (every key, all but the chosen hidden);
top-k at least the number of keys equals dense MLA; the indexer's scores and top-k equal a float64 implementation
written here from the formula; the keys-read meter, read off the gathered positions, falls as top-k falls; bad
input is refused before the cache changes. Random weights can tie at the k-th score (every indexer head's ReLU at
0): the seeds here give a margin there, and the tests assert it.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.cache import ModelCache
from attnlab.cache.indexed import IndexedCache
from attnlab.cache.latent import LatentCache
from attnlab.functional.selection import index_scores, top_k
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import ForwardArgs
from attnlab.nn.indexed import IndexedAttention
from attnlab.nn.latent import LatentAttention

SHAPE = dict(d_in=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
SHAPE |= dict(q_lora_rank=24)
T = 24


def layer(topk: int, *, interleave: bool = False, seed: int = 0) -> IndexedAttention:
    torch.manual_seed(seed)
    made = IndexedAttention(
        index_topk=topk, index_heads=8, index_head_dim=16, index_rope_interleave=interleave, **SHAPE
    )
    with torch.no_grad():
        made.indexer.k_norm.bias.normal_(0, 0.3)
        made.indexer.k_norm.weight.normal_(1, 0.3)
    return made.eval()


def inputs(seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, T, 32, generator=torch.Generator().manual_seed(seed))


def parts(m: IndexedAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    vis, pos = m._prepare(x, ForwardArgs(None, None, None, None, None, None, None))
    q_latent = m.query_latent(x)
    q_nope, q_pe, latents = m.project(x, pos, q_latent=q_latent)
    return vis, pos, q_latent, q_nope, q_pe, latents


@torch.no_grad()
@pytest.mark.parametrize("interleave", [False, True])
def test_the_gathered_form_equals_the_readable_one(interleave: bool) -> None:
    """Each query over its 5 gathered latents (absorbed) equals every key with the others hidden (expanded)."""
    m, x = layer(5, interleave=interleave), inputs()
    vis, pos, q_latent, q_nope, q_pe, latents = parts(m, x)
    selection = m.select(x, q_latent, m.index_keys(x, pos), pos, vis)
    fast = m.gathered(q_nope, q_pe, latents, selection, vis)
    readable = m.readable(q_nope, q_pe, latents, selection, vis)
    assert float((fast - readable).abs().max()) < 1e-5
    assert torch.equal(m(x), fast)  # forward runs the fast form


@torch.no_grad()
def test_a_prefill_then_one_token_a_step_on_its_cache_gives_the_uncached_output() -> None:
    """10 tokens, then one a step on an IndexedCache: within 1e-5 of one pass without a cache."""
    m, x = layer(5), inputs()
    cache = ModelCache.build([m.layer_state()], "plain", rows=2, capacity=32)[0]
    assert isinstance(cache, IndexedCache)
    stepped = torch.cat([m(x[:, :10], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(10, T)], 1)
    assert float((stepped - m(x)).abs().max()) < 1e-5


@torch.no_grad()
@pytest.mark.parametrize("cached", [False, True])
def test_top_k_at_least_the_keys_equals_dense_mla(cached: bool) -> None:
    """index_topk = T: every key chosen, so the output is MLA's with the same weights, the indexer aside."""
    m, x = layer(T), inputs()
    dense = LatentAttention(**SHAPE).eval()
    dense.load_state_dict({k: v for k, v in m.state_dict().items() if ".indexer." not in f".{k}"})
    if cached:
        ours = m(x, cache=ModelCache.build([m.layer_state()], "plain", rows=2, capacity=T)[0])
        theirs = dense(x, cache=ModelCache.build([dense.layer_state()], "plain", rows=2, capacity=T)[0])
    else:
        ours, theirs = m(x), dense(x)
    assert float((ours - theirs).abs().max()) < 1e-5
    m.index_topk = 4  # and it is not dense by default: fewer keys move the output
    assert float((m(x) - theirs).abs().max()) > 1e-2


def _turn(x: torch.Tensor, positions: torch.Tensor, rope: int, interleave: bool) -> torch.Tensor:
    """RoPE on the first ``rope`` values of x (.., T, D) in float64, from the paper: pair i turns by
    position * 10000^(-2i / rope); pairs (2i, 2i + 1) interleaved, or (i, i + rope / 2)."""
    angle = positions.double()[:, None] * 10000.0 ** (-torch.arange(0, rope, 2).double() / rope)  # (T, rope / 2)
    cos, sin = angle.cos(), angle.sin()
    x = x.double().clone()
    first, second = (
        (x[..., 0:rope:2], x[..., 1:rope:2]) if interleave else (x[..., : rope // 2], x[..., rope // 2 : rope])
    )
    a, b = first * cos - second * sin, second * cos + first * sin
    if interleave:
        x[..., 0:rope:2], x[..., 1:rope:2] = a, b
    else:
        x[..., : rope // 2], x[..., rope // 2 : rope] = a, b
    return x


def reference_scores(m: IndexedAttention, x: torch.Tensor) -> torch.Tensor:
    """I(t, s) = sum_j w_j(x_t) * ReLU(q_j(t) . k(s) / sqrt(Di)), w_j = weights_proj(x_t)_j / sqrt(Hi), in float64,
    from the layer's weights; -inf where s > t."""
    d, ix, p = x.double(), m.indexer, m.qk_rope_head_dim
    w64 = lambda lin: lin.weight.double()
    q_lat = d @ w64(m.q_a_proj).T
    q_lat = q_lat * torch.rsqrt(q_lat.pow(2).mean(-1, keepdim=True) + 1e-6) * m.q_a_layernorm.weight.double()
    b, t, _ = x.shape
    q = (q_lat @ w64(ix.wq_b).T).view(b, t, ix.num_heads, ix.head_dim).transpose(1, 2)  # (B, Hi, T, Di)
    k = d @ w64(ix.wk).T
    k = (k - k.mean(-1, keepdim=True)) / torch.sqrt(k.var(-1, unbiased=False, keepdim=True) + 1e-6)
    k = k * ix.k_norm.weight.double() + ix.k_norm.bias.double()  # LayerNorm
    pos = torch.arange(t)
    q, k = _turn(q, pos, p, m.index_rope_interleave), _turn(k, pos, p, m.index_rope_interleave)
    w = (d @ w64(ix.weights_proj).T) / math.sqrt(ix.num_heads)  # (B, T, Hi)
    scores = torch.zeros(b, t, t, dtype=torch.float64)
    for j in range(ix.num_heads):
        scores += w[..., j, None] * torch.relu(q[:, j] @ k.transpose(1, 2) / math.sqrt(ix.head_dim))
    return scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))


@torch.no_grad()
@pytest.mark.parametrize("interleave", [False, True])
def test_the_indexers_scores_and_top_k_equal_a_float64_reference(interleave: bool) -> None:
    """Scores within 1e-5 of the formula in float64 (on the visible keys), and the same top 6 of every query that
    sees more than 6 keys, each with a margin of at least 1e-4 between its 6th and 7th score (these seeds)."""
    m, x = layer(6, interleave=interleave), inputs()
    vis, pos, q_latent, *_ = parts(m, x)
    ours = index_scores(m.index_queries(q_latent, pos), m.index_keys(x, pos), m.index_weights(x), scale=0.25)
    theirs = reference_scores(m, x)
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    assert float((ours.double() - theirs)[:, seen].abs().max()) < 1e-5
    chosen = top_k(ours, vis, 6).indices
    ranked = theirs.sort(dim=-1, descending=True)
    for t in range(6, T):
        margin = ranked.values[:, t, 5] - ranked.values[:, t, 6]
        assert float(margin.min()) > 1e-4, (t, margin)  # no tie at the 6th: the choice is well defined
        assert torch.equal(chosen[:, t].sort().values, ranked.indices[:, t, :6].sort().values)
    for t in range(6):  # fewer than 6 visible: all of them, and -1 for the rest
        assert chosen[:, t].sort().values.tolist() == [[-1] * (5 - t) + list(range(t + 1))] * 2


@torch.no_grad()
def test_the_keys_read_meter_falls_as_top_k_falls() -> None:
    """Keys read over a 24-token pass of 2 rows: sum over t of min(k, t + 1) a row, counted off the gathered
    positions: 300 (dense, k = 24), then 228, 150, 94, 47 as k falls to 1; 48 queries each time."""
    m, x = layer(T), inputs()
    read = {}
    for k in (24, 8, 4, 2, 1):
        m.index_topk = k
        m.reset_meter()
        m(x)
        assert int(m.queries_read) == 2 * T
        read[k] = int(m.keys_read)
    assert read == {k: 2 * sum(min(k, t + 1) for t in range(T)) for k in (24, 8, 4, 2, 1)}
    assert read[24] == 2 * T * (T + 1) // 2 == 600


@torch.no_grad()
def test_bad_input_is_refused_before_anything_changes() -> None:
    """A top-k below 1; a cache that cannot hold indexer keys (MLA's latent cache, a cache of the wrong width); a
    named cache that keeps no indexer keys; each refused by name, and the caches hold what they held."""
    for bad, error in ((0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="index_topk must be"):
            IndexedAttention(index_topk=bad, index_heads=2, index_head_dim=8, **SHAPE)
    with pytest.raises(ValueError, match="set q_lora_rank"):
        IndexedAttention(index_topk=2, index_heads=2, index_head_dim=8, **{**SHAPE, "q_lora_rank": None})
    m, x = layer(4), inputs()
    latent = LatentCache(batch_size=2, kv_lora_rank=16, rope_dim=8, max_len=T)
    narrow = IndexedCache(batch_size=2, kv_lora_rank=16, rope_dim=8, index_dim=8, max_len=T)
    for cache, held in ((latent, "LatentCache"), (narrow, "IndexedCache holding 8")):
        with pytest.raises(TypeError, match=f"an indexed layer keeps its indexer keys .16 values a token.*{held}"):
            m(x, cache=cache)
        assert cache.length == 0
    for name in ("int8", "int4", "sink", "h2o", "snapkv"):
        with pytest.raises(ValueError, match=f"keeps its indexer keys beside each latent, which the {name} cache"):
            ModelCache.build([m.layer_state()], name, rows=2, capacity=T)
    cache = ModelCache.build([m.layer_state()], "plain", rows=2, capacity=T)[0]
    with pytest.raises(ValueError, match="pass a bool mask"):
        m(x, cache=cache, mask=torch.zeros(2, 1, 1, T))
    assert cache.length == 0  # type: ignore[attr-defined]


def test_a_selection_reads_a_bound_visibility_and_refuses_scores_that_move() -> None:
    scores = torch.randn(1, 3, 3)
    with pytest.raises(ValueError, match="bound to its keys' positions"):
        top_k(scores, Visibility(q_pos=torch.arange(3), causal=True), 2)
    with pytest.raises(ValueError, match="index_topk must be"):
        top_k(scores, Visibility.from_lengths(3, 3, causal=True), 0)
    moved = Visibility.from_lengths(3, 3, causal=True, mask=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="pass a bool mask"):
        top_k(scores, moved, 2)
