"""Calls through the bridge (``attnlab.hf.use``, ``attnlab.hf.cache``) that attnlab refuses, and what each leaves:
nothing (issue 54, items 3, 10, 11 and 13; the mutation audit's StaticCache).

``use`` refuses what no forward could run. A forward's mods, the heads a Recorder chose and an attnlab cache's
own limits are checked by the model's pre-hook before transformers' first layer writes its cache
(:mod:`attnlab.hf.checks`); beam search is refused when generate is handed the cache, before its prefill; what
moves every layer (reorder, crop) is checked for all of them first. Each test compares every layer of the
cache, its tensors and its positions, before and after the refused call.

The models are tiny and random, built here: Gemma 3's text model with a sliding layer first and a full one
after (the sliding layer is transformers' own, and it had written when a refusal came in the full one), and
Llama.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    StaticCache,
)

import attnlab.hf
from _refusals import floats, raises, same
from attnlab import Recorder
from attnlab.functional import mods

V = 64
SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
IDS = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(1))


def gemma() -> PreTrainedModel:
    """Layer 0 slides (a window of 4, transformers' own ring in every attnlab cache), layer 1 is full."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        **SIZES, num_key_value_heads=2, head_dim=8, layer_types=["sliding_attention", "full_attention"],
        sliding_window=4, max_position_embeddings=64,
    )  # fmt: skip
    model = Gemma3ForCausalLM(config).eval()
    model.set_attn_implementation("attnlab")
    return model


def llama(attn: str = "attnlab") -> PreTrainedModel:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SIZES, num_key_value_heads=2, max_position_embeddings=64)).eval()
    model.set_attn_implementation(attn)
    return model


def plain(obj: Any, seen: set[int] | None = None) -> Any:
    """What a cache layer holds, as plain values: tensors cloned, counts, an attnlab layer's inner cache whole
    (its buffers and its public attributes), what its last update returned."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (int, float, str, bool, type(None), torch.dtype, torch.device)):
        return obj
    if id(obj) in seen:
        return "<seen>"
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        return [plain(x, seen) for x in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v, seen) for k, v in obj.items()}
    if isinstance(obj, torch.nn.Module):
        public = {k: plain(v, seen) for k, v in vars(obj).items() if not k.startswith("_") and k != "rotary"}
        return {"buffers": {n: b.detach().clone() for n, b in obj.named_buffers()}, **public}
    if hasattr(obj, "__dict__"):
        return {k: plain(v, seen) for k, v in vars(obj).items() if k != "rotary"}
    return repr(obj)  # a weakref: the same object gives the same text


def held(cache: Any) -> list[Any]:
    return [plain(layer) for layer in cache.layers]


def score_raises(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("a bug in the user's score_mod")


def refused(cache: Any, call: Callable[[], Any], match: str, error: type[Exception] = ValueError) -> None:
    """``call`` raises ``error`` matching ``match``, and every layer of ``cache`` is as it was."""
    before = held(cache)
    with pytest.raises(error, match=match), torch.no_grad():
        call()
    same(before, held(cache), "cache")


def with_mods(model: PreTrainedModel, run: Callable[[], Any], **given: Any) -> Callable[[], Any]:
    def call() -> Any:
        with attnlab.hf.use(model, **given):
            return run()

    return call


KINDS = {"plain": {}, "int8": {}, "int4": {}, "sink": {"recent": 8}, "h2o": {"budget": 6}, "snapkv": {"budget": 6}}


@pytest.mark.parametrize("kind", [*KINDS, "dynamic"])
def test_every_refusal_through_the_bridge_leaves_every_layer_of_the_cache_as_it_was(kind: str) -> None:
    """A prompt of 6 is in the cache; then each call that is refused (its mods, its heads, its rows, its
    length, beam search, a crop or a reorder) leaves both layers, the sliding one (transformers') and the full
    one (attnlab's), exactly as they were; and the cache goes on as if none had been made."""
    model = gemma()
    made: Any = DynamicCache(config=model.config) if kind == "dynamic" else attnlab.hf.cache(kind, model, max_len=16, **KINDS[kind])  # fmt: skip
    step = lambda ids=IDS[:, 6:7], **kw: model(ids, cache=made, use_cache=True, **kw)
    with torch.no_grad():
        model(IDS[:, :6], cache=made, use_cache=True)
    refused(made, with_mods(model, step, mask_mod=raises), r"mask_mod raises raised RuntimeError")
    refused(made, with_mods(model, step, mask_mod=floats), r"mask_mod floats must return a bool tensor", TypeError)
    refused(made, with_mods(model, step, score_mod=score_raises), r"score_mod score_raises raised RuntimeError")

    def recorded() -> Any:
        with Recorder(heads=[(1, 7)]):
            return step()

    refused(made, recorded, r"chose head 7 of layer 1, which has 4 heads")
    if kind != "dynamic":  # attnlab's caches: their own limits, beam search, crop and reorder
        refused(made, lambda: step(IDS[:1, 6:7].expand(3, 1)), r"holds 2 rows and this call brings 3")
        if kind == "sink":  # the window is 4 + 8: 3 of its slots are left, and 9 tokens at once would push out
            refused(made, lambda: step(IDS[:, :9]), r"window holds 6 more of these 9 tokens at once")
        else:
            refused(made, lambda: step(IDS[:, :11]), r"max_len=16 positions and has 6; it cannot take 11 more")
        beams = lambda: model.generate(IDS[:, :7], cache=made, num_beams=2, max_new_tokens=2, do_sample=False)
        refused(made, beams, r"beam search reorders a cache's rows.*num_beams=1")
        refused(made, lambda: made.reorder_cache(torch.tensor([1, 0])), r"beam search reorders")
        if kind != "plain":
            refused(made, lambda: made.crop(-1), rf"the {kind} cache cannot be cut back")
    with torch.no_grad():  # the refusals left no trace: the next step equals a cache that never saw them
        fresh: Any = DynamicCache(config=model.config) if kind == "dynamic" else attnlab.hf.cache(kind, model, max_len=16, **KINDS[kind])  # fmt: skip
        model(IDS[:, :6], cache=fresh, use_cache=True)
        want = model(IDS[:, 6:7], cache=fresh, use_cache=True).logits
        assert torch.equal(step().logits, want)


def test_a_sink_cache_refuses_left_padding_and_beam_search_before_a_layer_writes() -> None:
    """Item 10: pads among the sinks were refused after layer 0 stored the prompt, and beam search after the whole
    prefill; both now before any layer, through generate and through a forward without position_ids."""
    model = gemma()
    padding = torch.ones(2, 8, dtype=torch.long)
    padding[0, :3] = 0
    made = attnlab.hf.cache("sink", model, recent=8)
    greedy = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
    pads = r"left padding \(attention_mask\) put pad tokens among the sink cache's 4 sinks"
    refused(made, lambda: model.generate(IDS[:, :8], attention_mask=padding, cache=made, **greedy), pads)
    refused(made, lambda: model(IDS[:, :8], attention_mask=padding, cache=made, use_cache=True), pads)
    refused(made, lambda: model.generate(IDS[:, :8], cache=made, num_beams=2, **greedy), r"beam search")
    assert made.get_seq_length() == 0 and not made.layers[0].is_initialized and made.layers[1].inner is None
    with torch.no_grad():  # unpadded, one prompt at a time, it runs
        model.generate(IDS[:1, :8], cache=made, **greedy)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_transformers_own_caches_are_not_written_by_a_call_the_bridge_refuses(cache: str) -> None:
    """The pre-hook guards transformers' caches too: mods that raise leave a DynamicCache as it was, and any mod
    on a StaticCache (whose buffer does not say which slots are filled) is refused before it is written."""
    model = llama()
    made = (
        DynamicCache(config=model.config) if cache == "dynamic" else StaticCache(config=model.config, max_cache_len=16)
    )
    step = lambda: model(IDS[:, :4], cache=made, use_cache=True)
    with torch.no_grad():
        step()
    if cache == "dynamic":
        refused(made, with_mods(model, step, mask_mod=raises), r"mask_mod raises raised RuntimeError")
    else:
        static = r"a static cache's buffer \(transformers' StaticCache\) does not say which of its slots are filled"
        refused(made, with_mods(model, step, mask_mod=lambda b, h, q, kv: kv != 2), static)


# ---- a mask_mod that sees the future cannot widen transformers' causal mask: refused when asked ----


def declared(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return kv_idx < 5


declared.sees_future = True  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "given, named",
    [
        (mods.prefix_lm(5), r"mask_mod prefix_lm\(prefix_len=5\) shows"),
        (mods.and_masks(mods.prefix_lm(5), mods.padding(torch.tensor([8]))), r"mask_mod and_masks\(prefix_lm"),
        (declared, r"mask_mod declared shows"),
        ({1: mods.prefix_lm(5)}, r"mask_mod prefix_lm\(prefix_len=5\) \(for layer 1\) shows"),
    ],
)
def test_a_mod_that_sees_the_future_is_refused_by_name_when_use_is_called(given: Any, named: str) -> None:
    """Item 3: prefix_lm through the bridge gave exactly the causal logits, with no word. It is refused by name at
    use(), with the reason and the fix, and the model is left as it was; a mod that restricts still acts."""
    model = llama("sdpa")
    with pytest.raises(ValueError, match=named) as err:
        attnlab.hf.use(model, mask_mod=given)
    for said in ("builds its own causal mask", "cannot widen it", "GPT(...)(ids, mask_mod=...)", "only restricts"):
        assert said in str(err.value)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        causal = model(IDS).logits
        with attnlab.hf.use(model, mask_mod=lambda b, h, q_idx, kv_idx: kv_idx != 2):
            hidden = model(IDS).logits
    assert torch.allclose(hidden[:, :2], causal[:, :2], atol=1e-5)  # queries 0 and 1 never saw key 2
    assert not torch.allclose(hidden[:, 3:], causal[:, 3:], atol=1e-3)


def test_use_refuses_what_no_forward_could_run_and_leaves_the_model_as_it_was() -> None:
    """sdpa with a score_mod that is not a bias, and Gemma 2's softcap on sdpa, were refused in the first layer of
    the first forward, after its cache was written: now when use() is called."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = llama("sdpa")
    with pytest.raises(ValueError, match=r"score_mod .*<lambda> is not declared an additive bias.*mods.bias\(fn\)"):
        attnlab.hf.use(model, backend="sdpa", score_mod=lambda s, b, h, q_idx, kv_idx: s * 0.5)
    assert model.config._attn_implementation == "sdpa"
    with attnlab.hf.use(model, backend="sdpa", score_mod=mods.alibi(4)):  # a bias sdpa adds
        pass
    torch.manual_seed(0)
    gemma2 = Gemma2ForCausalLM(Gemma2Config(**SIZES, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=50.0))
    before = gemma2.config._attn_implementation
    with pytest.raises(ValueError, match=r"caps its attention scores \(attn_logit_softcapping=50.0\).*'flash'"):
        attnlab.hf.use(gemma2, backend="sdpa")
    assert gemma2.config._attn_implementation == before
    with attnlab.hf.use(gemma2), torch.no_grad():  # flash takes the cap as a score_mod
        gemma2(IDS[:, :4])


def test_the_ring_refuses_a_mod_that_sees_the_future_before_it_needs_a_group() -> None:
    """The ring module ANDed prefix_lm with its causal rule, silently: now refused by name, in one process."""
    from attnlab.distributed import ContextParallelAttention

    ring = ContextParallelAttention(d_in=8, num_heads=2, rope=True)
    for mod in (mods.prefix_lm(2), mods.or_masks(mods.prefix_lm(2), mods.sliding_window(2))):
        with pytest.raises(ValueError, match=r"shows queries keys after them, but the ring keeps .* cannot widen it"):
            ring(torch.randn(1, 4, 8), mask_mod=mod)


# ---- positions a mod reads: right padding (item 13), and every backend's rows ----


@pytest.mark.parametrize("backend", ["flash", pytest.param("flex", marks=pytest.mark.slow)])  # flex: 14 s to compile
def test_a_right_padded_batch_takes_a_mask_mod_and_each_row_reads_as_itself(backend: str) -> None:
    """Item 13: a right-padded batch (no cache) was refused as "a static cache's buffer". Its rows sit at 0..T-1
    and its pads are hidden: each row's real tokens give what the row alone gives. (flex indexed each row's
    positions in a (1, T) table and failed on row 1.)"""
    model = llama()
    lengths = (5, 7)
    batch = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.zeros(2, 8, dtype=torch.long)
    for row, n in enumerate(lengths):
        batch[row, :n], mask[row, :n] = IDS[row, :n], 1
    with torch.no_grad(), attnlab.hf.use(model, backend=backend, mask_mod=lambda b, h, q_idx, kv_idx: kv_idx != 2):
        padded = model(batch, attention_mask=mask).logits
        for row, n in enumerate(lengths):
            alone = model(IDS[row : row + 1, :n]).logits[0]
            assert (padded[row, :n] - alone).abs().max().item() < 1e-5, row
        unmodded = model(IDS[:1, :5]).logits[0]
    assert (padded[0, 3:5] - unmodded[3:5]).abs().max().item() < 1e-5  # the mod is off after the with block
    with torch.no_grad():
        assert (padded[0, 3:5] - llama()(IDS[:1, :5]).logits[0, 3:5]).abs().max().item() > 1e-3  # it did act


# ---- transformers' StaticCache through the bridge (the mutation audit: no test ran one) ----


@torch.no_grad()
@pytest.mark.parametrize("left_pad", [0, 2])
def test_a_static_cache_through_the_bridge_gives_sdpas_logits(left_pad: int) -> None:
    """A prefill, a second chunk and decode steps into a StaticCache of 24 slots, 12 of them never filled: the
    bridge reads transformers' mask over the empty slots (and over a left pad) as sdpa does, to 1e-5; unpadded,
    transformers leaves the prefill's mask out and the bridge takes the buffer's first slots alone."""
    ours, theirs = llama(), llama("sdpa")
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[0, :left_pad] = 0
    runs = []
    for model in (ours, theirs):
        made = StaticCache(config=model.config, max_cache_len=24)
        step = lambda a, b: model(IDS[:, a:b], attention_mask=padding[:, :b], cache=made, use_cache=True).logits
        runs.append(torch.cat([step(0, 6), step(6, 9), *(step(n, n + 1) for n in range(9, 12))], dim=1))
    assert (runs[0] - runs[1]).abs().max().item() < 1e-5
    assert made.get_seq_length() == 12 and made.layers[0].keys.shape[2] == 24  # the empty slots were there


def test_a_crop_cuts_every_layer_or_none_when_a_full_layer_comes_before_a_sliding_one() -> None:
    """Qwen 2's first layer is full (attnlab's plain cache) and its second slides (transformers' ring): past the
    window the sliding layer refuses to be cut unless it records past states, and the full layer, cut first, was
    left shorter than the other. Now both are as they were; recording, both are cut."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SIZES, num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    model = Qwen2ForCausalLM(config).eval()
    model.set_attn_implementation("attnlab")
    made = attnlab.hf.cache("plain", model, max_len=16)
    assert [type(layer).__name__ for layer in made.layers] == ["AttnlabLayer", "DynamicSlidingWindowLayer"]
    with torch.no_grad():
        model(IDS[:, :6], cache=made, use_cache=True)
    refused(made, lambda: made.crop(-1), r"does not track past states", RuntimeError)
    made.activate_past_recording()
    made.crop(-1)
    assert made.layers[0].get_seq_length() == made.layers[1].get_seq_length() == 5
