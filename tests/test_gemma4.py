"""Gemma 4: read from Hugging Face directories (``gemma4_text``, and the text model of the ``gemma4`` multimodal
wrapper) and exact against transformers' Gemma4ForCausalLM on random weights from a small config where every
feature acts (issue 56).

The config: sliding and full layers of different head sizes (8 and 16) and key/value heads (2 and 1), keys as
values on the full layers, the last two layers sharing keys (one of each type) with MLPs twice as wide,
per-layer embeddings, four experts beside each MLP of which two run a token, layer scalars and router scales off
their ones, a final soft cap small enough to bend the logits, and a window of 12 under the 80-token prompts. Each
feature taken out moves the logits; the shared layers' caches hold no tensor.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

from attnlab.models import GPT
from attnlab.models.families import gemma4
from attnlab.models.moe_beside import FusedExperts, Router
from attnlab.models.per_layer import PerLayerEmbedding

pytestmark = pytest.mark.slow  # transformers' models, built and saved: the second stage

VOCAB = 96
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention"]
TEXT: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    layer_types=[*TYPES, "full_attention"],
    sliding_window=12,
    num_kv_shared_layers=2,  # layer 4 (sliding) reads layer 2's keys, layer 5 (full) layer 3's
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=VOCAB,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=12,
    final_logit_softcapping=1.5,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,  # no row stops early: transformers' generate would pad it, attnlab's repeat its eos
)
VARIANTS: dict[str, dict[str, Any]] = {
    "every": TEXT,
    "other": TEXT  # the other branch of each: a value projection, no sharing, no PLE or experts, untied
    | dict(
        attention_k_eq_v=False,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        hidden_size_per_layer_input=0,
        enable_moe_block=False,
        final_logit_softcapping=None,
        tie_word_embeddings=False,
        layer_types=["full_attention", *["sliding_attention"] * 2, "full_attention", *TYPES[-1:], "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "proportional", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
            "full_attention": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0},
        },
    ),
}
VISION = dict(  # the wrapper's towers, as small as they go
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=64,
    pooling_kernel_size=2,
)
AUDIO = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    subsampling_conv_channels=[8, 4],
    output_proj_dims=16,
    conv_kernel_size=3,
)
IDS = torch.randint(3, VOCAB, (2, 96), generator=torch.Generator().manual_seed(5))
PROMPTS = IDS[:, :80]


def perturb(model: torch.nn.Module) -> None:
    """Norms, scales and layer scalars off their ones, weights small enough that float32 agrees with float64."""
    g = torch.Generator().manual_seed(2)
    scalars = [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *scalars]:
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and any(word in name for word in ("norm", "scale", "layer_scalar")):
                p.copy_(1 + 0.3 * noise)
            else:
                p.copy_((0.05 if "embed" in name or "lm_head" in name else 0.15) * noise)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gemma4"))


@functools.cache
def hf_dir(root: str, variant: str = "every") -> Path:
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**VARIANTS[variant])).eval()
    perturb(model)
    where = Path(root) / variant
    model.save_pretrained(where)
    return where


@functools.cache
def hf(root: str, variant: str = "every") -> Gemma4ForCausalLM:
    return Gemma4ForCausalLM.from_pretrained(hf_dir(root, variant), attn_implementation="eager").eval()


@functools.cache
def wrapper_dir(root: str) -> Path:
    """A Gemma4ForConditionalGeneration folder: text_config, vision and audio towers, weights under
    model.language_model., model.vision_tower., model.audio_tower. and their embedders."""
    config = Gemma4Config(text_config=TEXT, vision_config=VISION, audio_config=AUDIO)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config).eval()
    perturb(model)
    where = Path(root) / "wrapper"
    model.save_pretrained(where)
    return where


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers_past_the_window(variant: str, root: str) -> None:
    ours = GPT.from_pretrained(hf_dir(root, variant))
    theirs = hf(root, variant)(PROMPTS).logits
    assert float((ours(PROMPTS) - theirs).abs().max()) < 1e-4
    assert ours.config.family == "gemma4_text" and ours.config.layer_shape(5).head_dim == 16
    wide = 2 if VARIANTS[variant]["use_double_wide_mlp"] else 1  # the layers that share keys: MLPs twice as wide
    assert [b.ff.fc1.weight.shape[0] for b in ours.blocks] == [48] * 4 + [48 * wide] * 2


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_generate_through_each_cache(variant: str, root: str) -> None:
    theirs = hf(root, variant).generate(PROMPTS, max_new_tokens=16, do_sample=False, pad_token_id=0)  # use_cache
    ours = GPT.from_pretrained(hf_dir(root, variant))
    for cache in ("plain", "paged"):
        assert torch.equal(ours.generate(PROMPTS, 16, cache=cache), theirs), cache


@torch.no_grad()
@pytest.mark.parametrize("cache", ["plain", "paged"])
def test_prefill_then_decode_equals_the_forward_without_a_cache(cache: str, root: str) -> None:
    ours = GPT.from_pretrained(hf_dir(root))
    whole = ours(IDS)
    caches = ours.make_caches(batch_size=2, max_len=96, cache=cache)
    steps = [ours(PROMPTS, caches=caches)] + [ours(IDS[:, i : i + 1], caches=caches) for i in range(80, 96)]
    assert float((torch.cat(steps, dim=1) - whole).abs().max()) < 1e-4


@torch.no_grad()
def test_the_shared_layers_caches_hold_no_tensor(root: str) -> None:
    """KV sharing's effect on memory: layers 4 and 5 keep nothing; their sources (2 and 3) keep what they would."""
    ours = GPT.from_pretrained(hf_dir(root))
    cache = ours.make_caches(batch_size=2, max_len=96, cache="plain")
    ours(PROMPTS, caches=cache)
    held = [sum(b.numel() * b.element_size() for b in layer.buffers()) for layer in cache]
    assert held[4] == held[5] == 0
    assert held[2] == 2 * (2 * 2 * 12 * 8 * 4) + 8  # k and v: 2 rows, 2 heads, a ring of 12, 8 wide; its length
    assert held[3] == 2 * (2 * 1 * 96 * 16 * 4) + 8  # the full layer: one head of 16, every position


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_folders_are_read_back_by_transformers(variant: str, root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir(root, variant))
    ours.save_pretrained(tmp_path / "again")
    loaded: Any = Gemma4ForCausalLM.from_pretrained(
        tmp_path / "again", attn_implementation="eager", output_loading_info=True
    )
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(PROMPTS).logits - ours(PROMPTS)).abs().max()) < 1e-4
    assert torch.equal(GPT.from_pretrained(tmp_path / "again")(PROMPTS), ours(PROMPTS))  # and attnlab reads it back
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    theirs = json.loads((hf_dir(root, variant) / "config.json").read_text())
    same = ("layer_types", "rope_parameters", "num_kv_shared_layers", "attention_k_eq_v", "hidden_size_per_layer_input")
    assert {k: written[k] for k in same} == {k: theirs[k] for k in same}
    assert {int(k): v for k, v in written["per_layer_config"].items()} == {
        int(k): v for k, v in theirs["per_layer_config"].items()
    }


@torch.no_grad()
def test_the_wrappers_text_model_is_read_and_its_towers_are_not(root: str) -> None:
    where = wrapper_dir(root)
    wrapper = Gemma4ForConditionalGeneration.from_pretrained(where, attn_implementation="eager").eval()
    ours = GPT.from_pretrained(where)
    assert ours.config.family == "gemma4" and ours.config.tie_weights
    assert not any("tower" in name or "embed_vision" in name for name in ours.state_dict())
    assert float((ours(PROMPTS) - wrapper(input_ids=PROMPTS).logits).abs().max()) < 1e-4
    theirs = wrapper.generate(PROMPTS, attention_mask=torch.ones_like(PROMPTS), max_new_tokens=16, do_sample=False)
    assert ours.generate(PROMPTS, 16).tolist() == theirs.tolist()


@torch.no_grad()
def test_a_wrapper_whose_images_attend_both_ways_reads_its_text_as_causal(root: str, tmp_path: Path) -> None:
    """use_bidirectional_attention="vision" (the larger Gemma 4 checkpoints): image tokens see each other both
    ways, text stays causal; on text alone transformers' wrapper gives what attnlab does."""
    raw = json.loads((wrapper_dir(root) / "config.json").read_text())
    raw["text_config"]["use_bidirectional_attention"] = "vision"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").symlink_to(wrapper_dir(root) / "model.safetensors")
    wrapper = Gemma4ForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert wrapper.config.text_config.use_bidirectional_attention == "vision"
    assert float((GPT.from_pretrained(tmp_path)(PROMPTS) - wrapper(input_ids=PROMPTS).logits).abs().max()) < 1e-4


def test_saving_a_model_read_from_the_wrapper_is_refused_and_writes_nothing(root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(wrapper_dir(root))
    with pytest.raises(ValueError, match="vision and audio towers"):
        ours.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@torch.no_grad()
def test_each_feature_taken_out_moves_the_logits(root: str) -> None:
    """So that parity is not parity by default: each of Gemma 4's parts changes the answer."""
    base = GPT.from_pretrained(hf_dir(root))
    reference = base(PROMPTS)
    state = base.state_dict()

    def moved(edit: Any = None, **changes: object) -> float:
        model = GPT(base.config.with_(**changes)).eval()
        for key, tensor in model.state_dict().items():  # the base's weights; a larger tensor's first rows
            tensor[: state[key].shape[0]].copy_(state[key])
        if edit is not None:
            edit(model)
        return float((model(PROMPTS) - reference).abs().max())

    def values(source: str) -> Any:
        """The full layers' own values: v rows appended to qkv, copied from their k rows or drawn at random."""

        def edit(model: GPT) -> None:
            for i in (1, 3):
                qkv, k = model.blocks[i].att.qkv.weight, state[f"trf_blocks.{i}.att.qkv.weight"][64:]
                qkv[80:] = k if source == "keys" else 0.15 * torch.randn(k.shape, generator=torch.Generator())

        return edit

    full = base.config.full_layers
    assert full is not None and full.keys_as_values
    no_kv = full.__class__(**{**full.__dict__, "keys_as_values": False})
    assert moved(values("keys"), full_layers=no_kv) < 1e-5  # K = V: the raw k_proj output is the value
    assert moved(values("random"), full_layers=no_kv) > 1e-3  # and values of their own are something else

    def swapped(layer: int) -> Any:
        """Layer ``layer`` leaves its keys in a dict of its own: its sharer reads the previous source of its type."""

        def edit(model: GPT) -> None:
            attend = model.blocks[layer].att.forward
            model.blocks[layer].att.forward = lambda x, **kw: attend(x, **{**kw, "shared": {}})  # type: ignore[method-assign]

        return edit

    assert moved(swapped(2)) > 1e-3  # KV sharing: layer 4 reads layer 0's keys instead of layer 2's
    assert moved(swapped(3)) > 1e-3  # layer 5 reads layer 1's instead of layer 3's
    assert moved(lambda m: [b.end.per_layer.projection.weight.zero_() for b in m.blocks]) > 1e-3  # PLE off
    assert moved(lambda m: [b.end.layer_scalar.fill_(1.0) for b in m.blocks]) > 1e-3
    assert moved(lambda m: [b.moe.post_norm_experts.weight.zero_() for b in m.blocks]) > 1e-3  # the experts
    assert moved(lambda m: [b.moe.router.per_expert_scale.fill_(1.0) for b in m.blocks]) > 1e-3
    assert moved(v_norm=False) > 1e-3
    assert moved(final_softcap=None) > 1e-3
    assert moved(full_layers=full.__class__(**{**full.__dict__, "rope_proportion": None})) > 1e-3  # all turn
    assert moved(window=96) > 1e-3  # the sliding layers see further back
    assert moved(attn_scale=None) > 1e-3  # 1, not head_dim ** -0.5


def test_the_readable_forms_equal_the_fast_ones() -> None:
    """PLE for all layers at once against one layer from its own rows; the experts on their tokens against every
    expert on every token weighted by the router."""
    torch.manual_seed(0)
    ple = PerLayerEmbedding(vocab_size=20, emb_dim=16, n_layers=3, ple_dim=4)
    ids, x = torch.randint(0, 20, (2, 7)), torch.randn(2, 7, 16)
    together = ple(ids, x)
    for layer in range(3):
        assert torch.allclose(together[:, :, layer], ple.for_layer(ids, x, layer), atol=1e-6)
    router, experts = Router(emb_dim=16, num_experts=5, k=2), FusedExperts(emb_dim=16, hidden_dim=8, num_experts=5)
    chosen, weights = router(x)
    assert chosen.shape == (2, 7, 2) and len(set(chosen.flatten().tolist())) > 2
    assert torch.allclose(experts(x, chosen, weights), experts.every_expert(x, chosen, weights), atol=1e-6)


def test_the_config_reads_each_layer_types_shape_as_transformers_does() -> None:
    """Without per_layer_config (the hub's form): full layers of global_head_dim (512 when absent), their key/value
    heads num_global_key_value_heads only with attention_k_eq_v, as Gemma4TextConfig resolves them."""
    base = {k: v for k, v in TEXT.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    cases = [
        {"global_head_dim": 16, "num_global_key_value_heads": 1},
        {"global_head_dim": 16, "num_global_key_value_heads": 1, "attention_k_eq_v": False},
        {},  # global_head_dim defaults to 512
    ]
    for case in cases:
        raw = {**base, **case, "model_type": "gemma4_text"}
        ours = gemma4.config_from_hf(raw, Path("hub"))
        theirs = Gemma4TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
        for i in range(6):
            layer = theirs.per_layer_config[i]
            shape = ours.layer_shape(i)
            assert (shape.head_dim, shape.n_kv_heads) == (layer.head_dim, layer.num_key_value_heads), (case, i)
    default = gemma4.config_from_hf({**base, "rope_parameters": None, "model_type": "gemma4_text"}, Path("hub"))
    assert default.full_layers is not None and default.full_layers.rope_proportion == 0.25
    assert (default.rope_base, default.rope_local_base, default.attn_scale) == (1e6, 1e4, 1.0)
    assert default.emb_scale == math.sqrt(32)


def test_bad_settings_of_the_new_parts_are_refused_by_name() -> None:
    from attnlab.models import GPTConfig
    from attnlab.models.per_layer import LayerEnd

    with pytest.raises(
        ValueError, match=r"ple_dim must be an int in \[0, 65536\] \(0: no per-layer embeddings\), got -4"
    ):
        GPTConfig(ple_dim=-4)
    with pytest.raises(ValueError, match="set num_experts with it"):
        GPTConfig(moe_beside=True)
    with pytest.raises(ValueError, match="use norm_placement 'pre' or 'sandwich'"):
        GPTConfig(moe_beside=True, num_experts=4, num_experts_per_tok=2, norm_placement="post")
    with pytest.raises(TypeError, match="layer_scalar must be a bool, got 'yes'"):
        GPTConfig(layer_scalar="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"k must be an int in \[1, num_experts=4\], got 5"):
        Router(emb_dim=8, num_experts=4, k=5)
    with pytest.raises(ValueError, match="run it inside its model"):
        LayerEnd(layer=0, emb_dim=8, ple_dim=2, scalar=True)(torch.zeros(1, 3, 8), None)


def _edited(source: Path, where: Path, change: dict[str, Any]) -> Path:
    """source's config.json with ``change`` in its text config, beside a weights file that is not safetensors:
    a reader that opened the weights before it had checked the config would fail on the file."""
    where.mkdir()
    raw = json.loads((source / "config.json").read_text())
    (raw.get("text_config") or raw).update(change)
    (where / "config.json").write_text(json.dumps(raw))
    (where / "model.safetensors").write_bytes(b"these are not weights" * 4)
    return where


@pytest.mark.parametrize("form", ["text", "wrapper"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": [*TYPES[:-1], "mamba", "full_attention"]}, r"\['mamba'\] not read by attnlab"),
        ({"quantization_config": {"quant_method": "fp8"}}, "is quantized"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention='all' is not supported"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        ({"hidden_activation": "silu"}, "hidden_activation='silu' is not supported"),
        ({"per_layer_config": {"1": {"intermediate_size": 64}}}, r"per_layer_config\[1\] sets \['intermediate_size'\]"),
        ({"per_layer_config": {"1": {"head_dim": 16}}}, "different shapes"),
        ({"num_kv_shared_layers": 5}, "no earlier layer of each type"),
        ({"vocab_size_per_layer_input": 64}, "vocab_size_per_layer_input=64 differs"),
        ({"rope_parameters": {"full_attention": {"rope_type": "dynamic", "rope_theta": 1e6}}}, "dynamic"),
    ],
)
def test_what_attnlab_does_not_read_is_refused_before_any_weight(
    form: str, change: dict[str, Any], message: str, root: str, tmp_path: Path
) -> None:
    source = hf_dir(root) if form == "text" else wrapper_dir(root)
    where = _edited(source, tmp_path / "bad", change)
    with pytest.raises(ValueError, match=message) as refused:
        GPT.from_pretrained(where)
    assert "safetensors" not in str(refused.value), refused.value
