"""Qwen3.5-MoE's text models (Qwen3.5's hybrid layers, a mixture of experts with a gated shared expert on every
layer) read from Hugging Face directories, exact against transformers' Qwen3_5MoeForCausalLM on random weights from
small configs where every feature acts (issue 56).

Qwen3.5's layers as ``tests/test_hybrids.py`` makes them act (grouped value heads wider than the keys, the
convolution, decays, zero-centred and gated norms, the output gate, partial RoPE), and on every layer 6 experts of
width 24 of which a token runs 2, the router's weights renormalized over those 2, and a shared expert of width 40
(not the experts' width: a reader that took one for the other would not fit) opened per token by
sigmoid(shared_expert_gate(x)). Prompts of 80 tokens are longer than transformers' 64-token chunk. A test takes
the shared expert's gate out, the shared expert, the renormalization and the routing itself, and watches the
logits move by more than 1e-3; the multimodal wrapper's text model reads the same way; what cannot be read is
refused from config.json alone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
)

from attnlab.models import GPT, GPTConfig
from attnlab.models.parts import MoEFeedForward
from test_hybrids import PROMPTS, VISION, perturb

pytestmark = pytest.mark.slow  # builds, saves and runs transformers' models: the second stage

TEXT = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False,
    num_experts=6,
    num_experts_per_tok=2,  # 2 of 6: the router chooses
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,  # not the experts' width
)
VARIANTS: dict[str, dict[str, object]] = {
    "untied": TEXT,
    # tied, a softmax layer first and last, 3 value heads per key head, 3 experts of 5 a token
    "tied": TEXT
    | dict(
        tie_word_embeddings=True,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_value_heads=6,
        linear_value_head_dim=8,
        num_experts=5,
        num_experts_per_tok=3,
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hybrids_moe"))


@functools.cache
def hf_dir(variant: str, root: str) -> Path:
    """A Qwen3_5MoeForCausalLM directory (model_type "qwen3_5_moe_text") of ``variant``, perturbed random weights."""
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**VARIANTS[variant])).eval()  # type: ignore[arg-type]
    perturb(model)
    where = Path(root) / variant
    model.save_pretrained(where)
    return where


@functools.cache
def hf(variant: str, root: str) -> Qwen3_5MoeForCausalLM:
    return Qwen3_5MoeForCausalLM.from_pretrained(hf_dir(variant, root)).eval()


@functools.cache
def hf_logits(variant: str, root: str) -> torch.Tensor:
    with torch.no_grad():
        return hf(variant, root)(PROMPTS).logits


def test_the_files_keep_each_expert_under_its_own_names(root: str) -> None:
    """transformers fuses the experts on load and splits them back on save: the file holds expert e's
    gate_proj, up_proj and down_proj, the router, the shared expert and its gate, which attnlab reads and writes."""
    from safetensors import safe_open

    with safe_open(str(hf_dir("untied", root) / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    layer = "model.layers.3.mlp."
    assert {f"{layer}experts.5.{p}_proj.weight" for p in ("gate", "up", "down")} <= names
    assert {layer + "gate.weight", layer + "shared_expert_gate.weight", layer + "shared_expert.up_proj.weight"} <= names
    assert not any("gate_up_proj" in name for name in names)


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers_past_one_chunk(variant: str, root: str) -> None:
    """Two prompts of 80 tokens in float32: within 1e-4 of Qwen3_5MoeForCausalLM, and the tokens go to several
    experts (the routing acts)."""
    ours = GPT.from_pretrained(hf_dir(variant, root))
    assert ours.config.family == "qwen3_5_moe_text" and ours.config.shared_expert_gate
    moe, seen = ours.trf_blocks[1].ff, []
    assert isinstance(moe, MoEFeedForward)
    hook = moe.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    err = float((ours(PROMPTS) - hf_logits(variant, root)).abs().max())
    hook.remove()
    assert err < 1e-4, (variant, err)
    chosen, _ = moe.route(seen[0])  # (B, T, k): the experts layer 1 gave each token
    assert chosen.unique().numel() == moe.num_experts


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_generate(variant: str, root: str) -> None:
    """16 greedy tokens after an 80-token prompt: GPT.generate on its caches, and without them, gives
    transformers' generate tokens."""
    prompt = PROMPTS[:1]
    theirs = hf(variant, root).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False, eos_token_id=None
    )
    model = GPT.from_pretrained(hf_dir(variant, root))
    assert model.generate(prompt, 16).tolist() == theirs.tolist()
    assert model.generate(prompt, 16, use_cache=False).tolist() == theirs.tolist()


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_save_pretrained_writes_what_transformers_loads(variant: str, root: str, tmp_path: Path) -> None:
    """attnlab writes the folder; Qwen3_5MoeForCausalLM reads it with no key missing or left over and gives the
    same logits; config.json keeps model_type "qwen3_5_moe_text" and the fields that shape the model; read back
    by attnlab, the model is the same to the bit."""
    ours = GPT.from_pretrained(hf_dir(variant, root))
    ours.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((hf_dir(variant, root) / "config.json").read_text())
    assert written["model_type"] == "qwen3_5_moe_text" and written["architectures"] == ["Qwen3_5MoeForCausalLM"]
    shape = ["layer_types", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"]
    shape += ["tie_word_embeddings", "rms_norm_eps", "num_experts", "num_experts_per_tok", "moe_intermediate_size"]
    shape += ["shared_expert_intermediate_size", "linear_conv_kernel_dim", "linear_num_value_heads"]
    assert {k: written[k] for k in shape} == {k: original[k] for k in shape}
    assert "intermediate_size" not in written  # no dense MLP in this class
    loaded: Any = Qwen3_5MoeForCausalLM.from_pretrained(tmp_path, output_loading_info=True)  # (model, info)
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(PROMPTS).logits - hf_logits(variant, root)).abs().max()) < 1e-5
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - ours(PROMPTS)).abs().max()) == 0.0


@functools.cache
def wrapper_dir(tied: bool, root: str) -> Path:
    """A Qwen3_5MoeForConditionalGeneration directory (model_type "qwen3_5_moe": text_config, vision_config,
    weights under model.language_model. and model.visual.), tied at the top level only, with mrope settings."""
    rope = TEXT["rope_parameters"] | {"mrope_section": [1, 1, 0], "mrope_interleaved": True}  # type: ignore[operator]
    config = Qwen3_5MoeConfig(
        text_config=TEXT | {"rope_parameters": rope}, vision_config=VISION, tie_word_embeddings=tied
    )
    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(config).eval()
    perturb(model)
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) == tied
    where = Path(root) / f"wrapper-{'tied' if tied else 'untied'}"
    model.save_pretrained(where)
    return where


@torch.no_grad()
@pytest.mark.parametrize("tied", [False, True])
def test_the_multimodal_wrappers_text_model_is_read(tied: bool, root: str) -> None:
    """GPT.from_pretrained on a Qwen3_5MoeForConditionalGeneration folder reads its language model and lm_head
    (the vision tower is in the file, and not loaded): logits within 1e-4 of the wrapper's forward on input_ids
    alone, and its greedy tokens."""
    where = wrapper_dir(tied, root)
    wrapper = Qwen3_5MoeForConditionalGeneration.from_pretrained(where).eval()
    ours = GPT.from_pretrained(where)
    assert (ours.config.family, ours.config.tie_weights) == ("qwen3_5_moe", tied)
    err = float((ours(PROMPTS) - wrapper(input_ids=PROMPTS).logits).abs().max())
    assert err < 1e-4, (tied, err)
    prompt = PROMPTS[:1]
    theirs = wrapper.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False, eos_token_id=None
    )
    assert ours.generate(prompt, 16).tolist() == theirs.tolist()


def test_saving_a_model_read_from_the_wrapper_is_refused_by_name(root: str, tmp_path: Path) -> None:
    """The vision tower was not loaded, so the wrapper cannot be written back whole: save_pretrained refuses,
    naming the vision tower and the text family to save as, before it writes anything."""
    ours = GPT.from_pretrained(wrapper_dir(False, root))
    with pytest.raises(ValueError, match=r"qwen3_5_moe multimodal folder whose vision tower.*'qwen3_5_moe_text'"):
        ours.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _edited_config(source: Path, where: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of ``source``'s config.json, edited (the text config of a wrapper), beside a model.safetensors that
    is not safetensors: a reader that opened the weights before checking the config would fail on the file."""
    where.mkdir()
    raw = json.loads((source / "config.json").read_text())
    edit(raw.get("text_config", raw))
    (where / "config.json").write_text(json.dumps(raw))
    (where / "model.safetensors").write_bytes(b"these are not weights" * 4)
    return where


EDITS: dict[str, tuple[Callable[[dict], None], str]] = {
    "unknown-layer-type": (lambda text: text["layer_types"].__setitem__(1, "mamba"), r"mamba"),
    "quantized": (
        lambda text: text.update(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
        r"quantized .*fp8.*unquantized",
    ),
    "dense-layers": (lambda text: text.update(mlp_only_layers=[1]), r"mlp_only_layers=\[1\] is not read .*every layer"),
    "sparse-step": (lambda text: text.update(decoder_sparse_step=2), r"decoder_sparse_step=2 is not read"),
    "unnormalized": (lambda text: text.update(norm_topk_prob=False), r"norm_topk_prob=False .*renormalized"),
    "ungated": (lambda text: text.update(attn_output_gate=False), r"attn_output_gate=False .*output gate"),
    "no-shared-width": (
        lambda text: text.pop("shared_expert_intermediate_size"),
        r"no 'shared_expert_intermediate_size'",
    ),
}


@pytest.mark.parametrize("form", ["text", "wrapper"])
@pytest.mark.parametrize("edit", EDITS)
def test_what_cannot_be_read_is_refused_from_the_config_alone(form: str, edit: str, root: str, tmp_path: Path) -> None:
    """A layer type attnlab does not have, a quantized checkpoint, the settings of other Qwen MoE configs that
    this class does not read (dense layers, a sparse step, unnormalized routing, no output gate) and a missing
    shared expert width: a ValueError naming the setting, before any weight is read (the weights file is
    corrupt and the message is not about it)."""
    source = hf_dir("untied", root) if form == "text" else wrapper_dir(False, root)
    change, message = EDITS[edit]
    where = _edited_config(source, tmp_path / "bad", change)
    with pytest.raises(ValueError, match=message) as refused:
        GPT.from_pretrained(where)
    assert "safetensors" not in str(refused.value), refused.value


def _without(root: str, **changes: object) -> torch.Tensor:
    """Logits of the untied model with one feature taken out, its other weights the same: only the shared
    expert's tensors may be missing or left over."""
    loaded = GPT.from_pretrained(hf_dir("untied", root))
    bare = GPT(loaded.config.with_(**changes)).eval()
    missing, unexpected = bare.load_state_dict(loaded.state_dict(), strict=False)
    assert all(".ff.shared" in k for k in [*missing, *unexpected]), (missing, unexpected)
    return bare(PROMPTS)


@torch.no_grad()
@pytest.mark.parametrize(
    "changes",
    [
        {"shared_expert_gate": False},  # the shared expert ungated: sigmoid(shared_gate(x)) taken as 1
        {"n_shared_experts": 0, "shared_expert_gate": False},  # no shared expert at all
        {"norm_topk_prob": False},  # the chosen experts' softmax weights not renormalized
        {"num_experts_per_tok": 6},  # every expert on every token: no routing
    ],
    ids=["shared-expert-gate", "shared-expert", "renormalization", "routing"],
)
def test_removing_a_feature_moves_the_logits(changes: dict[str, object], root: str) -> None:
    """Each part of the mixture the parity relies on acts in this config: without it the logits move by more
    than 1e-3."""
    assert float((_without(root, **changes) - hf_logits("untied", root)).abs().max()) > 1e-3


def test_the_routed_experts_and_the_gated_shared_expert_equal_the_readable_form() -> None:
    """MoEFeedForward with a gated shared expert: each expert on its tokens (forward) gives every expert on every
    token weighted by the router (every_expert), outputs and gradients, and the gate acts on both."""
    torch.manual_seed(0)
    moe = MoEFeedForward(emb_dim=16, hidden_dim=24, num_experts=6, num_experts_per_tok=2, shared=(20, True))
    x = torch.randn(2, 7, 16, requires_grad=True)
    routed, every = moe(x), moe.every_expert(x)
    torch.testing.assert_close(routed, every)
    assert moe.shared_gate is not None
    params = [x, moe.gate.weight, moe.shared_gate.weight, moe.shared.fc2.weight]  # type: ignore[union-attr]
    for a, b in zip(*(torch.autograd.grad(out.sum(), params) for out in (routed, every)), strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        opened = torch.sigmoid(moe.shared_gate(x))  # (B, T, 1)
        assert float(opened.max() - opened.min()) > 0.1  # a different opening per token
        ungated = moe.every_expert(x) + (1 - opened) * moe.shared(x)  # type: ignore[misc]
        moe.shared_gate = None
        torch.testing.assert_close(moe(x), ungated)


def test_a_shared_expert_gate_without_a_shared_expert_is_refused() -> None:
    with pytest.raises(ValueError, match=r"shared=\(0, True\): a gate opens a shared expert, which needs a width"):
        MoEFeedForward(emb_dim=16, hidden_dim=24, num_experts=4, num_experts_per_tok=2, shared=(0, True))
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    with pytest.raises(ValueError, match=r"shared_expert_gate opens a shared expert.*n_shared_experts=0"):
        GPTConfig(**moe, shared_expert_gate=True)
    with pytest.raises(TypeError, match=r"shared_expert_gate must be a bool, got 1"):
        GPTConfig(**moe, n_shared_experts=1, shared_expert_gate=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shared_expert_dim"):
        GPTConfig(**moe, n_shared_experts=1, shared_expert_dim=0)


def test_a_gated_shared_expert_is_saved_by_no_family_without_it() -> None:
    """Qwen3-MoE's and DeepSeek-V3's config.json have no shared expert gate, nor a shared width of its own: a model
    with either is not written as those families (it would lose them), only as Qwen3.5-MoE where it is one."""
    from attnlab.models import families

    moe = dict(norm="rmsnorm", mlp="swiglu", bias=False, rope=True, qk_norm=True, hidden_dim=64)
    moe |= dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    assert families.holds(GPTConfig(**moe, family="qwen3_moe"))  # what the settings are added to
    for changes in ({"n_shared_experts": 1, "shared_expert_gate": True}, {"shared_expert_dim": 12}):
        assert not families.holds(GPTConfig(**moe, **changes, family="qwen3_moe")), changes  # type: ignore[arg-type]
