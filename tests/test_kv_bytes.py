"""KV-cache bytes from the config alone (attnlab.bench.kv_bytes, attnlab memory): golden numbers worked out by
hand for published shapes, and the formula against the bytes of the caches attnlab really allocates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import cli
from attnlab.bench.kv_bytes import count_parameters, kv_report, read_config
from attnlab.cache import KVCache, SlidingWindowCache
from attnlab.models import GPT, GPTConfig

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    ("preset", "dtype", "per_token"),
    [
        ("llama-3.2-1b", "bfloat16", 16 * 2 * 8 * 64 * 2),  # 32,768: 8 KV heads of 32 query heads
        ("llama-3.1-8b", "bfloat16", 32 * 2 * 8 * 128 * 2),  # 131,072
        ("mistral-7b", "bfloat16", 32 * 2 * 8 * 128 * 2),  # 131,072 while inside the window
        ("qwen2.5-7b", "bfloat16", 28 * 2 * 4 * 128 * 2),  # 57,344: 4 KV heads
        ("qwen3-0.6b", "bfloat16", 28 * 2 * 8 * 128 * 2),  # 114,688: head_dim 128 although 1024 / 16 = 64
        ("qwen3-8b", "bfloat16", 36 * 2 * 8 * 128 * 2),  # 147,456
        ("gpt2-small", "float32", 12 * 2 * 12 * 64 * 4),  # 73,728: every head keeps its keys
    ],
)
def test_bytes_per_token_are_the_hand_computed_ones(preset: str, dtype: str, per_token: int) -> None:
    report = kv_report(GPTConfig.preset(preset), name=preset, tokens=(1024,), dtype=dtype)
    assert report.per_token == per_token
    assert report.at[0].total == 1024 * per_token


def test_llama_3_2_1b_at_128k_tokens_is_4_gib_and_within_its_context() -> None:
    report = kv_report(GPTConfig.preset("llama-3.2-1b"), name="l", tokens=(1024, 32768, 131072))
    assert [at.total for at in report.at] == [32 * MiB, 1 * GiB, 4 * GiB]
    assert not any(at.past_context for at in report.at)  # 131,072 is its context_length, not past it


def test_mistral_7b_sliding_layers_stop_at_the_window() -> None:
    report = kv_report(GPTConfig.preset("mistral-7b"), name="m", tokens=(1024, 4096, 32768))
    assert [k.kind for k in report.kinds] == ["sliding"] and report.kinds[0].window == 4096
    small, window, long = report.at
    assert small.held == {"sliding 4096": 1024} and small.total == 1024 * 131072  # 128 MiB
    assert window.total == long.total == 32 * 2 * 8 * 128 * 2 * 4096  # 512 MiB: each layer holds only 4096
    assert long.layer_bytes == {"sliding 4096": 2 * 8 * 128 * 2 * 4096}  # 16 MiB per layer


def test_qwen3_0_6b_past_its_context_is_marked() -> None:
    report = kv_report(GPTConfig.preset("qwen3-0.6b"), name="q", tokens=(32768, 40960, 131072))
    assert [at.past_context for at in report.at] == [False, False, True]
    assert report.at[0].total == 28 * 2 * 8 * 128 * 2 * 32768  # 3.5 GiB


def test_a_hybrid_pattern_counts_each_kind_of_layer() -> None:
    config = GPTConfig(
        vocab_size=64, emb_dim=32, n_heads=4, n_kv_heads=2, n_layers=4, rope=True, window=16, context_length=128
    ).with_(layer_types=("sliding", "full", "sliding", "sliding"))
    report = kv_report(config, name="h", tokens=(8, 100), dtype="float32")
    per_layer = 2 * 2 * 8 * 4
    assert [(k.kind, k.layers) for k in report.kinds] == [("full", 1), ("sliding", 3)]
    assert report.at[0].total == 4 * 8 * per_layer  # under the window every layer holds every token
    assert report.at[1].total == (1 * 100 + 3 * 16) * per_layer
    assert report.at[1].held == {"full": 100, "sliding 16": 16}


@pytest.mark.parametrize(
    ("preset", "parameters"),
    [  # the counts their publishers state (tied embeddings counted once)
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.1-8b", 8_030_261_248),
        ("mistral-7b", 7_241_732_096),
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-8b", 8_190_735_360),
        ("gpt2-small", 163_009_536),  # the book's untied count; 124,412,160 tied
    ],
)
def test_parameter_counts_are_the_published_ones(preset: str, parameters: int) -> None:
    assert count_parameters(GPTConfig.preset(preset)) == parameters


def test_a_tied_head_is_counted_once() -> None:
    untied = count_parameters(GPTConfig.preset("gpt2-small"))
    assert untied - count_parameters(GPTConfig.preset("gpt2-small", tie_weights=True)) == 50257 * 768


CONFIGS: dict[str, dict[str, Any]] = {
    "gqa": dict(n_heads=4, n_kv_heads=2),
    "mqa, own head_dim": dict(n_heads=4, n_kv_heads=1, head_dim=24),
    "sliding": dict(n_heads=4, n_kv_heads=2, window=8),
    "hybrid": dict(n_heads=4, n_kv_heads=2, window=8, layer_types=("full", "sliding", "sliding")),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", list(CONFIGS))
@pytest.mark.parametrize("tokens", [8, 20, 64])
def test_the_formula_is_the_bytes_attnlab_allocates(shape: str, dtype: str, tokens: int) -> None:
    """make_caches(max_len=N) on a tiny model: its key and value buffers, layer by layer, weigh what the formula
    says (a sliding layer's ring holds its window, not N). Token counts at or past the window of 8."""
    config = GPTConfig(vocab_size=64, context_length=64, emb_dim=32, n_layers=3, rope=True, **CONFIGS[shape])
    model = GPT(config).to(getattr(torch, dtype))
    caches = model.make_caches(batch_size=1, max_len=tokens)
    layers = [c for c in caches if isinstance(c, (KVCache, SlidingWindowCache))]
    assert len(layers) == config.n_layers
    allocated = [c.k_cache.nbytes + c.v_cache.nbytes for c in layers]
    report = kv_report(config, name=shape, tokens=(tokens,), dtype=dtype)
    (at,) = report.at
    assert sum(allocated) == at.total
    for layer, got in enumerate(allocated):
        window = config.layer_window(layer)
        assert got == at.layer_bytes["full" if window is None else f"sliding {window}"], layer


def test_a_folder_is_read_from_its_config_json_alone(tmp_path: Path) -> None:
    """A Hugging Face Qwen3 config.json with no weights beside it: the config is all `memory` needs."""
    config = GPTConfig.preset(
        "qwen3-0.6b", vocab_size=64, context_length=128, emb_dim=32, n_heads=4, n_kv_heads=2, n_layers=2, head_dim=16
    ).with_(hidden_dim=64)
    GPT(config).save_pretrained(tmp_path / "saved")
    raw = json.loads((tmp_path / "saved" / "config.json").read_text())
    raw.pop("attnlab")  # what Hugging Face writes: no attnlab config to fall back on
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(raw))
    read = read_config(tmp_path / "hf")
    assert (read.n_layers, read.n_kv_heads, read.d_head, read.qk_norm) == (2, 2, 16, True)
    assert kv_report(read, name="hf", tokens=(10,)).per_token == 2 * 2 * 2 * 16 * 2
    assert count_parameters(read) == sum(p.numel() for p in GPT(config).parameters())


# ------------------------------------------------------------------------------------------------ the command


def test_memory_prints_the_figures_and_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "memory.json"
    assert cli.main(["memory", "--model", "llama-3.2-1b", "mistral-7b", "--json", str(out_file)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "1,235,814,400 parameters" in out and "32,768 B" in out and "4.00 GiB" in out  # Llama at 128k
    assert "16.0 MiB (4,096 tokens)" in out and "past the context" in out  # Mistral's window, and past 32k
    models = json.loads(out_file.read_text())["models"]
    assert [m["per_token"] for m in models] == [32768, 131072]
    assert [at["tokens"] for at in models[0]["at"]] == [1024, 32768, 131072]


def test_a_folder_saved_by_attnlab_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = GPTConfig(vocab_size=64, context_length=32, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0)
    GPT(config).save_pretrained(tmp_path / "tiny")
    assert cli.main(["memory", "--model", str(tmp_path / "tiny"), "--dtype", "float32", "--tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert f"{2 * 2 * 2 * 8 * 4:,} B" in out  # 2 layers x k,v x 2 heads x 8 dims x 4 bytes


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a run that must stop before printing anything (argparse's own slips exit from it)."""
    try:
        code: object = cli.main(["memory", *argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2, argv
    out, err = capsys.readouterr()
    assert out == "", (argv, out)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    return err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model", "qwen3-0.5b"], "--model 'qwen3-0.5b' is neither a preset nor a folder with a config.json; "),
        (["--model", "qwen3-0.5b"], "did you mean 'qwen3-0.6b'?"),
        (["--model", "qwen3-0.6b", "nonsense"], "presets: gpt2-small, "),  # the second name too, before any output
        (["--model", "qwen3-0.6b", "--tokens", "0"], "--tokens must be >= 1, got 0"),
        (["--model", "qwen3-0.6b", "--tokens", "1024", "-5"], "--tokens must be >= 1, got -5"),
        (["--model", "qwen3-0.6b", "--tokens", str(2**31)], f"--tokens must be <= {2**30}, got {2**31}"),
        (["--model", "qwen3-0.6b", "--tokens", "1k"], "argument --tokens: invalid int value: '1k'"),
        (["--model", "qwen3-0.6b", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--model", "qwen3-0.6b", "--json", "out.txt"], "'out.txt' should end in .json"),
    ],
)
def test_each_slip_is_named_in_one_line_before_any_output(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(argv, capsys)
    assert said in err, err


def test_a_folder_without_config_and_a_state_dict_file_say_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--model", str(tmp_path)], capsys)
    assert "has no config.json: give a Hugging Face or attnlab checkpoint folder" in err, err
    (tmp_path / "book.pth").write_bytes(b"")
    err = _refused(["--model", str(tmp_path / "book.pth")], capsys)
    assert "is a state-dict file, which has no config.json; give its folder, or a preset" in err, err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    err = _refused(["--model", str(tmp_path / "other")], capsys)
    assert "is a 'gemma3' model; attnlab reads model_type 'gpt2' and" in err, err


def test_a_latent_attention_model_is_counted_by_its_latent_and_matches_the_cache_it_builds() -> None:
    """DeepSeek-V3's MLA stores kv_lora_rank + qk_rope_head_dim values a token and layer, for every head at once;
    the meter says so, and a tiny model's LatentCache holds exactly that."""
    import torch

    from attnlab.bench.kv_bytes import kv_report
    from attnlab.cache import stored_bytes
    from attnlab.models import GPT, GPTConfig

    config = GPTConfig(
        vocab_size=64, context_length=64, emb_dim=32, n_heads=4, n_layers=2, rope=True, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    report = kv_report(config, name="tiny-mla", tokens=(10,), dtype="float32")
    assert [k.kind for k in report.kinds] == ["latent"] and report.per_token == 2 * (16 + 4) * 4
    model = GPT(config)
    one, eleven = (stored_bytes(model.make_caches(batch_size=1, max_len=n)) for n in (1, 11))
    assert (eleven - one) // 10 == report.per_token
    assert report.formula == "20 latent and RoPE values x 4"
    assert torch.float32.itemsize == 4


def test_decode_bytes_counts_what_a_step_of_each_family_reads() -> None:
    """The roofline's bytes, counted by hand here: a tied head reads its table whole (no row subtracted), a
    sliding layer's keys stop at its window, and a token reads 2 of 4 experts, not all of them."""
    from attnlab.bench.roofline import decode_bytes

    shape = dict(vocab_size=100, context_length=64, emb_dim=16, n_heads=2, n_kv_heads=1, head_dim=8, n_layers=2)
    shape |= dict(norm="rmsnorm", mlp="swiglu", bias=False, qk_norm=True, rope=True, drop_rate=0.0)
    dense = GPTConfig(**shape, hidden_dim=32, tie_weights=True, layer_types=("full", "sliding"), window=4)
    attention = 16 * 16 + 16 * 8 + 16 * 8 + 16 * 16 + 8 + 8  # q, k, v, out; the QK norms
    layer = attention + 2 * 16 + 3 * 16 * 32  # two norms, the gated MLP
    step = decode_bytes(dense, 10)
    assert step.weights == 4 * (100 * 16 + 2 * layer + 16)  # the tied table once, whole; the final norm
    assert step.kv == 4 * (10 + 4) * 2 * 8  # keys and values: 10 positions in the full layer, 4 in the sliding one
    moe = GPTConfig(**shape, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    routed = 16 * 4 + 2 * 3 * 16 * 8  # the router, and the two experts a token goes to
    step = decode_bytes(moe, 10)
    assert step.weights == 4 * (16 + 2 * (attention + 2 * 16 + routed) + 16 + 100 * 16)  # one row; final norm; head
    assert step.kv == 4 * 2 * 10 * 2 * 8
    assert decode_bytes(moe, 10, element=2).weights == step.weights // 2
    ple = GPTConfig(**shape, hidden_dim=32, tie_weights=True, layer_types=("full", "sliding"), window=4, ple_dim=4)
    # Gemma 4's per-layer embeddings: the projection, its norm, one row of the (V, L*P) table; each layer's gate,
    # projection and post norm
    added = 16 * 2 * 4 + 4 + 2 * 4 + 2 * (16 * 4 + 4 * 16 + 16)
    assert decode_bytes(ple, 10).weights == decode_bytes(dense, 10).weights + 4 * added
    beside = ple.with_(ple_dim=0, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, moe_beside=True)
    # Gemma 4's experts beside each MLP: the router (its projection, scale and per-expert scale), three norms, and
    # the 2 of 4 fused experts (gate and up 2 x 8 x 16, down 16 x 8) a token is routed to
    added = 2 * (16 * 4 + 16 + 4 + 3 * 16 + 2 * (2 * 8 * 16 + 16 * 8))
    assert decode_bytes(beside, 10).weights == decode_bytes(dense, 10).weights + 4 * added
    shared = GPTConfig(**shape | dict(n_layers=3), hidden_dim=32, kv_shared_layers=1)  # layer 2 reads layer 1's
    assert decode_bytes(shared, 10).kv == 4 * 3 * 10 * 2 * 8  # stored twice, read three times


@pytest.mark.parametrize(
    ("name", "published", "digits"),
    [  # the count its publisher states, to the digits it states them: exact, or in billions
        ("gemma-3-1b", 999_885_952, 0),
        ("gemma-3-27b", 27.0, 1),  # the text model (27.4B with the vision encoder)
        ("gpt-oss-20b", 20.91, 2),  # the gpt-oss model card's total, 3.61B of it active
        ("qwen3.5-0.8b", 0.8, 1),  # its model card's language model (vision tower and MTP layer aside)
        ("qwen3.5-27b", 27, 0),  # its model card's language model
        pytest.param("deepseek-v3", 671, 0, marks=pytest.mark.slow),  # 671B without its MTP module: 7 s on meta
    ],
)
def test_published_shapes_read_by_their_families_have_the_published_parameter_counts(
    name: str, published: float, digits: int
) -> None:
    from attnlab.models.families.shapes import shape

    count = count_parameters(shape(name))
    assert (count == published) if digits == 0 and published > 1e6 else round(count / 1e9, digits) == published


def test_the_meter_sets_each_design_against_what_it_saves(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3's 5 local to 1 global layers against every layer full; gpt-oss's bands; MLA's latent against the
    expanded heads (and against a GQA model beside it), each counted here by hand from the published config."""
    from attnlab.models.families.shapes import shape

    monkeypatch.setenv("COLUMNS", "300")  # each sentence on one line
    gemma = kv_report(shape("gemma-3-27b"), name="g", tokens=(1024, 32768, 131072))
    one = 2 * 16 * 128 * 2  # bytes a layer, a token: keys and values of 16 KV heads of 128, bfloat16
    assert [(k.kind, k.window, k.layers) for k in gemma.kinds] == [("full", None, 10), ("sliding", 1024, 52)]
    assert gemma.at[2].total == (10 * 131072 + 52 * 1024) * one
    assert gemma.instead == ("every layer full", 62 * one)
    oss = kv_report(shape("gpt-oss-20b"), name="o", tokens=(131072,))
    assert [(k.kind, k.window, k.layers) for k in oss.kinds] == [("full", None, 12), ("sliding", 128, 12)]
    assert oss.at[0].total == (12 * 131072 + 12 * 128) * 2 * 8 * 64 * 2
    assert cli.main(["memory", "--model", "gemma-3-27b", "llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    assert "against every layer full (at 131,072 tokens 62.0 GiB): 10.4 GiB here, 6.0x less" in out
    assert out.count("against") == 1  # Llama 3.1 8B is one kind of layer: nothing to set it against


@pytest.mark.slow  # DeepSeek-V3's 671B on the meta device: 7 s
def test_mla_against_its_expanded_heads_and_gqa(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.bench import kv_bytes
    from attnlab.models.families.shapes import shape

    monkeypatch.setenv("COLUMNS", "300")  # each sentence on one line
    made: list[Any] = []  # the configs and reports the command makes: DeepSeek-V3 built on the meta device once

    def kept(config: GPTConfig, **kwargs: Any) -> Any:
        made.append((config, kv_report(config, **kwargs)))
        return made[-1][1]

    monkeypatch.setattr(kv_bytes, "kv_report", kept)
    assert cli.main(["memory", "--model", "deepseek-v3", "llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    config, v3 = made[0]
    assert config == shape("deepseek-v3")
    assert v3.per_token == 61 * (512 + 64) * 2
    assert v3.instead == ("the expanded heads, as Hugging Face caches them", 61 * 128 * (128 + 64 + 128) * 2)
    assert "a latent of 576 values a token for all 128 heads" in out and "4,997,120 B a token, 71.1x" in out
    llama = kv_report(GPTConfig.preset("llama-3.1-8b"), name="l", tokens=(131072,))
    assert llama.per_token / (v3.per_token / 61 * 32) > 3.5  # per layer, GQA's 8 heads hold 3.6x MLA's latent


def test_a_recurrent_layers_state_is_counted_once_whatever_the_tokens() -> None:
    """The zoo's hybrid: 3 Gated DeltaNet layers and 1 full, 4 heads of 32 dims in float32. A delta layer holds
    4 x 32 x 32 values (16,384 B) after 1 token and after 131,072; a linear layer adds a 4 x 32 normalizer. The
    figures equal the bytes of the StateCache the model builds."""
    from attnlab.cache.state import StateCache
    from attnlab.models import GPT

    for types, state in (
        (("delta", "delta", "delta", "full"), 4 * 32 * 32 * 4),
        (("linear",) * 3 + ("full",), (4 * 32 * 32 + 4 * 32) * 4),
    ):
        config = GPTConfig(
            vocab_size=256, context_length=256, emb_dim=128, n_heads=4, n_layers=4, rope=True, layer_types=types
        )
        report = kv_report(config, name="hybrid", tokens=(1024, 131072), dtype="float32")
        full, recurrent = report.kinds
        assert (full.kind, full.layers, full.bytes_per_token) == ("full", 1, 2 * 4 * 32 * 4)
        assert (recurrent.kind, recurrent.layers, recurrent.bytes_per_token, recurrent.state_bytes) == (
            types[0],
            3,
            0,
            state,
        )
        for at in report.at:
            assert at.total == at.tokens * 1024 + 3 * state
        assert report.instead == ("every layer full", 4 * 1024)
        caches = GPT(config).make_caches(batch_size=1, max_len=8)
        assert [c.nbytes() for c in caches if isinstance(c, StateCache)] == [state] * 3


def test_a_qwen35_delta_layers_state_counts_its_value_heads_and_its_convolution() -> None:
    """Qwen3.5's Gated DeltaNet: 2 query/key heads of 8, 4 value heads of 12, a convolution of 4 taps over
    q, k and v (2*2*8 + 4*12 = 80 channels). Its state: 4 x 8 x 12 values and 80 x 3 inputs, in float32: the
    bytes of the StateCache the model builds."""
    from attnlab.cache.state import StateCache
    from attnlab.models import GPT

    config = GPTConfig(
        vocab_size=64,
        context_length=64,
        emb_dim=32,
        n_heads=4,
        n_layers=2,
        rope=True,
        layer_types=("delta", "full"),
        delta_heads=2,
        delta_head_dim=8,
        delta_value_heads=4,
        delta_value_dim=12,
        conv_kernel=4,
    )
    (full, delta) = kv_report(config, name="q35", tokens=(16,), dtype="float32").kinds
    assert delta.state_bytes == (4 * 8 * 12 + 80 * 3) * 4
    halves = kv_report(config, name="q35", tokens=(16,), dtype="bfloat16").kinds  # the keys in 2 bytes, the state in 4
    assert (halves[0].bytes_per_token, halves[1].state_bytes) == (full.bytes_per_token // 2, delta.state_bytes)
    caches = GPT(config).make_caches(batch_size=1, max_len=8)
    assert [c.nbytes() for c in caches if isinstance(c, StateCache)] == [delta.state_bytes]


@pytest.mark.parametrize("variant", ["moba", "nsa", "dsa"])
def test_block_sparse_and_indexed_layers_are_counted_as_the_caches_they_build_hold(variant: str) -> None:
    """The zoo's moba (every key, one row a head), nsa (a key and value row for each of its three branches) and
    dsa (the latent and the indexer's key): the meter's bytes a token equal what ten more tokens add to the
    caches the model builds. GLM-5's shared indexer layers keep the latent alone: counted without the indexer key."""
    from attnlab.cache import stored_bytes
    from attnlab.models.zoo import zoo_config

    configs = [zoo_config(variant)]
    if variant == "dsa":
        configs.append(configs[0].with_(index_shared=(1, 3)))
    for config in configs:
        report = kv_report(config, name=variant, tokens=(10,), dtype="float32")
        model = GPT(config)
        one, eleven = (stored_bytes(model.make_caches(batch_size=1, max_len=n)) for n in (1, 11))
        assert report.per_token > 0 and (eleven - one) // 10 == report.per_token, config.index_shared
