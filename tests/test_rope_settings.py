"""RoPE's settings in a family's config.json (issue 54, items 1 and 14): every key read as transformers 5 reads it,
per layer type where the config has one entry per type (Gemma 3), or refused by name before a weight is read.

The parity is against transformers' own rotary embeddings (their inverse frequencies and the factor on cos and
sin) and, for the cases the issue names, against the logits of the transformers model itself.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers import Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from attnlab.functional.rotary import RopeScaling, RotaryEmbedding
from attnlab.models import GPT
from attnlab.models.families import config_from_hf, holds, to_hf
from attnlab.models.families.book import config_from_book
from test_families import BOOK_LLAMA, COMMON, IDS

SMALL = {k: v for k, v in COMMON.items() if k != "tie_word_embeddings"} | {"num_hidden_layers": 2}
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
YARN = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0, "original_max_position_embeddings": 16}
GEMMA = {"head_dim": 16, "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]}
# (module, config class, the family's other keys, rope_parameters): a config.json as transformers would read it
CASES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any] | None]] = {
    "llama-linear": ("llama", "Llama", {}, {"rope_type": "linear", "factor": 3.0, "rope_theta": 5e5}),
    "llama-llama3": ("llama", "Llama", {}, LLAMA3 | {"original_max_position_embeddings": 16}),
    "llama-llama3-equal-factors": ("llama", "Llama", {}, LLAMA3 | {"low_freq_factor": 2.0, "high_freq_factor": 2.0}),
    "llama-yarn-mscales": ("llama", "Llama", {}, YARN | {"mscale": 0.8, "mscale_all_dim": 0.5}),
    "llama-yarn-attention-factor": ("llama", "Llama", {}, YARN | {"attention_factor": 1.3, "truncate": False}),
    "llama-yarn-phi3-original": (
        "llama",
        "Llama",
        {"original_max_position_embeddings": 4096},  # Phi-3's place for it, beside the entry's 16: it wins
        YARN | {"truncate": False},
    ),
    "llama-v4-type-alias": ("llama", "Llama", {}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0}),
    "mistral-yarn": ("mistral", "Mistral", {}, YARN | {"rope_theta": 1e6}),
    "qwen2-linear": ("qwen2", "Qwen2", {}, {"rope_type": "linear", "factor": 2.0}),
    "qwen3-yarn": ("qwen3", "Qwen3", {"head_dim": 24}, YARN),
    "gpt_oss-its-default": ("gpt_oss", "GptOss", {"head_dim": 16, "num_local_experts": 4}, None),
    "deepseek_v3-yarn": ("deepseek_v3", "DeepseekV3", {"qk_rope_head_dim": 8}, YARN | {"mscale_all_dim": 0.7}),
    "deepseek_v3-llama3": ("deepseek_v3", "DeepseekV3", {"qk_rope_head_dim": 8}, LLAMA3),
    "gemma3-issue-repro": (  # the issue's: the sliding layers' linear scaling was dropped
        "gemma3",
        "Gemma3Text",
        GEMMA,
        {
            "full_attention": {"rope_type": "default", "rope_theta": 1e4},
            "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        },
    ),
    "gemma3-sliding-llama3-full-yarn": (
        "gemma3",
        "Gemma3Text",
        GEMMA,
        {"full_attention": YARN | {"mscale": 1.0, "mscale_all_dim": 0.5}, "sliding_attention": LLAMA3},
    ),
    "gemma3-sliding-yarn": ("gemma3", "Gemma3Text", GEMMA, {"sliding_attention": YARN | {"rope_theta": 20.0}}),
    "gemma3-v4-keys": (
        "gemma3",
        "Gemma3Text",
        GEMMA,
        {
            "full_attention": LLAMA3 | {"rope_theta": 3e4},
            "sliding_attention": {"rope_type": "default", "rope_theta": 99.0},
        },
    ),
}
V4 = ("llama-v4-type-alias", "gemma3-v4-keys")  # written as transformers 4 wrote them: rope_theta, rope_scaling


def _as_v4(raw: dict[str, Any]) -> dict[str, Any]:
    """The same settings in transformers 4's keys: rope_theta and rope_scaling (with its old "type" key, which
    Gemma 3 cannot take), and Gemma 3's rope_local_base_freq for the sliding layers' theta."""
    raw, parameters = dict(raw), raw["rope_parameters"]
    del raw["rope_parameters"]
    if raw["model_type"] == "gemma3_text":
        raw["rope_local_base_freq"] = parameters["sliding_attention"]["rope_theta"]
        parameters = parameters["full_attention"]
    raw["rope_theta"] = parameters.pop("rope_theta")
    alias = "rope_type" if "rope_local_base_freq" in raw else "type"  # Gemma 3's updates its "default" entry
    raw["rope_scaling"] = {alias: parameters.pop("rope_type"), **parameters}
    return raw


def _hf_config(case: str) -> tuple[Any, dict[str, Any]]:
    """transformers' config for the case, and the config.json it writes."""
    module, prefix, extra, parameters = CASES[case]
    cls = getattr(transformers, f"{prefix}Config")
    given = {**SMALL, "max_position_embeddings": 64, **extra}
    if module == "deepseek_v3":
        given |= {"kv_lora_rank": 8, "q_lora_rank": None, "qk_nope_head_dim": 8, "v_head_dim": 8}
    config = cls(**given, **({} if parameters is None else {"rope_parameters": json.loads(json.dumps(parameters))}))
    raw = json.loads(config.to_json_string())
    if parameters is None:  # a config.json that names no RoPE: the family's own defaults
        del raw["rope_parameters"]
    if case in V4:
        raw = _as_v4(raw)
    return cls.from_dict(json.loads(json.dumps(raw))), raw  # transformers reads the same config.json


def _theirs(case: str, config: Any = None) -> dict[str, tuple[torch.Tensor, float]]:
    """transformers' inverse frequencies and cos/sin factor, per layer type ("one": the same on every layer), for
    the case's config or ``config`` (one of its family's)."""
    config = _hf_config(case)[0] if config is None else config
    module, prefix = CASES[case][:2]
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    rotary = getattr(modeling, f"{prefix.removesuffix('Text')}RotaryEmbedding")(config)
    if module != "gemma3":
        return {"one": (rotary.inv_freq, float(rotary.attention_scaling))}
    kinds = ("sliding_attention", "full_attention")
    return {k: (getattr(rotary, f"{k}_inv_freq"), float(getattr(rotary, f"{k}_attention_scaling"))) for k in kinds}


@pytest.mark.parametrize("case", CASES)
def test_every_layer_types_rope_is_transformers_own(case: str) -> None:
    """Each layer type's inverse frequencies and cos/sin factor, read from config.json, equal transformers'."""
    ours = config_from_hf(_hf_config(case)[1], Path("case"))
    layers = {"sliding_attention": 0, "full_attention": 1, "one": 0}  # GEMMA's layer_types
    for kind, (inv_freq, attention_scaling) in _theirs(case).items():
        base, scaling = ours.layer_rope(layers[kind])
        width = ours.qk_rope_head_dim if ours.kv_lora_rank is not None else ours.d_head
        rotary = RotaryEmbedding(head_dim=width, base=base, scaling=scaling)
        torch.testing.assert_close(rotary.inv_freq, inv_freq, rtol=1e-6, atol=0.0, msg=f"{case} {kind}")
        assert rotary.mscale == pytest.approx(attention_scaling, rel=1e-12), (case, kind)


@pytest.mark.parametrize("case", CASES)
def test_what_was_read_is_written_back_for_transformers_and_attnlab(case: str) -> None:
    """save_pretrained's config.json (without attnlab's own copy) reads back, in transformers and here, as the
    same RoPE on every layer type as the file it was read from."""
    ours = config_from_hf(_hf_config(case)[1], Path("case"))
    assert holds(ours)
    _, written = to_hf(GPT(ours).state_dict(), ours)
    del written["attnlab"]
    again = config_from_hf(json.loads(json.dumps(written)), Path("written"))
    assert again.with_(attn_scale=ours.attn_scale) == ours and again.attn_scale == pytest.approx(ours.attn_scale)
    hf_class = getattr(transformers, f"{CASES[case][1]}Config")
    theirs = _theirs(case, hf_class.from_dict(written))
    for kind, (inv_freq, attention_scaling) in _theirs(case).items():
        torch.testing.assert_close(theirs[kind][0], inv_freq, rtol=1e-6, atol=0.0, msg=f"{case} {kind}")
        assert theirs[kind][1] == pytest.approx(attention_scaling, rel=1e-12), (case, kind)


def test_gemma3s_sliding_layers_without_their_own_rope_are_written_with_the_full_layers() -> None:
    """A Gemma config with no rope_local_base turns its sliding layers as its full ones, scaling included: so
    does the config.json written for it."""
    ours = config_from_hf(_hf_config("gemma3-sliding-llama3-full-yarn")[1], Path("case"))
    ours = ours.with_(rope_local_base=None, rope_local_scaling=None)
    assert ours.layer_rope(0) == ours.layer_rope(1) and ours.rope_scaling is not None
    _, written = to_hf(GPT(ours).state_dict(), ours)
    sliding = _theirs("gemma3-sliding-yarn", transformers.Gemma3TextConfig.from_dict(written))["sliding_attention"]
    rotary = RotaryEmbedding(head_dim=ours.d_head, base=ours.rope_base, scaling=ours.rope_scaling)
    torch.testing.assert_close(sliding[0], rotary.inv_freq, rtol=1e-6, atol=0.0)
    assert sliding[1] == pytest.approx(rotary.mscale, rel=1e-12)


def test_a_rope_its_familys_config_json_cannot_hold_is_not_saved_as_that_family() -> None:
    """A sliding layer's own RoPE in a Mistral, DeepSeek's YaRN softmax scale without its YaRN, and YaRN's
    truncate=False in Gemma's entries by type (always truncated there) go to attnlab's own format instead."""
    mistral = config_from_hf(_hf_config("mistral-yarn")[1], Path("case"))
    assert holds(mistral.with_(window=4)) and not holds(mistral.with_(window=4, rope_local_base=100.0))
    deepseek = config_from_hf(_hf_config("deepseek_v3-yarn")[1], Path("case"))
    assert holds(deepseek) and not holds(deepseek.with_(rope_scaling=None))
    gemma = config_from_hf(_hf_config("gemma3-sliding-yarn")[1], Path("case"))
    assert gemma.rope_local_scaling is not None
    untruncated = RopeScaling(**{**vars(gemma.rope_local_scaling), "truncate": False})
    assert holds(gemma) and not holds(gemma.with_(rope_local_scaling=untruncated))


def test_deepseeks_softmax_scale_takes_yarns_mscale_all_dim() -> None:
    """transformers' yarn_apply_mscale: the softmax scale times mscale(factor, mscale_all_dim)^2."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    for case in ("deepseek_v3-yarn", "deepseek_v3-llama3"):
        config, raw = _hf_config(case)
        assert config_from_hf(raw, Path("x")).attn_scale == pytest.approx(DeepseekV3Attention(config, 0).scaling)
    by_hand = 16**-0.5 * (0.1 * 0.7 * math.log(8.0) + 1.0) ** 2  # qk head 8 + 8, factor 8, mscale_all_dim 0.7
    assert config_from_hf(_hf_config("deepseek_v3-yarn")[1], Path("x")).attn_scale == pytest.approx(by_hand)


def _saved(model: PreTrainedModel, where: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # norms off their defaults, so that no layer is the identity
                p.add_(torch.randn_like(p) * 0.5)
    model.eval().save_pretrained(where)
    return where


GEMMA_LOGITS = ["gemma3-issue-repro", "gemma3-sliding-llama3-full-yarn", "gemma3-sliding-yarn"]


@torch.no_grad()
@pytest.mark.parametrize("case", GEMMA_LOGITS)
def test_gemma3s_sliding_layers_take_their_own_scaling_as_transformers_does(case: str, tmp_path: Path) -> None:
    """The issue's repro and two more: logits equal transformers' (they were 0.03 to 0.23 away), the sliding
    layers' scaling acts (without it they move), and save_pretrained writes it back for transformers to load."""
    config, _ = _hf_config(case)
    torch.manual_seed(0)
    theirs = _saved(Gemma3ForCausalLM(config), tmp_path / "hf")
    reference = Gemma3ForCausalLM.from_pretrained(theirs).eval()(IDS).logits
    ours = GPT.from_pretrained(theirs)
    assert float((ours(IDS) - reference).abs().max()) < 1e-4
    unscaled = GPT(ours.config.with_(rope_local_scaling=None)).eval()
    unscaled.load_state_dict(ours.state_dict())
    assert float((unscaled(IDS) - reference).abs().max()) > 1e-3  # the parity is not parity by default

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    again = Gemma3ForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert float((again(IDS).logits - reference).abs().max()) < 1e-5
    del written["attnlab"]  # read back from the keys transformers reads: the same settings
    assert config_from_hf(written, tmp_path) == ours.config


@torch.no_grad()
def test_llama3_with_equal_freq_factors_loads_as_transformers_does_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """low_freq_factor == high_freq_factor: transformers warns and loads it (no band to blend); so does attnlab,
    through logging, with the logits transformers gives."""
    config, _ = _hf_config("llama-llama3-equal-factors")
    torch.manual_seed(0)
    where = _saved(LlamaForCausalLM(config), tmp_path)
    reference = LlamaForCausalLM.from_pretrained(where).eval()(IDS).logits
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        ours = GPT.from_pretrained(where)
    assert any("high_freq_factor equals low_freq_factor (2.0)" in r.getMessage() for r in caplog.records)
    logits = ours(IDS)
    assert bool(logits.isfinite().all())
    assert float((logits - reference).abs().max()) < 1e-4
    unscaled = GPT(ours.config.with_(rope_scaling=None)).eval()
    unscaled.load_state_dict(ours.state_dict())
    assert float((unscaled(IDS) - reference).abs().max()) > 1e-3


def test_a_wavelength_on_llama3s_edge_is_finite_and_divided_by_factor() -> None:
    """With equal factors transformers computes 0 / 0 for a wavelength that lands exactly on the edge; here it is
    divided by factor, as the wavelength at low_wavelen is when the band is not empty (smooth = 0 there)."""
    original, dim, base = 16, 16, 10000.0
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    wavelen = 2 * math.pi / inv_freq
    edge = original / float(wavelen[2])  # low = high: low_wavelen is dimension 2's wavelength
    assert bool(wavelen[2] == original / edge)  # the edge is hit exactly, as the scaling compares in float32
    scaling = RopeScaling(
        kind="llama3", factor=4.0, low_freq_factor=edge, high_freq_factor=edge, original_context_length=original
    )
    ours = scaling.inv_freq(inv_freq, base)
    assert bool(ours.isfinite().all())
    expected = torch.cat([inv_freq[:2], inv_freq[2:] / 4.0])  # shorter kept; the edge and longer divided
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0.0)
    parameters = {"rope_type": "llama3", "factor": 4.0, "rope_theta": base, "low_freq_factor": edge}
    parameters |= {"high_freq_factor": edge, "original_max_position_embeddings": original}
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**SMALL, rope_parameters=parameters), None)
    off_edge = torch.arange(dim // 2) != 2
    torch.testing.assert_close(ours[off_edge], theirs[off_edge], rtol=1e-6, atol=0.0)  # elsewhere, transformers'


REFUSED = [  # (rope_parameters, what the message names)
    (
        {"rope_type": "linear", "factor": 2.0, "beta_fast": 4.0},
        r"beta_fast=4.0 not read by attnlab with rope_type 'linear'",
    ),
    ({"rope_type": "dynamic", "factor": 2.0}, r"rope_type 'dynamic' is not supported: dynamic NTK recomputes"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}, r"rope_type 'longrope' is not supported"),
    ({"rope_type": "proportional"}, r"rope_type 'proportional' is not supported \(attnlab reads \['default'"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5 is not supported"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, r"rope_type 'llama3' needs high_freq_factor"),
    ({"rope_type": "yarn", "factor": -2.0}, r"rope scaling factor must be a number > 0, got -2.0"),
    ({"rope_type": "default", "mrope_section": [2, 2]}, r"mrope_section=\[2, 2\] not read by attnlab"),
]


@pytest.mark.parametrize(("parameters", "message"), REFUSED)
def test_a_rope_key_attnlab_does_not_read_is_refused_by_name_before_any_weight(
    parameters: dict[str, Any], message: str, tmp_path: Path
) -> None:
    raw = {**SMALL, "model_type": "llama", "max_position_embeddings": 64, "rope_parameters": parameters}
    (tmp_path / "config.json").write_text(json.dumps(raw))  # and no weights: the config is refused first
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)


GEMMA_REFUSED = [  # (config.json's RoPE keys, what the message names)
    ({"rope_parameters": LLAMA3}, r"a gemma3_text rope_parameters holds one entry per layer type"),
    ({"rope_parameters": {"sliding_attention": YARN | {"truncate": False}}}, r"\['sliding_attention'\]: truncate=F"),
    ({"rope_parameters": {"full_attention": {**LLAMA3, "rope_type": "linear"}}}, r"\['full_attention'\]: high_freq"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"type='linear' is not read beside rope_type='default'"),
]


@pytest.mark.parametrize(("keys", "message"), GEMMA_REFUSED)
def test_gemma3s_entries_by_layer_type_are_refused_by_name_where_transformers_reads_otherwise(
    keys: dict[str, Any], message: str
) -> None:
    """A flat entry beside the entries by type, YaRN's truncate in one (read off the outer dict), a key its type
    does not take, and v4's "type" merged into Gemma's own "default" entry: transformers drops each silently."""
    raw = {**SMALL, **GEMMA, "model_type": "gemma3_text", "max_position_embeddings": 64}
    with pytest.raises(ValueError, match=message):
        config_from_hf({**raw, **keys}, Path("x"))


def test_the_books_rope_freq_is_read_whole_or_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"rope_freq must be None or a dict of \['factor', .*: \['beta'\] not read"):
        config_from_book({**BOOK_LLAMA, "rope_freq": {**BOOK_LLAMA["rope_freq"], "beta": 32.0}})
