"""The KV bytes meter on the hybrid families' published shapes (benchmarks/kv_shapes.py, issue 56): each figure
worked out here by hand from the config.json numbers, a shared layer counted once (in the layer whose keys it
reads) against the caches a tiny model really builds, the parameter counts against the published names, and
docs/benchmarks.md quoting the committed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.bench.kv_bytes import cache_at, every_layer_full, kv_report, layer_kinds
from attnlab.cache import KVCache, SlidingWindowCache
from attnlab.cache.latent import LatentCache
from attnlab.cache.shared import SharedCache
from attnlab.cache.state import ConvolutionCache, StateCache
from attnlab.models import GPT, GPTConfig
from attnlab.models.families import config_from_hf
from attnlab.models.families.shapes import SHAPES, SOURCES, shape
from attnlab.models.gpt import count_parameters
from attnlab.models.layer_shape import LayerShape
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]
F32 = 4  # a recurrent state's bytes per number: float32 at least, as the StateCache keeps it


def delta_state(*, k_heads: int, dk: int, v_heads: int, dv: int, taps: int) -> int:
    """A Gated DeltaNet layer's state in bytes, by hand: a (Dk, Dv) matrix per value head, and the convolution's
    last taps - 1 inputs of each q, k and v channel."""
    return (v_heads * dk * dv + (2 * k_heads * dk + v_heads * dv) * (taps - 1)) * F32


@pytest.mark.parametrize(
    ("name", "layers", "full", "kv_heads", "head_dim", "state"),
    [  # the config.json numbers: layers, full layers (1 in 4), KV heads x head size, then the DeltaNet's heads
        ("qwen3.5-0.8b", 24, 6, 2, 256, delta_state(k_heads=16, dk=128, v_heads=16, dv=128, taps=4)),
        ("qwen3.5-4b", 32, 8, 4, 256, delta_state(k_heads=16, dk=128, v_heads=32, dv=128, taps=4)),
        ("qwen3.5-9b", 32, 8, 4, 256, delta_state(k_heads=16, dk=128, v_heads=32, dv=128, taps=4)),
        ("qwen3.5-27b", 64, 16, 4, 256, delta_state(k_heads=16, dk=128, v_heads=48, dv=128, taps=4)),
        ("olmo-hybrid-7b", 32, 8, 30, 128, delta_state(k_heads=30, dk=96, v_heads=30, dv=192, taps=4)),
    ],
)
def test_each_published_hybrid_keeps_what_its_config_says(
    name: str, layers: int, full: int, kv_heads: int, head_dim: int, state: int
) -> None:
    config = shape(name)
    report = kv_report(config, name=name, tokens=(32_768, 131_072))
    one = 2 * kv_heads * head_dim * 2  # keys and values, bfloat16: bytes a token, one full layer
    assert [(k.kind, k.layers, k.bytes_per_token, k.state_bytes) for k in report.kinds] == [
        ("full", full, one, 0),
        ("delta", layers - full, 0, state),
    ]
    for at in report.at:
        assert at.total == full * one * at.tokens + (layers - full) * state
    assert every_layer_full(config) == layers * one  # every layer full, shaped as the model's full layers


def test_the_shapes_are_read_as_their_families_read_a_downloaded_folder() -> None:
    """Qwen3.5's hub folders are the multimodal wrapper (its text model read, the head tied by the wrapper's own
    flag); OLMo-Hybrid-7B has no RoPE at all; Qwen3.5 turns a quarter of each 256-wide head."""
    small, large, olmo = shape("qwen3.5-0.8b"), shape("qwen3.5-27b"), shape("olmo-hybrid-7b")
    assert (small.family, small.tie_weights, large.tie_weights) == ("qwen3_5", True, False)
    assert (small.rotary_dim, small.context_length, small.vocab_size) == (64, 262_144, 248_320)
    assert (olmo.family, olmo.rope, olmo.nope, olmo.delta_negative_eigenvalues) == ("olmo_hybrid", False, True, True)
    assert [olmo.layer_type(i) for i in range(8)] == ["delta", "delta", "delta", "full"] * 2


def test_a_shared_layer_counts_nothing_and_each_type_its_own_shape_as_the_caches_hold_them() -> None:
    """Gemma 4's way: full layers with their own head size and KV heads, and the last two layers reading the
    keys of the last earlier layer of their type. The meter counts the two sources in their own shapes and the
    shared layers as nothing: the key and value buffers of the caches a tiny model builds, layer by layer."""
    config = GPTConfig(
        vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_kv_heads=2, n_layers=4, rope=True, window=8,
        layer_types=("sliding", "full", "sliding", "full"), full_layers=LayerShape(head_dim=24, n_kv_heads=1),
        kv_shared_layers=2,
    )  # fmt: skip
    report = kv_report(config, name="shared", tokens=(20,), dtype="float32")
    full, sliding = 2 * 1 * 24 * 4, 2 * 2 * 8 * 4  # per token: 1 KV head of 24; 2 of 8 (32 / 4 heads)
    assert [(k.kind, k.window, k.layers, k.bytes_per_token) for k in report.kinds] == [
        ("full", None, 1, full),
        ("sliding", 8, 1, sliding),
        ("shared", None, 2, 0),
    ]
    (at,) = report.at
    assert at.held == {"full": 20, "sliding 8": 8, "shared": 0}
    assert at.total == 20 * full + 8 * sliding
    caches = GPT(config).make_caches(batch_size=1, max_len=20)
    kept = [c.k_cache.nbytes + c.v_cache.nbytes for c in caches if isinstance(c, (KVCache, SlidingWindowCache))]
    shared = [c for c in caches if isinstance(c, SharedCache)]
    assert sum(kept) == at.total and len(shared) == 2
    assert all(not list(c.buffers(recurse=False)) for c in shared)  # a shared layer's cache holds no tensor
    assert every_layer_full(config, dtype="float32") == 4 * full  # the full layers' own shape, on every layer


def test_the_meter_counts_what_the_caches_of_values_apart_and_convolution_layers_hold() -> None:
    """MiMo's value heads of their own size and LFM's convolution layers: the meter's bytes at 20 tokens are the
    buffers the model's caches hold after 20 tokens (float32)."""
    config = GPTConfig(
        vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_kv_heads=2, n_layers=4, rope=True, window=8,
        layer_types=("conv", "sliding", "conv", "full"), v_head_dim=4, conv_kernel=3,
    )  # fmt: skip
    (at,) = kv_report(config, name="mixed", tokens=(20,), dtype="float32").at
    model = GPT(config)
    caches = model.make_caches(batch_size=1, max_len=20)
    with torch.no_grad():
        model(torch.zeros(1, 20, dtype=torch.long), caches=caches)
    kv = [c.k_cache.nbytes + c.v_cache.nbytes for c in caches if isinstance(c, (KVCache, SlidingWindowCache))]
    conv = [c.nbytes() for c in caches if isinstance(c, ConvolutionCache)]
    assert kv == [8 * 2 * (8 + 4) * 4, 20 * 2 * (8 + 4) * 4] and conv == [32 * 2 * 4] * 2
    assert at.total == sum(kv) + sum(conv)


@pytest.mark.parametrize(
    ("name", "layers", "full", "sliding", "shared", "kv_heads", "global_kv_heads", "window"),
    [  # config.json's numbers; full and sliding count the layers before the shared ones (layers - shared)
        ("gemma-4-e2b", 35, 3, 12, 20, 1, 1, 512),  # 4 sliding : 1 full, layers 0..14 own: full 4, 9, 14
        ("gemma-4-e4b", 42, 4, 20, 18, 2, 2, 512),  # 5 : 1, layers 0..23 own: full 5, 11, 17, 23
        ("gemma-4-31b", 60, 10, 50, 0, 16, 4, 1024),  # 5 : 1; K = V on the full layers, 4 global KV heads
        ("gemma-4-26b-a4b", 30, 5, 25, 0, 8, 2, 1024),  # 5 : 1; K = V, 2 global KV heads
    ],
)
def test_each_gemma4_shape_keeps_its_own_layers_keys_and_its_shared_layers_nothing(
    name: str, layers: int, full: int, sliding: int, shared: int, kv_heads: int, global_kv_heads: int, window: int
) -> None:
    """Sliding layers of 256-wide heads, full layers of 512 (global_head_dim); K = V still keeps keys beside values
    (the keys are normed and turned, the values normed alone), so both are counted; a shared layer keeps 0 B."""
    config = shape(name)
    report = kv_report(config, name=name, tokens=(32_768, 131_072))
    one_full, one_sliding = 2 * global_kv_heads * 512 * 2, 2 * kv_heads * 256 * 2  # bytes a token, bfloat16
    expected = [("full", None, full, one_full), ("sliding", window, sliding, one_sliding)]
    expected += [("shared", None, shared, 0)] if shared else []
    assert [(k.kind, k.window, k.layers, k.bytes_per_token) for k in report.kinds] == expected
    for at in report.at:
        assert at.total == full * one_full * at.tokens + sliding * one_sliding * window
    assert every_layer_full(config) == layers * one_full
    assert (config.family, config.context_length) == ("gemma4", 262_144 if shared == 0 else 131_072)


def test_kimi_linear_keeps_seven_latents_a_token_and_twenty_kda_states() -> None:
    """linear_attn_config's lists, counted from 1: latent attention on 4, 8, ..., 24 and 27, Kimi Delta Attention
    on the other 20. A latent layer keeps 512 + 64 values a token; a KDA layer a (128, 128) matrix for each of 32
    heads and its q, k and v convolutions' last 3 inputs, in float32."""
    config = shape("kimi-linear-48b-a3b")
    assert [i for i in range(27) if config.layer_type(i) == "full"] == [3, 7, 11, 15, 19, 23, 26]
    kinds = layer_kinds(config)  # the report's kinds, without its parameter count (7 s of experts on meta)
    kda = (32 * 128 * 128 + 3 * 32 * 128 * (4 - 1)) * F32
    assert [(k.kind, k.layers, k.bytes_per_token, k.state_bytes) for k in kinds] == [
        ("latent", 7, (512 + 64) * 2, 0),
        ("kda", 20, 0, kda),
    ]
    assert cache_at(kinds, 131_072, context_length=config.context_length).total == 7 * 1152 * 131_072 + 20 * kda
    assert every_layer_full(config) == 27 * 1152  # every layer latent: the model's full layers are


def held(caches: list[object]) -> int:
    """What a model's caches hold after a forward, by kind: keys and values, latents, states; a shared layer's
    cache holds no tensor of its own."""
    total = 0
    for c in caches:
        if isinstance(c, (KVCache, SlidingWindowCache)):
            total += c.k_cache.nbytes + c.v_cache.nbytes
        elif isinstance(c, LatentCache):
            total += c.latent.nbytes
        elif isinstance(c, (StateCache, ConvolutionCache)):
            total += c.nbytes()
        else:
            assert isinstance(c, SharedCache) and not list(c.buffers(recurse=False)), type(c)
    return total


TINY_GEMMA4 = {  # keys as values on the full layers, their own head size and KV heads, the last 2 layers shared
    "model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "global_head_dim": 24, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"] * 3, "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64, "max_position_embeddings": 64,
}  # fmt: skip
TINY_KIMI = {  # layer 3 latent (counted from 1), the others Kimi Delta Attention
    "model_type": "kimi_linear", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12, "num_experts": 4,
    "num_experts_per_token": 2, "model_max_length": 64,
    "linear_attn_config": {"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4, "kda_layers": [1, 2, 4],
                           "full_attn_layers": [3]},
}  # fmt: skip
TINY_LFM3 = {  # convolutions of kernel 3 between a sliding layer (window 8) and a full one
    "model_type": "lfm3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "conv_L_cache": 3, "sliding_window": 8,
    "layer_types": ["conv", "sliding_attention", "conv", "full_attention"], "max_position_embeddings": 64,
}  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "total"),
    [
        # 2 full layers own (1 KV head: a key of 24 and a value of 24), 20 tokens; 2 sliding (2 of 8), 8 tokens
        (TINY_GEMMA4, 2 * 20 * 1 * (24 + 24) * F32 + 2 * 8 * 2 * (8 + 8) * F32),
        # 1 latent layer: 16 + 8 values a token; 3 KDA layers: 4 heads of (8, 8) and 3 x 4 x 8 channels x 3 inputs
        (TINY_KIMI, 20 * (16 + 8) * F32 + 3 * (4 * 8 * 8 + 3 * 4 * 8 * 3) * F32),
        # 1 full layer (2 KV heads of 8), 20 tokens; 1 sliding, 8 tokens; 2 conv layers: 32 channels x 2 inputs
        (TINY_LFM3, 20 * 2 * 2 * 8 * F32 + 8 * 2 * 2 * 8 * F32 + 2 * 32 * (3 - 1) * F32),
    ],
    ids=["gemma4", "kimi_linear", "lfm3"],
)
def test_the_meter_counts_what_the_caches_of_a_config_json_hold(raw: dict[str, object], total: int) -> None:
    """Through the family's reader, as a downloaded folder: the meter's bytes at 20 tokens are the buffers the
    model's caches hold after reading 20 tokens (float32), by hand."""
    config = config_from_hf(raw, Path("tiny"))
    (at,) = kv_report(config, name="tiny", tokens=(20,), dtype="float32").at
    model = GPT(config)
    caches = model.make_caches(batch_size=1, max_len=20)
    with torch.no_grad():
        model(torch.zeros(1, 20, dtype=torch.long), caches=caches)
    assert held(caches) == at.total == total


def test_the_gemma4_shapes_have_their_names_parameter_counts() -> None:
    """31B is 30.x B; 26B-A4B 25.x B in all and 4 B a token (8 of 128 experts, each 3 x 2816 x 704 on 30 layers);
    E2B and E4B are 2.x and 4.x B without their per-layer embedding table (262,144 rows of layers x 256)."""
    assert int(count_parameters(shape("gemma-4-31b")) / 1e9) == 30
    total = count_parameters(shape("gemma-4-26b-a4b"))
    idle = 30 * (128 - 8) * 3 * 2816 * 704
    assert int(total / 1e9) == 25 and round((total - idle) / 1e9) == 4
    for name, layers, effective in (("gemma-4-e2b", 35, 2), ("gemma-4-e4b", 42, 4)):
        table = 262_144 * layers * 256
        assert int((count_parameters(shape(name)) - table) / 1e9) == effective, name


LFM3_FULL, LFM3_SLIDING = [2, 6, 10, 14, 18, 22], [4, 8, 12, 16, 20]  # Lfm3Config's pattern: i % 4 == 2, 0 (i > 0)


def test_lfm3_keeps_six_full_layers_five_windows_and_thirteen_convolutions() -> None:
    """Lfm3Config's defaults: 4 KV heads of 128 on every attention layer, a window of 256 on the sliding ones, and
    13 convolution layers that keep their last 7 - 1 inputs of each of 2,048 channels, in the weights' dtype."""
    config = shape("lfm3-1.7b")
    kinds = {"full": LFM3_FULL, "sliding": LFM3_SLIDING}
    assert [config.layer_type(i) for i in range(24)] == [
        next((k for k, at in kinds.items() if i in at), "conv") for i in range(24)
    ]
    one = 2 * 4 * 128 * 2  # keys and values, bfloat16: bytes a token, one attention layer
    conv = 2048 * (7 - 1) * 2  # bfloat16, as ConvolutionCache keeps the weights' dtype
    kept = layer_kinds(config)
    assert [(k.kind, k.window, k.layers, k.bytes_per_token, k.state_bytes) for k in kept] == [
        ("full", None, 6, one, 0),
        ("sliding", 256, 5, one, 0),
        ("conv", None, 13, 0, conv),
    ]
    at = cache_at(kept, 131_072, context_length=config.context_length)
    assert at.total == 6 * one * 131_072 + 5 * one * 256 + 13 * conv
    assert every_layer_full(config) == 24 * one


def lfm3_parameters() -> int:
    """Lfm3Config's defaults counted by hand: the tied embedding, 24 SwiGLU MLPs of 7,680, four sandwich norms a
    layer and the final one; 11 attention layers (q and o 2,048 x 2,048, k and v 2,048 x 512, QK-norms of 128, a
    gate of one opening a head); 13 convolution layers (in_proj to B, C and x, a depthwise kernel of 7, out_proj)."""
    d, vocab, hidden = 2048, 128_000, 7680
    attention = 2 * d * d + 2 * d * 4 * 128 + 2 * 128 + d * 16
    convolution = d * 3 * d + d * 7 + d * d
    return vocab * d + 24 * (3 * d * hidden + 4 * d) + d + 11 * attention + 13 * convolution


def test_lfm3_has_its_names_parameter_count() -> None:
    """1,728,801,536 parameters: 1.7B to the digits "LFM3-1.7B" gives."""
    total = count_parameters(shape("lfm3-1.7b"))
    assert total == lfm3_parameters() == 1_728_801_536
    assert round(total / 1e9, 1) == 1.7


@pytest.mark.slow  # transformers' import and a model on the meta device: 4 s
def test_the_lfm3_shape_is_lfm3configs_defaults_as_transformers_builds_them() -> None:
    """The table's fields are the class's defaults: Lfm3Config() read by attnlab's reader is the table's config,
    and Lfm3ForCausalLM built from it holds the parameters counted by hand."""
    from transformers import Lfm3Config, Lfm3ForCausalLM

    default = Lfm3Config()
    assert config_from_hf(default.to_dict(), Path("defaults")) == shape("lfm3-1.7b")
    assert default.layer_types == SHAPES["lfm3-1.7b"]["layer_types"]
    with torch.device("meta"):
        model = Lfm3ForCausalLM(default)
    assert sum(p.numel() for p in model.parameters()) == lfm3_parameters()


@pytest.mark.slow  # 256 experts on 26 layers, built on the meta device: 7 s
def test_kimi_linear_is_48b_without_its_embeddings_and_3b_a_token() -> None:
    """The name's 48B is the count without the embedding table and the untied head (163,840 x 2,304 each): with
    them the config counts 49.1B. A token runs 8 of 256 experts (3 x 2304 x 1024 each) on 26 sparse layers."""
    total = count_parameters(shape("kimi-linear-48b-a3b"))
    embeddings = 2 * 163_840 * 2304
    idle = 26 * (256 - 8) * 3 * 2304 * 1024
    assert round(total / 1e9, 1) == 49.1 and round((total - embeddings) / 1e9) == 48
    assert round((total - idle) / 1e9) == 3


@pytest.mark.slow  # transformers' import: 3 s
def test_transformers_reads_each_new_shape_as_attnlab_does() -> None:
    """The table's config fields read by transformers' own config classes: the same layer types, the same shape
    per layer (head size, KV heads), the same layers sharing keys, the same windows and context."""
    from transformers import Gemma4Config, KimiLinearConfig

    for name in ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-31b", "gemma-4-26b-a4b"):
        hf, ours = Gemma4Config.from_dict(SHAPES[name]).text_config, shape(name)
        kinds = [{"full_attention": "full", "sliding_attention": "sliding"}[t] for t in hf.layer_types]
        assert [ours.layer_type(i) for i in range(ours.n_layers)] == kinds, name
        shapes = [(c.head_dim, c.num_key_value_heads) for c in hf.per_layer_config]
        ours_shapes = [(s.head_dim, s.n_kv_heads) for s in map(ours.layer_shape, range(ours.n_layers))]
        assert ours_shapes == shapes, name
        assert [ours.kv_source(i) is not None for i in range(ours.n_layers)] == [
            m == "reuse" for m in hf.kv_sharing_modes
        ], name
        assert (ours.window, ours.context_length) == (hf.sliding_window, hf.max_position_embeddings), name
    hf_kimi, kimi = KimiLinearConfig.from_dict(SHAPES["kimi-linear-48b-a3b"]), shape("kimi-linear-48b-a3b")
    assert [kimi.layer_type(i) for i in range(27)] == [
        {"full_attention": "full", "linear_attention": "kda"}[t] for t in hf_kimi.layer_types
    ]
    assert (kimi.delta_heads, kimi.delta_head_dim, kimi.conv_kernel, kimi.kv_lora_rank) == (
        hf_kimi.linear_num_heads, hf_kimi.linear_head_dim, hf_kimi.linear_conv_kernel_dim, hf_kimi.kv_lora_rank
    )  # fmt: skip
    assert kimi.context_length == hf_kimi.max_position_embeddings == 1_048_576
    default = KimiLinearConfig()  # its class defaults are this checkpoint's, but for the layers: 6 full, not 7
    assert [i for i, t in enumerate(default.layer_types) if t == "full_attention"] == [4, 8, 12, 16, 20, 24]


def test_memory_sets_a_qwen35_shape_against_every_layer_full(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # each sentence on one line
    assert cli.main(["memory", "--model", "qwen3.5-0.8b", "--tokens", "131072"]) == 0
    out = capsys.readouterr().out
    assert (
        "6 full, 18 delta" in out
        and f"a state of {delta_state(k_heads=16, dk=128, v_heads=16, dv=128, taps=4):,} B" in out
    )
    assert "against every layer full (at 131,072 tokens 6.00 GiB): 1.52 GiB here, 4.0x less" in out


# ------------------------------------------------------------------------------------------------ the script


def saved_run() -> dict[str, object]:
    runs = sorted((ROOT / "benchmarks" / "results").glob("kv_shapes-*.json"))
    assert runs, "no result file of benchmarks/kv_shapes.py in benchmarks/results/"
    result: dict[str, object] = json.loads(runs[-1].read_text(encoding="utf-8"))
    return result


def test_docs_quote_the_committed_run_and_it_measured_every_shape() -> None:
    """docs/benchmarks.md's table and sentences are what the script renders from the committed file."""
    script = load("kv_shapes")
    result = saved_run()
    assert result["schema"] == script.SCHEMA and [r["name"] for r in result["rows"]] == list(script.SHAPES)  # type: ignore[index, union-attr]
    assert script.problems(result) == []
    assert script.render(result) in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")


def test_the_run_matches_the_meter_and_a_row_that_does_not_add_up_is_named() -> None:
    script = load("kv_shapes")
    result = saved_run()
    row = next(r for r in result["rows"] if r["name"] == "qwen3.5-27b")  # type: ignore[union-attr]
    assert row == script.measure("qwen3.5-27b")  # the committed figures are today's meter's
    at = row["at"][-1]
    assert at["by_kind"] == {
        "full": 16 * 4096 * 131_072,
        "delta": 48 * delta_state(k_heads=16, dk=128, v_heads=48, dv=128, taps=4),
    }
    broken = json.loads(json.dumps(result))
    broken["rows"][0]["at"][0]["by_kind"]["delta"] += 1
    broken["rows"][1]["at"][1]["every_layer_full"] = broken["rows"][1]["at"][1]["total"]
    assert [line.split(":")[0] for line in script.problems(broken)] == [
        "qwen3.5-0.8b at 32,768",
        "qwen3.5-4b at 131,072",
    ]


def test_the_sentences_read_right_for_shared_latent_and_kda_layers() -> None:
    """The committed run's words for the kinds the Gemma 4 and Kimi Linear rows bring: shared layers at 0 B,
    latents in place of keys and values, and the KDA state; each row's source is the table's."""
    script = load("kv_shapes")
    result = saved_run()
    text = script.render(result)
    assert [r["repo"] for r in result["rows"]] == [SOURCES[name] for name in script.SHAPES]  # type: ignore[union-attr]
    e2b = next(line for line in text.splitlines() if line.startswith("- google/gemma-4-E2B-it:"))
    assert "3 of 35 layers keep every token's keys and values, 6,144 B a token against 71,680 B" in e2b
    assert "20 shared layers keep 0 B of their own: each reads the keys and values of the last earlier" in e2b
    kimi = next(line for line in text.splitlines() if line.startswith("- moonshotai/Kimi-Linear-48B-A3B-Instruct:"))
    assert "7 of 27 layers keep every token's latent and RoPE key, 8,064 B a token against 31,104 B with every " in kimi
    assert "layer latent; 20 Kimi Delta Attention layers keep a state of fixed size" in kimi
    assert "| 4.63B (2.28B without its per-layer table) |" in text and "GiB (every layer latent) |" in text
    assert "keys and values" not in kimi and "shared" not in kimi


def test_the_lfm3_sentence_says_what_a_convolution_layer_keeps() -> None:
    """A convolution layer keeps its last K - 1 inputs, of fixed size; the run says its fields are the config
    class's defaults, not a downloaded config.json."""
    script = load("kv_shapes")
    text = script.render(saved_run())
    lfm3 = next(line for line in text.splitlines() if line.startswith("- LiquidAI/LFM3-1.7B:"))
    assert "6 of 24 layers keep every token's keys and values, 12,288 B a token against 49,152 B" in lfm3
    assert "5 sliding layers keep their last 256 tokens' keys and values, 2.50 MiB in all" in lfm3
    conv = "13 convolution layers keep their last 6 inputs of each channel (a kernel of 7), a state of fixed size, "
    assert conv + "312 KiB in all whatever the tokens" in lfm3 and 13 * 2048 * 6 * 2 == 312 * 1024
    assert "LiquidAI/LFM3-1.7B's: transformers 5.24's Lfm3Config defaults" in text
    assert "not a downloaded config.json" in text


def test_the_committed_gemma4_row_is_todays_meter() -> None:
    script = load("kv_shapes")
    rows = {r["name"]: r for r in saved_run()["rows"]}  # type: ignore[union-attr]
    assert rows["gemma-4-e2b"] == script.measure("gemma-4-e2b")
    assert rows["gemma-4-e2b"]["per_layer_table"] == 262_144 * 35 * 256
    assert rows["lfm3-1.7b"] == script.measure("lfm3-1.7b")
