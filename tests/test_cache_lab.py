"""The KV-cache lab (issue 23): prefix sharing, sinks, quantized and evicting caches, each exact where it says
so, each refusing what it cannot do, each reachable by name from generate."""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab import Attention
from attnlab.cache import CACHES, EvictingCache, ModelCache, PrefixCache, QuantizedKVCache, SinkCache
from attnlab.models import GPT, GPTConfig

BACKENDS = ["eager", "sdpa", "flash"]


def model(backend: str = "sdpa", *, rope: bool = True, context: int = 64) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=64,
        context_length=context,
        emb_dim=32,
        n_heads=4,
        n_kv_heads=2 if rope else None,
        n_layers=2,
        rope=rope,
        drop_rate=0.0,
        backend=backend,
    )
    return GPT(config).eval()


def ids(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


# ---- prefix sharing ----


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompts_that_share_a_prefix_reuse_its_blocks_and_get_the_same_tokens(backend: str) -> None:
    m = model(backend)
    system = ids(40).tolist()  # 2 full blocks of 16, and 8 more
    prompts = [system + ids(5, seed=s).tolist() for s in (2, 3)]
    alone = [m.generate(torch.tensor([p]), 8)[0, len(p) :].tolist() for p in prompts]  # plain: tested = no cache
    store = PrefixCache.for_model(m, batch_size=2, max_len=64)
    first = m.generate(torch.tensor([prompts[0]]), 8, cache=store)[0, 45:].tolist()
    assert store.hit_rate == 0.0
    second = m.generate(torch.tensor([prompts[1]]), 8, cache=store)[0, 45:].tolist()
    assert [first, second] == alone
    assert store.reused == 32  # the two full blocks of the shared 40 tokens; the rest is computed
    assert store.hit_rate == pytest.approx(32 / 90)  # of the 2 x 45 prompt tokens
    # a batch whose rows share a prompt: the second row takes the first row's blocks
    batch = torch.tensor([prompts[0], prompts[0]])
    fresh = PrefixCache.for_model(m, batch_size=2, max_len=64)
    out = m.generate(batch, 6, cache=fresh)
    assert torch.equal(out, m.generate(batch, 6))
    assert fresh.reused == 32
    assert m.generate_many([*prompts, system[:20]], 5, slots=2, cache="prefix") == [a[:5] for a in alone] + [
        m.generate(torch.tensor([system[:20]]), 5)[0, 20:].tolist()
    ]


def test_a_full_prefix_pool_lets_go_of_the_least_recently_used_prefix() -> None:
    m = model()
    store = PrefixCache.for_model(m, batch_size=1, max_len=48, num_blocks=4)  # a sequence of 3 blocks, 1 spare
    a, b = ids(40, seed=4).tolist(), ids(40, seed=5).tolist()
    m.generate(torch.tensor([a]), 4, cache=store)
    assert store.cached_tokens() == 32  # a's two full blocks
    m.generate(torch.tensor([b]), 4, cache=store)  # needs 3 blocks, 2 free: a's last block of prefix goes
    assert store.cached_tokens() == 16 + 32
    m.generate(torch.tensor([b]), 4, cache=store)  # b's own prefix was kept
    assert store.reused == 32


def test_the_prefix_cache_refuses_what_it_cannot_share() -> None:
    m = model()
    store = PrefixCache.for_model(m, batch_size=1, max_len=32)
    with pytest.raises(ValueError, match="runs 1 sequences at once, got 2"):
        m.generate(ids(2, 5), 3, cache=store)
    with pytest.raises(ValueError, match="longer than this prefix cache's max_len=32"):
        m.generate(ids(1, 30), 8, cache=store)
    with pytest.raises(ValueError, match="a layer's cache never sees"):  # a layer alone cannot share by ids
        CACHES["prefix"]()
    assert isinstance(m.make_caches(batch_size=1, max_len=8, cache="prefix"), PrefixCache)  # a model can
    assert store.looked_up == 0  # nothing was attached by the refused calls
    windowed = GPT(GPTConfig(vocab_size=64, context_length=32, emb_dim=16, n_heads=2, n_layers=1, rope=True, window=8))
    with pytest.raises(ValueError, match="the sink cache does not keep a sliding window's ring, and every"):
        windowed.stream(ids(1, 5), 3, cache="sink")  # every layer slides: a cache that would apply to none is refused
    # 'paged' and 'prefix' keep a window in blocks (tests/test_prefix_every_kind.py): rows of their own, shared prefixes


# ---- sinks ----


def test_a_sink_cache_step_equals_attention_over_the_sinks_and_the_window_counted_from_zero() -> None:
    """StreamingLLM's rule on one RoPE layer: after 40 tokens through 2 sinks + 6 recent, the last token's output
    is attention over [the 2 first tokens, the 6 latest] at positions 0..7, as if they were the whole text."""
    torch.manual_seed(0)
    attn = Attention(d_in=16, num_heads=4, num_kv_heads=2, rope=True).eval()
    x = torch.randn(1, 40, 16)
    cache = ModelCache.build(
        [attn.layer_state()], functools.partial(CACHES["sink"], sinks=2, recent=6), rows=1, capacity=40
    )[0]
    assert isinstance(cache, SinkCache)
    with torch.no_grad():
        attn(x[:, :5], cache=cache)  # a prompt that fits
        for p in range(5, 40):
            out = attn(x[:, p : p + 1], cache=cache)
        kept = torch.cat([x[:, :2], x[:, 34:]], dim=1)  # (1, 8, 16)
        expected = attn(kept)[:, -1:]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_sink_cache_generates_four_contexts_with_rope_and_refuses_past_learned_positions() -> None:
    m = model(context=32)
    out = m.generate(ids(1, 8), 128, cache="sink")  # 4 x context_length
    assert out.shape == (1, 136)
    gpt2 = model(rope=False, context=32)
    with pytest.raises(ValueError, match="a sink cache runs past context_length only with rotary positions"):
        gpt2.generate(ids(1, 8), 40, cache="sink")
    assert gpt2.generate(ids(1, 8), 20, cache="sink").shape == (1, 28)  # within the context it runs
    cache = SinkCache(batch_size=1, num_kv_heads=2, head_dim=8, sinks=2, recent=4)
    with pytest.raises(ValueError, match="give a prompt of at most 6 tokens"):
        cache.update(torch.zeros(1, 2, 7, 8), torch.zeros(1, 2, 7, 8))
    assert cache.length == 0


# ---- quantized ----


@pytest.mark.parametrize("bits", [8, 4])
def test_a_prefill_is_quantized_as_if_it_came_one_token_at_a_time(bits: int) -> None:
    torch.manual_seed(0)
    k, v = torch.randn(2, 3, 90, 8), torch.randn(2, 3, 90, 8)

    def filled(pieces: list[int]) -> QuantizedKVCache:
        cache = QuantizedKVCache(
            batch_size=2, num_kv_heads=3, head_dim=8, max_len=96, bits=bits, group_size=4, residual=8
        )
        start = 0
        for n in pieces:
            cache.update(k[:, :, start : start + n], v[:, :, start : start + n])
            start += n
        return cache

    whole, steps, chunks = filled([90]), filled([1] * 90), filled([7] * 12 + [6])
    for name, buffer in whole.named_buffers():
        assert torch.equal(buffer, dict(steps.named_buffers())[name]), name
        assert torch.equal(buffer, dict(chunks.named_buffers())[name]), name
    keys, values, positions = steps.update(k[:, :, :1] * 0, v[:, :, :1] * 0)  # one more step reads the past
    assert positions[:91].tolist() == list(range(91)) and positions[91:].eq(-1).all()
    assert torch.equal(keys[:, :, 83:90], k[:, :, 83:90])  # the latest tokens are exact
    step = {8: 6 / 255, 4: 6 / 15}[bits]  # a code's width over randn's range of about 6
    assert (keys[:, :, :80] - k[:, :, :80]).abs().max() < step
    assert (values[:, :, :80] - v[:, :, :80]).abs().max() < step
    assert not torch.equal(keys[:, :, :80], k[:, :, :80])  # and they are quantized, not kept


def test_a_quantized_decode_step_compiles_whole_and_matches_eager() -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=16, num_heads=2, rope=True).eval()
    x = torch.randn(1, 20, 16)
    made = [
        ModelCache.build(
            [attn.layer_state()], functools.partial(CACHES["int8"], group_size=4, residual=4), rows=1, capacity=24
        )[0]
        for _ in range(2)
    ]

    def step(token: torch.Tensor, cache: QuantizedKVCache) -> torch.Tensor:
        return attn(token, cache=cache)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        for cache in made:
            attn(x[:, :10], cache=cache)
        for p in range(10, 20):
            torch.testing.assert_close(compiled(x[:, p : p + 1], made[0]), step(x[:, p : p + 1], made[1]))
    assert torch.equal(made[0].k_codes, made[1].k_codes)


def test_quantized_generation_runs_by_name_and_the_cache_refuses_bad_settings() -> None:
    m = model()
    idx = ids(2, 10)
    for name in ("int8", "int4"):
        assert m.generate(idx, 8, cache=name).shape == (2, 18)
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantizedKVCache(batch_size=1, num_kv_heads=1, head_dim=8, max_len=8, bits=2)
    with pytest.raises(ValueError, match="residual \\(40\\) must be a multiple of group_size \\(32\\)"):
        QuantizedKVCache(batch_size=1, num_kv_heads=1, head_dim=8, max_len=8, residual=40)
    cache = QuantizedKVCache(batch_size=1, num_kv_heads=1, head_dim=8, max_len=4)
    with pytest.raises(ValueError, match="the cache is full"):
        cache.update(torch.zeros(1, 1, 5, 8), torch.zeros(1, 1, 5, 8))
    assert cache.length == 0


# ---- eviction ----


def test_h2o_keeps_the_recent_tokens_and_the_heaviest_hitter() -> None:
    """Keys 0..5, one query per step; key 1 is the one every query looks at: with a budget of 3 (2 recent),
    H2O keeps key 1 and the 2 latest, and lets the others go."""
    cache = EvictingCache(batch_size=1, num_kv_heads=1, head_dim=4, budget=3, recent=2)
    keys = torch.zeros(1, 1, 6, 4)
    keys[0, 0, 1] = torch.tensor([8.0, 0, 0, 0])  # q . k_1 = 8: most of every softmax
    q = torch.tensor([1.0, 0, 0, 0]).view(1, 1, 1, 4)
    attn_scale = 1.0
    from attnlab.functional import Visibility

    for p in range(6):
        k, v = keys[:, :, p : p + 1], torch.randn(1, 1, 1, 4)
        held_k, held_v, pos = cache.update(k, v)
        vis = Visibility(q_pos=torch.tensor([p]), causal=True).for_keys(pos)
        cache.observe(q, held_k, held_v, visibility=vis, scale=attn_scale)
    assert cache.positions[0].tolist() == [1, 4, 5]
    assert sorted(cache.evicted[0]) == [0, 2, 3]


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_an_eviction_budget_that_holds_everything_is_exact_and_a_small_one_stays_small(policy: str) -> None:
    m = model("flash")
    idx = ids(2, 24)
    roomy = functools.partial(CACHES[policy], budget=64)
    assert torch.equal(m.generate(idx, 10, cache=roomy), m.generate(idx, 10))
    tight = m.make_caches(batch_size=2, max_len=34, cache=functools.partial(CACHES[policy], budget=8))
    with torch.no_grad():
        m(idx, caches=tight)
        for _ in range(10):
            m(ids(2, 1), caches=tight)
    held = tight[0].keys.shape[2]  # type: ignore[attr-defined]
    assert held == (8 if policy == "h2o" else 8 + 10)  # SnapKV compresses the prompt; new tokens are kept
    assert len(tight[0].evicted[0]) == 34 - held  # type: ignore[attr-defined]


def test_eviction_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        EvictingCache(batch_size=1, num_kv_heads=1, head_dim=4, budget=8, policy="lru")
    with pytest.raises(ValueError, match="recent \\(8\\) must be below budget \\(8\\)"):
        EvictingCache(batch_size=1, num_kv_heads=1, head_dim=4, budget=8, recent=8)
    windowed = Attention(d_in=16, num_heads=2, window=4)  # a band keeps only positions it was trained to see
    for policy in ("h2o", "snapkv"):
        with pytest.raises(ValueError, match=rf"evicting from a band is refused: a layer with window=4 .* so {policy}"):
            ModelCache.build([windowed.layer_state()], policy, rows=1, capacity=8)[0]


def test_a_prompt_longer_than_the_sink_window_goes_in_pieces_as_if_token_by_token() -> None:
    m = model()
    small_window = functools.partial(CACHES["sink"], sinks=2, recent=6)
    prompt = ids(1, 20)
    out = m.generate(prompt, 4, cache=small_window)
    caches = m.make_caches(batch_size=1, max_len=24, cache=small_window)
    with torch.no_grad():
        for p in range(20):  # one token at a time: StreamingLLM's own order
            logits = m(prompt[:, p : p + 1], caches=caches)[:, -1]
    assert int(out[0, 20]) == int(logits.argmax())


def test_explain_shows_each_cache_and_says_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab.cli import main

    text = "the cat sat on the mat. the cat sat on the"
    assert main(["explain", "--model", "induction", "--cache", "prefix", text]) == 0
    shown = capsys.readouterr().out
    assert "sequence 1: blocks [0, 1, 3], 32 tokens taken from the tree" in shown
    assert main(["explain", "--model", "induction", "--cache", "h2o", "--lang", "zh", text]) == 0
    assert "第 0 层：保留 Token" in capsys.readouterr().out
    from attnlab.explain.model_view import attention_view
    from attnlab.models import ByteTokenizer

    view = attention_view(GPT.from_pretrained("induction"), ByteTokenizer(ascii=True), text, cache="sink")
    assert view.held is not None
    held = view.held.int().tolist()
    # a sink cache of 4 sinks and 16 recent tokens, the same in every layer: the middle of the text let go
    assert all(row == held[0] for row in held) and sum(held[0]) == 20 and len(held[0]) == len(text)
    assert held[0][:4] == [1] * 4 and held[0][-16:] == [1] * 16 and held[0][4:-16] == [0] * (len(text) - 20)
    assert (
        '"held": [[1, 1, 1, 1, 0' in view.to_fragment() and "the sink cache holds {n} of {t} keys" in view.to_fragment()
    )
    assert main(["explain", "--model", "induction", "--cache", "int3", text]) == 2
    assert "--cache 'int3' is not a cache; the caches are ['plain'" in capsys.readouterr().err
    assert main(["explain", "--cache", "int8", text]) == 2
    assert "give --model too" in capsys.readouterr().err


def test_the_command_line_knows_every_cache_by_name() -> None:
    from attnlab.cli.generate import CACHE_NAMES

    assert CACHE_NAMES == tuple(CACHES)


def test_a_recorder_sees_the_models_own_steps_once_beside_an_evicting_cache() -> None:
    from attnlab.observe import Recorder

    m = model("eager")
    counts = []
    for cache in ("plain", "h2o"):
        with Recorder() as rec:
            m.generate(ids(1, 12), 3, cache=functools.partial(CACHES["h2o"], budget=8) if cache == "h2o" else cache)
        counts.append(sum(1 for step in rec.steps if step.name == "attn_weights"))
    assert counts[0] == counts[1] == 2 * 3  # 2 layers x (a prefill and 2 steps): the cache's own pass is not there


def test_a_sink_cache_takes_what_rotates_keys_and_refuses_the_rest() -> None:
    """The rotary a sink cache moves its sinks with is anything with ``rotate(x, positions)`` (the layer's
    RotaryEmbedding, the transformers bridge's rotation); anything else is refused by its type."""
    from attnlab.functional.rotary import RotaryEmbedding

    SinkCache(batch_size=1, num_kv_heads=1, head_dim=4, recent=2, sinks=1, rotary=RotaryEmbedding(head_dim=4))
    with pytest.raises(TypeError, match="rotary must be the layer's RotaryEmbedding or None, got int"):
        SinkCache(batch_size=1, num_kv_heads=1, head_dim=4, recent=2, sinks=1, rotary=3)  # type: ignore[arg-type]
