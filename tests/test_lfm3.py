"""LFM3 (Liquid AI): gated short-convolution layers between sliding and full attention layers, read from Hugging
Face directories and exact against transformers' Lfm3ForCausalLM on random weights from small configs where every
feature acts (issue 56).

Two configs: the default one (sandwich norms, the per-head output gate, a proportional RoPE on the full layers,
tied) and its opposite (no sandwich, no gate, convolutions with biases, a scaled proportional RoPE on the sliding
layers, untied). Prompts of 80 tokens run past the sliding window of 8 and every convolution's 3 taps, so a
decode carries the ring and the convolutions' inputs. Each feature taken out moves the logits; a convolution
layer's state is its last inputs, the same size after 10 tokens as after 70.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Lfm3Config, Lfm3ForCausalLM

from attnlab.cache.state import ConvolutionCache
from attnlab.models import GPT

pytestmark = pytest.mark.slow  # transformers' models, built and saved: the second stage

VOCAB = 96
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    layer_types=["conv", "sliding_attention", "conv", "full_attention", "conv"],
    sliding_window=8,
    conv_L_cache=3,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,  # no row stops early: transformers' generate would pad it, attnlab's repeat its eos
)
VARIANTS: dict[str, dict[str, Any]] = {
    "default": BASE,
    "other": BASE
    | dict(
        use_sandwich_norm=False,
        use_attention_gate=False,
        conv_bias=True,
        tie_word_embeddings=False,
        layer_types=["sliding_attention", "conv", "full_attention", "conv", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {
                "rope_type": "proportional",
                "rope_theta": 500.0,
                "partial_rotary_factor": 0.5,
                "factor": 2.0,
            },
            "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
        },
    ),
}
IDS = torch.randint(3, VOCAB, (2, 96), generator=torch.Generator().manual_seed(5))
PROMPTS = IDS[:, :80]


def perturb(model: Lfm3ForCausalLM) -> None:
    """Norms off their ones, convolution taps and biases that matter, weights small enough that float32 agrees
    with float64 well under 1e-4."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * noise)
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.5 * noise)
            else:
                p.copy_((0.05 if "embed" in name or "lm_head" in name else 0.15) * noise)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("lfm3"))


@functools.cache
def hf_dir(variant: str, root: str) -> Path:
    torch.manual_seed(0)
    model = Lfm3ForCausalLM(Lfm3Config(**VARIANTS[variant])).eval()
    perturb(model)
    where = Path(root) / variant
    model.save_pretrained(where)
    return where


@functools.cache
def hf(variant: str, root: str) -> Lfm3ForCausalLM:
    return Lfm3ForCausalLM.from_pretrained(hf_dir(variant, root)).eval()


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers_past_the_window(variant: str, root: str) -> None:
    ours = GPT.from_pretrained(hf_dir(variant, root))
    theirs = hf(variant, root)(PROMPTS).logits
    assert float((ours(PROMPTS) - theirs).abs().max()) < 1e-4
    assert ours.config.family == "lfm3" and "conv" in (ours.config.layer_types or ())


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_generate_through_every_cache(variant: str, root: str) -> None:
    theirs = hf(variant, root).generate(PROMPTS, max_new_tokens=16, do_sample=False, pad_token_id=0)
    ours = GPT.from_pretrained(hf_dir(variant, root))
    for cache in ("plain", "paged", "int8"):
        assert torch.equal(ours.generate(PROMPTS, 16, cache=cache), theirs), cache


@torch.no_grad()
def test_a_left_padded_row_decodes_as_it_does_alone(root: str) -> None:
    ours = GPT.from_pretrained(hf_dir("default", root))
    alone = ours.generate(PROMPTS[:1, :40], 12)
    padded = torch.cat([torch.zeros(1, 7, dtype=torch.long), PROMPTS[:1, :40]], dim=1)
    mask = (torch.arange(47) >= 7).long()[None]
    assert torch.equal(ours.generate(padded, 12, attention_mask=mask)[:, 7:], alone)
    logits = ours(padded, attention_mask=mask)[:, 7:]  # the padding reaches no convolution's taps
    assert float((logits - ours(PROMPTS[:1, :40])).abs().max()) < 1e-5


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_folders_are_read_back_by_transformers(variant: str, root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir(variant, root))
    ours.save_pretrained(tmp_path / "again")
    again = Lfm3ForCausalLM.from_pretrained(tmp_path / "again").eval()
    assert float((again(PROMPTS).logits - ours(PROMPTS)).abs().max()) < 1e-4
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert written["model_type"] == "lfm3" and written["layer_types"] == VARIANTS[variant]["layer_types"]


@torch.no_grad()
def test_each_feature_taken_out_moves_the_logits(root: str) -> None:
    """So that parity is not parity by default: the per-head gate, the convolution taps, the proportional RoPE,
    the sandwich's post norms and the window each change the answer."""
    base = GPT.from_pretrained(hf_dir("default", root))
    reference = base(PROMPTS)

    def moved(**changes: object) -> float:
        edited = GPT(base.config.with_(**changes)).eval()
        edited.load_state_dict(base.state_dict())
        return float((edited(PROMPTS) - reference).abs().max())

    def edited(edit: Any) -> float:
        copy = GPT(base.config).eval()
        copy.load_state_dict(base.state_dict())
        edit(copy)
        return float((copy(PROMPTS) - reference).abs().max())

    assert moved(full_layers=None) > 1e-3  # the full layers' RoPE turns every frequency
    assert moved(window=64) > 1e-3  # the sliding layer sees further back
    assert edited(lambda m: m.blocks[1].att.gate.weight.zero_()) > 1e-3  # every head half open
    assert edited(lambda m: m.blocks[0].att.conv.weight[..., :-1].zero_()) > 1e-3  # only the token itself
    assert edited(lambda m: m.blocks[0].post_norm1.weight.fill_(1.0)) > 1e-3


@torch.no_grad()
def test_a_convolution_layers_state_is_its_last_inputs_whatever_the_length(root: str) -> None:
    ours = GPT.from_pretrained(hf_dir("default", root))
    cache = ours.make_caches(batch_size=2, max_len=96, cache="plain")
    conv = [layer for layer in cache if isinstance(layer, ConvolutionCache)]
    assert len(conv) == 3 and all(tuple(c.conv.shape) == (2, 32, 2) for c in conv)
    before = [c.nbytes() for c in conv]
    ours(PROMPTS[:, :10], caches=cache)
    ours(PROMPTS[:, 10:70], caches=cache)
    assert [c.nbytes() for c in conv] == before and conv[0].length == 70
    assert float(conv[0].conv.abs().sum()) > 0  # what it holds: the layer's last two inputs, not zeros


def _config(variant: str, root: str) -> dict[str, Any]:
    return json.loads((hf_dir(variant, root) / "config.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["conv", "mamba", "conv", "full_attention", "conv"]}, r"\['mamba'\] not read by attnlab"),
        ({"quantization_config": {"quant_method": "fp8"}}, "is quantized"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "mrope": 1}}},
            "proportional RoPE attnlab reads",
        ),
    ],
)
def test_what_attnlab_does_not_read_is_refused_before_any_weight(
    change: dict[str, Any], message: str, root: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_config("default", root) | change))
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)  # no weights in the folder: refused from config.json alone


@torch.no_grad()
def test_the_views_draw_a_convolution_layers_implicit_weights(root: str) -> None:
    """attention_weights holds, for a convolution layer, the mean over channels of C_t w B_s: zero beyond its 3
    taps, and summed with the inputs it is the layer's mixing on a one-channel input."""
    from attnlab.explain.model_view import layer_kinds
    from attnlab.explain.report_text import REPORT_TEXT

    ours = GPT.from_pretrained(hf_dir("default", root))
    weights = ours.attention_weights(PROMPTS[:, :12])  # (L, B, H, T, T); a convolution layer has one "head"
    conv = weights[0, :, 0]  # (B, T, T)
    reach = torch.ones(12, 12, dtype=torch.bool).tril().triu(-2)  # the token and its 2 predecessors
    assert float(conv[:, ~reach].abs().max()) == 0 and float(conv[:, reach].abs().min()) > 0
    assert layer_kinds(ours, REPORT_TEXT["en"])[0].startswith("gated short convolution: its last 64 inputs")


def test_only_what_lfm3s_config_json_can_say_is_saved_as_lfm3(root: str) -> None:
    """holds: the config.json written reads back as the same config; a setting LFM3 has not (values scaled, KV
    sharing, per-layer embeddings) keeps the model out of the family rather than saving it without that setting."""
    from attnlab.models.families import lfm3

    config = GPT.from_pretrained(hf_dir("other", root)).config
    assert lfm3.holds(config)
    for changes in ({"value_scale": 0.5}, {"kv_shared_layers": 1}, {"ple_dim": 4}, {"layer_scalar": True}):
        assert not lfm3.holds(config.with_(**changes)), changes
