"""Keys read and state bytes a token, measured (``attnlab.bench.sparse_meter``, issue 59 item 4), and
benchmarks/sparse.py: each count worked out here by hand from the zoo's shapes (a dense layer reads every token it
holds, a window its last W, DSA its top-k, a compressed layer its window and its closed or chosen entries), the
bytes from the layers' widths, and docs/benchmarks.md quoting the committed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.bench.sparse_meter import keys_read, state_bytes
from attnlab.models import GPT
from attnlab.models.zoo import DSA_TOPK, V4_TOPK, V4_WINDOW, WINDOW, zoo_config
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]
N = 100  # tokens held when the metered token is decoded (its own included)


def filled(name: str, n: int = N, **changes: object) -> tuple[GPT, object, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(zoo_config(name).with_(**changes)).eval()
    ids = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(3))
    caches = model.make_caches(batch_size=1, max_len=n)
    with torch.no_grad():
        model(ids[:, :-1], caches=caches, last_only=True)
    return model, caches, ids[:, -1:]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mha", [N] * 4),  # every token it holds, once however many heads read it
        ("mla", [N] * 4),  # one latent a token
        ("sliding", [WINDOW] * 4),
        ("hybrid", [0, 0, 0, N]),  # DeltaNet layers score no keys: they read a state
        ("dsa", [DSA_TOPK] * 4),
        # compressed-sparse: the window and the top 8 of N // 4 closed entries; heavily compressed: the window and
        # every closed entry, one a 16 tokens
        ("compressed", [V4_WINDOW + V4_TOPK, V4_WINDOW + N // 16] * 2),
    ],
)
def test_the_meter_counts_the_keys_each_kind_reads(name: str, expected: list[int]) -> None:
    model, caches, token = filled(name)
    assert keys_read(model, caches, token) == expected


def test_the_keys_read_fall_with_top_k_and_the_meter_is_zeroed_each_token() -> None:
    model, caches, token = filled("dsa", index_topk=8)
    assert keys_read(model, caches, token) == [8] * 4  # its kernel's gathers, not the zoo's 32
    model, caches, token = filled("dsa", index_topk=N + 50)  # a top-k past the context: every key, as dense
    assert keys_read(model, caches, token) == [N] * 4
    model, caches, token = filled("compressed", n=N + 1)  # N held
    assert int(model.blocks[0].att.keys_read) > 0  # the prompt's reads are on the meter; keys_read zeroes it first
    assert keys_read(model, caches, token) == [V4_WINDOW + V4_TOPK, V4_WINDOW + (N + 1) // 16] * 2
    with pytest.raises(ValueError, match=r"token of shape \(1, 1\), got \(1, 2\)"):
        keys_read(model, caches, torch.zeros(1, 2, dtype=torch.long))


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        ("mha", 4 * 2 * 4 * 16 * 4),  # 4 layers x keys and values x 4 heads x 16 x float32
        ("mla", 4 * (32 + 8) * 4),  # the latent and the RoPE key
        ("dsa", 4 * (32 + 8 + 16) * 4),  # and the indexer's key beside them
    ],
)
def test_the_state_bytes_are_what_the_layers_keep_a_token(name: str, per_token: int) -> None:
    _, caches, _ = filled(name)
    assert per_token * N <= state_bytes(caches) < per_token * N + 256  # and a length counter or two


def test_the_compressed_cache_keeps_a_window_and_an_entry_a_block() -> None:
    """Each layer: a window of 16 keys, N // m entries of 16 (the compressed-sparse layer's indexer keys of 16
    beside them), and the last 2m tokens' compressor rows: far less a token than mha's 2,048 B at 1,024 tokens."""
    _, caches, _ = filled("compressed", n=1024)
    per_token = state_bytes(caches) / 1024
    entries = 2 * (1024 // 4) * (16 + 16) * 4 + 2 * (1024 // 16) * 16 * 4  # the closed entries alone
    assert entries / 1024 < per_token < 150


def test_a_variants_period_is_its_repeating_layers() -> None:
    sparse = load("sparse")
    assert [sparse.period(zoo_config(n)) for n in ("mha", "dsa", "compressed", "banded", "local-global")] == [
        1,
        1,
        2,
        2,
        4,
    ]
    cut = sparse.one_period(zoo_config("compressed"))
    assert cut.n_layers == 2 and cut.deepseek_v4.layer_kinds == ("compressed_sparse", "heavily_compressed")


@pytest.mark.slow  # a zoo model's 1,024-token prompt, four times
def test_the_zoos_four_layers_are_the_benchmarks_period_repeated() -> None:
    """What the zoo records (four layers, measured) equals the benchmark's one period times its repeats."""
    from attnlab.bench.zoo import measure_reads
    from attnlab.bench.zoo_result import PROMPT

    sparse, table = load("sparse"), load("_sparse_table")
    for name in ("mha", "dsa", "compressed"):
        torch.manual_seed(0)
        by_layer, bytes_a_token = measure_reads(GPT(zoo_config(name)).eval())
        keys, held = table.per_token(sparse.measure_reads(name, PROMPT + 1))
        assert sum(by_layer) == keys
        assert bytes_a_token == pytest.approx(held, rel=1e-3)  # the length counters, once a layer


@pytest.mark.slow  # seconds: the script's smoke run
def test_the_smoke_run_measures_renders_and_reads_back(tmp_path: Path) -> None:
    sparse, table = load("sparse"), load("_sparse_table")
    result = sparse.run(smoke=True, rounds=2, threads=1)
    assert sparse.problems(result) == []
    path = tmp_path / "sparse.json"
    path.write_text(json.dumps(result))
    text = table.render(json.loads(path.read_text()))
    assert text == table.render(result) and "dsa against mla" in text and "(smoke" in text
    assert {r["variant"] for r in result["reads"]} == {"mha", "mla", "dsa", "compressed", "moba", "nsa"}
    moba = next(r for r in result["reads"] if r["variant"] == "moba" and r["tokens"] == 128)
    assert moba["keys_by_layer"][0] < 128  # its four heads' blocks, a key once: fewer than dense reads
    counted_per_head = {**result, "reads": [{**moba, "keys_by_layer": [192]}], "decode": []}
    assert sparse.problems(counted_per_head) == ["moba at 128 tokens read [192] keys, more than held"]


def test_the_docs_quote_the_committed_run() -> None:
    table, sparse = load("_sparse_table"), load("sparse")
    runs = sorted((ROOT / "benchmarks" / "results").glob("sparse-*.json"))
    assert runs, "no committed run of benchmarks/sparse.py: run it (see its docstring) and render it into the docs"
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == sparse.SCHEMA and not result["smoke"] and result["rounds"] >= 3
    assert [n for n in sorted({r["tokens"] for r in result["reads"]}) if n >= 1024] == [1024, 8192, 32768]
    assert sparse.problems(result) == []
    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert table.render(result) in docs
