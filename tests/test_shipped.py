"""The models that ship (issue 35, part 4): the Tang-poems model reads characters and never saw 静夜思; every
shipped model together stays under 10 MB; docs/heads.md quotes benchmarks/shipped_models.py's run file."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from attnlab.models import GPT, load_tokenizer
from attnlab.models.locate import SHIPPED, locate
from attnlab.models.tokenizer import CharTokenizer
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]


def script() -> ModuleType:
    return load("shipped_models")


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


def test_a_loop_is_a_block_said_three_times_back_to_back() -> None:
    loop = script().longest_loop
    said = list(b"s are the same as the same as the same as the same a")  # the shipped text model's greedy text
    assert loop(said, 0) == (len(said) - 5 - 12, 12)  # after "s are" and one " the same as", each byte repeats 12 back
    assert loop(list(b"abcabcabc"), 0) == (6, 3)  # "abc" three times: 6 bytes repeat the one 3 back
    assert loop(list(b"abcabcab"), 0) == (0, 0)  # not quite three times
    assert loop(list(b"abcabc"), 0) == (0, 0)  # said twice: not yet a loop
    assert loop(list(b"x" + b" " * 40 + b"y"), 0) == (39, 1)  # 40 spaces: each repeats the one before
    assert loop(list(b"abababab" + b"cd"), 4) == (4, 2)  # only the continuation (from 4) is measured


def test_real_documentation_repeats_little() -> None:
    """The reference the continuations are set beside: windows of the held-out docs, measured the same way, repeat
    few of their 8-grams, and their longest loop is a heading's underline (a run of one character)."""
    real = script().real_text(17, 200, 100)
    assert real["median_repeated_8grams"] < 0.1
    assert 0 < real["longest_loop"] < 64
