"""The guided tour: every step checked against the book, in English and Chinese."""

from __future__ import annotations

import re

import pytest

from attnlab import cli
from attnlab.book import golden
from attnlab.explain.tour import build_tour, mismatches
from attnlab.explain.tour_text import EN, ZH


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_tour_check_passes_and_covers_the_chapter(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "tour", "--check")
    assert code == 0, out
    assert "all steps match the book" in out
    keys = [s.key for s in build_tour("en")]
    assert keys[0] == "inputs" and keys.index("softmax") < keys.index("weights_init") < keys.index(
        "causal_inf"
    ) < keys.index("mha")
    assert set(keys) == set(EN) == set(ZH)


def test_every_number_in_the_notes_appears_in_the_tour(capsys: pytest.CaptureFixture[str], seed_text: str) -> None:
    _, out = run_cli(capsys, "tour")
    printed = set(re.findall(r"-?\d+\.\d{4}\b", seed_text))
    missing = {n for n in printed if n not in out}
    assert not missing, f"numbers from the notes missing in the tour: {sorted(missing)}"


def test_chinese_tour_uses_the_notes_terms(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "tour", "--lang", "zh", "--check")
    assert code == 0
    for term in (
        "注意力分数",
        "注意力权重",
        "归一化",
        "上下文向量",
        "因果注意力",
        "多头注意力",
        "点积",
        "缩放点积注意力",
    ):
        assert term in out, term
    assert "所有步骤与书中数值一致" in out


def test_check_fails_on_a_wrong_book_value(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = list(golden.CONTEXT_VECTOR_2)
    wrong[1] += 0.001  # one printed digit off
    monkeypatch.setattr(golden, "CONTEXT_VECTOR_2", wrong)
    assert [key for key, _ in mismatches(build_tour("en"))] == ["context_2_trainable", "sa_v1"]
    code, out = run_cli(capsys, "tour", "--check")
    assert code == 1
    assert "2 mismatches" in out and "context_2_trainable" in out


def test_unknown_language_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lang must be one of \['en', 'zh'\], got 'fr'"):
        build_tour("fr")
    with pytest.raises(SystemExit):
        cli.main(["tour", "--lang", "fr"])
