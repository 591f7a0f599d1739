"""DeepSeek-V4's compressed layers under the 'paged' and 'prefix' caches (attnlab.cache.compressed_paged): rows that
run each at its own length, and prompts that resume after an earlier prompt's pages.

A real V4 decoder (attnlab's, from transformers' DeepseekV4Config: a sliding layer, compressed-sparse layers of
blocks of 4 with the indexer's top 3, a heavily compressed layer of blocks of 8 or 32, a window of 4 with sinks, 2
hyper-connection streams, a hash-routed first layer), random weights. Oracles: each prompt generated alone on the
plain cache (CompressedCache: a ring, entries unpaged), and a fresh prefix cache (cold).

Tolerance: a warm prompt's logits equal a cold prefix cache's bitwise (the same pieces run; the ring restored is the
one a cold run had there), and the plain cache's within 1e-4 in float32 (the plain ring hands the window's keys in
ring order, the pages in position order: another summation order). Top-k choices on random weights can tie (every
indexer head's ReLU at 0) and flip under such an order or another split into calls: 32 indexer heads, and each test
asserts a gap between the 3rd and 4th score of every query over the sequences it compares (``least_margin``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DeepseekV4Config

from attnlab.cache import CACHES, LayerState, ModelCache, PrefixCache
from attnlab.cache.compressed_paged import PagedCompressedCache
from attnlab.models import GPT
from attnlab.models.families import config_from_hf
from attnlab.nn.compressed import CompressedAttention
from test_compressed import margin

KINDS = [
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "compressed_sparse_attention",
]
G = torch.Generator().manual_seed(3)
SHARED = torch.randint(0, 64, (48,), generator=G).tolist()  # three pages of 16
FIRST = [*SHARED, *torch.randint(0, 64, (9,), generator=G).tolist()]
SECOND = [*SHARED, *torch.randint(0, 64, (13,), generator=G).tolist()]


@functools.cache
def v4(heavy: int = 8, sparse: int = 4) -> GPT:
    """A small V4 decoder, attnlab's, with blocks of ``sparse`` (compressed-sparse) and ``heavy`` tokens."""
    config: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        head_dim=16,
        q_lora_rank=8,
        num_experts_per_tok=2,
        n_routed_experts=4,
        hc_mult=2,
        hc_sinkhorn_iters=3,
        sliding_window=4,
        o_groups=2,
        o_lora_rank=8,
        index_n_heads=32,  # 32 heads: a score of exactly 0 (every ReLU at 0) all but never
        index_head_dim=16,
        index_topk=3,
        layer_types=KINDS,
        compress_rates={"compressed_sparse_attention": sparse, "heavily_compressed_attention": heavy},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        partial_rotary_factor=0.5,
        max_position_embeddings=256,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    m = GPT(config_from_hf(DeepseekV4Config(**config).to_dict(), Path("deepseek_v4"))).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():  # off their inits: sinks, position biases and gates act
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return m


def least_margin(m: GPT, sequences: list[list[int]]) -> float:
    """The least gap between the 3rd and 4th indexer score of any query, over every compressed-sparse layer and
    every sequence run whole (its layers' inputs caught by hooks; ``test_compressed.margin`` reads the gap)."""
    sparse = [b.att for b in m.blocks if isinstance(b.att, CompressedAttention) and b.att.index_topk is not None]
    caught: list[tuple[CompressedAttention, torch.Tensor]] = []
    hooks = [a.register_forward_pre_hook(lambda att, args: caught.append((att, args[0]))) for a in sparse]
    try:
        with torch.no_grad():
            for tokens in sequences:
                m(torch.tensor([tokens]))
    finally:
        for h in hooks:
            h.remove()
    return min(margin(att, x) for att, x in caught)


def tokens_each_layer_runs(m: GPT) -> tuple[list[list[int]], list[Any]]:
    """Per layer, the tokens its attention is given call by call (hooks, not the cache's counters)."""
    seen: list[list[int]] = [[] for _ in m.blocks]
    hooks = [
        block.att.register_forward_pre_hook(lambda _, args, n=n: seen[n].append(args[0].shape[1]))
        for n, block in enumerate(m.blocks)
    ]
    return seen, hooks


@pytest.mark.slow  # two generations of three prompts
@torch.no_grad()
def test_generate_many_on_paged_rows_gives_each_prompt_what_it_gets_alone() -> None:
    """Three prompts of 37, 43 and 34 tokens, two slots: rows at their own lengths, one closing a block while the
    other's stays open, the third taking a finished row's place."""
    m = v4()
    g = torch.Generator().manual_seed(5)  # a seed whose choices have a margin (asserted below)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (37, 43, 34)]
    alone = [m.generate(torch.tensor([p]), 12, compile=False)[0, len(p) :].tolist() for p in prompts]
    assert least_margin(m, [p + a for p, a in zip(prompts, alone, strict=True)]) > 1e-4
    assert m.generate_many(prompts, 12, cache="paged", slots=2) == alone


@pytest.mark.slow  # three generations
@pytest.mark.parametrize(("heavy", "resumed", "pieces"), [(8, 48, [13]), (32, 32, [16, 13])])
@torch.no_grad()
def test_a_second_prompt_resumes_after_the_shared_pages_and_gets_what_it_gets_alone(
    heavy: int, resumed: int, pieces: list[int]
) -> None:
    """48 shared tokens: with blocks of 4 and 8 every page end closes a block, so the second prompt resumes after
    all three pages; with blocks of 32 only the page ending at 32 does (an entry there is closed, the next is not),
    so it resumes at 32. The layers run only the rest (the effect), and the tokens and logits are those of a cold
    prefix cache (bitwise) and of the plain cache."""
    m = v4(heavy)
    got: list[torch.Tensor] = []
    hook = m.out_head.register_forward_hook(lambda _, args, out: got.append(out[:, -1].clone()))
    seen, hooks = tokens_each_layer_runs(m)
    try:
        store = PrefixCache.for_model(m, batch_size=1, max_len=96)
        m.generate(torch.tensor([FIRST]), 3, cache=store)
        assert seen[1] == [16, 16, 16, 9, 1, 1]  # cold: pieces ending at page ends (the ring kept at them)
        for layer in seen:
            layer.clear()
        got.clear()
        warm = m.generate(torch.tensor([SECOND]), 12, cache=store)
        assert seen == [[*pieces, *[1] * 11]] * 4 and sum(pieces) == len(SECOND) - resumed  # warm: the rest alone
        assert store.hit_rate == resumed / (len(FIRST) + len(SECOND))
        warm_logits = got[len(pieces) - 1]  # the prompt's last piece
        got.clear()
        cold = m.generate(torch.tensor([SECOND]), 12, cache=PrefixCache.for_model(m, batch_size=1, max_len=96))
        cold_logits = got[-12]  # after the prompt's pieces
        got.clear()
        plain = m.generate(torch.tensor([SECOND]), 12, compile=False)
        plain_logits = got[0]
    finally:
        hook.remove()
        for h in hooks:
            h.remove()
    assert least_margin(m, [plain[0].tolist()]) > 1e-4  # the oracle's choices are clear of rounding
    assert torch.equal(warm, cold) and torch.equal(warm, plain)
    assert torch.equal(warm_logits, cold_logits)
    assert (warm_logits - plain_logits).abs().max() < 1e-4


@pytest.mark.slow  # a prefix cache over three prompts at once
@torch.no_grad()
def test_generate_many_on_a_prefix_cache_shares_the_prefix_across_rows() -> None:
    m = v4()
    prompts = [FIRST, SECOND, [*SHARED[:32], 5, 6, 7]]
    alone = [m.generate(torch.tensor([p]), 8, compile=False)[0, len(p) :].tolist() for p in prompts]
    assert least_margin(m, [p + a for p, a in zip(prompts, alone, strict=True)]) > 1e-4
    store = PrefixCache.for_model(m, batch_size=2, max_len=96)
    assert m.generate_many(prompts, 8, cache=store, slots=2) == alone
    assert store.hit_rate == (48 + 32) / sum(len(p) for p in prompts)


def layers_with(block: int) -> list[LayerState]:
    full = LayerState(kind="full", kv_heads=1, head_dim=4)
    compressed = LayerState(kind="compressed", kv_heads=1, head_dim=8, window=4, block=block, row_width=32)
    return [full, compressed]


@pytest.mark.parametrize("name", ["paged", "prefix"])
def test_a_block_that_does_not_line_up_with_the_pages_is_refused_by_name(name: str) -> None:
    """Blocks of 6 or 24 straddle pages of 16 (an entry would close in a page a prefix could share without it):
    refused by the plan and the build, before anything is made."""
    for block in (6, 24):
        why = f"its block of {block} tokens must divide the page of 16 tokens or be a multiple of it"
        with pytest.raises(ValueError, match=why):
            ModelCache.plan(layers_with(block), name)
        with pytest.raises(ValueError, match=why):
            ModelCache.build(layers_with(block), name, rows=1, capacity=32)
    for block in (2, 4, 8, 16, 32, 128):  # these line up
        assert ModelCache.plan(layers_with(block), name).rows
        assert isinstance(ModelCache.build(layers_with(block), name, rows=1, capacity=32)[1], PagedCompressedCache)
    with pytest.raises(ValueError, match="a cache factory \\(function\\) does not build"):
        ModelCache.plan(layers_with(4), lambda **kw: CACHES["plain"](**kw))


@torch.no_grad()
def test_a_model_whose_block_does_not_line_up_is_refused_before_generating() -> None:
    m = v4(heavy=24)
    with pytest.raises(ValueError, match="its block of 24 tokens must divide the page of 16"):
        m.generate_many([FIRST], 2, cache="paged")
    with pytest.raises(ValueError, match="its block of 24 tokens must divide the page of 16"):
        PrefixCache.for_model(m, batch_size=1, max_len=64)


@pytest.mark.slow  # three generations with guesses
@torch.no_grad()
def test_speculation_on_paged_rows_goes_back_to_the_mark_and_gives_greedys_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prompt lookup on a repetitive prompt: refused guesses send a row back (its ring to the mark, its pages by the
    table), and the tokens are the plain cache's without guesses."""
    m = v4()
    prompt = torch.tensor([(FIRST[:20] * 3)[:50]])
    went_back: list[tuple[int, int]] = []
    crop_row = PagedCompressedCache.crop_row

    def seen(self: PagedCompressedCache, row: int, to: int) -> None:
        went_back.append((self.table.length[row], to))
        crop_row(self, row, to)

    monkeypatch.setattr(PagedCompressedCache, "crop_row", seen)
    expected = m.generate(prompt, 16, compile=False)
    assert least_margin(m, [expected[0].tolist()]) > 1e-4
    for cache in ("paged", "prefix"):
        went_back.clear()
        assert torch.equal(m.generate(prompt, 16, cache=cache, lookup=3), expected), cache
        assert any(to < held for held, to in went_back), cache  # some guess was refused and taken back
