"""The models that ship (issue 35, part 4): the Tang-poems model reads characters and never saw 静夜思; every
shipped model together stays under 10 MB; docs/heads.md quotes benchmarks/shipped_models.py's run file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from attnlab.models import GPT, load_tokenizer
from attnlab.models.checkpoints import SHIPPED, locate
from attnlab.models.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shipped_models", ROOT / "benchmarks" / "shipped_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeated_8grams_are_counted_by_hand() -> None:
    share = script().repeated_share
    assert share(list(range(20)), 5) == 0.0  # nothing repeats
    loop = [1, 2, 3] * 10  # a loop of 3 from the start: every 8-gram after the first three is a repeat
    assert share(loop, 0) == (len(loop) - 7 - 3) / (len(loop) - 7)
    assert share([7] * 8 + [1, 2, 3, 4, 5, 6, 7, 8], 8) == 0.0  # the prompt's 8-gram; the continuation's are new


def test_the_shipped_models_stay_under_ten_megabytes_together() -> None:
    total = sum(f.stat().st_size for name in SHIPPED for f in locate(name).iterdir() if f.is_file())
    assert total < 10_000_000, total
    assert not any((locate(name) / "train_state.pt").exists() for name in SHIPPED)  # weights, config and log only


def test_the_poems_model_reads_characters_and_never_trained_on_jing_ye_si() -> None:
    where = locate("poems")
    chars = load_tokenizer(where)
    assert isinstance(chars, CharTokenizer)
    model = GPT.from_pretrained("poems")
    assert model.config.vocab_size == chars.vocab_size
    line = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    assert chars.tokens(line) == list(line)  # every character of the poem is in its vocabulary, one token each
    log = json.loads((where / "train_log.json").read_text(encoding="utf-8"))
    assert log["task"] == "poems" and log["eval_loss"][-1] < log["eval_loss"][0]


def test_docs_quote_the_shipped_models_run() -> None:
    runs = sorted((ROOT / "benchmarks" / "results").glob("shipped-*.json"))
    assert runs, "no result file of benchmarks/shipped_models.py in benchmarks/results/"
    text = (ROOT / "docs" / "heads.md").read_text(encoding="utf-8")
    for run in runs:
        assert script().render(json.loads(run.read_text(encoding="utf-8"))) in text, run.name
