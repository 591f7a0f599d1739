"""The KV bytes meter on the hybrid families' published shapes (benchmarks/kv_shapes.py, issue 56): each figure
worked out here by hand from the config.json numbers, a shared layer counted once (in the layer whose keys it
reads) against the caches a tiny model really builds, and docs/benchmarks.md quoting the committed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.bench.kv_bytes import every_layer_full, kv_report
from attnlab.cache import KVCache, SlidingWindowCache
from attnlab.cache.shared import SharedCache
from attnlab.cache.state import ConvolutionCache
from attnlab.models import GPT, GPTConfig
from attnlab.models.families.shapes import shape
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
    assert row == script.measure("qwen3.5-27b", "Qwen/Qwen3.5-27B")  # the committed figures are today's meter's
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
