"""Speculation on every kind of layer (issue 57): each layer's state goes back after a refused guess, exactly.

A full cache crops to any token; a sliding ring keeps ``spare`` slots more, so its window is whole after any of
the last ``spare`` tokens is refused; a recurrent or convolution state goes back to the mark the loop set before
the pass, and the tokens kept after it run again (``going_back="mark"``; the default, the state after each token
kept, is tests/test_going_back_each.py's). One model here has a layer of each kind.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnlab.cache import KVCache, ModelCache, SlidingWindowCache
from attnlab.cache.state import ConvolutionCache, StateCache
from attnlab.cache.ways import going_back_as
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for
from attnlab.models.zoo import VARIANTS, zoo_config

EVERY_KIND = ("conv", "sliding", "delta", "kda", "full", "linear")


def every_kind(seed: int = 0, **changes: object) -> GPT:
    """Six layers, one of each kind (window 4: the ring wraps on any prompt here), random weights."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=64,
        context_length=128,
        emb_dim=32,
        n_heads=4,
        n_layers=6,
        rope=True,
        drop_rate=0.0,
        window=4,
        layer_types=EVERY_KIND,
        conv_kernel=4,
    )
    return GPT(config.with_(**changes)).eval()


def repeated(n: int = 12) -> torch.Tensor:
    part = torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(1))
    return torch.cat([part, part, part[:, :4]], dim=1)  # (1, 2n + 4): a text that repeats, lookup has guesses


def held(cache: ModelCache) -> list[torch.Tensor]:
    """What each layer holds for the tokens it keeps: a state's tensors; a ring's keys and values at the positions a
    next query can see; a full cache's filled slots."""
    out: list[torch.Tensor] = []
    for layer in cache:
        if isinstance(layer, StateCache):
            out += [layer.matrix, layer.normalizer, layer.conv, layer._length]
        elif isinstance(layer, ConvolutionCache):
            out += [layer.conv, layer._length]
        elif isinstance(layer, SlidingWindowCache):
            positions = layer.positions()
            order = positions.argsort()[positions.sort().values >= layer.length - layer.window]  # the window, in order
            out += [positions[order], layer.k_cache[:, :, order], layer.v_cache[:, :, order]]
        else:
            assert isinstance(layer, KVCache)
            out += [layer.k_cache[:, :, : layer.length], layer.v_cache[:, :, : layer.length]]
    return out


@torch.no_grad()
def test_a_refused_pass_sends_every_kind_of_state_back_bitwise() -> None:
    """The state after a pass whose guesses are all refused, taken back, against a cache that never saw them."""
    m = every_kind()
    text = repeated()[:, :20]  # (1, 20): past the window of 4
    guesses = torch.tensor([[60, 61, 62]])
    never = m.make_caches(batch_size=1, max_len=64, spare=4)  # the same calls and shapes, without the guesses
    m(text[:, :19], caches=never)
    m(text[:, 19:], caches=never)
    seen = ModelCache(going_back_as(m.make_caches(batch_size=1, max_len=64, spare=4), "mark"))
    m(text[:, :19], caches=seen)
    seen.mark()  # as the decode loop does: before the last token held for certain, then the guesses
    m(torch.cat([text[:, 19:], guesses], dim=1), caches=seen)
    assert seen.crop(20) == 19  # the recurrent states go back to their mark; every layer with them
    m(text[:, 19:], caches=seen)  # the token kept runs again
    for got, want in zip(held(seen), held(never), strict=True):
        assert torch.equal(got, want)
    ring = seen[1]
    assert isinstance(ring, SlidingWindowCache) and ring.slots == 8 and ring.length == 20


@torch.no_grad()
def test_a_model_of_full_and_sliding_layers_goes_back_to_the_token_itself() -> None:
    m = every_kind(layer_types=("sliding", "full", "sliding", "full", "sliding", "full"))
    text = repeated()[:, :20]
    cache, never = (m.make_caches(batch_size=1, max_len=64, spare=4) for _ in range(2))
    m(text[:, :19], caches=cache)
    m(text[:, :19], caches=never)
    cache.mark()
    m(torch.cat([text[:, 19:], torch.tensor([[60, 61, 62]])], dim=1), caches=cache)
    assert cache.crop(21) == 21  # no layer needs a mark: nothing runs again
    assert cache.crop(19) == 19  # every token of the pass refused: 4 back, the rings' spare
    for got, want in zip(held(cache), held(never), strict=True):
        assert torch.equal(got, want)


def test_going_back_further_than_a_state_keeps_is_refused_and_changes_nothing() -> None:
    ring = SlidingWindowCache(batch_size=1, num_kv_heads=1, head_dim=2, window=4, spare=2)
    ring.update(torch.ones(1, 1, 9, 2), torch.ones(1, 1, 9, 2))
    with pytest.raises(
        ValueError, match=r"holds 9 tokens and room for 2 refused ones: it can go back to 7\.\.9, not 6"
    ):
        ring.crop(6)
    assert ring.length == 9
    state = StateCache(batch_size=1, num_heads=1, key_dim=2, value_dim=2, going_back="mark")
    state.write(torch.ones(1, 1, 2, 2), 5)
    with pytest.raises(
        ValueError, match=r"keeps no state before its latest 5 tokens: it cannot go back to 3; mark\(\)"
    ):
        state.crop(3)
    state.mark()
    state.write(torch.full((1, 1, 2, 2), 2.0), 3)
    with pytest.raises(ValueError, match=r"\(its mark is at 5\): it cannot go back to 4"):
        state.crop(4)
    assert state.length == 8 and bool((state.matrix == 2).all())
    assert state.reach(8) == 8 and state.reach(6) == 5
    state.crop(7)
    assert state.length == 5 and bool((state.matrix == 1).all())
    assert state.marked_nbytes() == state.matrix.nbytes  # what going back costs: one more state (no normalizer)


@torch.no_grad()
def test_lookup_on_every_kind_of_layer_gives_greedys_tokens_in_fewer_passes() -> None:
    """Greedy without a cache is the reference. The text repeats; a random model falls into a cycle too, which
    lookup then guesses: fewer passes than tokens (with lookup off, one pass a token)."""
    m = every_kind(seed=1)
    prompt = repeated()
    greedy = m.generate(prompt, 100, use_cache=False)
    marked = ModelCache(going_back_as(m.make_caches(batch_size=1, max_len=prompt.shape[1] + 100, spare=5), "mark"))
    decoding = decode(m, replace(request_for(m, prompt, 100, {"lookup": 4}), cache=marked))
    new = [token for drawn in decoding for _, token in drawn]
    assert new == greedy[0, prompt.shape[1] :].tolist()
    counts = decoding.counts
    assert counts.passes < 80 and counts.kept > 40, counts  # 65 passes, 54 kept here
    assert 0 < counts.rerun < counts.kept, counts  # a refused pass sends the states back: kept tokens run again


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
@torch.no_grad()
def test_a_draft_of_another_kind_gives_greedys_tokens_both_ways() -> None:
    hybrid, full = every_kind(seed=2), every_kind(seed=3, layer_types=("full",) * 6, window=None)
    prompt = repeated()
    for m, draft in ((hybrid, full), (full, hybrid), (hybrid, every_kind(seed=4))):
        greedy = m.generate(prompt, 24)
        assert torch.equal(m.generate(prompt, 24, draft=draft, draft_tokens=3), greedy)


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
@torch.no_grad()
def test_bfloat16_speculation_on_every_kind_keeps_greedys_tokens_and_float32_states() -> None:
    m = every_kind(seed=1).to(torch.bfloat16)
    prompt = repeated()
    greedy = m.generate(prompt, 32)
    assert torch.equal(m.generate(prompt, 32, lookup=4), greedy)
    assert torch.equal(m.generate(prompt, 32, draft=every_kind(seed=5).to(torch.bfloat16), draft_tokens=3), greedy)
    caches = list(m.make_caches(batch_size=1, max_len=8))
    assert {c.matrix.dtype for c in caches if isinstance(c, StateCache)} == {torch.float32}  # warm or cold alike
    convolved = [c.conv.dtype for c in caches if isinstance(c, ConvolutionCache)]
    assert convolved == [torch.bfloat16]  # a convolution's last inputs: bfloat16 values kept as they are


@pytest.mark.slow  # every variant of the zoo, two proposers each
@torch.no_grad()
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_zoo_variant_speculates_exactly(variant: str) -> None:
    torch.manual_seed(1)
    m = GPT(zoo_config(variant).with_(drop_rate=0.0)).eval()
    torch.manual_seed(2)
    draft = GPT(zoo_config("hybrid-conv" if variant != "hybrid-conv" else "mha").with_(drop_rate=0.0)).eval()
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12] * 2 + [5, 6, 7, 8, 9]])  # 21 tokens; the window is 32
    greedy = m.generate(prompt, 48)  # 69 positions: every ring wraps (plain greedy equals no cache: test_models)
    assert torch.equal(m.generate(prompt, 48, lookup=4), greedy)
    assert torch.equal(m.generate(prompt, 48, draft=draft, draft_tokens=3), greedy)


@pytest.mark.slow  # 1,000 draws
def test_sampling_through_a_draft_on_recurrent_layers_gives_the_models_distribution() -> None:
    """The first two new tokens, drawn 1,000 times with a draft of one guess, against the model's own joint
    distribution p(x1) p(x2 | x1) (chi-square over the 25 pairs at the 0.1% level, seeded). Where the guess is
    refused, x2 is drawn after the states went back to their mark: a state that kept the refused guess would
    draw x2 from another distribution."""
    changes: dict[str, object] = dict(vocab_size=5, emb_dim=8, n_heads=2, n_layers=3, window=2)
    changes["layer_types"] = ("delta", "sliding", "kda")
    m, draft = every_kind(1, **changes), every_kind(2, **changes)
    with torch.no_grad():  # weights three times as large: the states sway the next token (a state that kept the
        for p in m.parameters():  # refused guess then scores about 148 here, against 8)
            p.mul_(3.0)
    prompt = torch.tensor([[0, 3, 1, 4]])
    with torch.no_grad():
        first = torch.softmax(m(prompt)[0, -1], dim=-1)  # (5,)
        after = torch.softmax(m(torch.cat([prompt.repeat(5, 1), torch.arange(5)[:, None]], dim=1))[:, -1], dim=-1)
    joint = (first[:, None] * after).flatten()  # (25,): p(x1) p(x2 | x1)
    generator, n, counts = torch.Generator().manual_seed(0), 1_000, torch.zeros(25)
    for _ in range(n):
        out = m.generate(prompt, 2, draft=draft, draft_tokens=1, temperature=1.0, generator=generator)
        counts[int(out[0, 4]) * 5 + int(out[0, 5])] += 1
    chi2 = float(((counts / n - joint) ** 2 / joint).sum()) * n
    assert chi2 < 51.18, (chi2, counts / n, joint)  # 24 degrees of freedom, p = 0.001


def test_the_docs_quote_the_committed_speculation_run() -> None:
    """docs/benchmarks.md's table of speculation on a hybrid and a sliding model is what benchmarks/
    speculative_kinds.py renders from its committed results file; every row's tokens were checked in the run."""
    import json
    from pathlib import Path

    from benchmark_scripts import load

    root = Path(__file__).resolve().parents[1]
    runs = sorted((root / "benchmarks" / "results").glob("speculative_kinds-*.json"))
    assert runs, "no result file of benchmarks/speculative_kinds.py in benchmarks/results/"
    script = load("speculative_kinds")
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == script.SCHEMA
    assert [(r["model"], r["text"]) for r in result["rows"]] == [
        (kind, text) for kind in script.MODELS for text in ("copies", "does not copy")
    ]
    assert script.render(result) in (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
