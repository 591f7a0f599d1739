"""Issue 32: one decode loop over one model cache.

The loop equals the readable reference (the book's greedy loop, with a cache) on every cache and backend; the
paged layers of a model share one block table, whose bookkeeping touches only what a step writes; a prefix
tree node holds one block id; rows of any length run on a paged cache; a forward that fails between layers
leaves the cache as it was; and ``Sampling`` is checked once and draws every token.
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab.cache import CACHES, BlockTable, ModelCache, PagedKVCache, PrefixCache
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import Request, Sampling, Stop, decode, reference_greedy

BACKENDS = ("eager", "sdpa", "flash")
SIZED = {"h2o": functools.partial(CACHES["h2o"], budget=12), "snapkv": functools.partial(CACHES["snapkv"], budget=8)}


@functools.cache
def model(backend: str = "sdpa", rope: bool = True) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_layers=2, rope=rope, drop_rate=0.0, backend=backend
    )
    return GPT(config).eval()


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["plain", "paged", "prefix", "sink", "int8", "int4", "h2o", "snapkv"])
def test_the_loop_gives_the_readable_reference_loops_tokens(backend: str, name: str) -> None:
    """The same cache kind fed by the ten-line reference and by the loop: the same greedy tokens."""
    m, ids = model(backend), prompt(20)
    made = name if name != "prefix" else "paged"  # the reference has no tree: the blocks under it
    reference = reference_greedy(m, ids, 12, m.make_caches(batch_size=1, max_len=32, cache=SIZED.get(made, made)))
    if name == "prefix":
        cache: ModelCache = PrefixCache.for_model(m, batch_size=1, max_len=31)
    else:
        cache = m.make_caches(batch_size=1, max_len=32, cache=SIZED.get(name, name))
    passes = decode(m, Request(prompts=[ids], cache=cache, sampling=Sampling(), stop=Stop(max_new_tokens=12)))
    assert [token for drawn in passes for _, token in drawn] == reference
    if name in ("plain", "paged", "prefix"):  # lossless: the reference with no cache at all
        assert reference == m.generate(torch.tensor([ids]), 12, use_cache=False)[0, 20:].tolist()


@torch.no_grad()
def test_the_paged_layers_of_a_model_share_one_block_table() -> None:
    m = model()
    cache = m.make_caches(batch_size=2, max_len=40, cache="paged")
    tables = {id(layer.table) for layer in cache if isinstance(layer, PagedKVCache)}
    assert len(tables) == 1 and cache.table is not None and cache.table.layers == 2
    m(torch.tensor([prompt(20)]), caches=cache.views([1]))
    assert cache.table.held[1] == [0, 1] and cache.table.length == [0, 20]  # two blocks, taken once for both layers
    assert cache.table.refcount[:3] == [1, 1, 0]  # one holder each, not one per layer
    cache.release(1)
    assert cache.table.free_blocks() == cache.table.num_blocks


@torch.no_grad()
def test_a_forward_that_fails_between_layers_leaves_the_paged_cache_as_it_was() -> None:
    m = model()
    cache = m.make_caches(batch_size=1, max_len=40, cache="paged")
    m(torch.tensor([prompt(10)]), caches=cache)
    before = (list(cache.table.refcount), list(cache.table.free), [list(h) for h in cache.table.held])
    second = cache[1]
    assert isinstance(second, PagedKVCache)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the second layer refuses its keys")

    second.check = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the second layer refuses"):
        m(torch.tensor([prompt(10, seed=2)]), caches=cache)  # layer 0 wrote 10 tokens and took a block
    assert (list(cache.table.refcount), list(cache.table.free), [list(h) for h in cache.table.held]) == before
    assert cache.table.length == [10] and cache.table.pending is None


class CountingList(list[int]):
    """A refcount list that counts how many of its entries are read."""

    reads = 0

    def __getitem__(self, index: object) -> object:  # type: ignore[override]
        CountingList.reads += 1
        return super().__getitem__(index)  # type: ignore[index]

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountingList.reads += len(self)
        return super().__iter__()


def test_a_decode_steps_bookkeeping_does_not_grow_with_the_pool() -> None:
    """Reads of the refcounts over 16 decode steps of 2 rows: the same for a pool of 16 blocks and one of 4,096
    (the old per-layer scan read every block at each step of each layer), at most one per row and step."""
    reads = {}
    for blocks in (16, 4096):
        table = BlockTable(batch_size=2, num_blocks=blocks, max_len=64, block_size=4)
        table.layers = 1
        table.refcount = CountingList(table.refcount)
        table.wrote(table.plan((0, 1), 3))
        CountingList.reads = 0
        for _ in range(16):
            table.wrote(table.plan((0, 1), 1))
        reads[blocks] = CountingList.reads
        assert table.length == [19, 19] and table.free_blocks() == blocks - 10
    assert reads[16] == reads[4096] <= 16 * 2, reads


@torch.no_grad()
def test_a_prefix_tree_node_holds_one_block_id() -> None:
    m = model()
    store = PrefixCache.for_model(m, batch_size=1, max_len=48)
    m.generate(torch.tensor([prompt(40)]), 4, cache=store)
    nodes = store._nodes()
    assert len(nodes) == 2 and all(isinstance(n.block, int) for n in nodes)
    assert [store.table.refcount[n.block] for n in nodes] == [1, 1]  # the tree's reference, once for all layers


def test_rows_of_different_lengths_run_on_paged_and_prefix_caches() -> None:
    """A left-padded batch: each row gets what it gets alone, on every cache (paged rows run unpadded)."""
    m = model()
    short, long = prompt(5, seed=3), prompt(9, seed=4)
    idx = torch.tensor([[0] * 4 + short, long])
    mask = torch.tensor([[0] * 4 + [1] * 5, [1] * 9])
    alone = [m.generate(torch.tensor([p]), 6)[0, len(p) :].tolist() for p in (short, long)]
    for name in ("plain", "paged", "prefix", "int8"):
        out = m.generate(idx, 6, attention_mask=mask, cache=name)[:, 9:].tolist()
        assert out == alone, name


def test_sampling_is_checked_once_and_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0 \(0 = greedy\), got -1"):
        Sampling(temperature=-1)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_k must be"):
        Sampling(temperature=1.0, top_k=0)
    assert Sampling(temperature=1e-46).greedy and not Sampling(temperature=0.5).greedy


def test_a_greedy_draw_is_argmaxs_first_index_of_a_tie_and_of_a_nan() -> None:
    """Greedy draws by max's kernel: every row's token is what argmax gives, on rows full of ties (the first of
    them), with a NaN (argmax takes it), all -inf, and in float32, bfloat16 and float16, vocabularies up to
    gpt2's."""
    generator = torch.Generator().manual_seed(0)
    for trial, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16] * 4):
        width = [5, 999, 50257][trial % 3]
        logits = torch.randint(-2, 2, (4, width), generator=generator).to(dtype)  # many tied maxima a row
        logits[1, width // 2] = float("nan")
        logits[2].fill_(float("-inf"))
        got = Sampling().draw(logits)
        assert got.shape == (4, 1) and torch.equal(got[:, 0], logits.argmax(dim=-1)), (dtype, width)
        assert got[0, 0] == (logits[0] == logits[0].max()).nonzero()[0, 0]  # the first of the ties, counted


def test_sampled_generation_draws_through_sampling_with_its_generator() -> None:
    """The same generator seed gives the same tokens; another seed other tokens (the draw is Sampling's)."""
    m, ids = model(), torch.tensor([prompt(8)])
    runs = [m.generate(ids, 16, temperature=1.5, generator=torch.Generator().manual_seed(s)) for s in (5, 5, 6)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_a_kept_prefix_cache_that_saw_a_layer_fail_gives_the_right_tokens_after() -> None:
    """A forward that fails between layers inside generate_many (the loop hands the model per-row views): the
    kept store's half-made write is undone, and the next call gives the reference tokens (it gave others)."""
    m = model()
    prompts = [list(range(1, 24)), [*range(1, 21), 9]]
    reference = m.generate_many(prompts, 12, slots=2)
    store = PrefixCache.for_model(m, batch_size=2, max_len=40)

    def boom(module: object, args: object) -> None:
        raise RuntimeError("layer 1 failed")

    hook = m.trf_blocks[1].register_forward_pre_hook(boom)  # layer 0 writes, layer 1 never does
    try:
        with pytest.raises(RuntimeError, match="layer 1 failed"):
            m.generate_many(prompts, 12, slots=2, cache=store)
    finally:
        hook.remove()
    assert store.blocks.pending is None
    assert m.generate_many(prompts, 12, slots=2, cache=store) == reference
    assert m.generate_many(prompts, 12, slots=2, cache=store) == reference


def test_a_call_past_the_context_is_refused_before_any_cache_is_made() -> None:
    """10**8 new tokens would be a cache of gigabytes: the context says no first, at once."""
    with pytest.raises(ValueError, match=r"more than the model's context_length 64"):
        model().generate(torch.tensor([prompt(4)]), 10**8)
