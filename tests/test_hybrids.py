"""Hybrids: Qwen3.5's text models (Gated DeltaNet layers beside gated softmax attention) read from Hugging Face
directories, exact against transformers' Qwen3_5ForCausalLM on random weights from small configs where every
feature acts (issue 56).

The configs make each part matter: linear-attention layers before and after full ones, two key heads serving
4 (or 6) value heads whose width differs from the keys' (12 against 8), a causal convolution of 4 taps over q, k
and v, decays from slow (A = exp(-4)) to fast (exp(1)), zero-centred RMSNorms (1 + w) whose w are not zeros, a
gated RMSNorm whose weights are not ones, the softmax layers' output gate and partial RoPE (a quarter of each
head). Prompts of 80 tokens are longer than transformers' 64-token chunks, so a prefill carries its state from
one chunk to the next. A test takes each feature out and watches the logits move by more than 1e-3, so the
parity is not parity by default; the multimodal wrapper's text model reads the same way, and what cannot be read
(an unknown layer type, quantized weights) is refused from config.json alone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    PreTrainedModel,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)

from attnlab.models import GPT

VOCAB = 128
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # grouped value heads: each key head serves 2
    linear_key_head_dim=8,
    linear_value_head_dim=12,  # wider than the keys
    linear_conv_kernel_dim=4,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},  # 4 of 16
    tie_word_embeddings=False,
)
VARIANTS: dict[str, dict[str, object]] = {
    "untied": TEXT,
    # tied, a softmax layer first and last, 3 value heads per key head, as wide as the keys; an RMSNorm epsilon
    # large enough to act (the norms read it, the l2norm of q and k keeps its own 1e-6)
    "tied": TEXT
    | dict(
        tie_word_embeddings=True,
        rms_norm_eps=1e-2,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_value_heads=6,
        linear_value_head_dim=8,
    ),
}
VISION = dict(  # the wrapper's vision tower, as small as it goes; its output is the text model's width
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=16,
)
IDS = torch.randint(0, VOCAB, (2, 96), generator=torch.Generator().manual_seed(3))
PROMPTS = IDS[:, :80]  # past transformers' 64-token chunk


def perturb(model: PreTrainedModel, seed: int = 1) -> None:
    """Weights where every part acts: transformers initialises the zero-centred norms to 0 (a scale of 1 + 0),
    the gated norm to ones and dt_bias to ones; these draw them off those values. Linear weights of std 0.15
    and an output head of 0.05 keep the logits near 0.3 in std, where float32 agrees with float64 to about 1e-5
    (std 0.2 everywhere puts transformers' own float32 error at 5e-5, too near the 1e-4 tested)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda p, std: torch.randn(p.shape, generator=g) * std
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("model.embed_tokens", "model.layers", "model.norm", "lm_head", "model.language")):
                p.copy_(draw(p, 0.1))  # the wrapper's vision tower: not read, but not left at its init either
            elif name.endswith("A_log"):  # decays exp(-exp(A_log) * softplus(.)): A from exp(-4) to exp(1)
                p.copy_(torch.rand(p.shape, generator=g) * 5 - 4)
            elif name.endswith("dt_bias"):
                p.copy_(draw(p, 0.5))
            elif name.endswith("linear_attn.norm.weight"):  # the gated norm scales by w (ones at init)
                p.copy_(1 + draw(p, 0.3))
            elif p.dim() == 1:  # every other norm is zero-centred: it scales by 1 + w (zeros at init)
                p.copy_(draw(p, 0.3))
            elif name.endswith("conv1d.weight"):  # (channels, 1, taps): a kernel of 4 per channel
                p.copy_(draw(p, 0.5))
            elif name.endswith(("lm_head.weight", "embed_tokens.weight")):
                p.copy_(draw(p, 0.05))
            else:
                p.copy_(draw(p, 0.15))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hybrids"))


@functools.cache
def hf_dir(variant: str, root: str) -> Path:
    """A Qwen3_5ForCausalLM directory (model_type "qwen3_5_text") of ``variant`` with perturbed random weights."""
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**VARIANTS[variant])).eval()  # type: ignore[arg-type]
    perturb(model)
    where = Path(root) / variant
    model.save_pretrained(where)
    return where


@functools.cache
def hf(variant: str, root: str) -> Qwen3_5ForCausalLM:
    return Qwen3_5ForCausalLM.from_pretrained(hf_dir(variant, root)).eval()


@functools.cache
def hf_logits(variant: str, root: str, length: int = 80) -> torch.Tensor:
    with torch.no_grad():
        return hf(variant, root)(IDS[:, :length]).logits


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers_past_one_chunk(variant: str, root: str) -> None:
    """Two prompts of 80 tokens, in float32: within 1e-4 of Qwen3_5ForCausalLM, whose chunked prefill runs 64
    tokens and carries its state into the next 16."""
    ours = GPT.from_pretrained(hf_dir(variant, root))
    assert ours.config.family == "qwen3_5_text"
    err = float((ours(PROMPTS) - hf_logits(variant, root)).abs().max())
    assert err < 1e-4, (variant, err)


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_generate(variant: str, root: str) -> None:
    """16 greedy tokens after an 80-token prompt: GPT.generate (a prefill, then one token a step on the cache)
    gives transformers' generate tokens, and so does generate without a cache (the whole text each step)."""
    prompt = PROMPTS[:1]
    theirs = hf(variant, root).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False, eos_token_id=None
    )
    model = GPT.from_pretrained(hf_dir(variant, root))
    assert model.generate(prompt, 16).tolist() == theirs.tolist()
    assert model.generate(prompt, 16, use_cache=False).tolist() == theirs.tolist()


@torch.no_grad()
@pytest.mark.parametrize(("prefill", "end"), [(80, 96), (2, 24)])  # past a chunk; fewer than the 4 taps
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_prefill_then_one_token_a_step_gives_transformers_logits(
    variant: str, prefill: int, end: int, root: str
) -> None:
    """The cache split as generate makes it: ``prefill`` tokens in one call, then one token a step up to
    ``end`` on the same caches (the convolution's last 3 inputs and the delta rule's state; the softmax
    layers' keys and values). Every position's logits are within 1e-4 of transformers' single pass over the
    tokens: what the prefill leaves in the cache is what the next token needs, after 80 tokens (a chunk and
    16) and after 2, fewer than the convolution's window."""
    model = GPT.from_pretrained(hf_dir(variant, root))
    caches = model.make_caches(batch_size=2, max_len=96)
    parts = [model(IDS[:, :prefill], caches=caches)]
    parts += [model(IDS[:, t : t + 1], caches=caches) for t in range(prefill, end)]
    err = float((torch.cat(parts, dim=1) - hf_logits(variant, root, 96)[:, :end]).abs().max())
    assert err < 1e-4, (variant, prefill, err)


@torch.no_grad()
def test_a_left_padded_row_reads_as_transformers_reads_it(root: str) -> None:
    """Row 1 padded on the left by 7: attnlab's logits at its real positions equal transformers' with the same
    attention_mask within 1e-4 (transformers zeroes a padded token's input to the linear layers), and greedy
    decoding of the padded batch gives transformers' tokens."""
    model, theirs = GPT.from_pretrained(hf_dir("untied", root)), hf("untied", root)
    mask = torch.ones_like(PROMPTS)
    mask[1, :7] = 0
    reference = theirs(PROMPTS, attention_mask=mask).logits
    ours = model(PROMPTS, attention_mask=mask)
    assert float((ours[0] - reference[0]).abs().max()) < 1e-4
    assert float((ours[1, 7:] - reference[1, 7:]).abs().max()) < 1e-4
    expected = theirs.generate(
        PROMPTS, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert model.generate(PROMPTS, 8, attention_mask=mask)[:, 80:].tolist() == expected[:, 80:].tolist()


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_save_pretrained_writes_what_transformers_loads(variant: str, root: str, tmp_path: Path) -> None:
    """attnlab writes the folder; Qwen3_5ForCausalLM reads it with no key missing or left over and gives the
    same logits; config.json keeps model_type "qwen3_5_text" and the fields that shape the model; read back by
    attnlab, the model is the same to the bit."""
    ours = GPT.from_pretrained(hf_dir(variant, root))
    ours.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((hf_dir(variant, root) / "config.json").read_text())
    assert written["model_type"] == "qwen3_5_text" and written["architectures"] == ["Qwen3_5ForCausalLM"]
    shape = ["layer_types", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"]
    shape += ["head_dim", "vocab_size", "tie_word_embeddings", "rms_norm_eps", "linear_conv_kernel_dim"]
    shape += [f"linear_{k}" for k in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")]
    assert {k: written[k] for k in shape} == {k: original[k] for k in shape}
    rope = ("rope_theta", "partial_rotary_factor")
    assert {k: written["rope_parameters"][k] for k in rope} == {k: original["rope_parameters"][k] for k in rope}
    loaded: Any = Qwen3_5ForCausalLM.from_pretrained(tmp_path, output_loading_info=True)  # (model, info)
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(PROMPTS).logits - hf_logits(variant, root)).abs().max()) < 1e-5
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - ours(PROMPTS)).abs().max()) == 0.0


@functools.cache
def wrapper_dir(tied: bool, root: str) -> Path:
    """A Qwen3_5ForConditionalGeneration directory (model_type "qwen3_5": text_config, vision_config, weights
    under model.language_model. and model.visual.). ``tied`` ties at the top level only, as transformers reads
    a wrapper's tie_word_embeddings (the text_config's says False). The text config's rope_parameters carries
    mrope_section and mrope_interleaved, as the published configs do: on text alone every section sees the
    same position."""
    rope = TEXT["rope_parameters"] | {"mrope_section": [1, 1, 0], "mrope_interleaved": True}  # type: ignore[operator]
    config = Qwen3_5Config(text_config=TEXT | {"rope_parameters": rope}, vision_config=VISION, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    perturb(model)
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) == tied
    where = Path(root) / f"wrapper-{'tied' if tied else 'untied'}"
    model.save_pretrained(where)
    return where


@pytest.mark.slow  # builds and saves further models: the second stage keeps the first under budget
@torch.no_grad()
@pytest.mark.parametrize("tied", [False, True])
def test_the_multimodal_wrappers_text_model_is_read(tied: bool, root: str) -> None:
    """GPT.from_pretrained on a Qwen3_5ForConditionalGeneration folder reads its language model and lm_head:
    logits within 1e-4 of the wrapper's own forward on input_ids alone (no image), and its greedy tokens."""
    where = wrapper_dir(tied, root)
    wrapper = Qwen3_5ForConditionalGeneration.from_pretrained(where).eval()
    ours = GPT.from_pretrained(where)
    assert ours.config.tie_weights == tied
    err = float((ours(PROMPTS) - wrapper(input_ids=PROMPTS).logits).abs().max())
    assert err < 1e-4, (tied, err)
    prompt = PROMPTS[:1]
    theirs = wrapper.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, eos_token_id=None
    )
    assert ours.generate(prompt, 8).tolist() == theirs.tolist()


def test_saving_a_model_read_from_the_wrapper_is_refused_by_name(root: str, tmp_path: Path) -> None:
    """attnlab holds the text model only: writing it back as the wrapper would lose the vision tower, and
    writing it as a text model would not be the folder it came from. save_pretrained refuses, naming the vision
    tower, before it writes anything."""
    ours = GPT.from_pretrained(wrapper_dir(False, root))
    with pytest.raises(ValueError, match="vision"):
        ours.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _edited_config(source: Path, where: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of ``source``'s config.json, edited (the text config where the folder is a wrapper), beside a
    model.safetensors that is not safetensors: a reader that opens the weights before it has checked the
    config fails on the file, not on the config."""
    where.mkdir()
    raw = json.loads((source / "config.json").read_text())
    edit(raw)
    (where / "config.json").write_text(json.dumps(raw))
    (where / "model.safetensors").write_bytes(b"these are not weights" * 4)
    return where


def _text(raw: dict) -> dict:
    return raw.get("text_config", raw)


def _unknown_layer(raw: dict) -> None:
    _text(raw)["layer_types"][1] = "mamba"


def _short_layer_types(raw: dict) -> None:
    _text(raw)["layer_types"] = _text(raw)["layer_types"][:3]


def _quantized(raw: dict) -> None:  # as Qwen's FP8 releases write it, at the top level
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


@pytest.mark.parametrize("form", ["text", "wrapper"])
@pytest.mark.parametrize(
    ("edit", "message"),
    [(_unknown_layer, r"mamba"), (_short_layer_types, r"layer_types"), (_quantized, r"quantiz")],
    ids=["unknown-layer-type", "layer-types-too-short", "quantized"],
)
def test_what_cannot_be_read_is_refused_from_the_config_alone(
    form: str, edit: Callable[[dict], None], message: str, root: str, tmp_path: Path
) -> None:
    """A layer type attnlab does not have (named in the message), a layer_types list shorter than
    num_hidden_layers, and a quantized checkpoint (its weights are not float tensors of the model's shapes) are
    refused with a ValueError about the config before any weight is read: the folder's weights file is
    corrupt, and the message is not about it."""
    source = hf_dir("untied", root) if form == "text" else wrapper_dir(False, root)
    where = _edited_config(source, tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=message) as refused:
        GPT.from_pretrained(where)
    assert "safetensors" not in str(refused.value), refused.value


@torch.no_grad()
def test_a_config_without_partial_rotary_factor_reads_as_transformers_reads_it(root: str, tmp_path: Path) -> None:
    """transformers' Qwen3_5TextConfig turns a quarter of each head when rope_parameters does not say
    (partial_rotary_factor defaults to 0.25 there, not 1.0): attnlab reads the same folder alike."""
    source = hf_dir("untied", root)
    raw = json.loads((source / "config.json").read_text())
    del raw["rope_parameters"]["partial_rotary_factor"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    theirs = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()(PROMPTS).logits
    assert float((theirs - hf_logits("untied", root)).abs().max()) < 1e-6  # transformers: the same model
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - theirs).abs().max()) < 1e-4


@torch.no_grad()
def test_multi_token_prediction_weights_in_the_file_are_left_as_transformers_leaves_them(
    root: str, tmp_path: Path
) -> None:
    """Qwen3.5's releases carry a multi-token-prediction head (tensors named mtp.*) that Qwen3_5ForCausalLM
    ignores on load: attnlab reads such a file too, with the same logits."""
    source = hf_dir("untied", root)
    tensors = load_file(source / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    tensors |= {
        "mtp.fc.weight": torch.randn(32, 64, generator=g),
        "mtp.norm.weight": torch.randn(32, generator=g),
        "mtp.layers.0.input_layernorm.weight": torch.randn(32, generator=g),
    }
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    theirs = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()(PROMPTS).logits
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - theirs).abs().max()) < 1e-4


def _without(root: str, **changes: object) -> torch.Tensor:
    """Logits of the untied model with one feature taken out (its weights otherwise the same): a weight that
    only the feature had (the convolution's, the output gate's) is the only one missing or left over."""
    loaded = GPT.from_pretrained(hf_dir("untied", root))
    bare = GPT(loaded.config.with_(**changes)).eval()
    missing, unexpected = bare.load_state_dict(loaded.state_dict(), strict=False)
    assert all(any(n in k for n in ("conv", ".gate.")) for k in [*missing, *unexpected]), (missing, unexpected)
    return bare(PROMPTS)


@torch.no_grad()
@pytest.mark.parametrize(
    "changes",
    [
        {"conv_kernel": None},  # the causal convolution over q, k and v of the linear layers
        {"attn_output_gate": False},  # the softmax layers' output gate, sigmoid(gate(x)) on each head's output
        {"rotary_dim": None},  # partial RoPE: the whole head turned instead of its first quarter
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_removing_a_feature_moves_the_logits(changes: dict[str, object], root: str) -> None:
    """Each feature the parity relies on acts in this config: without it the logits move by more than 1e-3."""
    assert float((_without(root, **changes) - hf_logits("untied", root)).abs().max()) > 1e-3


def _zero_centred_norms(name: str, w: torch.Tensor) -> torch.Tensor | None:
    """Every Qwen3_5RMSNorm (input, post-attention, q, k, final): scaled by 1 + w, so w + 0.5 is 1.5 + w."""
    return w + 0.5 if name.endswith("norm.weight") and ".linear_attn.norm." not in name else None


def _gated_norms(name: str, w: torch.Tensor) -> torch.Tensor | None:
    """The linear layers' gated RMSNorm, which scales by w itself (ones at init): w + 0.5."""
    return w + 0.5 if ".linear_attn.norm." in name else None


def _decays(name: str, w: torch.Tensor) -> torch.Tensor | None:
    return w + 1.0 if name.endswith(("A_log", "dt_bias")) else None


def _reversed_taps(name: str, w: torch.Tensor) -> torch.Tensor | None:
    """The convolution's 4 taps in the other order: the oldest input weighted as the newest was."""
    return w.flip(-1) if name.endswith("conv1d.weight") else None


@pytest.mark.slow  # builds and saves further models: the second stage keeps the first under budget
@torch.no_grad()
@pytest.mark.parametrize(
    "edit",
    [_zero_centred_norms, _gated_norms, _decays, _reversed_taps],
    ids=["zero-centred-norms", "gated-norms", "decays", "conv-taps-reversed"],
)
def test_an_edit_to_the_weights_moves_transformers_and_attnlab_alike(
    edit: Callable[[str, torch.Tensor], torch.Tensor | None], root: str, tmp_path: Path
) -> None:
    """The file's weights edited: transformers' logits move by more than 1e-3 and attnlab, reading the edited
    file, follows within 1e-4. For the zero-centred norms this is the +1 read right whatever w is (an offset
    applied twice, or to the gated norm that has none, breaks it)."""
    source = hf_dir("untied", root)
    tensors = load_file(source / "model.safetensors")
    edited = {name: edit(name, w) for name, w in tensors.items()}
    assert any(w is not None for w in edited.values())
    tensors |= {name: w.contiguous() for name, w in edited.items() if w is not None}
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    theirs = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()(PROMPTS).logits
    assert float((theirs - hf_logits("untied", root)).abs().max()) > 1e-3
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - theirs).abs().max()) < 1e-4


@torch.no_grad()
def test_the_rms_norm_epsilon_is_read_as_transformers_reads_it(root: str, tmp_path: Path) -> None:
    """rms_norm_eps set to 1e-2 in config.json: transformers' logits move by more than 1e-3 (the zero-centred
    norms and the gated norm read it), and attnlab, reading the same folder, follows within 1e-4 (the l2norm of
    the linear layers' q and k keeps its own 1e-6 there)."""
    source = hf_dir("untied", root)
    raw = json.loads((source / "config.json").read_text())
    raw["rms_norm_eps"] = 1e-2
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    theirs = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()(PROMPTS).logits
    assert float((theirs - hf_logits("untied", root)).abs().max()) > 1e-3
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - theirs).abs().max()) < 1e-4
