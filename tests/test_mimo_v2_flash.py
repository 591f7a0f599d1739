"""MiMo-V2-Flash (Xiaomi): sliding layers with twice the key/value heads of the full ones and learned sinks, values
of their own head size scaled by attention_value_scale, partial RoPE with a theta per layer type and DeepSeek-V3's
grouped sigmoid router without shared experts, read from Hugging Face directories under the names on disk and exact
against transformers' MiMoV2FlashForCausalLM on random weights from small configs where every feature acts
(issue 56).

Two configs. "default": q/k/v biases, a value scale of 0.5, keys of 12 beside values of 8, RoPE turning 6 of the
full layers' 12 dimensions at theta 1e6 and int(12 * 0.334) = 4 of the sliding layers' at theta 500,
sliding_window_size 7 (a window of 8 keys), 8 experts in 4 groups of which 2 are kept, top 2, a dense first layer.
"other": no biases, tied embeddings, rope_parameters, attention_value_scale and mlp_layer_types left to transformers'
defaults (thetas 5e6 and 1e4, 0.334 of a head, a value scale of 0.707, layer 0 dense) and one type turning int(12 *
0.55) = 6 dimensions (rounding would say 7). Prompts of 80 tokens run far past the window.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import MiMoV2FlashConfig, MiMoV2FlashForCausalLM

from attnlab.models import GPT
from attnlab.models.layer_shape import LayerShape

pytestmark = pytest.mark.slow  # transformers' models, built and saved: the second stage

VOCAB = 96
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=1,  # 1 on full layers, 2 on sliding ones
    head_dim=12,
    v_head_dim=8,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"],
    sliding_window_size=7,
    attention_bias=True,
    attention_value_scale=0.5,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},  # 0.334 of the head
    },
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,  # no row stops early: transformers' generate would pad it, attnlab's repeat its eos
)
OTHER = {k: v for k, v in BASE.items() if k not in ("rope_parameters", "attention_value_scale", "mlp_layer_types")}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": BASE,
    "other": OTHER
    | dict(
        attention_bias=False,
        tie_word_embeddings=True,
        sliding_window=6,
        sliding_window_size=None,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.55},
        },
    ),
}
IDS = torch.randint(3, VOCAB, (2, 96), generator=torch.Generator().manual_seed(5))
PROMPTS = IDS[:, :80]


def perturb(model: MiMoV2FlashForCausalLM) -> None:
    """Norms off their ones, sinks large enough to take a share of each row, a correction bias that moves the
    choice, weights small enough that float32 agrees with float64 well under 1e-4."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * noise)
            elif name.endswith("sinks"):
                p.copy_(1 + 0.5 * noise)
            else:
                p.copy_((0.05 if "embed" in name or "lm_head" in name else 0.15) * noise)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("mimo"))


@functools.cache
def hf_dir(variant: str, root: str) -> Path:
    torch.manual_seed(0)
    model = MiMoV2FlashForCausalLM(MiMoV2FlashConfig(**VARIANTS[variant])).eval()
    perturb(model)
    where = Path(root) / variant
    model.save_pretrained(where)
    return where


@functools.cache
def hf(variant: str, root: str) -> MiMoV2FlashForCausalLM:
    return MiMoV2FlashForCausalLM.from_pretrained(hf_dir(variant, root)).eval()


def test_the_folder_holds_the_names_on_disk(root: str) -> None:
    """What attnlab reads is the file's names (per expert, attention_sink_bias), not transformers' fused ones."""
    names = set(load_file(hf_dir("default", root) / "model.safetensors"))
    assert "model.layers.1.self_attn.attention_sink_bias" in names
    assert "model.layers.0.self_attn.attention_sink_bias" not in names  # a full layer: no sinks
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names and "model.layers.0.mlp.gate_proj.weight" in names


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers_past_the_window(variant: str, root: str) -> None:
    ours = GPT.from_pretrained(hf_dir(variant, root))
    theirs = hf(variant, root)(PROMPTS).logits
    assert float((ours(PROMPTS) - theirs).abs().max()) < 1e-4
    c = ours.config
    shapes = {kind: c.layer_shape(c.layer_types.index(kind)) for kind in ("full", "sliding")}  # type: ignore[union-attr]
    assert (shapes["full"].n_kv_heads, shapes["sliding"].n_kv_heads) == (1, 2)
    assert (shapes["full"].sinks, shapes["sliding"].sinks) == (False, True)
    expected = {"default": (6, 4, 8, 0.5), "other": (4, 6, 6, 0.707)}[variant]  # int(12 * share), window, scale
    assert (shapes["full"].rotary_dim, shapes["sliding"].rotary_dim, c.window, c.value_scale) == expected


@torch.no_grad()
def test_every_backend_that_returns_a_rows_log_sum_exp_gives_the_same_logits(root: str) -> None:
    """Eager and flash read the sliding layers' sinks off each row's log-sum-exp, over values narrower than the
    keys; sdpa and flex return none, and are refused by name rather than run without the sinks."""
    from attnlab.functional.registry import BACKENDS

    theirs = hf("default", root)(PROMPTS).logits
    for backend in BACKENDS:
        ours = GPT.from_pretrained(hf_dir("default", root), backend=backend)
        if backend in ("sdpa", "flex"):
            with pytest.raises(ValueError, match=f"which the {backend} backend does not return"):
                ours(PROMPTS)
            continue
        assert float((ours(PROMPTS) - theirs).abs().max()) < 1e-4, backend


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_generate_through_every_cache(variant: str, root: str) -> None:
    theirs = hf(variant, root).generate(PROMPTS, max_new_tokens=16, do_sample=False, pad_token_id=0)
    ours = GPT.from_pretrained(hf_dir(variant, root))
    for cache in ("plain", "paged"):
        assert torch.equal(ours.generate(PROMPTS, 16, cache=cache), theirs), cache


@torch.no_grad()
def test_a_left_padded_row_decodes_as_it_does_alone(root: str) -> None:
    """Padding is no key for a sliding layer's ring or its sinks' row either."""
    ours = GPT.from_pretrained(hf_dir("default", root))
    alone = ours.generate(PROMPTS[:1, :40], 12)
    padded = torch.cat([torch.zeros(1, 7, dtype=torch.long), PROMPTS[:1, :40]], dim=1)
    mask = (torch.arange(47) >= 7).long()[None]
    assert torch.equal(ours.generate(padded, 12, attention_mask=mask)[:, 7:], alone)


@torch.no_grad()
def test_prefill_then_decode_through_the_cache_equals_no_cache(root: str) -> None:
    """70 tokens at once, then 10 one at a time through attnlab's cache: each step's logits are the full
    forward's at that position (the ring keeps 8 keys of a sliding layer, 2 heads of keys 12 and values 8)."""
    ours = GPT.from_pretrained(hf_dir("default", root))
    whole = ours(PROMPTS)
    cache = ours.make_caches(batch_size=2, max_len=96, cache="plain")
    steps = [ours(PROMPTS[:, :70], caches=cache)]
    steps += [ours(PROMPTS[:, t : t + 1], caches=cache) for t in range(70, 80)]
    assert float((torch.cat(steps, dim=1) - whole).abs().max()) < 1e-5


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_folders_are_read_back_by_transformers(variant: str, root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir(variant, root))
    ours.save_pretrained(tmp_path / "again")
    again = MiMoV2FlashForCausalLM.from_pretrained(tmp_path / "again").eval()
    assert float((again(PROMPTS).logits - ours(PROMPTS)).abs().max()) < 1e-4
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert written["model_type"] == "mimo_v2_flash" and written["layer_types"] == VARIANTS[variant]["layer_types"]
    assert set(load_file(tmp_path / "again" / "model.safetensors")) == set(
        load_file(hf_dir(variant, root) / "model.safetensors")
    )  # the names on disk, every one


def test_only_what_the_family_can_write_back_is_saved_as_it(root: str) -> None:
    """Sliding layers without sinks, full layers with the sliding ones' heads, QK-norm: not MiMo-V2-Flash."""
    from attnlab.models.families import holds

    c = GPT.from_pretrained(hf_dir("default", root)).config
    assert holds(c) and holds(c.with_(drop_rate=0.1))
    assert not holds(c.with_(sliding_layers=LayerShape(n_kv_heads=2, sinks=False, rotary_dim=4)))
    assert not holds(c.with_(full_layers=LayerShape(n_kv_heads=2, sinks=False, rotary_dim=6)))
    assert not holds(c.with_(qk_norm=True)) and not holds(c.with_(n_shared_experts=1))


@torch.no_grad()
def test_each_feature_taken_out_moves_the_logits(root: str) -> None:
    """So that parity is not parity by default: the sinks, the value scale, each type's theta and partial
    rotation, the window, the router's groups, correction bias and scaling, and the q/k/v biases each change it."""
    base = GPT.from_pretrained(hf_dir("default", root))
    reference = base(PROMPTS)
    c = base.config

    def moved(**changes: object) -> float:
        edited = GPT(c.with_(**changes)).eval()
        edited.load_state_dict(base.state_dict())
        return float((edited(PROMPTS) - reference).abs().max())

    def edited(edit: Any) -> float:
        copy = GPT(c).eval()
        copy.load_state_dict(base.state_dict())
        edit(copy)
        return float((copy(PROMPTS) - reference).abs().max())

    sliding = [b.att for b in base.blocks if b.att.window is not None]
    assert edited(lambda m: [m.blocks[i].att.sinks.fill_(-1e4) for i in (1, 2, 4)]) > 1e-3  # no sinks at all
    assert len(sliding) == 3 and all(a.sinks is not None for a in sliding)
    assert moved(value_scale=None) > 1e-3
    assert moved(rope_base=c.rope_local_base, rope_local_base=c.rope_base) > 1e-3  # the types' thetas swapped
    assert moved(full_layers=LayerShape(n_kv_heads=1, sinks=False)) > 1e-3  # the full layers turn whole heads
    assert moved(sliding_layers=LayerShape(n_kv_heads=2, sinks=True)) > 1e-3  # and the sliding ones
    assert moved(window=64) > 1e-3
    assert moved(n_group=1, topk_group=1) > 1e-3  # every expert eligible
    assert moved(routed_scaling_factor=1.0) > 1e-3
    assert edited(lambda m: [b.ff.e_score_correction_bias.zero_() for b in m.blocks if hasattr(b.ff, "gate")]) > 1e-3
    assert edited(lambda m: [b.att.qkv.bias.zero_() for b in m.blocks]) > 1e-3


def _config(variant: str, root: str) -> dict[str, Any]:
    return json.loads((hf_dir(variant, root) / "config.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quantization_config": {"quant_method": "fp8"}}, "is quantized"),
        ({"layer_types": ["full_attention", "chunked_attention"] + ["sliding_attention"] * 3}, "chunked_attention"),
        ({"mlp_layer_types": ["dense", "moe", "sparse", "dense", "sparse"]}, r"mlp_layer_types.*\['moe'\]"),
        ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types must list 5"),
        ({"n_shared_experts": 1}, "n_shared_experts=1"),
        ({"num_key_value_heads": 3}, r"2 \* num_key_value_heads = 6"),
        ({"head_dim": None}, r"\['head_dim'\] are null"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
            r"rope_parameters\['sliding_attention'\] is missing",
        ),
        (
            {
                "rope_parameters": {
                    k: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0}
                    for k in ("full_attention", "sliding_attention")
                }
            },
            "reads a 'default' RoPE entry",
        ),
        (
            {
                "rope_parameters": {
                    k: {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
                    for k in ("full_attention", "sliding_attention")
                }
            },
            r"int\(12 \* 0.25\) = 3 dimensions",
        ),
        ({"sliding_window_size": None, "sliding_window": None}, "sliding layers need an int sliding_window"),
        ({"rope_parameters": None, "head_dim": 16}, r"int\(16 \* 0.334\) = 5 dimensions"),  # the default share
    ],
)
def test_what_attnlab_does_not_read_is_refused_before_any_weight(
    change: dict[str, Any], message: str, root: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_config("default", root) | change))
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)  # no weights in the folder: refused from config.json alone


@torch.no_grad()
def test_the_multi_token_prediction_layers_are_not_loaded(root: str, tmp_path: Path) -> None:
    """The hub's folder adds model.mtp.* (transformers skips them on load): attnlab reads the rest, the same model."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(hf_dir("default", root), tmp_path / "mtp")
    tensors = load_file(tmp_path / "mtp" / "model.safetensors")
    tensors["model.mtp.layers.0.final_layernorm.weight"] = torch.ones(32)
    save_file(tensors, tmp_path / "mtp" / "model.safetensors", metadata={"format": "pt"})
    ours = GPT.from_pretrained(tmp_path / "mtp")
    assert float((ours(PROMPTS) - hf("default", root)(PROMPTS).logits).abs().max()) < 1e-4


@torch.no_grad()
def test_the_caches_keep_values_of_their_own_width_and_the_meter_counts_them(root: str) -> None:
    """Values of 8 beside keys of 12, in each type's own heads: the buffers the plain cache builds are what the
    KV bytes meter counts, and a cache that keeps values as wide as keys is refused by name."""
    from attnlab.bench.kv_bytes import kv_report
    from attnlab.cache import KVCache, SlidingWindowCache

    ours = GPT.from_pretrained(hf_dir("default", root))
    caches = ours.make_caches(batch_size=1, max_len=20)
    held = [c for c in caches if isinstance(c, (KVCache, SlidingWindowCache))]
    widths = [(tuple(c.k_cache.shape), tuple(c.v_cache.shape)) for c in held]
    assert widths[:2] == [((1, 1, 20, 12), (1, 1, 20, 8)), ((1, 2, 8, 12), (1, 2, 8, 8))]  # full, then sliding
    (at,) = kv_report(ours.config, name="mimo", tokens=(20,), dtype="float32").at
    assert at.total == sum(c.k_cache.nbytes + c.v_cache.nbytes for c in held) == 4 * (2 * 20 * 20 + 3 * 8 * 40)
    with pytest.raises(ValueError, match="the int8 cache keeps values as wide as keys"):
        ours.generate(PROMPTS, 2, cache="int8")


def test_the_published_shape_has_its_309b_parameters_and_15b_active() -> None:
    """MiMo-V2-Flash's model card: 309B parameters, 15B active. By hand: each of 256 experts is 3 x 4096 x 2048 on
    47 sparse layers, 8 of them active a token; the meter reads 9 full layers of 4 KV heads and 39 sliding ones of
    8 (keys of 192, values of 128) at a window of 129."""
    from attnlab.bench.kv_bytes import softmax_bytes
    from attnlab.models.families.shapes import shape
    from attnlab.models.gpt import count_parameters

    config = shape("mimo-v2-flash")
    total = count_parameters(config)
    idle = 47 * (256 - 8) * 3 * 4096 * 2048
    assert round(total / 1e9) == 309 and round((total - idle) / 1e9) == 15
    types = config.layer_types or ()
    assert (types.count("full"), types.count("sliding"), config.window) == (9, 39, 129)
    assert (softmax_bytes(config, 0, 2), softmax_bytes(config, 1, 2)) == (4 * 320 * 2, 8 * 320 * 2)


@torch.no_grad()
def test_the_views_show_the_sinks_share_on_the_sliding_layers_only(root: str) -> None:
    """The weights the views draw: a full layer's rows sum to 1, a sliding layer's to 1 less its sinks' share."""
    ours = GPT.from_pretrained(hf_dir("default", root))
    sums = ours.attention_weights(PROMPTS[:, :12]).sum(-1)  # (L, B, H, T)
    for layer in (0, 3):
        assert torch.allclose(sums[layer], torch.ones_like(sums[layer]), atol=1e-5)
    for layer in (1, 2, 4):
        assert float(sums[layer].max()) < 1 and float(1 - sums[layer].mean()) > 0.05  # sinks near e^1 each
