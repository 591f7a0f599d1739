"""Each technique of the cache lab and of speculative decoding does what it claims, not only stays exact (issue 30).

A cache that evicts the wrong keys, a prefix store that recomputes everything or a lookup that never guesses
is still exact; these tests check the effect instead: the keys a policy keeps, worked out here from the
attention weights by the paper's rule; the error a quantizer leaves, against each group's own range; the
positions a shared prefix skips; the passes a guess saves. Each was broken on purpose once (the closing note
of issue 30 lists how) and went red.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import pytest
import torch

from attnlab import Attention
from attnlab.cache import EvictingCache, PrefixCache, QuantizedKVCache
from attnlab.models import GPT, GPTConfig


def layer(seed: int = 0) -> Attention:
    torch.manual_seed(seed)
    return Attention(d_in=16, num_heads=4, num_kv_heads=2, backend="sdpa").eval()


def weights_by_hand(attn: Attention, x: torch.Tensor, held: list[int], query: int) -> torch.Tensor:
    """The attention (summed over heads) that token ``query`` of x (1, T, d_in) gives the keys at ``held``,
    from the layer's projections and a softmax written here: no cache, no kernel of attnlab's."""
    q, k, _ = attn.split_qkv(x)  # q (1, H, T, D), k (1, Hkv, T, D)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (1, H, T, D): each query head's kv head
    scores = torch.einsum("hd,hsd->hs", q[0, :, query], k[0][:, held]) * q.shape[-1] ** -0.5  # (H, |held|)
    return torch.softmax(scores, dim=-1).sum(dim=0)  # (|held|,)


# ---- eviction: the keys each policy keeps ----


def test_h2o_keeps_the_recent_keys_and_the_heaviest_hitters_by_accumulated_attention() -> None:
    """Heavy-Hitter Oracle, worked out here step by step: every key adds the attention it gets at each step;
    past the budget, the latest ``recent`` stay and the ``budget - recent`` heaviest of the rest. At some step
    the last step's weights alone would keep other keys: a policy that does not accumulate fails."""
    attn, budget, recent = layer(), 6, 3
    x = torch.randn(1, 30, 16, generator=torch.Generator().manual_seed(1))
    cache = EvictingCache(batch_size=1, num_kv_heads=2, head_dim=4, budget=budget, policy="h2o", recent=recent)
    held: list[int] = []
    got: dict[int, float] = {}
    disagreements = 0
    with torch.no_grad():
        for p in range(30):
            attn(x[:, p : p + 1], cache=cache)
            held.append(p)
            got[p] = 0.0
            step = weights_by_hand(attn, x[:, : p + 1], held, p)
            for key, w in zip(held, step.tolist(), strict=True):
                got[key] += w
            if len(held) > budget:
                rest = held[:-recent]
                heavy = sorted(rest, key=got.__getitem__, reverse=True)[: budget - recent]
                by_one_step = sorted(rest, key=lambda key: float(step[held.index(key)]), reverse=True)
                disagreements += set(heavy) != set(by_one_step[: budget - recent])
                held = sorted(heavy) + held[-recent:]
            assert cache.positions[0].tolist() == held, f"after token {p}"
    assert disagreements > 0  # the case tells accumulated scores from one step's
    assert sorted(cache.evicted[0] + held) == list(range(30))


def test_snapkv_keeps_what_the_observation_window_attends_most_pooled_over_neighbours() -> None:
    """SnapKV, worked out here: the prompt's last ``observe`` queries vote for the keys before them (attention
    summed over the window's queries and every head), votes averaged over 7 neighbours (zeros past the
    ends), the top ``budget - observe`` kept with the window itself. The last query alone, or the votes
    unpooled, would keep other keys."""
    attn, budget, window, t = layer(2), 12, 6, 40
    x = torch.randn(1, t, 16, generator=torch.Generator().manual_seed(3))
    cache = EvictingCache(batch_size=1, num_kv_heads=2, head_dim=4, budget=budget, policy="snapkv", observe=window)
    with torch.no_grad():
        attn(x, cache=cache)
        rows = [weights_by_hand(attn, x, list(range(i + 1)), i) for i in range(t - window, t)]
    votes = torch.stack([r[: t - window] for r in rows]).sum(dim=0)  # (T - w,)
    pooled = torch.tensor(
        [sum(float(votes[j]) for j in range(i - 3, i + 4) if 0 <= j < t - window) / 7 for i in range(t - window)]
    )

    def choice(scores: torch.Tensor) -> list[int]:
        return sorted(scores.topk(budget - window).indices.tolist()) + list(range(t - window, t))

    assert cache.positions[0].tolist() == choice(pooled)
    assert choice(pooled) != choice(votes) and choice(pooled) != choice(rows[-1][: t - window])


# ---- quantized keys and values: within half a step of each group's own range ----


def worst_error_in_half_steps(bits: int) -> float:
    """The largest |dequantized - exact| over a cache's quantized tokens, in half steps of the range each one
    was quantized over: a key's channel within its group of 32 tokens, a value's channels of its token."""
    t, g, residual = 160, 32, 32
    generator = torch.Generator().manual_seed(0)
    channel_scale = torch.tensor([8.0, 0.1, 1, 1, 3, 0.5, 1, 20])  # keys' few large channels (KIVI)
    k = torch.randn(1, 2, t, 8, generator=generator) * channel_scale
    v = torch.randn(1, 2, t, 8, generator=generator)
    cache = QuantizedKVCache(batch_size=1, num_kv_heads=2, head_dim=8, max_len=t, bits=bits, group_size=g)
    for p in range(t):
        cache.update(k[:, :, p : p + 1], v[:, :, p : p + 1])
    keys, values = cache.read()
    old = t - residual  # tokens before the exact ring: read quantized, groups 0 .. old / g - 1 final
    half = (2**bits - 1) * 2
    groups = k[:, :, :old].unflatten(2, (old // g, g))  # (1, Hkv, N, G, D)
    key_step = (groups.amax(3) - groups.amin(3)).repeat_interleave(g, dim=2) / half  # (1, Hkv, old, D)
    value_step = (v[:, :, :old].amax(-1, keepdim=True) - v[:, :, :old].amin(-1, keepdim=True)) / half
    key_error = ((keys[:, :, :old] - k[:, :, :old]).abs() / key_step).max()
    value_error = ((values[:, :, :old] - v[:, :, :old]).abs() / value_step).max()
    assert torch.equal(keys[:, :, old:t], k[:, :, old:]) and torch.equal(values[:, :, old:t], v[:, :, old:])
    return float(max(key_error, value_error))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_caches_are_within_half_a_step_of_each_groups_own_range(bits: int) -> None:
    # float16 scales and zeros round each step by at most 2^-11 of itself, a few levels away: 1% covers it
    assert 0.5 < worst_error_in_half_steps(bits) <= 1.01


def test_a_quantizer_one_bit_short_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    quantized_cache = importlib.import_module("attnlab.cache.quantized")  # the module: the package names a factory so
    real = quantized_cache.quantize
    monkeypatch.setattr(quantized_cache, "quantize", lambda x, low, high, bits: real(x, low, high, bits - 1))
    assert worst_error_in_half_steps(8) > 1.5  # a step of 7 bits is two of 8


# ---- prefix sharing: what the model runs ----


def positions_seen(m: GPT) -> list[int]:
    """Tokens the first block is given, call by call (a hook on it; the counters of the cache are not asked)."""
    seen: list[int] = []
    m.trf_blocks[0].register_forward_pre_hook(lambda _, args, kwargs: seen.append(args[0].shape[1]), with_kwargs=True)
    return seen


def tiny(seed: int = 0, **overrides: object) -> GPT:
    torch.manual_seed(seed)
    values: dict = dict(vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_layers=2, rope=True, drop_rate=0.0)
    return GPT(GPTConfig(**{**values, **overrides})).eval()


def test_a_shared_prefix_is_not_run_again_and_a_warm_prompt_costs_its_suffix_alone() -> None:
    m = tiny()
    seen = positions_seen(m)
    system = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    first, second = [*system, 1, 2, 3, 4, 5], [*system, 6, 7, 8, 9, 10]
    store = PrefixCache.for_model(m, batch_size=1, max_len=64)
    m.generate(torch.tensor([first]), 3, cache=store)
    assert seen == [45, 1, 1]  # cold: the whole prompt, then a token a step
    seen.clear()
    m.generate(torch.tensor([second]), 3, cache=store)
    assert seen == [45 - 32, 1, 1]  # warm: the two full blocks of the shared 40 tokens are not run again
    seen.clear()
    m.generate_many([first, second], 3, slots=1, cache=store)
    assert seen == [45 - 32, 1, 1] * 2  # both prompts now find their blocks


def test_a_prefix_store_kept_across_calls_makes_room_for_every_running_row() -> None:
    """Calls of a batch of 2 and of generate_many, one after another on one store: each has room for all its
    rows (the store lets go of old prefixes), and each gets what it gets without the store."""
    m = tiny()
    store = PrefixCache.for_model(m, batch_size=2, max_len=48)
    for call in range(5):
        ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(call))
        assert torch.equal(m.generate(ids, 10, cache=store), m.generate(ids, 10))
        prompts = [torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(10 + call)).tolist()] * 3
        alone = m.generate(torch.tensor(prompts[:1]), 10)[0, 30:].tolist()
        assert m.generate_many(prompts, 10, slots=2, cache=store) == [alone] * 3
    assert all(int(n) == 0 for n in store.table.lengths)  # every row given back at the end of its call


def test_a_prefix_store_refuses_other_weights_than_those_that_filled_it() -> None:
    m, other = tiny(), tiny(seed=1)
    store = PrefixCache.for_model(m, batch_size=1, max_len=64)
    prompt = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(2))
    m.generate(prompt, 2, cache=store)
    for model in (other, m):
        if model is m:
            with torch.no_grad():
                m.out_head.weight.add_(0.1)  # trained since: its keys are no longer these
        with pytest.raises(ValueError, match="holds keys and values computed by other weights"):
            model.generate(prompt, 2, cache=store)
        with pytest.raises(ValueError, match="call clear\\(\\) on it or build a new one"):
            model.generate_many([prompt[0].tolist()], 2, cache=store)
    store.clear()
    assert torch.equal(m.generate(prompt, 2, cache=store), m.generate(prompt, 2))


def test_a_prefix_store_holds_a_generation_that_ends_at_its_max_len_as_plain_decoding_does() -> None:
    m = tiny()
    store = PrefixCache.for_model(m, batch_size=1, max_len=48)  # 40 + 9 - 1 = 48 positions written
    prompt = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(2))
    assert torch.equal(m.generate(prompt, 9, cache=store), m.generate(prompt, 9))
    assert m.generate_many([prompt[0].tolist()], 9, cache=store) == [m.generate(prompt, 9)[0, 40:].tolist()]
    with pytest.raises(ValueError, match=r"a sequence of 49 tokens .* longer than this prefix cache's max_len=48"):
        m.generate(prompt, 10, cache=store)


# ---- speculative decoding: the passes a guess saves ----


def passes(m: GPT) -> list[int]:
    """One entry per pass of ``m``: a call of its step, which the decode loop and ``forward`` both run (counted
    on ``m`` alone, after any copy)."""
    calls: list[int] = []
    step = m.step

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return step(*args, **kwargs)

    m.step = counted  # type: ignore[method-assign]
    return calls


def test_lookup_and_a_draft_make_fewer_passes_than_tokens_on_text_that_repeats() -> None:
    m = GPT.from_pretrained("induction")  # trained to copy: on repeated text its argmax is what came before
    draft = copy.deepcopy(m)
    calls = passes(m)
    block = torch.randperm(m.config.vocab_size, generator=torch.Generator().manual_seed(0))[:12]
    prompt = torch.cat([block, block[:4]])[None]  # the second copy has begun: what follows is known
    plain = m.generate(prompt, 8)
    assert len(calls) == 8 and torch.equal(plain[0, 16:], block[4:12])  # the model copies
    calls.clear()
    assert torch.equal(m.generate(prompt, 8, lookup=4), plain)
    assert len(calls) <= 3  # 8 tokens: 5 a pass, twice, if every guess is kept
    calls.clear()
    assert torch.equal(m.generate(prompt, 8, draft=draft, draft_tokens=3), plain)
    assert len(calls) == 2  # a draft that is the model: 4 tokens a pass


def test_a_sampled_draft_that_is_the_model_keeps_every_guess() -> None:
    """Rejection sampling keeps a guess x drawn from q with probability min(1, p(x) / q(x)): 1 when q is p.
    A rule that took the draft's sample for a point mass (kept with p(x)) would refuse some."""
    m = tiny(vocab_size=8)
    draft = copy.deepcopy(m)
    calls = passes(m)
    prompt = torch.randint(0, 8, (1, 6), generator=torch.Generator().manual_seed(0))
    for seed in range(5):
        calls.clear()
        out = m.generate(
            prompt, 12, draft=draft, draft_tokens=3, temperature=1.0, generator=torch.Generator().manual_seed(seed)
        )
        assert out.shape == (1, 18) and len(calls) == 3  # 4 tokens a pass


def test_sampling_through_a_draft_gives_the_models_distribution() -> None:
    """The first new token of generate(draft=...), drawn 1,000 times, against the model's own distribution p
    by a chi-square test at the 0.1% level (seeded: not flaky). The draft's q is far from p: keeping its
    guesses as drawn would score about 1,400 here, and redrawing a refused one from p instead of (p - q)+
    about 80; the test tells them apart."""
    tiny_config = dict(vocab_size=5, emb_dim=8, n_heads=2, n_layers=1)
    m, draft = tiny(1, **tiny_config), tiny(2, **tiny_config)
    prompt = torch.tensor([[0, 3, 1, 4]])
    with torch.no_grad():
        p = torch.softmax(m(prompt)[0, -1], dim=-1)
        q = torch.softmax(draft(prompt)[0, -1], dim=-1)
    n = 1_000

    def chi2(distribution: torch.Tensor) -> float:  # what n draws from it score against p, in expectation
        return float(((distribution - p) ** 2 / p).sum()) * n

    redrawn_from_p = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * p
    assert chi2(q) > 1000 and chi2(redrawn_from_p) > 60
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(n):
        out = m.generate(prompt, 2, draft=draft, draft_tokens=1, temperature=1.0, generator=generator)
        counts[int(out[0, 4])] += 1
    assert chi2(counts / n) < 18.47, (counts / n, p)  # 4 degrees of freedom, p = 0.001


def test_generate_many_names_the_prompt_with_a_bad_token_before_running_any() -> None:
    m = tiny()
    seen = positions_seen(m)
    with pytest.raises(ValueError, match=r"prompt 2 has token id 64 at position 1: this model's ids are 0\.\.63"):
        m.generate_many([[1, 2], [3], [4, 64, 5]], 3, slots=1)
    assert seen == []


def test_a_sink_cache_refuses_left_padding_past_its_window_and_keeps_it_within() -> None:
    m = tiny(context_length=16)  # the sink cache: 4 sinks and 12 recent
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    within = m.generate(ids, 11, attention_mask=mask, cache="sink")  # 16 tokens: nothing leaves the window
    assert torch.equal(within[1], m.generate(ids[1:], 11, cache="sink")[0])
    assert torch.equal(within[0, 2:], m.generate(ids[:1, 2:], 11, cache="sink")[0])
    with pytest.raises(ValueError, match="17 tokens run past its 4 \\+ 12 slots, where the pads would take"):
        m.generate(ids, 12, attention_mask=mask, cache="sink")
    assert m.generate(ids, 40, cache="sink").shape == (2, 46)  # unpadded, it runs on past the window
