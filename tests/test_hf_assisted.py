"""transformers' assisted generation through ``attnlab.hf.cache`` (issue 57, item 3's last bullet).

transformers 5.24's ``_assisted_decoding`` asks three things of the target's cache: ``activate_past_recording()``
before its prefill, ``is_croppable`` after it, and ``crop(-n)`` after each pass, n the guesses the model refused.
The plain cache crops to any token; transformers' own ring (a sliding layer) and a short convolution's layer keep
a pass whole while recording and are cut back by the crop. So greedy with a draft model (``assistant_model=``) or
with prompt lookup (``prompt_lookup_num_tokens=``) gives greedy's tokens, and its logits, on a full-attention
model (Llama), on ones with sliding layers (Gemma 3, and Gemma 4 whose shared layers' rings stay empty, through
attnlab's attention) and on one with convolution and sliding layers (LFM3). A small random draft has most of its guesses refused, so the crops are exercised (counted);
a draft of the model's own weights has all of them kept, so the model runs fewer passes than it makes tokens.

What cannot go back is refused by name before anything is written: int8/int4 (a guess ages a token into codes),
sink and h2o/snapkv (a guess may push a token out), a recurrent state (transformers hands its cache the state after
a pass's last token alone) when the cache is made; and a second generate on a cache that already holds tokens,
which transformers would take unread as the prompt's beginning (prefix reuse stays refused through the bridge).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

import attnlab.hf
import test_gemma4 as gemma4
import test_hybrids as qwen35
import test_lfm3 as lfm3
from attnlab.hf.caches import AttnlabCacheForHF
from attnlab.hf.layer import AttnlabLayer
from test_families import FAMILIES, IDS, VOCAB, hf_dir

pytestmark = pytest.mark.slow  # transformers' models, built, saved and generating: the second stage

NEW = 32  # tokens each generate makes
GREEDY = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=None)  # every run makes NEW tokens (Gemma 3's eos is 1)
# (family, the attention the target runs): Llama's full layers under sdpa, Gemma 3's local and global layers
# through attnlab's attention (its sliding keys read where transformers' recording ring holds them), Gemma 4's
# (its last two layers read earlier layers' keys, their own rings never written) through attnlab's too, LFM3's
# convolution, sliding and full layers under sdpa
TARGETS = [("llama", "sdpa"), ("gemma3_text", "attnlab"), ("gemma4", "attnlab"), ("lfm3", "sdpa")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hf_assisted"))


OWN = {  # the families of their own test files: (class, folder, prompt)
    "gemma4": (gemma4.Gemma4ForCausalLM, lambda root: gemma4.hf_dir(root), gemma4.PROMPTS[:1, :40]),
    "lfm3": (lfm3.Lfm3ForCausalLM, lambda root: lfm3.hf_dir("default", root), lfm3.PROMPTS[:1, :40]),
}


def load(family: str, root: str, attn: str = "sdpa") -> PreTrainedModel:
    """A fresh instance (a target and its twin draft must not share hooks or attention)."""
    cls, where = (
        (OWN[family][0], OWN[family][1](root)) if family in OWN else (FAMILIES[family][0], hf_dir(family, root))
    )
    return cls.from_pretrained(where, attn_implementation=attn).eval()


def prompt(family: str) -> torch.Tensor:
    return OWN[family][2] if family in OWN else IDS[:1]


@functools.cache
def small_dir(root: str) -> Path:
    """A one-layer random Llama of the same vocabulary: a draft whose guesses the targets mostly refuse."""
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    where = Path(root) / "small_draft"
    LlamaForCausalLM(config).eval().save_pretrained(where)
    return where


def draft(kind: str, family: str, root: str) -> PreTrainedModel:
    """The twin (the target's own weights: every guess kept) or the small random Llama, guessing 4 tokens a pass
    whatever its confidence (transformers' default stops a draft whose top probability falls under 0.4, which a
    random model's always does, and grows or shrinks the count by what was kept)."""
    made = load(family, root) if kind == "twin" else LlamaForCausalLM.from_pretrained(small_dir(root)).eval()
    made.generation_config.num_assistant_tokens = 4
    made.generation_config.num_assistant_tokens_schedule = "constant"
    made.generation_config.assistant_confidence_threshold = 0.0
    return made


@contextlib.contextmanager
def passes(model: PreTrainedModel) -> Iterator[list[int]]:
    """The tokens of each forward ``model`` runs (a hook on the model: a draft's own passes are not counted)."""
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        yield seen
    finally:
        hook.remove()


def crops(made: AttnlabCacheForHF) -> list[int]:
    """Each ``crop`` transformers asks of ``made`` (its argument), recorded as it passes through."""
    asked: list[int] = []
    crop = made.crop

    def recorded(tokens_to_remove: int) -> None:
        asked.append(tokens_to_remove)
        crop(tokens_to_remove)

    made.crop = recorded  # type: ignore[method-assign]  # an observer on this instance; the crop itself runs
    return asked


def generate(model: PreTrainedModel, ids: torch.Tensor, **extra: Any) -> Any:
    """Greedy, NEW tokens, every token of ``ids`` read (a random prompt may hold the pad id, 0, which generate
    would otherwise take for padding)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), **{**GREEDY, **extra})


def greedy(model: PreTrainedModel, ids: torch.Tensor, **extra: Any) -> Any:
    return generate(model, ids, return_dict_in_generate=True, output_logits=True, **extra)


@torch.no_grad()
@pytest.mark.parametrize(("family", "attn"), TARGETS)
@pytest.mark.parametrize("helper", ["small", "twin", "lookup"])
def test_assisted_generation_gives_greedys_tokens_and_logits(family: str, attn: str, helper: str, root: str) -> None:
    """Greedy with a draft or with prompt lookup, through attnlab's plain cache, equals greedy without assistance
    through transformers' own cache: the same 32 tokens and each token's logits within 1e-4. With the small draft
    guesses are refused (crop(-n), n > 0, asked and done), so a cache that did not go back would be caught."""
    model, ids = load(family, root, attn), prompt(family)
    want = greedy(load(family, root), ids)  # transformers' own attention and DynamicCache, no assistance
    made = attnlab.hf.cache("plain", model)
    asked = crops(made)
    extra = {"prompt_lookup_num_tokens": 4} if helper == "lookup" else {"assistant_model": draft(helper, family, root)}
    got = greedy(model, ids, cache=made, **extra)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.logits) == len(want.logits) == NEW
    assert max((a - b).abs().max().item() for a, b in zip(got.logits, want.logits, strict=True)) < 1e-4
    assert asked, "assisted decoding asked no crop"
    if helper == "small":
        assert min(asked) < 0  # refused guesses were cut off
    written = [layer for layer in made.layers if isinstance(layer, AttnlabLayer) and layer.inner is not None]
    assert written and all(layer.get_seq_length() == ids.shape[1] + NEW - 1 for layer in written)  # as greedy leaves


@torch.no_grad()
@pytest.mark.parametrize(("family", "attn"), TARGETS)
def test_a_draft_that_guesses_right_saves_passes(family: str, attn: str, root: str) -> None:
    """The effect. Without assistance the model runs a pass per new token; with a draft of its own weights, whose
    4 guesses a pass are all kept, about one pass per 5 tokens. Same tokens both ways."""
    model, ids = load(family, root, attn), prompt(family)
    with passes(model) as alone:
        want = generate(model, ids, cache=attnlab.hf.cache("plain", model))
    with passes(model) as assisted:
        twin = draft("twin", family, root)
        got = generate(model, ids, cache=attnlab.hf.cache("plain", model), assistant_model=twin)
    assert torch.equal(got, want)
    assert torch.equal(want, generate(load(family, root), ids))  # transformers' own cache's tokens
    assert len(alone) == NEW  # the prefill and a pass per token after it (the last token is not fed)
    assert alone[1:] == [1] * (NEW - 1)
    assert len(assisted) <= 1 + -(-(NEW - 1) // 5)  # the prefill, then 5 tokens a pass: 4 guesses and one more
    assert max(assisted[1:]) == 5


# the prompt's continuation that, with it, makes the text each model goes on repeating (a random model falls
# into loops: Llama's of 4 tokens, Gemma 3's runs of one token); LFM3's perturbed weights do not loop
LOOPS = {"llama": 48, "gemma3_text": 160}


@torch.no_grad()
@pytest.mark.parametrize(("family", "attn"), [t for t in TARGETS if t[0] in LOOPS])
def test_prompt_lookup_on_a_repetitive_text_saves_passes(family: str, attn: str, root: str) -> None:
    """The effect on a text the model repeats: prompt lookup's guesses, read off the text, are kept, and the model
    runs fewer passes than it makes tokens; same tokens as without it."""
    model, ids = load(family, root, attn), prompt(family)
    text = generate(load(family, root), ids, max_new_tokens=LOOPS[family])
    room = text.shape[1] + NEW  # past Gemma 3's 128 positions, on its RoPE
    with passes(model) as alone:
        want = generate(model, text, cache=attnlab.hf.cache("plain", model, max_len=room))
    with passes(model) as looked_up:
        got = generate(model, text, cache=attnlab.hf.cache("plain", model, max_len=room), prompt_lookup_num_tokens=4)
    assert torch.equal(got, want)
    assert len(alone) == NEW
    assert len(looked_up) <= NEW - 8  # Llama's loop: 8 passes; Gemma 3's runs, some guesses refused: 23
    assert max(looked_up[1:]) == 5  # a pass that checked 4 guesses


@pytest.mark.parametrize(
    ("name", "options", "why"),
    [
        ("int8", {}, r"a QuantizedKVCache goes back only as far as the spare exact slots it is built with"),
        ("int4", {}, r"a QuantizedKVCache goes back only as far as the spare exact slots it is built with"),
        ("h2o", {"budget": 16}, r"an EvictingCache cannot: a refused guess may already have evicted a key"),
        ("snapkv", {"budget": 16}, r"an EvictingCache cannot: a refused guess may already have evicted a key"),
        ("sink", {}, r"a SinkCache cannot: a refused guess may already have pushed the oldest recent token out"),
    ],
)
@pytest.mark.parametrize("helper", ["twin", "lookup"])
@torch.no_grad()
def test_a_cache_that_cannot_go_back_is_refused_before_the_prefill(
    name: str, options: dict[str, Any], why: str, helper: str, root: str
) -> None:
    """Refused by attnlab's reason for the cache's class, naming the fix, in activate_past_recording: nothing was
    written (no layer holds a token, no ring records), and the same cache then generates greedy's tokens alone."""
    model, ids = load("gemma3_text", root, "attnlab"), IDS[:1]
    made = attnlab.hf.cache(name, model, **options)
    extra = (
        {"prompt_lookup_num_tokens": 4}
        if helper == "lookup"
        else {"assistant_model": draft("twin", "gemma3_text", root)}
    )
    with pytest.raises(
        ValueError,
        match=rf"the {name} cache cannot serve transformers' assisted generation \(assistant_model= or "
        rf"prompt_lookup_num_tokens=\), which writes each pass's guesses into the cache and then cuts the refused "
        rf"ones off \(Cache.crop\(-n\)\): {why}.*; generate with attnlab.hf.cache\('plain', model\), or without "
        r"assistance. Nothing was written",
    ):
        generate(model, ids, cache=made, **extra)
    assert made.get_seq_length() == 0
    assert all(layer.inner is None for layer in made.layers if isinstance(layer, AttnlabLayer))
    assert not any(getattr(layer, "record_past", False) or layer.is_initialized for layer in made.layers)
    if name in ("int8", "sink"):  # lossless on this short text (int8 keeps its last 32 tokens exact)
        assert torch.equal(generate(model, ids, cache=made), generate(load("gemma3_text", root), ids))


def test_a_recurrent_state_is_refused_when_the_cache_is_made_saying_why_no_cache_can_go_back(root: str) -> None:
    """Qwen3.5's Gated DeltaNet layers: refused when made, naming what transformers calls (the state after a pass's
    last token alone, crop(-n) with no re-run of the kept tokens) and the ways that work."""
    model = qwen35.hf("tied", root)
    with pytest.raises(
        ValueError,
        match=r"layers \[1, 2\] are 'linear_attention', which keep a recurrent state.*; nor could any cache take a "
        r"recurrent state back to an earlier token, which transformers' assisted generation asks: the layer hands "
        r"its cache only the state after a pass's last token \(Cache.update_recurrent_state\), and "
        r"_assisted_decoding cuts refused guesses off with Cache.crop\(-n\) and never runs the kept ones again.*"
        r"is_croppable=False.*: leave the cache to transformers.*GPT.from_pretrained\(path\).*lookup=k\) or draft=",
    ):
        attnlab.hf.cache("plain", model)


@torch.no_grad()
@pytest.mark.parametrize("helper", [None, "lookup"])
def test_a_cache_that_holds_tokens_is_refused_for_another_generate(helper: str | None, root: str) -> None:
    """Prefix reuse stays refused through the bridge: a second generate on a used cache (another prompt, or the
    first one continued) is refused before its prefill, naming why and the way that works; the cache keeps what
    it held."""
    model = load("llama", root)
    made = attnlab.hf.cache("plain", model)
    first = generate(model, IDS[:1], cache=made)
    held = made.get_seq_length()
    assert held == IDS.shape[1] + NEW - 1
    keys = made.layers[0].inner.k_cache[:, :, :held].clone()
    extra = {"prompt_lookup_num_tokens": 4} if helper else {}
    for other in (IDS[1:], first):
        with pytest.raises(
            ValueError,
            match=rf"this plain cache already holds {held} tokens of an earlier call, and transformers' generate "
            rf"would take them, unread, as the first {held} tokens of this prompt: a transformers cache never sees "
            r"token ids.*attnlab reuses no prefix through the bridge. Make a new attnlab.hf.cache\(...\) for each "
            r"generate call; .*PrefixCache across calls",
        ):
            generate(model, other, cache=made, **extra)
    assert made.get_seq_length() == held
    assert torch.equal(made.layers[0].inner.k_cache[:, :, :held], keys)


def snapshot(layer: Any) -> dict[str, Any]:
    """What one of transformers' layers holds: its ring's keys and length, or its convolution's inputs."""
    held = {name: getattr(layer, name, None) for name in ("keys", "values", "cumulative_length")}
    held.update({f"conv{i}": state for i, state in getattr(layer, "conv_states", {}).items()})
    return {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in held.items()}


@torch.no_grad()
def test_a_crop_one_layer_refuses_leaves_every_layer_as_it_was(root: str) -> None:
    """LFM3's other variant: sliding, conv, full, conv, sliding. The first convolution records its past, the second
    does not; a crop cuts the ring and the first convolution back, then the second refuses (transformers' own
    RuntimeError): both are put back, the convolution's dict of states included, and attnlab's layer never moved."""
    model = lfm3.hf("other", root)
    made = attnlab.hf.cache("plain", model)
    made.layers[1].activate_past_recording()
    model(lfm3.PROMPTS[:1, :6], cache=made, use_cache=True)  # under the window of 8: the ring crops as a full layer
    before = [snapshot(layer) for layer in made.layers if not isinstance(layer, AttnlabLayer)]
    assert before[1]["conv0"].shape[-1] == 6  # recording: the whole prompt's inputs, to be cut back
    with pytest.raises(RuntimeError, match=r"does not track past states"):
        made.crop(-2)
    after = [snapshot(layer) for layer in made.layers if not isinstance(layer, AttnlabLayer)]
    for was, now in zip(before, after, strict=True):
        assert was.keys() == now.keys()
        for name, value in was.items():
            assert torch.equal(value, now[name]) if isinstance(value, torch.Tensor) else value == now[name], name
    assert made.layers[2].get_seq_length() == 6


@torch.no_grad()
@pytest.mark.parametrize("keep", [1, 5])
def test_gemma4s_shared_layers_computed_for_the_last_tokens_read_every_key(keep: int, root: str) -> None:
    """Gemma 4 runs its KV-shared layers for the last logits_to_keep tokens alone, their mask left out (a guard it
    makes for sdpa only); assisted generation's first pass keeps 5. Through attnlab's attention those queries are
    the last of the keys, as in the whole forward: the logits equal the whole forward's last rows. (Before, the
    bridge took the keys for an empty static cache's prefill and kept the first 5: off by 0.18.)"""
    model, ids = load("gemma4", root, "attnlab"), prompt("gemma4")
    whole = model(ids).logits[0, -keep:]
    assert (model(ids, logits_to_keep=keep).logits[0] - whole).abs().max().item() < 1e-5
