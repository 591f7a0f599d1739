"""The paged KV cache (issue 23, part 1): one pool of blocks, a block table per sequence, sequences of different
lengths in one batch, fork with copy on write; token-identical to no cache."""

from __future__ import annotations

import pytest
import torch

from attnlab.cache import PagedKVCache
from attnlab.models import GPT, GPTConfig

BACKENDS = ["eager", "sdpa", "flash"]


def model(backend: str = "sdpa", rope: bool = True) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=64,
        context_length=64,
        emb_dim=32,
        n_heads=4,
        n_kv_heads=2 if rope else None,
        n_layers=2,
        rope=rope,
        drop_rate=0.0,
        backend=backend,
    )
    return GPT(config).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rope", [True, False])
def test_generation_with_the_paged_cache_is_token_identical_to_no_cache(backend: str, rope: bool) -> None:
    m = model(backend, rope)
    idx = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    paged = m.generate(idx, 24, cache="paged")
    assert torch.equal(paged, m.generate(idx, 24, use_cache=False))
    assert torch.equal(paged, m.generate(idx, 24))  # and to the plain cache


def _alone(m: GPT, prompt: list[int], n: int) -> list[int]:
    return m.generate(torch.tensor([prompt]), n, use_cache=False)[0, len(prompt) :].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequences_of_different_lengths_share_one_batch(backend: str) -> None:
    """Two prompts of 5 and 11 tokens prefilled into their own sequences, then decoded together: each row's
    tokens are what the prompt generates alone, and the pool holds at most one partly filled block each."""
    m = model(backend)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]]
    caches = [
        PagedKVCache(batch_size=2, num_kv_heads=2, head_dim=8, num_blocks=8, max_len=32, block_size=4) for _ in m.blocks
    ]
    last = []
    with torch.no_grad():
        for row, prompt in enumerate(prompts):  # each prompt into its own sequence: the other keeps its tokens
            logits = m(torch.tensor([prompt]), caches=[c.sequence(row) for c in caches], last_only=True)
            last.append(int(logits[0, -1].argmax()))
        out = [[t] for t in last]
        token = torch.tensor([[t] for t in last])  # (2, 1): one token for each, at its own position
        for _ in range(7):
            token = m(token, caches=caches, last_only=True)[:, -1].argmax(-1, keepdim=True)
            for row in range(2):
                out[row].append(int(token[row]))
    for row, prompt in enumerate(prompts):
        assert out[row] == _alone(m, prompt, 8), row
    assert caches[0].lengths.tolist() == [5 + 7, 11 + 7]
    assert 0 <= caches[0].waste() < 2 * 4  # at most one partly filled block per sequence
    assert caches[0].waste() == sum(-(-n // 4) * 4 - n for n in (12, 18))


def test_a_fork_shares_blocks_until_a_sequence_writes_then_copies_that_block() -> None:
    m = model()
    prompt = [7, 7, 1, 2, 3, 4]  # 6 tokens: one full block of 4 and a partly filled one
    caches = [
        PagedKVCache(batch_size=2, num_kv_heads=2, head_dim=8, num_blocks=6, max_len=16, block_size=4) for _ in m.blocks
    ]
    with torch.no_grad():
        first = m(torch.tensor([prompt]), caches=[c.sequence(0) for c in caches], last_only=True)[0, -1]
        for c in caches:
            c.fork(0, 1)
        assert caches[0].free_blocks() == 4 and caches[0].refcount[:2] == [2, 2]  # shared, not copied
        two = torch.tensor([[int(first.argmax())], [5]])  # the two samples take different next tokens
        logits = m(two, caches=caches, last_only=True)[:, -1]
    assert caches[0].refcount[:2] == [2, 1] and caches[0].free_blocks() == 3  # the partly filled block: copied
    for row, token in enumerate(two[:, 0].tolist()):
        alone = m(torch.tensor([[*prompt, token]]), last_only=True)[0, -1]
        torch.testing.assert_close(logits[row], alone, atol=1e-5, rtol=1e-5)
    for c in caches:
        c.release(1)
    assert caches[0].free_blocks() == 4 and caches[0].lengths.tolist() == [7, 0]


def test_a_full_pool_is_refused_before_anything_is_written() -> None:
    cache = PagedKVCache(batch_size=2, num_kv_heads=1, head_dim=2, num_blocks=2, max_len=8, block_size=2)
    kv = torch.ones(2, 1, 2, 2)
    cache.update(kv, kv)  # one block each: the pool is now full
    before = (cache.k_pool.clone(), cache.block_table.clone(), cache.lengths.clone(), list(cache.refcount))
    with pytest.raises(ValueError, match=r"the pool is full: its 2 blocks of 2 tokens are taken; release finished"):
        cache.update(kv[:, :, :1], kv[:, :, :1])
    after = (cache.k_pool, cache.block_table, cache.lengths, cache.refcount)
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before, after, strict=True))
    with pytest.raises(ValueError, match=r"cannot take 9 more: this cache was built for max_len=8"):
        cache.update(torch.ones(2, 1, 9, 2), torch.ones(2, 1, 9, 2))


def test_a_step_reads_only_the_blocks_up_to_its_longest_row() -> None:
    """The effect: rows of 3 and 6 tokens in blocks of 2 hand attention 3 blocks' slots each (6), not the 16 of
    max_len, and every slot past a row's end is marked empty. (Gathering every block made each decode step copy
    a whole context's keys for every row and layer.)"""
    cache = PagedKVCache(batch_size=2, num_kv_heads=1, head_dim=2, num_blocks=8, max_len=16, block_size=2)
    k = torch.arange(2 * 6 * 2, dtype=torch.float32).view(2, 1, 6, 2)
    cache.rows([0]).update(k[:1, :, :3], k[:1, :, :3])
    keys, values, positions = cache.rows([1]).update(k[1:], k[1:])
    assert keys.shape == (1, 1, 6, 2) and torch.equal(keys[0, 0], k[1, 0])
    keys, values, positions = cache.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))  # 4 and 7 tokens
    assert keys.shape == (2, 1, 8, 2) and positions.shape == (2, 8)
    assert positions.tolist() == [[0, 1, 2, 3, -1, -1, -1, -1], [0, 1, 2, 3, 4, 5, 6, -1]]
    assert torch.equal(keys[0, 0, :3], k[0, 0, :3]) and torch.equal(keys[1, 0, :6], k[1, 0])


def test_a_step_copies_each_block_it_reads_once() -> None:
    """The effect of the pool's layout, heads outermost: the gathered blocks become (R, Hkv, S, D) as a view,
    with no second copy (torch.profiler: no clone or copy_ in a decode step's update; the blocks-first pool
    made one for the keys and one for the values), and they are the keys written."""
    from torch.profiler import ProfilerActivity, profile

    cache = PagedKVCache(batch_size=2, num_kv_heads=3, head_dim=4, num_blocks=8, max_len=16, block_size=2)
    k = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(0))
    cache.update(k, -k)
    new = torch.randn(2, 3, 1, 4, generator=torch.Generator().manual_seed(1))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        keys, values, _ = cache.update(new, -new)
    copies = [e.name for e in prof.events() if e.name in ("aten::clone", "aten::copy_")]
    assert copies == [], copies
    assert torch.equal(keys[:, :, :6], torch.cat([k, new], dim=2)) and torch.equal(values[:, :, :6], -keys[:, :, :6])


def test_the_cache_is_named_and_its_misuses_are_refused() -> None:
    m = model()
    idx = torch.randint(0, 64, (1, 4))
    with pytest.raises(ValueError, match=r"unknown cache 'pages'; the caches are \['plain', 'paged', 'prefix', 'sink'"):
        m.generate(idx, 2, cache="pages")
    windowed = GPT(GPTConfig(vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=1, rope=True, window=4))
    # a window in paged blocks: every key kept, the window masking the rest (its ring's tokens, rows of their own)
    assert torch.equal(windowed.eval().generate(idx, 9, cache="paged"), windowed.generate(idx, 9))
    caches = m.make_caches(batch_size=2, max_len=16, cache="paged")
    with torch.no_grad():
        m(idx, caches=caches.views([0]))  # sequence 0 holds 4 tokens, sequence 1 none: padding cannot line them up
    with pytest.raises(ValueError, match=r"this cache's sequences hold different lengths \(\[4, 0\]\) \(a paged"):
        m(torch.randint(0, 64, (2, 1)), caches=caches, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"fork needs two different sequences, got src = dst = 0"):
        PagedKVCache(batch_size=2, num_kv_heads=1, head_dim=2, num_blocks=2, max_len=8).fork(0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_continuous_batching_gives_each_prompt_what_it_gets_alone_and_reuses_the_blocks(backend: str) -> None:
    """Five prompts of different lengths through two slots: as each ends, its blocks go back to the pool and the
    next prompt takes its row, while the other keeps decoding."""
    m = model(backend)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (3, 11, 6, 1, 8)]
    got = m.generate_many(prompts, 9, slots=2)
    assert got == [_alone(m, p, 9) for p in prompts]
    ends = m.generate_many(prompts, 9, slots=3, eos_id=got[1][2])  # a sequence that stops early frees its row
    assert ends[1] == got[1][:3] and all(len(e) <= 9 for e in ends)


def test_continuous_batching_refuses_what_it_cannot_run() -> None:
    m = model()
    with pytest.raises(ValueError, match=r"prompt 1 must be a non-empty list of int token ids"):
        m.generate_many([[1, 2], []], 4)
    with pytest.raises(ValueError, match=r"prompt 0 has 60 tokens and max_new_tokens is 10: more than .* 64"):
        m.generate_many([[1] * 60], 10)
