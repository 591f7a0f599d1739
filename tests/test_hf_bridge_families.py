"""The transformers bridge on the families of issue 56 (Gemma 4, MiMo-V2-Flash, Kimi Linear, Qwen3.5 and
Qwen3.5-MoE): ``attnlab.hf.use`` and ``attnlab.hf.cache`` work exactly or refuse by name.

Each family's tiny transformers model is the one its own test file builds (random weights where every feature
acts). ``use``: logits within 1e-4 of transformers' eager attention, and a score_mod on one layer at a time moves
the logits, so every softmax layer (Gemma 4's KV-shared ones, MiMo's sliding ones with sinks, Kimi's latent one,
Qwen3.5's gated full ones) ran attnlab's attention; a ``use`` that left the model's attention alone would fail it.
(Qwen3.5's logits under ``use(backend="flash")`` can equal sdpa's to the bit: on the CPU attnlab's flash gives a
causal diagonal tile to PyTorch's fused kernel, the one sdpa runs; the effect test tells the two apart.)
``cache``: 16 greedy tokens equal transformers' own generate (Gemma 4 with KV sharing, MiMo's values narrower
than its keys, layer by layer); what it cannot hold is refused when the cache is made, before any layer writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnlab.hf
import test_gemma4 as gemma4
import test_hybrids as qwen35
import test_hybrids_moe as qwen35_moe
import test_kimi_linear as kimi
import test_mimo_v2_flash as mimo
from attnlab.functional import mods
from attnlab.models import GPT

pytestmark = pytest.mark.slow  # transformers' models, built, saved and run: the second stage

Build = Callable[[str], Any]
FAMILIES: dict[str, tuple[Build, torch.Tensor]] = {
    "gemma4": (lambda root: gemma4.hf(root), gemma4.PROMPTS),
    "gemma4-other": (lambda root: gemma4.hf(root, "other"), gemma4.PROMPTS),
    "mimo": (lambda root: mimo.hf("default", root), mimo.PROMPTS),
    "mimo-other": (lambda root: mimo.hf("other", root), mimo.PROMPTS),
    "kimi": (lambda root: kimi.hf(root), kimi.PROMPTS),
    "qwen3.5": (lambda root: qwen35.hf("tied", root), qwen35.PROMPTS),
    "qwen3.5-moe": (lambda root: qwen35_moe.hf("untied", root), qwen35_moe.PROMPTS),
}
SOFTMAX = ("full_attention", "sliding_attention")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("bridge_families"))


def model(family: str, root: str) -> Any:
    return FAMILIES[family][0](root)


def eager_logits(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own logits, its eager attention."""
    before = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return hf(ids).logits
    finally:
        hf.set_attn_implementation(before)


def softmax_layers(hf: Any) -> list[int]:
    return [i for i, kind in enumerate(hf.config.layer_types) if kind in SOFTMAX]


@pytest.mark.parametrize("family", ["gemma4", "mimo", "kimi", "qwen3.5", "qwen3.5-moe"])
def test_use_gives_eager_logits_and_runs_every_softmax_layer(family: str, root: str) -> None:
    hf, ids = model(family, root), FAMILIES[family][1]
    theirs = eager_logits(hf, ids)
    with torch.no_grad():
        own = hf(ids).logits  # the attention it was loaded with
    with torch.no_grad(), attnlab.hf.use(hf, backend="flash"):
        ours = hf(ids).logits
    assert (ours - theirs).abs().max() < 1e-4
    layers = softmax_layers(hf)
    assert layers, family
    if family == "gemma4":  # its last two layers read layers 2's and 3's keys: they must be among those tested
        assert {4, 5} <= set(layers) and hf.model.layers[5].self_attn.is_kv_shared_layer
    for layer in layers:  # squashing one layer's scores moves the logits only if attnlab ran that layer
        with torch.no_grad(), attnlab.hf.use(hf, backend="flash", score_mod={layer: mods.softcap(0.5)}):
            moved = hf(ids).logits
        assert (moved - ours).abs().max() > 1e-3, (family, layer)
    with torch.no_grad():  # and undo() gave the model its own attention back
        assert torch.equal(hf(ids).logits, own)
    assert hf.config._attn_implementation != "attnlab"


@pytest.mark.parametrize("family", ["qwen3.5", "kimi"])
def test_a_mod_on_a_layer_that_is_not_attention_is_refused(family: str, root: str) -> None:
    hf = model(family, root)
    other = next(i for i, kind in enumerate(hf.config.layer_types) if kind == "linear_attention")
    before = hf.config._attn_implementation
    with pytest.raises(ValueError, match=rf"score_mod names layers \[{other}\], of types \['linear_attention'\], "
                       r"which compute no attention scores.*attention layers \["):  # fmt: skip
        attnlab.hf.use(hf, score_mod={other: mods.softcap(0.5)})
    assert hf.config._attn_implementation == before  # the model unchanged


@pytest.mark.parametrize(
    ("family", "name", "attnlab_attention"),
    [
        ("gemma4", "plain", False),
        ("gemma4", "plain", True),
        ("gemma4", "int8", True),  # int8 and int4 code keys older than `residual`; here none is: exact
        ("gemma4-other", "plain", True),
        ("gemma4-other", "int8", False),
        ("gemma4-other", "sink", True),  # within its window: the plain cache; its rotation reads the full layers'
        ("mimo", "plain", False),
        ("mimo", "plain", True),
        ("mimo-other", "plain", True),  # a sliding layer first
    ],
)
def test_greedy_tokens_through_an_attnlab_cache_equal_transformers(
    family: str, name: str, attnlab_attention: bool, root: str
) -> None:
    hf, prompts = model(family, root), FAMILIES[family][1]
    with torch.no_grad():
        theirs = hf.generate(prompts, max_new_tokens=16, do_sample=False)
        exact = {"residual": 96} if name == "int8" else {}  # the 96 tokens kept in full: int8's wiring, exact
        with attnlab.hf.use(hf) if attnlab_attention else contextlib.nullcontext():
            cache = attnlab.hf.cache(name, hf, max_len=prompts.shape[1] + 16, **exact)
            ours = hf.generate(prompts, max_new_tokens=16, do_sample=False, cache=cache)
    assert torch.equal(ours, theirs)


def test_each_layer_keeps_its_own_shape(root: str) -> None:
    """MiMo's full layers' caches hold values of 8 beside keys of 12; Gemma 4's full layers one key/value head of
    16 where its sliding ones keep transformers' ring of 2 heads of 8, and the shared layers' caches nothing."""
    for family, full, shape in (("mimo", 0, (1, 12, 8)), ("gemma4", 1, (1, 16, 16))):
        hf, prompts = model(family, root), FAMILIES[family][1]
        cache = attnlab.hf.cache("plain", hf, max_len=96)
        with torch.no_grad():
            hf.generate(prompts, max_new_tokens=2, do_sample=False, cache=cache)
        inner = cache.layers[full].inner
        assert (inner.num_kv_heads, inner.head_dim, inner.value_dim) == shape, family
    assert cache.layers[0].keys.shape[1:4:2] == (2, 8)  # Gemma 4's sliding layer 0: transformers' ring
    assert cache.layers[5].inner is None  # layer 5 reads layer 3's keys: its own cache was never written


@pytest.mark.parametrize("family", ["mimo", "mimo-other"])
@pytest.mark.parametrize("name", ["int8", "int4", "sink", "h2o", "snapkv"])
def test_a_cache_that_keeps_values_as_wide_as_keys_is_refused_on_mimo_when_made(
    family: str, name: str, root: str
) -> None:
    hf = model(family, root)
    with attnlab.hf.use(hf), pytest.raises(
        ValueError, match=rf"the {name} cache keeps values as wide as keys; this layer's values are 8 wide beside "
        r"keys of 12.*use the 'plain' or 'paged' cache"
    ):  # fmt: skip
        attnlab.hf.cache(name, hf, max_len=96)


@pytest.mark.parametrize("name", ["sink", "h2o", "snapkv"])
def test_a_positioned_cache_is_refused_on_a_model_that_shares_keys(name: str, root: str) -> None:
    hf = model("gemma4", root)
    with attnlab.hf.use(hf), pytest.raises(
        ValueError, match=rf"the {name} cache keeps its keys at positions only the layer that wrote them is read at.*"
        r"last 2 layers read earlier layers' keys and values \(KV sharing.*use 'plain', 'int8' or 'int4'"
    ):  # fmt: skip
        attnlab.hf.cache(name, hf, max_len=96)


@pytest.mark.parametrize(
    ("family", "why"),
    [
        ("kimi", r"layers \[0, 1, 3\] are 'linear_attention', which keep a recurrent state and a short convolution's "
         r"\(Gated DeltaNet, Kimi Delta Attention\); its latent attention \(DeepSeek's MLA\)"),
        ("qwen3.5", r"layers \[1, 2\] are 'linear_attention', which keep a recurrent state"),
        ("qwen3.5-moe", r"layers \[0, 1, 2\] are 'linear_attention', which keep a recurrent state"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("name", ["plain", "int8"])
def test_a_layer_that_keeps_no_keys_and_values_is_refused_naming_the_fix(
    family: str, why: str, name: str, root: str
) -> None:
    hf = model(family, root)
    with pytest.raises(ValueError, match=rf"attnlab.hf.cache gives a model keys and values alone, and {why}.*: leave "
                       r"the cache to transformers \(generate without cache=.*GPT.from_pretrained\(path\)"):  # fmt: skip
        attnlab.hf.cache(name, hf, max_len=96)


@pytest.mark.parametrize("family", ["kimi", "qwen3.5-moe"])
def test_the_way_the_refusal_names_works(family: str, root: str) -> None:
    """Both ways out the message gives: transformers' own cache under attnlab's attention, and attnlab's model."""
    hf, prompts = model(family, root), FAMILIES[family][1][:1, :40]
    with torch.no_grad():
        theirs = hf.generate(prompts, max_new_tokens=8, do_sample=False)
        with attnlab.hf.use(hf):
            assert torch.equal(hf.generate(prompts, max_new_tokens=8, do_sample=False), theirs)
    folder = kimi.hf_dir(root) if family == "kimi" else qwen35_moe.hf_dir("untied", root)
    ours = GPT.from_pretrained(folder).generate(prompts, 8, cache="plain")
    assert torch.equal(ours, theirs)
