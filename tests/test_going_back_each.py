"""Going back "each" (issue 57): a recurrent or convolution state keeps the state after each token of a pass of
guesses, so a refused guess sends it back to the token itself and nothing runs again (attnlab.cache.going_back).

The recurrence's states after each token are its own (``each=True``: bitwise the state after the first t tokens);
a pass whose guesses are refused leaves the states it would have had without them, and no trace of what the
guesses were; greedy with lookup or a draft keeps greedy's tokens with no token run twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from attnlab.cache import ModelCache
from attnlab.cache.going_back import WAYS, ToEach, ToMark
from attnlab.cache.state import ConvolutionCache, StateCache
from attnlab.cache.ways import going_back_as
from attnlab.functional.convolution import short_convolution, short_convolution_reference
from attnlab.functional.kda import kimi_delta_rule
from attnlab.functional.recurrent import feature_map, gated_delta_rule, linear_attention
from attnlab.models import GPT
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for
from test_going_back import every_kind, held, repeated

ROOT = Path(__file__).resolve().parents[1]


def rules(t: int = 7) -> dict[str, Callable[..., tuple[torch.Tensor, Any]]]:
    """Each recurrence over random (1, 2, t, 4) inputs (float64), a function of form, state and each."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, t, 4, generator=g, dtype=torch.float64) for _ in range(3))
    unit_q, unit_k = F.normalize(q, dim=-1) / 2, F.normalize(k, dim=-1)
    decay = -torch.rand(1, 2, t, generator=g, dtype=torch.float64)
    beta = torch.rand(1, 2, t, generator=g, dtype=torch.float64)
    per_channel = -torch.rand(1, 2, t, 4, generator=g, dtype=torch.float64)
    return {
        "linear": lambda n, **o: linear_attention(feature_map(q[:, :, :n]), feature_map(k[:, :, :n]), v[:, :, :n], **o),
        "delta": lambda n, **o: gated_delta_rule(
            unit_q[:, :, :n], unit_k[:, :, :n], v[:, :, :n], decay[:, :, :n], beta[:, :, :n], **o
        ),
        "kda": lambda n, **o: kimi_delta_rule(
            unit_q[:, :, :n], unit_k[:, :, :n], v[:, :, :n], per_channel[:, :, :n], beta[:, :, :n], **o
        ),
    }


def parts(state: Any) -> tuple[torch.Tensor, ...]:
    """A state as its tensors: linear attention's (S, z), or the one matrix."""
    return state if isinstance(state, tuple) else (state,)


@pytest.mark.parametrize("rule", ["linear", "delta", "kda"])
def test_the_state_after_each_token_is_the_recurrences_own(rule: str) -> None:
    run = rules()[rule]
    out, each = run(7, form="recurrent", each=True)
    for t in range(1, 8):  # the state after token t, bitwise, is the state the recurrence ends with after t tokens
        _, alone = run(t, form="recurrent")
        for got, want in zip(parts(each), parts(alone), strict=True):
            assert torch.equal(got[:, :, t - 1], want), (rule, t)
    fast_out, fast_state = run(7, form="chunked", chunk_size=3)  # the fast form agrees on the output and the last
    torch.testing.assert_close(out, fast_out)
    for got, want in zip(parts(each), parts(fast_state), strict=True):
        torch.testing.assert_close(got[:, :, -1], want)
    with pytest.raises(ValueError, match=r"each=True returns the state after each token.*got form='chunked'"):
        run(7, form="chunked", each=True)


@pytest.mark.parametrize("kernel", [1, 2, 4])
def test_the_convolutions_inputs_hold_its_state_after_each_token(kernel: int) -> None:
    torch.manual_seed(0)
    x, weight, state = torch.randn(2, 6, 3), torch.randn(3, kernel), torch.randn(2, 3, kernel - 1)
    _, inputs = short_convolution(x, weight, state=state, each=True)
    _, readable = short_convolution_reference(x, weight, state=state, each=True)
    assert inputs.shape == (2, 3, kernel - 1 + 6) and torch.equal(inputs, readable)
    for t in range(7):  # slice [t : t + K - 1] is the state after the first t tokens, bitwise
        after = state if t == 0 else short_convolution(x[:, :t], weight, state=state)[1]
        assert torch.equal(inputs[:, :, t : t + kernel - 1], after)


def state_cache(**options: Any) -> StateCache:
    return StateCache(batch_size=1, num_heads=1, key_dim=2, value_dim=2, conv=(3, 2), **options)


def filled(t: int, start: float) -> tuple[torch.Tensor, torch.Tensor]:
    """t states whose values count the tokens (start + 1, start + 2, ...), and their convolution inputs."""
    marks = torch.arange(start + 1, start + t + 1)
    return marks[None, None, :, None, None].expand(1, 1, t, 2, 2), marks[None, None].expand(1, 3, t)


def test_a_state_goes_back_to_any_token_of_the_pass_and_no_further() -> None:
    cache = state_cache()
    cache.write(torch.zeros(1, 1, 2, 2), 5, conv=torch.zeros(1, 3, 2))
    assert not cache.each and cache.each_tokens(4) == 0  # no pass open: a plain write keeps nothing
    with pytest.raises(
        ValueError, match=r"has no pass open \(mark\(\) opens one.*holds 5 tokens and cannot go back to 4"
    ):
        cache.reach(4)
    cache.mark()
    states, new = filled(4, 0.0)
    cache.write_each(states, 4, inputs=torch.cat([torch.zeros(1, 3, 2), new], dim=2))
    assert cache.length == 9 and [cache.reach(n) for n in range(5, 10)] == [5, 6, 7, 8, 9]
    with pytest.raises(
        ValueError, match=r"keeps the state at its mark \(5\) and after tokens 6\.\.9 since: it cannot go back to 4"
    ):
        cache.crop(4)
    assert cache.marked_nbytes() == cache.nbytes() + states.nbytes + 3 * 6 * 4  # the copy, 4 states, 6 inputs
    cache.crop(7)  # after the second token of the pass: its state, its last K - 1 = 2 inputs (tokens 1 and 2)
    assert cache.length == 7 and bool((cache.matrix == 2).all()) and cache.conv[0, 0].tolist() == [1.0, 2.0]
    assert not cache.each and cache.marked_nbytes() == cache.nbytes()  # the pass closed: its states let go
    with pytest.raises(ValueError, match="has no pass open"):
        cache.crop(6)
    cache.mark()
    cache.write_each(filled(1, 10.0)[0], 1, inputs=torch.cat([cache.conv, filled(1, 10.0)[1]], dim=2))
    cache.crop(7)  # back to the mark itself: its copy
    assert cache.length == 7 and bool((cache.matrix == 2).all()) and cache.conv[0, 0].tolist() == [1.0, 2.0]


def test_spare_keeps_the_states_of_a_writes_last_tokens_only() -> None:
    cache = state_cache(spare=2)
    cache.mark()
    assert cache.each_tokens(6) == 2 and cache.each_tokens(1) == 1
    states, new = filled(6, 0.0)
    cache.write_each(states[:, :, 4:], 6, inputs=torch.cat([torch.zeros(1, 3, 2), new], dim=2))
    assert cache.reach(0) == 0 and cache.reach(5) == 5  # the mark, and the states of the last 2 tokens
    with pytest.raises(
        ValueError,
        match=r"after tokens 5\.\.6 since: it cannot go back to 3 \(a write keeps the states of its last spare=2",
    ):
        cache.reach(3)
    cache.crop(5)
    assert bool((cache.matrix == 5).all()) and cache.conv[0, 0].tolist() == [4.0, 5.0]


def test_the_writes_and_choices_that_do_not_fit_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"going_back must be one of \['each', 'mark'\].*got 'every'"):
        state_cache(going_back="every")
    with pytest.raises(ValueError, match=r"going_back must be one of.*got 3"):
        ConvolutionCache(batch_size=1, channels=2, kernel=3, going_back=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"spare must be None or an int in \[0, 65536\].*got -1"):
        state_cache(spare=-1)
    cache = state_cache()
    with pytest.raises(ValueError, match=r"keeps the states after each token only while a pass is open"):
        cache.write_each(filled(1, 0.0)[0], 1, inputs=torch.zeros(1, 3, 3))
    cache.mark()
    with pytest.raises(ValueError, match=r"has a pass open since its mark at 0: write_each\(\)"):
        cache.write(torch.zeros(1, 1, 2, 2), 1, conv=torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match=r"states after the last 3 tokens must be \(1, 1, 3, 2, 2\)"):
        cache.write_each(filled(2, 0.0)[0], 3, inputs=torch.zeros(1, 3, 5))
    assert cache.length == 0 and cache._after == []  # refused before anything was written
    marked = state_cache(going_back="mark")
    with pytest.raises(ValueError, match=r"\(going_back='mark'\) keeps the states after each token only while"):
        marked.write_each(filled(1, 0.0)[0], 1, inputs=torch.zeros(1, 3, 3))


def test_each_way_declares_itself_and_the_mark_twin_takes_nothing_of_each() -> None:
    for made, way in ((state_cache(), "each"), (state_cache(going_back="mark"), "mark")):
        assert isinstance(made, StateCache) and made.going_back == way
        assert made.capabilities.crop and made.capabilities.marks == (way == "mark")
    conv = ConvolutionCache(batch_size=1, channels=2, kernel=3, going_back="mark")
    assert isinstance(conv, ConvolutionCache) and conv.capabilities.marks
    assert WAYS[0] == "each" and StateCache.going_back == "each"  # the default, as docs/caches.md says
    for twin in (StateCache.ways["mark"], ConvolutionCache.ways["mark"]):
        for name in ("each", "each_tokens", "mark", "reach", "crop", "marked_nbytes"):
            assert getattr(twin, name) is not getattr(ToEach, name, None), (twin, name)
        assert twin.reach is ToMark.reach and twin.capabilities is ToMark.capabilities
    layers = every_kind().make_caches(batch_size=1, max_len=8, spare=3)
    assert not layers.capabilities.marks and ModelCache(going_back_as(layers, "mark")).capabilities.marks


@torch.no_grad()
def test_a_refused_pass_leaves_every_state_as_without_its_guesses() -> None:
    """A pass of 1 certain token and 3 guesses, all refused and cropped. The oracle of the same calls: the same
    pass with other guesses, cropped alike, leaves every layer's state bitwise equal (no trace of what the guesses
    were). Against a run that never saw any guesses (its pass 1 token, so its matrix products group the rows
    otherwise): equal to float32's last bits, while the state after a guess differs by far more."""
    m = every_kind()
    text = repeated()[:, :20]  # (1, 20): past the window of 4

    def after(guesses: list[int] | None, crop: int = 20) -> ModelCache:
        cache = m.make_caches(batch_size=1, max_len=64, spare=4)
        m(text[:, :19], caches=cache)
        cache.mark()  # as the decode loop does for a cache without marks: where the pass starts
        m(torch.cat([text[:, 19:], torch.tensor([guesses or []], dtype=torch.long)], dim=1), caches=cache)
        assert cache.crop(crop) == crop  # the token itself: nothing runs again
        return cache

    seen, other, never = after([60, 61, 62]), after([1, 2, 3]), after(None)
    for got, want in zip(held(seen), held(other), strict=True):
        assert torch.equal(got, want)
    for got, want in zip(held(seen), held(never), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # a few ulps of float32
    one_guess = after([60, 61, 62], crop=21)  # the state after the first guess: what a wrong index would keep
    for layer, wrong in zip(seen, one_guess, strict=True):
        if isinstance(layer, StateCache):
            assert isinstance(wrong, StateCache) and (layer.matrix - wrong.matrix).abs().max() > 1e-3
    for layer in seen:  # every state went back to the token, and lets go of the pass's states
        if isinstance(layer, StateCache | ConvolutionCache):
            assert layer.length == 20 and not layer.each and layer.marked_nbytes() == layer.nbytes()


@torch.no_grad()
def test_a_prompt_read_in_a_pass_runs_its_fast_form_up_to_the_states_it_keeps() -> None:
    """A pass of 20 tokens into caches that keep a write's last 2 states (spare=2: the first lookup pass reads the
    prompt beside its guesses): the chunked form up to them, the recurrence through them, the same logits as a
    plain cache's, and a crop to either of the 2 leaves the states of a run of that many tokens."""
    m = every_kind()
    text = repeated()[:, :20]
    plain = m.make_caches(batch_size=1, max_len=32)
    want = m(text, caches=plain)
    cache = m.make_caches(batch_size=1, max_len=32, spare=2)
    cache.mark()
    torch.testing.assert_close(m(text, caches=cache), want, rtol=1e-5, atol=1e-5)
    assert [c.each_tokens(20) for c in cache if isinstance(c, StateCache)] == [2, 2, 2]
    with pytest.raises(ValueError, match=r"after tokens 19\.\.20 since: it cannot go back to 18"):
        cache.crop(18)
    assert cache.crop(19) == 19
    never = m.make_caches(batch_size=1, max_len=32)
    m(text[:, :19], caches=never)
    for got, want_held in zip(held(cache), held(never), strict=True):
        torch.testing.assert_close(got, want_held, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_plain_decode_opens_no_pass_and_keeps_nothing_more() -> None:
    m = every_kind()
    cache = m.make_caches(batch_size=1, max_len=32, spare=5)
    request = request_for(m, repeated()[:, :16], 8, {})
    assert len([t for drawn in decode(m, replace(request, cache=cache)) for t in drawn]) == 8
    states = [c for c in cache if isinstance(c, StateCache | ConvolutionCache)]
    assert states and all(c.length == 23 and c.most_held_back == 0 and not c.each for c in states)


def decoded(m: GPT, prompt: torch.Tensor, new: int, options: dict[str, Any], way: str) -> tuple[list[int], Any]:
    request = request_for(m, prompt, new, options)
    spare = 0 if request.proposer is None else request.proposer.k + 1
    cache = ModelCache(going_back_as(m.make_caches(batch_size=1, max_len=prompt.shape[1] + new, spare=spare), way))
    decoding = decode(m, replace(request, cache=cache))
    return [t for drawn in decoding for _, t in drawn], decoding.counts


@pytest.mark.slow  # two decodes of 100 tokens: seconds on a busy machine
@torch.no_grad()
def test_lookup_on_every_kind_gives_greedys_tokens_and_runs_nothing_again() -> None:
    """Greedy without a cache is the reference. Going back "each", no token runs twice and fewer passes run than
    going back to a mark, which runs the kept guesses again (the effect: take "each" out and the counts move)."""
    m = every_kind(seed=1)
    prompt = repeated()
    greedy = m.generate(prompt, 100, use_cache=False)[0, prompt.shape[1] :].tolist()
    tokens, counts = decoded(m, prompt, 100, {"lookup": 4}, "each")
    marked_tokens, marked = decoded(m, prompt, 100, {"lookup": 4}, "mark")
    assert tokens == greedy and marked_tokens == greedy
    assert counts.rerun == 0 and counts.kept > 40 and marked.rerun > 0, (counts, marked)
    assert counts.passes < marked.passes < 100, (counts, marked)  # 46 against 65 here


@pytest.mark.slow  # seconds long: drafts of another kind, and bfloat16
@torch.no_grad()
def test_drafts_and_bfloat16_going_back_each_keep_greedys_tokens_and_float32_states() -> None:
    hybrid, full = every_kind(seed=2), every_kind(seed=3, layer_types=("full",) * 6, window=None)
    prompt = repeated()
    for m, draft in ((hybrid, full), (full, hybrid), (hybrid, every_kind(seed=4))):
        greedy = m.generate(prompt, 24)
        assert torch.equal(m.generate(prompt, 24, draft=draft, draft_tokens=3), greedy)  # the default: "each"
    low = every_kind(seed=1).to(torch.bfloat16)
    greedy = low.generate(prompt, 32)
    assert torch.equal(low.generate(prompt, 32, lookup=4), greedy)
    cache = low.make_caches(batch_size=1, max_len=64, spare=5)
    low(prompt[:, :20], caches=cache)
    cache.mark()
    low(prompt[:, 20:24], caches=cache)
    kept = [t for c in cache if isinstance(c, StateCache) for _, _, states in c._after for t in states[:1]]
    assert kept and {t.dtype for t in kept} == {torch.float32}  # the states after each token: float32 too
    assert cache.crop(22) == 22


def test_the_docs_quote_the_committed_run_and_its_pick_is_the_default() -> None:
    """docs/benchmarks.md's section is what benchmarks/going_back.py renders from its committed results file, and
    the way the run picks is the default (the first of WAYS) and the one docs/caches.md names."""
    from benchmark_scripts import load

    runs = sorted((ROOT / "benchmarks" / "results").glob("going_back-*.json"))
    assert runs, "no result file of benchmarks/going_back.py in benchmarks/results/"
    script = load("going_back")
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == script.SCHEMA
    assert [r["text"] for r in result["rows"]] == list(script.TEXTS)
    assert script.render(result) in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    picked, why = script.verdict(result)
    assert picked == WAYS[0]
    assert " ".join(why.split()) in " ".join((ROOT / "docs" / "caches.md").read_text(encoding="utf-8").split())
