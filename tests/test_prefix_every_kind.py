"""Prefix reuse and continuous batching on every kind of layer (issue 57).

A prefix cache keeps every key in paged blocks (a sliding layer's window among them, its visibility masking the
rest, MLA's latents as one head) and, for a recurrent or convolution layer, the state at each block's end, freed
with the block. A second prompt sharing a beginning runs only its own tokens on every layer; warm gives what cold
gives. Oracles: the plain cache (a ring, a state carried along), no cache at all, and a fresh prefix cache (cold).

Tolerance: a warm prompt's logits equal a cold prefix cache's bitwise (the same pieces run: the state at a block's
end is the one a cold run computes there), and the plain cache's within 1e-4 in float32 (that cache runs the prompt
in one call, the chunked recurrence summing in another order than pieces of 16 do: float32 rounding over ~60 tokens
of random weights moves a logit by ~1e-6; 1e-4 is the house's float32 bound against transformers).
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab.cache import CACHES, PrefixCache
from attnlab.cache.row_states import PagedConvolutionCache, PagedStateCache
from attnlab.models.gpt import GPT
from attnlab.models.zoo import VARIANTS, zoo_config
from test_going_back import every_kind

PAGED = list(VARIANTS)  # compressed too: its entries page with the blocks (cache/compressed_paged.py)

G = torch.Generator().manual_seed(5)
SHARED = torch.randint(0, 64, (48,), generator=G).tolist()  # three blocks of 16
FIRST = [*SHARED, *torch.randint(0, 64, (9,), generator=G).tolist()]
SECOND = [*SHARED, *torch.randint(0, 64, (13,), generator=G).tolist()]


def tokens_each_layer_runs(m: GPT) -> list[list[int]]:
    """Per layer, the tokens it is given call by call (hooks on the blocks; the cache's counters are not asked)."""
    seen: list[list[int]] = [[] for _ in m.blocks]
    for n, block in enumerate(m.blocks):
        block.register_forward_pre_hook(lambda _, args, n=n: seen[n].append(args[0].shape[1]))
    return seen


def last_logits(m: GPT) -> list[torch.Tensor]:
    """The logits of each call's last position (a hook on the output head)."""
    got: list[torch.Tensor] = []
    m.out_head.register_forward_hook(lambda _, args, out: got.append(out[:, -1].clone()))
    return got


@torch.no_grad()
def test_a_second_prompt_sharing_48_tokens_runs_only_its_own_on_every_kind_of_layer() -> None:
    m = every_kind()
    seen = tokens_each_layer_runs(m)
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    m.generate(torch.tensor([FIRST]), 3, cache=store)
    assert seen == [[16, 16, 16, 9, 1, 1]] * 6  # cold: pieces ending at block ends (the states kept there)
    for layer in seen:
        layer.clear()
    m.generate(torch.tensor([SECOND]), 3, cache=store)
    assert seen == [[13, 1, 1]] * 6  # warm: the shared 48 tokens are run by no layer
    assert store.hit_rate == 48 / (len(FIRST) + len(SECOND))


@torch.no_grad()
def test_warm_gives_the_tokens_of_cold_and_of_the_plain_cache_and_no_cache() -> None:
    m = every_kind()
    logits = last_logits(m)
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    m.generate(torch.tensor([FIRST]), 12, cache=store)
    logits.clear()
    warm = m.generate(torch.tensor([SECOND]), 12, cache=store)
    warm_logits = logits[0]
    logits.clear()
    cold = m.generate(torch.tensor([SECOND]), 12, cache=PrefixCache.for_model(m, batch_size=1, max_len=96))
    cold_logits = logits[3]  # after the prompt's three pieces that end at block ends
    logits.clear()
    plain = m.generate(torch.tensor([SECOND]), 12)
    plain_logits = logits[0]
    assert torch.equal(warm, cold) and torch.equal(warm, plain)
    assert torch.equal(warm, m.generate(torch.tensor([SECOND]), 12, use_cache=False))
    assert torch.equal(warm_logits, cold_logits)  # the same pieces: bitwise
    assert (warm_logits - plain_logits).abs().max() < 1e-4


@torch.no_grad()
def test_the_states_kept_at_block_ends_cost_what_their_shapes_say_and_go_with_their_blocks() -> None:
    m = every_kind()
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    assert store.kept_nbytes() == 0
    m.generate(torch.tensor([FIRST]), 8, cache=store)  # 57 + 7 = 64 tokens: four full blocks in the tree
    per_block = 0
    for block in m.blocks:  # from the layers' own shapes, not the caches': a state's values, float32
        state = block.att.layer_state()
        if state.kind == "recurrent":
            per_block += state.kv_heads * state.head_dim * (state.value_dim or state.head_dim)
            per_block += state.kv_heads * state.head_dim * state.normalizer
            per_block += state.conv[0] * state.conv[1] if state.conv else 0
        if state.kind == "convolution":
            assert state.conv is not None
            per_block += state.conv[0] * state.conv[1]
    assert store.cached_tokens() == 64 and store.kept_nbytes() == 4 * per_block * 4
    store.clear()  # the tree lets go of its blocks: what was kept at their ends goes with them
    assert store.kept_nbytes() == 0 and all(not s.blocks for s in store.states)


@pytest.mark.slow  # three generations; the resume rule's effect is in the first test
@torch.no_grad()
def test_a_block_whose_state_was_let_go_is_not_resumed_from() -> None:
    m = every_kind()
    seen = tokens_each_layer_runs(m)
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    expected = m.generate(torch.tensor([SECOND]), 6)
    m.generate(torch.tensor([FIRST]), 3, cache=store)
    assert not any(store.blocks.held)  # the row was released: the tree alone holds the blocks
    node = next(iter(store.root.children.values()))
    deepest = next(iter(next(iter(node.children.values())).children.values()))  # the third block's node
    for state in store.states:  # one layer's state at the third block's end is gone (as if never kept)
        state.blocks.pop(deepest.block)
        break
    for layer in seen:
        layer.clear()
    got = m.generate(torch.tensor([SECOND]), 6, cache=store)
    assert seen[0][:2] == [16, len(SECOND) - 48]  # resumed after the second block, the last every state kept
    assert torch.equal(got, expected)
    assert all(state.has(deepest.block) for state in store.states)  # the run kept it again, for the tree's block


@pytest.mark.slow  # ten generations
@torch.no_grad()
def test_continuous_batching_on_every_kind_gives_each_prompt_what_it_gets_alone() -> None:
    m = every_kind()
    prompts = [FIRST, SECOND[:20], [3, 4, 5], SECOND]
    alone = [m.generate(torch.tensor([p]), 9)[0, len(p) :].tolist() for p in prompts]
    assert m.generate_many(prompts, 9, slots=2) == alone
    assert m.generate_many(prompts, 9, slots=2, cache="prefix") == alone


@pytest.mark.slow  # both dtypes of the six-kind model, three prompts
@torch.no_grad()
def test_bfloat16_warm_gives_cold_tokens_with_float32_states() -> None:
    m = every_kind().to(torch.bfloat16)
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    m.generate(torch.tensor([FIRST]), 12, cache=store)
    warm = m.generate(torch.tensor([SECOND]), 12, cache=store)
    cold = m.generate(torch.tensor([SECOND]), 12, cache=PrefixCache.for_model(m, batch_size=1, max_len=96))
    assert torch.equal(warm, cold)
    kept = [t for s in store.states for state in s.blocks.values() for t in state]
    kinds = {type(s) for s in store.states}
    assert kinds == {PagedStateCache, PagedConvolutionCache}
    assert {
        t.dtype for s in store.states if isinstance(s, PagedStateCache) for t in s.blocks[next(iter(s.blocks))]
    } == {torch.float32}
    assert kept


@pytest.mark.slow  # every variant of the zoo
@torch.no_grad()
@pytest.mark.parametrize("variant", PAGED)
def test_every_zoo_variant_reuses_a_prefix_exactly(variant: str) -> None:
    torch.manual_seed(1)
    m = GPT(zoo_config(variant).with_(drop_rate=0.0)).eval()
    v = m.config.vocab_size
    shared = [t % v for t in SHARED]
    first, second = [*shared, *(t % v for t in FIRST[48:])], [*shared, *(t % v for t in SECOND[48:])]
    sized = functools.partial(CACHES["prefix"], num_blocks=32)
    store = m.make_caches(batch_size=1, max_len=96, cache=sized)
    assert isinstance(store, PrefixCache)
    m.generate(torch.tensor([first]), 3, cache=store)
    seen = tokens_each_layer_runs(m)
    warm = m.generate(torch.tensor([second]), 24, cache=store)  # 61 + 23 positions: every ring of window 32 wraps
    assert seen[0][0] == len(second) - 48
    assert torch.equal(warm, m.generate(torch.tensor([second]), 24))
    assert m.generate_many([first, second], 6, slots=1) == [
        m.generate(torch.tensor([p]), 6)[0, len(p) :].tolist() for p in (first, second)
    ]


def test_the_docs_quote_the_committed_prefix_run() -> None:
    """docs/benchmarks.md's prefix-reuse table is what benchmarks/prefix_kinds.py renders from its committed results
    file; every row's tokens were checked against the plain cache in the run, and warm ran fewer tokens than cold."""
    import json
    from pathlib import Path

    from benchmark_scripts import load

    root = Path(__file__).resolve().parents[1]
    runs = sorted((root / "benchmarks" / "results").glob("prefix_kinds-*.json"))
    assert runs, "no result file of benchmarks/prefix_kinds.py in benchmarks/results/"
    script = load("prefix_kinds")
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == script.SCHEMA
    assert [r["model"] for r in result["rows"]] == list(script.MODELS)
    assert all(r["ran"]["warm"] == r["own"] + r["new_tokens"] - 1 < r["ran"]["cold"] for r in result["rows"])
    assert script.render(result) in (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")


# ---- speculation on rows of their own: each row back to what it kept ----


@pytest.mark.slow  # six generations of 40 tokens
@torch.no_grad()
def test_lookup_on_paged_and_prefix_rows_gives_greedys_tokens_on_every_kind_in_fewer_passes() -> None:
    """Each row goes back alone (``ModelCache.crop_row``): its blocks through the block table, a state per row to
    its mark. On the six-kind model the tokens are greedy's; on full layers alone, lookup takes fewer passes."""
    from attnlab.models.generation import decode
    from attnlab.models.generation.request import request_for
    from test_going_back import repeated

    m, prompt = every_kind(), repeated(12)
    greedy = m.generate(prompt, 40)
    for cache in ("paged", "prefix"):
        assert torch.equal(m.generate(prompt, 40, cache=cache, lookup=4), greedy), cache
        assert torch.equal(m.generate(prompt, 40, cache=cache, draft=every_kind(seed=3), draft_tokens=3), greedy)
    full = every_kind(layer_types=("full",) * 2, n_layers=2)
    decoding = decode(full, request_for(full, prompt, 40, {"lookup": 4, "cache": "paged"}))
    assert [t for drawn in decoding for _, t in drawn] == full.generate(prompt, 40)[0, prompt.shape[1] :].tolist()
    assert decoding.counts.passes < 40 and decoding.counts.kept > 0 and decoding.counts.rerun == 0


@torch.no_grad()
def test_a_row_goes_back_alone_and_a_refused_guess_keeps_nothing_at_a_block_end() -> None:
    """Two rows of a prefix cache; one takes a pass of guesses that ends at a block's end and goes back: its state
    is the mark's bitwise, the other row's is untouched, and the state the refused guesses left at the block's end
    is not kept (the tree would otherwise resume the next prompt from it)."""
    m = every_kind()
    store = PrefixCache.for_model(m, batch_size=2, max_len=96)
    for row, tokens in ((0, FIRST[:13]), (1, SECOND[:20])):
        store.admit(row, tokens, total=40)
        m.step(torch.tensor([tokens]), torch.arange(len(tokens))[None], store.views([row]))
    state = store.states[1]
    other = [t[1].clone() for t in state._tensors()]
    store.mark()
    at_mark = [t[0].clone() for t in state._tensors()]
    m.step(torch.tensor([FIRST[13:16]]), torch.arange(13, 16)[None], store.views([0]))  # ends at 16, a block's end
    assert 0 in state.ends[0]  # kept there, by the pass
    assert store.crop_row(0, 14) == 13  # a state per row: back to its mark
    assert all(torch.equal(t[0], a) for t, a in zip(state._tensors(), at_mark, strict=True))
    assert all(torch.equal(t[1], o) for t, o in zip(state._tensors(), other, strict=True))
    assert 0 not in state.ends[0] and store.blocks.length == [13, 20]
    with pytest.raises(ValueError, match=r"row 0 of this PagedStateCache holds 13 tokens and its mark is at 13"):
        state.reach_row(0, 12)
    with pytest.raises(ValueError, match=r"rows run on their own and go back one by one: crop_row\(row, n\)"):
        store.crop(10)


@pytest.mark.slow  # every variant of the zoo on paged rows, lookup
@torch.no_grad()
@pytest.mark.parametrize("variant", PAGED)
def test_every_zoo_variant_speculates_on_paged_rows_exactly(variant: str) -> None:
    torch.manual_seed(1)
    m = GPT(zoo_config(variant).with_(drop_rate=0.0)).eval()
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12] * 2 + [5, 6, 7, 8, 9]])
    assert torch.equal(m.generate(prompt, 48, cache="prefix", lookup=4), m.generate(prompt, 48))


@torch.no_grad()
def test_a_row_admitted_where_another_ran_starts_from_zeros_beside_a_running_row() -> None:
    """Rows of one group run through one view: a fresh row beside a running one is handed its state, which must be
    the zeros a layer starts from, not what the row's last sequence left there."""
    m = every_kind()
    store = PrefixCache.for_model(m, batch_size=2, max_len=64)
    for row in (0, 1):
        store.admit(row, FIRST[:5], total=10)
        m.step(torch.tensor([FIRST[:5]]), torch.arange(5)[None], store.views([row]))
    store.release(0)
    store.admit(0, [7], total=4)
    for state in store.states:
        view = state.rows([0, 1])
        assert view.length == 5  # the running row's: the view hands its states, the fresh row's among them
        assert all(not t[0].any() for t in _view_tensors(view)) and any(t[1].any() for t in _view_tensors(view))


def _view_tensors(view: object) -> list[torch.Tensor]:
    from attnlab.cache.state import ConvolutionCache, StateCache

    if isinstance(view, StateCache):
        return [view.matrix, *([view.conv] if view.has_conv else [])]
    assert isinstance(view, ConvolutionCache)
    return [view.conv]
