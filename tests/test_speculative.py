"""Speculative decoding (issue 24, part 4): prompt lookup and a draft model, the same tokens greedy and the same
distribution sampled, and every misuse refused before anything runs."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import Draft, Request, Sampling, Stop, decode, lookup_guess


def model(backend: str = "sdpa", *, layers: int = 2, dim: int = 32, rope: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=64,
        context_length=128,
        emb_dim=dim,
        n_heads=4,
        n_layers=layers,
        rope=rope,
        drop_rate=0.0,
        backend=backend,
    )
    return GPT(config).eval()


def repeated() -> torch.Tensor:
    part = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    return torch.cat([part, part, part[:, :8]], dim=1)  # a text that repeats itself: lookup has guesses


def test_lookup_guesses_what_followed_the_latest_earlier_occurrence() -> None:
    assert lookup_guess([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2, 3) == [7, 8]  # the latest, not the first
    assert lookup_guess([5, 6, 1, 2, 4], 3, 3) == []  # (1, 2, 4), (2, 4), (4): never seen before
    assert lookup_guess([5, 4, 6, 2, 4], 3, 3) == [6, 2, 4]  # falls back to the last token alone


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash"])
def test_greedy_speculation_gives_the_tokens_of_plain_greedy_decoding(backend: str) -> None:
    m = model(backend)
    draft = model(backend, layers=1, dim=16, seed=3)
    prompt = repeated()
    plain = m.generate(prompt, 20)
    assert torch.equal(m.generate(prompt, 20, lookup=4), plain)
    assert torch.equal(m.generate(prompt, 20, draft=draft, draft_tokens=3), plain)
    eos = int(plain[0, prompt.shape[1] + 5])  # stops at the first eos, as plain decoding does
    assert torch.equal(m.generate(prompt, 20, lookup=4, eos_id=eos), m.generate(prompt, 20, eos_id=eos))


def test_a_model_checking_its_own_guesses_keeps_every_one() -> None:
    m = model()
    draft = Draft(m, k=4, capacity=128)
    cache = m.make_caches(batch_size=1, max_len=128)
    run = decode(m, Request(prompts=repeated().tolist(), cache=cache, stop=Stop(max_new_tokens=20), proposer=draft))
    passes = list(run)
    assert sum(map(len, passes)) == 20 and run.counts.kept == run.counts.guessed == 16
    assert run.counts.passes == len(passes) == 4


@pytest.mark.parametrize("point_mass", [True, False])
def test_a_refused_guess_is_redrawn_so_the_token_has_the_models_distribution(point_mass: bool) -> None:
    """Draw a guess from q, keep it with min(1, p/q), else draw from (p - q)+: the kept-or-redrawn token must be
    distributed as p. 8,000 draws against p by a chi-square test at the 0.1% level (seeded: not flaky)."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1])
    generator = torch.Generator().manual_seed(0)
    sampling = Sampling(temperature=1.0, generator=generator)
    counts = torch.zeros(5)
    n = 8_000
    for _ in range(n):
        guess = 2 if point_mass else int(torch.multinomial(q, 1, generator=generator))
        instead = sampling.accept(p, None if point_mass else q, guess)
        counts[guess if instead is None else instead] += 1
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (counts / n).tolist()  # 4 degrees of freedom, p = 0.001


def test_sampled_speculation_is_reproducible_and_stays_in_the_vocabulary() -> None:
    m = model()
    runs = [
        m.generate(repeated(), 12, lookup=3, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(4))
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1]) and int(runs[0].max()) < 64


def test_speculation_refuses_what_it_cannot_do_before_running() -> None:
    m = model()
    prompt = repeated()
    with pytest.raises(ValueError, match="goes back after a refused guess; use_cache=False keeps no cache to go"):
        m.generate(prompt, 4, lookup=2, use_cache=False)  # a batch speculates: tests/test_batched_speculation.py
    with pytest.raises(ValueError, match="not both"):
        m.generate(prompt, 4, lookup=2, draft=m)
    for cache, why in (("h2o", "a refused guess may already have evicted a key"), ("sink", "out of its window")):
        with pytest.raises(ValueError, match=why):
            m.generate(prompt, 4, lookup=2, cache=cache)
    with pytest.raises(ValueError, match="the draft model's vocabulary \\(32\\) must be the model's \\(64\\)"):
        torch.manual_seed(0)
        other = GPT(GPTConfig(vocab_size=32, context_length=64, emb_dim=16, n_heads=2, n_layers=1, rope=True))
        m.generate(prompt, 4, draft=other)
    for rope in (False, True):  # learned positions end there; rotary ones were not trained past it either
        with pytest.raises(ValueError, match="48 tokens and max_new_tokens is 82: 129 positions to run, more than "):
            model(rope=rope).generate(prompt, 128 - 48 + 2, lookup=4)
    with pytest.raises(ValueError, match="lookup must be"):
        m.generate(prompt, 4, lookup=0)


def nudged(m: GPT, scale: float, seed: int) -> GPT:
    """``m`` with noise added to every weight: a draft that agrees with the model on some tokens, not all."""
    import copy

    draft = copy.deepcopy(m)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return draft


@torch.no_grad()
def spelled_out(m: GPT, draft: GPT, prompt: list[int], new: int, k: int) -> tuple[int, int, int]:
    """Greedy speculation written out without a cache: per pass the draft guesses up to k tokens (each its argmax
    over the whole text so far), the model keeps the guesses its own argmax agrees with, then adds one of its
    own. The (passes, guessed, kept) counts that a draft whose cache holds only what the model kept must give."""
    tokens, passes, guessed, kept = list(prompt), 0, 0, 0
    while len(tokens) - len(prompt) < new:
        want = min(k, new - (len(tokens) - len(prompt)) - 1)
        guesses: list[int] = []
        for _ in range(want):
            guesses.append(int(draft(torch.tensor([tokens + guesses]))[0, -1].argmax()))
        logits = m(torch.tensor([tokens + guesses]))[0, -(want + 1) :]  # (want + 1, V)
        agree = 0
        while agree < want and int(logits[agree].argmax()) == guesses[agree]:
            agree += 1
        tokens += [*guesses[:agree], int(logits[agree].argmax())]
        passes, guessed, kept = passes + 1, guessed + want, kept + agree
    return passes, guessed, kept


def test_a_draft_that_is_refused_gives_the_passes_of_speculation_written_out() -> None:
    """The passes a guess saves, with a draft that disagrees sometimes: its cache must keep only what the model
    kept (a draft whose cache kept its refused guesses guesses from a text that is not the text, and runs past
    its capacity). Counted against the loop written out without caches; both refusals and keeps happen."""
    m = model()
    draft_model = nudged(m, 0.05, seed=5)
    prompt, new, k = repeated()[0].tolist(), 30, 4
    want = spelled_out(m, draft_model, prompt, new, k)
    draft = Draft(draft_model, k=k, capacity=len(prompt) + new)  # exactly the text's length: no room for refusals
    cache = m.make_caches(batch_size=1, max_len=128)
    run = decode(m, Request(prompts=[prompt], cache=cache, stop=Stop(max_new_tokens=new), proposer=draft))
    passes = list(run)
    assert (run.counts.passes, run.counts.guessed, run.counts.kept) == want and len(passes) == want[0]
    assert 0 < run.counts.kept < run.counts.guessed  # the draft was refused, and kept, some of the time
