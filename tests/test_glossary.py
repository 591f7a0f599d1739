"""The glossary (issue 35, part 1): one table of terms in the notes' Chinese, the other Chinese, English and the
code's names; the tour links each term to it on first use; a term the tour introduces and the table lacks fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnlab import cli
from attnlab.explain.glossary import BY_KEY, TERMS, Term, lookup
from attnlab.explain.render.html import _linked
from attnlab.explain.tour import build_tour
from attnlab.explain.tour import zh as zh_text

ROOT = Path(__file__).resolve().parents[1]
# a word with its English in brackets, as the notes introduce a term: 点积(dot products), 分页 (Paged)
INTRODUCED = re.compile(r"[\u4e00-\u9fff]\s*[(（]([A-Za-z][A-Za-z ,\-]*)[)）]")
CITED = {"KIVI", "StreamingLLM", "i, j"}  # a paper's method, a system, an index pair: named, not terms


def covered(english: str, terms: tuple[Term, ...] = TERMS) -> bool:
    word = english.casefold()
    return any(word == name.casefold() or name.casefold() in word for t in terms for name in (t.en, *t.en_other))


def introduced() -> list[str]:
    """Every English the zh tour gives in brackets after a Chinese word, in its steps, titles and values."""
    texts = [f"{title} {body} {zh_text.VALUES.get(key, '')}" for key, (title, body) in zh_text.STEPS.items()]
    return [m.group(1) for text in texts for m in INTRODUCED.finditer(text)]


def test_every_term_the_zh_tour_introduces_is_in_the_glossary() -> None:
    found = introduced()
    assert len(found) >= 12  # the notes' way of introducing a term: self-attention, context vector, ...
    missing = [word for word in found if word not in CITED and not covered(word)]
    assert missing == []
    # and the check bites: without the normalization entry, the tour's "normalize" is reported
    fewer = tuple(t for t in TERMS if t.key != "normalization")
    assert [w for w in found if w not in CITED and not covered(w, fewer)] == ["normalize", "sum normalization"]


def test_each_terms_first_step_is_where_the_zh_tour_first_writes_it() -> None:
    steps = build_tour("zh")
    assert [s.key for s in steps] == list(zh_text.STEPS)  # the words' order is the tour's
    texts = [(s.key, f"{s.title} {s.text} {s.value}") for s in steps]
    for term in TERMS:
        first = next((key for key, text in texts if term.zh in text), None)
        assert first == term.first, term.key
        if term.first is None:
            assert term.where and term.where_zh, term.key  # used past the tour: the table says where


def test_terms_past_the_tour_are_used_where_they_say() -> None:
    from attnlab.explain.render.view import VIEW_TEXT
    from attnlab.explain.report_text import REPORT_TEXT

    shown = " ".join(REPORT_TEXT["zh"].values()) + " ".join(VIEW_TEXT["zh"].values())
    docs = " ".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    for term in (t for t in TERMS if t.first is None):
        assert term.zh in shown or term.en.split(" (")[0] in docs, term.key


def test_every_code_name_is_a_name_in_the_books_code_or_attnlabs() -> None:
    import llms_from_scratch

    book = Path(llms_from_scratch.__file__).parent
    source = " ".join(p.read_text(encoding="utf-8") for p in [*book.glob("ch0[34].py"), *book.glob("kv_cache/*.py")])
    source += " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "attnlab").rglob("*.py"))
    for term in TERMS:
        for name in term.code:
            assert name in source, (term.key, name)
    assert len({t.key for t in TERMS}) == len(TERMS) == len(BY_KEY)


def test_lookup_finds_a_term_by_either_chinese_english_or_code() -> None:
    assert [t.key for t in lookup("注意力得分")] == ["attention_scores"]  # the other rendering
    assert [t.key for t in lookup("遮蔽")] == ["mask"]
    assert [t.key for t in lookup("attn_weights")] == ["attention_weights"]
    assert [t.key for t in lookup("Attention Weights")] == ["attention_weights"]
    assert "kv_cache" in {t.key for t in lookup("缓存")}  # a part of a word: every term that holds it
    with pytest.raises(ValueError, match="give a word to look up"):
        lookup("  ")


def test_the_html_tour_links_each_term_once_to_its_row(tour_pages: dict[str, Path]) -> None:
    for lang in ("zh", "en"):
        page = tour_pages[lang].read_text(encoding="utf-8")
        links = re.findall(r'<a class="term" href="#term-(\w+)">([^<]+)</a>', page)
        rows = set(re.findall(r'<tr id="term-(\w+)">', page))
        assert rows == {t.key for t in TERMS}
        keys = [key for key, _ in links]
        assert len(keys) == len(set(keys)), lang  # first use only
        for key, text in links:  # the link's text is the term as the step writes it (English in any case)
            assert text == BY_KEY[key].zh if lang == "zh" else text.casefold() == BY_KEY[key].en.casefold(), key
        in_tour = {t.key for t in TERMS if t.first is not None}
        if lang == "zh":  # every term the tour writes in a step's text is linked there
            assert {"attention_scores", "mask", "context_vector", "kv_cache", "softmax"} <= set(keys) <= in_tour
            assert len(keys) >= 25
        else:  # whole words in any case: "Self-attention" is linked, "head" never inside "ahead"
            assert {"self_attention", "scaled_dot_product", "attention_weights", "mask", "head"} <= set(keys)
            assert ">ahead<" not in page and 'a<a class="term"' not in page
        assert ("<h2" in page) and ('id="glossary"' in page)


def test_a_linked_phrase_is_escaped_and_the_longer_one_wins() -> None:
    out = _linked("多头注意力 <b> 注意力", {"注意力": "term-a", "多头注意力": "term-b", "<b>": "term-c"})
    assert out == (
        '<a class="term" href="#term-b">多头注意力</a> <a class="term" href="#term-c">&lt;b&gt;</a> '
        '<a class="term" href="#term-a">注意力</a>'
    )


def test_the_terminal_tour_glosses_a_term_where_it_first_appears(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # one term a line, unwrapped
    assert cli.main(["tour", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert "术语: 注意力分数 = attention scores（另译：注意力得分），代码：attn_scores, omega" in out
    assert out.count("注意力分数 = attention scores") == 1


def test_attnlab_glossary_prints_looks_up_and_writes_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "terms.json"
    assert cli.main(["glossary", "--lang", "zh", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "笔记的译法" in printed and "注意力得分" in printed
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [d["key"] for d in data] == [t.key for t in TERMS] and data[0]["zh"] == "自注意力"
    assert cli.main(["glossary", "遮蔽"]) == 0
    assert "掩码" in capsys.readouterr().out
    assert cli.main(["glossary", "nothing-like-this"]) == 2
    assert "no term matches 'nothing-like-this'" in capsys.readouterr().err
    assert cli.main(["glossary", "--json", str(tmp_path / "terms.txt")]) == 2


def test_attnlabs_chinese_uses_the_notes_terms_not_the_other_translation() -> None:
    """Every Chinese sentence attnlab shows (the tour, the reports, the view, the exercises) writes the notes'
    term; the other rendering appears only in the glossary, which maps it. An other rendering that is a part of
    the notes' term, or holds it (查询 in 查询向量), is the same word and not checked."""
    from attnlab.exercises.text import HINTS, TASKS
    from attnlab.explain.render.view import VIEW_TEXT
    from attnlab.explain.report_text import REPORT_TEXT

    both = {"上溢": "the tour names overflow's direction, 上溢 beside 下溢, as it explains exp(x) growing to inf"}
    shown = [*(f"{t} {b}" for t, b in zh_text.STEPS.values()), *zh_text.VALUES.values(), *zh_text.CHECKS.values()]
    shown += [*zh_text.WORDS.values(), *REPORT_TEXT["zh"].values(), *VIEW_TEXT["zh"].values(), *HINTS["zh"].values()]
    shown += [f"{t} {b}" for t, b in TASKS["zh"].values()]
    checked = 0
    for term in TERMS:
        for other in term.zh_other:
            if other in term.zh or term.zh in other or other in both:
                continue
            checked += 1
            assert not [s for s in shown if other in s], (term.key, other)
    assert checked >= 15


def test_the_table_lists_what_came_after_the_chapter_in_the_tours_order_after_the_chapters_terms() -> None:
    order = {key: i for i, key in enumerate(zh_text.STEPS)}
    steps = [order[t.first] if t.first is not None else None for t in TERMS]
    chapter = [i for i, step in enumerate(steps) if step is not None and step <= order["summary"]]
    after = [i for i, step in enumerate(steps) if step is not None and step > order["summary"]]
    assert len(after) >= 14 and max(chapter) < min(after)  # the chapter's terms, then those of the variants
    assert [steps[i] for i in after] == sorted(steps[i] for i in after)  # type: ignore[type-var]
    past = [i for i, step in enumerate(steps) if step is None]
    assert past == list(range(len(TERMS) - len(past), len(TERMS)))  # the terms past the tour come last
