"""Kimi Linear read from Hugging Face directories, exact against transformers' KimiLinearForCausalLM on random weights
from a small config where every feature acts (issue 56).

Kimi Delta Attention layers before and after a latent attention (MLA) layer without RoPE; decays per channel drawn
from slow to fast (A = exp(-4) to exp(1), dt_bias of std 0.5) through their own low-rank projection; short
convolutions of 4 taps on q, k and v; a gated output norm whose weights are not ones; a dense first layer, then a
mixture of 8 experts in 2 groups (the best group kept, 2 experts a token) with a correction bias that is not zero
and a shared expert. Prompts of 80 tokens pass transformers' 64-token chunk, so a prefill carries its state. The
folder is transformers' own save, with Moonshot's names (``block_sparse_moe``, ``q_conv1d``, ``w1``..., and the
dense layer under ``block_sparse_moe`` too, as its save writes it). A test takes each feature out in turn and
watches the logits move by more than 1e-3, so the parity is not parity by default.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import KimiLinearConfig, KimiLinearForCausalLM

from attnlab.models import GPT
from attnlab.models.families import config_from_hf

pytestmark = pytest.mark.slow  # family parity: the second stage
VOCAB = 128
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,  # kept in every key, turned by no position
    v_head_dim=12,  # wider than the keys' parts
    num_local_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4, "kda_layers": [1, 2, 4]}
    | {"full_attn_layers": [3]},
    first_k_dense_replace=1,
    max_position_embeddings=256,
    pad_token_id=None,  # KimiLinearConfig's ids are past this vocabulary; a pad id would mask those tokens
    bos_token_id=None,
    eos_token_id=None,
)
IDS = torch.randint(0, VOCAB, (2, 96), generator=torch.Generator().manual_seed(5))
PROMPTS = IDS[:, :80]  # past transformers' 64-token chunk


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("kimi_linear"))


@functools.cache
def hf_dir(root: str) -> Path:
    """A KimiLinearForCausalLM directory with weights drawn off their inits (norms around 1, the correction bias and
    dt_bias not zero, decays from slow to fast), saved by transformers."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig(**CONFIG)).eval()  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            draw = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):  # decays exp(-exp(A_log) * softplus(.)): A from exp(-4) to exp(1)
                p.copy_(torch.rand(p.shape, generator=g) * 5 - 4)
            elif name.endswith(("dt_bias", "e_score_correction_bias")):
                p.copy_(draw * (0.5 if name.endswith("dt_bias") else 0.3))
            elif p.dim() == 1:  # norms: they scale by w
                p.copy_(1 + 0.3 * draw)
            elif "conv1d" in name:  # (channels, 1, taps)
                p.copy_(0.5 * draw)
            else:
                p.copy_(draw * (0.05 if name.endswith(("lm_head.weight", "embed_tokens.weight")) else 0.15))
    where = Path(root) / "kimi"
    model.save_pretrained(where)
    return where


@functools.cache
def hf(root: str) -> KimiLinearForCausalLM:
    return KimiLinearForCausalLM.from_pretrained(hf_dir(root)).eval()


@functools.cache
def hf_logits(root: str, length: int = 80) -> torch.Tensor:
    with torch.no_grad():
        return hf(root)(IDS[:, :length]).logits


@torch.no_grad()
def test_logits_and_greedy_tokens_equal_transformers(root: str) -> None:
    """Two prompts of 80 tokens in float32 within 1e-4 of KimiLinearForCausalLM; 16 greedy tokens as its generate
    gives them, on attnlab's cache and without one."""
    ours = GPT.from_pretrained(hf_dir(root))
    c = ours.config
    assert (c.family, c.layer_types, c.dense_layers, c.nope, c.rope) == (
        "kimi_linear",
        ("kda", "kda", "full", "kda"),
        (0,),
        True,
        False,
    )
    err = float((ours(PROMPTS) - hf_logits(root)).abs().max())
    assert err < 1e-4, err
    prompt = PROMPTS[:1]
    theirs = hf(root).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert ours.generate(prompt, 16).tolist() == theirs.tolist()
    assert ours.generate(prompt, 16, use_cache=False).tolist() == theirs.tolist()


@torch.no_grad()
@pytest.mark.parametrize(("prefill", "end"), [(80, 96), (2, 24)])  # past a chunk; fewer than the 4 taps
def test_a_prefill_then_one_token_a_step_gives_the_uncached_logits(prefill: int, end: int, root: str) -> None:
    """``prefill`` tokens in one call, then one token a step on the same caches (each KDA layer's state and its
    convolution's last 3 inputs, the MLA layer's latents): every position within 1e-4 of one pass without a cache,
    and of transformers'."""
    model = GPT.from_pretrained(hf_dir(root))
    caches = model.make_caches(batch_size=2, max_len=96)
    parts = [model(IDS[:, :prefill], caches=caches)]
    parts += [model(IDS[:, t : t + 1], caches=caches) for t in range(prefill, end)]
    stepped = torch.cat(parts, dim=1)
    assert float((stepped - model(IDS[:, :end])).abs().max()) < 1e-4
    assert float((stepped - hf_logits(root, 96)[:, :end]).abs().max()) < 1e-4


@torch.no_grad()
def test_a_left_padded_row_reads_as_transformers_reads_it(root: str) -> None:
    """Row 1 padded on the left by 7: its real positions' logits within 1e-4 of transformers' with the same mask."""
    mask = torch.ones_like(PROMPTS)
    mask[1, :7] = 0
    reference = hf(root)(PROMPTS, attention_mask=mask).logits
    ours = GPT.from_pretrained(hf_dir(root))(PROMPTS, attention_mask=mask)
    assert float((ours[0] - reference[0]).abs().max()) < 1e-4
    assert float((ours[1, 7:] - reference[1, 7:]).abs().max()) < 1e-4


@torch.no_grad()
def test_save_pretrained_writes_moonshots_names_and_transformers_reads_them(root: str, tmp_path: Path) -> None:
    """Written under Moonshot's names (a convolution a projection, A_log one a head as (1, 1, H, 1), experts' w1,
    w2, w3, the dense layer under mlp.) and keys; KimiLinearForCausalLM reads it with no key missing or left over
    and the same logits; config.json read back without attnlab's own copy gives the same config."""
    ours = GPT.from_pretrained(hf_dir(root))
    ours.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        a_log = f.get_slice("model.layers.0.self_attn.A_log").get_shape()
    assert a_log == [1, 1, 4, 1]
    assert {
        "model.layers.0.self_attn.k_conv1d.weight",
        "model.layers.0.self_attn.f_b_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.block_sparse_moe.experts.7.w3.weight",
        "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
        "model.layers.2.block_sparse_moe.shared_experts.down_proj.weight",
        "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
    } <= names
    loaded: Any = KimiLinearForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(PROMPTS).logits - hf_logits(root)).abs().max()) < 1e-5
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "kimi_linear" and raw["linear_attn_config"]["kda_layers"] == [1, 2, 4]
    del raw["attnlab"]
    assert config_from_hf(raw, tmp_path) == ours.config


def _flat_gate(name: str, w: torch.Tensor) -> torch.Tensor | None:
    """The per-channel gate made one a head: f_b's rows and dt_bias averaged over each head's 8 channels."""
    if name.endswith(("att.dt_bias", "att.f_b_proj.weight")):
        heads = w.view(4, 8, *w.shape[1:])  # (H, D, ...)
        return heads.mean(1, keepdim=True).expand_as(heads).reshape(w.shape)
    return None


def _fixed_beta(name: str, w: torch.Tensor) -> torch.Tensor | None:
    return torch.zeros_like(w) if name.endswith("att.b_proj.weight") else None  # beta = sigmoid(0) = 1/2


def _no_correction(name: str, w: torch.Tensor) -> torch.Tensor | None:
    return torch.zeros_like(w) if name.endswith("e_score_correction_bias") else None


EDITS: dict[str, tuple[dict[str, object], Callable[[str, torch.Tensor], torch.Tensor | None] | None]] = {
    "per-channel-gate-made-scalar": ({}, _flat_gate),
    "beta-fixed": ({}, _fixed_beta),
    "convolution-off": ({"conv_kernel": None}, None),
    "correction-bias-off": ({}, _no_correction),
    "shared-expert-off": ({"n_shared_experts": 0}, None),
    "one-group": ({"n_group": 1}, None),
    "rope-on-mla": ({"nope": False, "rope": True}, None),
}


@torch.no_grad()
@pytest.mark.parametrize("feature", EDITS)
def test_removing_a_feature_moves_the_logits(feature: str, root: str) -> None:
    """Each feature the parity relies on acts here: taken out (by the config, or by weights that undo it) the
    logits move by more than 1e-3; only the weights the feature alone had are missing or left over."""
    changes, edit = EDITS[feature]
    loaded = GPT.from_pretrained(hf_dir(root))
    bare = GPT(loaded.config.with_(**changes)).eval()
    state = {k: (edit(k, w) if edit else None) for k, w in loaded.state_dict().items()}
    state = {k: w if w is not None else loaded.state_dict()[k] for k, w in state.items()}
    missing, unexpected = bare.load_state_dict(state, strict=False)
    assert all(".conv." in k or ".ff.shared." in k for k in [*missing, *unexpected]), (missing, unexpected)
    assert float((bare(PROMPTS) - hf_logits(root)).abs().max()) > 1e-3


def _refused(root: str, where: Path, edit: Callable[[dict], None]) -> str:
    """The message GPT.from_pretrained gives for the folder's config.json edited, beside a weights file that is not
    safetensors: a reader that opened the weights before it checked the config would fail on the file."""
    where.mkdir()
    raw = json.loads((hf_dir(root) / "config.json").read_text())
    edit(raw)
    (where / "config.json").write_text(json.dumps(raw))
    (where / "model.safetensors").write_bytes(b"these are not weights" * 4)
    with pytest.raises(ValueError) as refused:
        GPT.from_pretrained(where)
    assert "safetensors" not in str(refused.value), refused.value
    return str(refused.value)


REFUSALS: dict[str, tuple[Callable[[dict], None], str]] = {
    "quantized": (lambda r: r.update(quantization_config={"quant_method": "fp8"}), r"is quantized"),
    "unknown-layer-type": (lambda r: r["layer_types"].__setitem__(1, "mamba"), r"\['mamba'\] not read by attnlab"),
    "full-rank-gate": (
        lambda r: r["linear_attn_config"].update(use_full_rank_gate=True),
        r"linear_attn_config\.use_full_rank_gate not read by attnlab",
    ),
    "mla-output-gate": (lambda r: r.update(mla_use_output_gate=True), r"mla_use_output_gate not read by attnlab"),
    "mla-with-rope": (lambda r: r.update(mla_use_nope=False), r"mla_use_nope=False is not supported"),
    "softmax-router": (
        lambda r: r.update(moe_router_activation_func="softmax"),
        r"moe_router_activation_func='softmax' is not supported",
    ),
    "fewer-kv-heads": (lambda r: r.update(num_key_value_heads=2), r"num_key_value_heads=2 below num_attention_heads"),
    "bad-mlp-types": (lambda r: r.update(mlp_layer_types=["dense", "moe", "sparse", "sparse"]), r"mlp_layer_types"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_cannot_be_read_is_refused_from_the_config_alone(case: str, root: str, tmp_path: Path) -> None:
    edit, message = REFUSALS[case]
    said = _refused(root, tmp_path / "bad", edit)
    assert re.search(message, said), said


def test_a_layer_in_neither_list_is_refused_by_name(root: str, tmp_path: Path) -> None:
    """linear_attn_config's lists alone (no layer_types), one layer in neither: refused, naming the gap."""

    def edit(raw: dict) -> None:
        del raw["layer_types"]
        raw["linear_attn_config"]["kda_layers"] = [1, 2]  # layer 4 is neither kda nor full

    said = _refused(root, tmp_path / "bad", edit)
    assert "layers [4] (counted from 1) are in neither linear_attn_config.kda_layers nor full_attn_layers" in said


@torch.no_grad()
def test_the_views_name_each_layer_and_draw_the_kda_layers_implicit_weights(root: str) -> None:
    """attention_weights holds a KDA layer's implicit weights (lower triangular, not a softmax), and the views name
    it by its state, not as the model's latent layers."""
    from attnlab.explain.model_view import layer_kinds
    from attnlab.explain.report_text import REPORT_TEXT

    ours = GPT.from_pretrained(hf_dir(root))
    weights = ours.attention_weights(IDS[:1, :10])  # (L, 1, H, T, T)
    kinds = layer_kinds(ours, REPORT_TEXT["en"])
    types = ours.config.layer_types or ()
    for layer, kind in enumerate(types):
        upper = weights[layer, 0].triu(1)
        assert float(upper.abs().max()) == 0, layer  # nothing reads a later token
        assert kinds[layer].startswith("Kimi Delta Attention" if kind == "kda" else "latent attention"), kinds[layer]
