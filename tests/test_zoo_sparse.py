"""The zoo's sparse variants (issue 59 item 7): dsa (mla with a lightning indexer, top-32 of a 128-token training
sequence) and compressed (DeepSeek-V4's compressed-sparse and heavily compressed layers at the zoo's size): they
select while they train, they are saved and read back in attnlab's format, and a zoo run records the keys they
read and the bytes they keep, beside every other variant's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.models.tasks import make_task
from attnlab.models.train import TrainConfig, train
from attnlab.models.zoo import DSA_TOPK, SEQ_LEN, V4_TOPK, V4_WINDOW, zoo_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_compressed_variant_is_saved_and_read_back_in_attnlabs_format() -> None:
    config = zoo_config("compressed")
    assert config.deepseek_v4 is not None and config.deepseek_v4.layer_kinds[:2] == (
        "compressed_sparse",
        "heavily_compressed",
    )
    assert GPTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_both_select_within_the_training_sequence() -> None:
    """One training forward of SEQ_LEN tokens: the query at position p (p + 1 tokens visible) reads min(32, p + 1)
    keys in dsa; in compressed, min(16, p + 1) of its window and, in a compressed-sparse layer, min(8, (p + 1) // 4)
    entries (an entry visible once its block of 4 has closed), in a heavily compressed one (p + 1) // 16."""
    ids = torch.randint(0, 256, (1, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    positions = range(SEQ_LEN)
    for name in ("dsa", "compressed"):
        torch.manual_seed(0)
        model = GPT(zoo_config(name)).eval()
        with torch.no_grad():
            model(ids)
        read = [int(block.att.keys_read) for block in model.blocks]
        if name == "dsa":
            assert read == [sum(min(DSA_TOPK, p + 1) for p in positions)] * 4
            assert read[0] < SEQ_LEN * (SEQ_LEN + 1) // 2  # fewer than dense mla's
        else:
            sparse = sum(min(V4_TOPK, (p + 1) // 4) for p in positions)
            heavy = sum((p + 1) // 16 for p in positions)
            assert read == [sparse, heavy] * 2
            window = sum(min(V4_WINDOW, p + 1) for p in positions)
            assert [int(block.att.window_read) for block in model.blocks] == [window] * 4


@pytest.mark.slow  # seconds: a smoke zoo run of both
def test_a_zoo_run_trains_them_and_records_keys_read_and_bytes(tmp_path: Path) -> None:
    from attnlab.bench.zoo import run_zoo
    from attnlab.bench.zoo_result import PROMPT, READ, ZooResult, rows

    result = run_zoo(["mha", "dsa", "compressed"], minutes=5, smoke=True, models=tmp_path / "models")
    got = {v.name: v for v in result.variants}
    assert got["mha"].keys_read_by_layer == [PROMPT + 1] * 4  # dense: every token held, the decoded one too
    assert got["dsa"].keys_read_by_layer == [DSA_TOPK] * 4
    assert got["compressed"].keys_read_by_layer == [V4_WINDOW + V4_TOPK, V4_WINDOW + (PROMPT + 1) // 16] * 2
    assert got["mha"].state_bytes_per_token == pytest.approx(2048, rel=1e-3)  # 4 x 2 x 4 heads x 16 x float32
    assert got["compressed"].state_bytes_per_token < got["dsa"].state_bytes_per_token < 2048
    assert all(v.decode_tokens_per_s > 0 and v.final_losses for v in result.variants)
    again = ZooResult.read(result.write(tmp_path / "zoo.json"))
    table = rows(again)
    assert [r[READ] for r in table] == [f"{4 * (PROMPT + 1):,}", f"{4 * DSA_TOPK:,}", f"{2 * (24 + 16 + 64):,}"]
    for name in ("dsa", "compressed"):
        assert GPT.from_pretrained(tmp_path / "models" / name).config == zoo_config(name)


def test_train_trains_the_indexers_by_their_own_loss_as_docs_zoo_says(tmp_path: Path) -> None:
    """A top-k is a choice, not a function the loss can differentiate: the language-model loss alone leaves every
    indexer weight of dsa and compressed without a gradient (None or 0), while the attention around it gets one.
    So ``train()`` adds the indexers' own loss (attnlab.nn.index_loss): after a few steps every indexer weight has
    moved and the log holds its loss a step. docs/zoo.md says how the shipped run's indexers trained."""
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    for name in ("dsa", "compressed"):
        torch.manual_seed(0)
        model = GPT(zoo_config(name)).train()
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        indexer = [g for n, g in grads.items() if ".indexer." in n]
        assert indexer and all(g is None or not g.any() for g in indexer), name
        assert any(g is not None and g.any() for n, g in grads.items() if ".att." in n and ".indexer." not in n)
        model.zero_grad(set_to_none=True)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if ".indexer." in n}
        task = make_task("text", seq_len=64)
        log = train(model, task, TrainConfig(steps=3, batch_size=2, warmup=1, eval_every=3, eval_batches=1))
        moved = [n for n, p in model.named_parameters() if ".indexer." in n and not torch.equal(p, before[n])]
        assert sorted(moved) == sorted(before), (name, set(before) - set(moved))
        assert len(log.index_loss) == 3 and all(v > 0 for v in log.index_loss), name
    docs = " ".join((ROOT / "docs" / "zoo.md").read_text(encoding="utf-8").split())
    assert "the language-model loss sends their indexers no gradient" in docs
    assert "KL divergence" in docs and "attnlab.nn.index_loss" in docs
