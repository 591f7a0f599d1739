"""MoBA (issue 59 item 1): each query reads its own block and the blocks whose mean key suits it best.

The fast form (each head's query over its gathered blocks) equals the readable one (every key, all but the chosen
blocks hidden); with top_k at least the blocks of the past it equals full causal attention; keys read, counted
from the gathered positions, fall as top_k falls; on a retrieval construction the highest-scoring choice finds a
key planted far back and the lowest does not; greedy decoding through a cache equals the no-cache forward; bad
input is refused by name.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.cache import ModelCache
from attnlab.cache.kv import KVCache
from attnlab.functional.attention import attention
from attnlab.functional.sparse_blocks import (
    chosen_visibility,
    gathered_attention,
    keys_read,
    moba_select,
)
from attnlab.models import GPT
from attnlab.models.zoo import zoo_config
from attnlab.nn.moba import MoBAAttention

B, H, HK, S, D, L = 2, 4, 2, 45, 8, 8  # 6 blocks, the last one open


def qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, S, D, generator=g, dtype=torch.float64),
        torch.randn(B, HK, S, D, generator=g, dtype=torch.float64),
        torch.randn(B, HK, S, D, generator=g, dtype=torch.float64),
    )


POS = torch.arange(S).expand(B, S)


@pytest.mark.parametrize("top_k", [1, 2, 4, 6])
def test_the_gathered_blocks_give_the_readable_forms_attention(top_k: int) -> None:
    q, k, v = qkv()
    chosen = moba_select(q, k, POS, POS, block=L, top_k=top_k)
    fast, _ = gathered_attention(q, k, v, chosen, POS, POS, block=L)
    readable = attention(q, k, v, visibility=chosen_visibility(chosen, POS, POS, L, H), backend="eager")
    torch.testing.assert_close(fast, readable, rtol=0, atol=1e-12)
    own = chosen[..., 0]  # the query's own block is always taken, first
    assert torch.equal(own, (POS // L)[:, None, :].expand_as(own))


def test_empty_slots_after_the_held_keys_change_nothing() -> None:
    """A compiled cache returns its whole buffer, the slots past its length at position -1."""
    q, k, v = qkv(5)
    held = 37
    empty = torch.where(torch.arange(S) < held, torch.arange(S), -1).expand(B, S)
    q_pos = torch.arange(held - 4, held).expand(B, 4)  # the last 4 queries written
    chosen = moba_select(q[:, :, held - 4 : held], k, q_pos, empty, block=L, top_k=3)
    out, read = gathered_attention(q[:, :, held - 4 : held], k, v, chosen, q_pos, empty, block=L)
    cut = POS[:, :held]
    alone = moba_select(q[:, :, held - 4 : held], k[:, :, :held], q_pos, cut, block=L, top_k=3)
    expected, read_alone = gathered_attention(q[:, :, held - 4 : held], k[:, :, :held], v[:, :, :held], alone, q_pos, cut, block=L)  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert torch.equal(read, read_alone)  # the same keys gathered: the empty slots read nothing


def test_top_k_covering_the_past_is_full_causal_attention_and_less_is_not() -> None:
    q, k, v = qkv(1)
    full = attention(q, k, v, is_causal=True)
    chosen = moba_select(q, k, POS, POS, block=L, top_k=6)
    torch.testing.assert_close(gathered_attention(q, k, v, chosen, POS, POS, block=L)[0], full, rtol=0, atol=1e-12)
    fewer = moba_select(q, k, POS, POS, block=L, top_k=2)
    assert (gathered_attention(q, k, v, fewer, POS, POS, block=L)[0] - full).abs().max() > 1e-2


def test_keys_read_fall_as_top_k_falls() -> None:
    q, k, v = qkv(2)
    read = [int(keys_read(gathered_attention(q, k, v, moba_select(q, k, POS, POS, block=L, top_k=n), POS, POS, block=L)[1])) for n in (6, 4, 2, 1)]  # fmt: skip
    assert read == sorted(read, reverse=True) and len(set(read)) == 4, read
    every = B * H * S * (S + 1) // 2  # full causal attention reads each query's past and itself
    assert read[0] == every and read[-1] == B * H * sum(p % L + 1 for p in range(S))  # top_k 1: its own block


def test_a_key_planted_far_back_is_found_by_the_highest_scores_and_missed_by_the_lowest() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, S, D, generator=g, dtype=torch.float64) * 0.1
    k = torch.randn(1, 1, S, D, generator=g, dtype=torch.float64) * 0.1
    v = torch.zeros(1, 1, S, D, dtype=torch.float64)
    needle = torch.zeros(D, dtype=torch.float64)
    needle[0] = 1.0
    k[0, 0, 3] = 8 * L * needle  # planted in block 0, far from the last query (block 5)
    v[0, 0, 3] = needle
    q[0, 0, -1] = needle
    pos = torch.arange(S)[None]
    for sign, finds in ((1, True), (-1, False)):  # -q: the blocks of lowest score
        chosen = moba_select(sign * q, k, pos, pos, block=L, top_k=2)
        out, _ = gathered_attention(q, k, v, chosen, pos, pos, block=L)
        assert (0 in chosen[0, 0, -1].tolist()) == finds
        assert (out[0, 0, -1, 0] > 0.99) == finds, float(out[0, 0, -1, 0])


def test_bad_sizes_are_refused_by_name() -> None:
    shape = dict(d_in=16, num_heads=2, context_length=64)
    with pytest.raises(ValueError, match="block_size"):
        MoBAAttention(block_size=0, top_k=1, **shape)
    with pytest.raises(ValueError, match="block_size"):
        MoBAAttention(block_size=-4, top_k=1, **shape)
    with pytest.raises(ValueError, match=r"top_k=5 blocks a query, but a context of 64 tokens holds 4 blocks"):
        MoBAAttention(block_size=16, top_k=5, **shape)
    with pytest.raises(ValueError, match="window=8"):
        MoBAAttention(block_size=16, top_k=2, window=8, **shape)


def test_its_state_is_planned_plain_or_paged_and_the_caches_that_move_keys_are_refused() -> None:
    layer = MoBAAttention(block_size=8, top_k=2, d_in=16, num_heads=2, context_length=64)
    state = layer.layer_state()
    assert state.kind == "blocks"
    assert isinstance(ModelCache.build([state], "plain", rows=1, capacity=8)[0], KVCache)
    for name in ("sink", "int8", "h2o"):
        with pytest.raises(ValueError, match=f"a block-sparse layer .* the {name} cache"):
            ModelCache.build([state], name, rows=1, capacity=8)


@pytest.mark.slow  # three generations of 16 tokens
@torch.no_grad()
def test_greedy_through_a_cache_is_the_no_cache_forward_and_a_padded_row_is_its_row_alone() -> None:
    torch.manual_seed(0)
    model = GPT(zoo_config("moba")).eval()
    prompt = torch.randint(1, 256, (1, 21), generator=torch.Generator().manual_seed(4))
    ids = prompt
    for _ in range(16):  # the no-cache loop: every token's logits from the whole sequence
        ids = torch.cat((ids, model(ids)[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(model.generate(prompt, 16), ids)
    assert torch.equal(model.generate(prompt, 16, cache="paged"), ids)
    padded = torch.cat((torch.zeros(1, 5, dtype=torch.long), ids), dim=1)
    mask = torch.cat((torch.zeros(1, 5, dtype=torch.long), torch.ones_like(ids)), dim=1)
    alone, beside = model(ids), model(padded, attention_mask=mask)[:, 5:]
    torch.testing.assert_close(beside, alone, rtol=0, atol=1e-5)
    assert F.cross_entropy(alone[0, :-1], ids[0, 1:]) > 0  # the model reads something


@pytest.mark.slow  # a model's forward under a Recorder
@torch.no_grad()
def test_a_recorder_sees_each_heads_weights_on_the_keys_its_gathers_read() -> None:
    from attnlab.observe import Recorder

    torch.manual_seed(0)
    model = GPT(zoo_config("moba")).eval()
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    att = model.trf_blocks[1].att
    assert isinstance(att, MoBAAttention)
    att.reset_meter()
    with Recorder(names=["attn_weights"]) as rec:
        model(ids)
    weights = rec.get("attn_weights", module="trf_blocks.1.att")  # (B, H, T, T)
    assert weights.shape == (1, 4, 40, 40)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 40))
    # the map's keys are the gathers' keys, a key counted once however many heads gave it weight
    assert int((weights > 0).any(dim=1).sum()) == int(att.keys_read)


def test_distinct_keys_counts_a_key_once_however_many_heads_gathered_it() -> None:
    from attnlab.functional.sparse_blocks import distinct_keys

    picked = torch.tensor([[[[0, 1, 2, 3], [5, 6, -1, -1]], [[2, 3, -1, -1], [6, 7, 8, -1]]]])  # (B=1, R=2, Tq=2, M=4)
    assert distinct_keys(picked).tolist() == [[4, 4]]  # query 0: 0..3 and 2, 3 again; query 1: 5, 6 and 6, 7, 8
    assert int(keys_read(picked)) == 11  # a key a head and query
