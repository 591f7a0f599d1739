"""explain's sink marks (explain/sink_marks.py, the view's data and cells): each head's first-token share, from
explain.sinks' one definition, marked a sink head above THRESHOLDS["attnlab"]; a learned sink's share apart.

Constructions with known answers: a head wired to token 0 (share 1.00, marked), a head spread evenly over the T
keys of each row (1/T, not marked), a causal head spread evenly (by hand, not marked), and a real GPT whose first
head is wired to token 0 and whose second head reads nothing (equal scores: the causal even head)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.explain.render.view import AttentionView
from attnlab.explain.report import explain_report
from attnlab.explain.sink_marks import SINK_THRESHOLD, is_sink_head, sink_marks, sink_section
from attnlab.explain.sinks import THRESHOLDS
from attnlab.models import GPT, ByteTokenizer, GPTConfig

T = 6
BY_HAND = (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5 + 1 / 6) / 5  # causal and even: rows 1..5 give 1/2, ..., 1/6 to token 0


def _heads() -> torch.Tensor:
    """(1, 3, T, T): head 0 wired to token 0, head 1 even over all T keys (1/T), head 2 causal and even."""
    on_first = torch.zeros(T, T)
    on_first[:, 0] = 1.0
    causal = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # row i: 1/(i+1) on keys 0..i
    return torch.stack([on_first, torch.full((T, T), 1 / T), causal])[None]


def _data(fragment: str) -> dict[str, object]:
    return json.loads(fragment.split('class="attnview-data">')[1].split("</script>")[0])


def test_the_marks_read_each_heads_share_and_mark_only_the_head_on_token_0() -> None:
    assert SINK_THRESHOLD == THRESHOLDS["attnlab"] and SINK_THRESHOLD.score == "first_token_share"
    marks = sink_marks(_heads())
    assert marks.first_token[0] == pytest.approx([1.0, 1 / 6, BY_HAND])
    assert [marks.is_sink(0, h) for h in range(3)] == [True, False, False]
    assert is_sink_head(0.41) and not is_sink_head(0.40) and not is_sink_head(0.39)  # strictly above, as sink_rate


def test_the_sentence_report_and_its_text_carry_the_share_and_the_mark() -> None:
    section = sink_section(_heads(), "en", causal=True)
    lines = (section.value or "").splitlines()
    assert lines == [
        "layer 0 head 0: first-token share 1.00  ← sink head",
        "layer 0 head 1: first-token share 0.17",
        "layer 0 head 2: first-token share 0.29",
    ]
    assert "above 0.40" in section.text and f"give {BY_HAND:.2f} on these 6 tokens" in section.text
    zh = sink_section(_heads(), "zh").value or ""
    assert zh.splitlines()[0] == "第 0 层 头 0：首个 Token 份额 1.00  ← 汇聚头" and zh.count("汇聚头") == 1
    short = sink_section(torch.ones(1, 2, 1, 1), "en")  # one token: no share to read, and it says why
    assert short.value is None and "at least 2 tokens" in short.text


def test_the_sentence_report_has_the_section_after_its_weights(capsys: pytest.CaptureFixture[str]) -> None:
    report = explain_report("the cat sat on the mat", heads=2, figures=False)
    keys = [s.key for s in report.sections]
    assert keys.index("sinks") == keys.index("weights") + 1
    lines = (report.sections[keys.index("sinks")].value or "").splitlines()
    assert [line.split(":")[0] for line in lines] == ["layer 0 head 0", "layer 0 head 1"]  # one line per head
    assert all(line in report.to_html() for line in lines)  # the HTML report carries them
    assert cli.main(["explain", "the cat sat on the mat"]) == 0  # and so does the terminal
    out = capsys.readouterr().out
    assert "Sink heads" in out and all(line in out for line in lines)


def test_the_view_carries_each_heads_share_and_marks_the_sink_head() -> None:
    fragment = AttentionView(tokens=list("abcdef"), weights=_heads()).to_fragment()
    data = _data(fragment)
    assert data["first_token"] == [pytest.approx([1.0, 1 / 6, BY_HAND])]
    assert data["sink_heads"] == [[1, 0, 0]] and data["learned_share"] is None
    cells = fragment.split('<div class="cell')[1:]
    assert cells[0].startswith(' sinkhead"') and "first token 1.00" in cells[0] and "sink head" in cells[0]
    assert all(c.startswith('"') and "sink head" not in c for c in cells[1:])
    assert "first token 0.17" in cells[1] and "first token 0.29" in cells[2]
    zh = AttentionView(tokens=list("abcdef"), weights=_heads(), lang="zh").to_fragment()
    assert "首个 Token 1.00" in zh and zh.count('<span class="name mark">汇聚头</span>') == 1
    one = _data(AttentionView(tokens=["a"], weights=torch.ones(1, 1, 1, 1)).to_fragment())
    assert one["first_token"] is None and one["sink_heads"] is None  # one token: no share, no mark


def _wired_gpt() -> GPT:
    """One layer, two heads of 4: head 0's query is a constant (norm1 gives channel 1 the bias 1 and weight 0)
    and its key reads channel 0, which only token 0 carries (position 0's embedding, 50 there): every query
    matches token 0 far above the rest. Head 1's query is zero: equal scores, the causal even head."""
    config = GPTConfig(vocab_size=256, context_length=16, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(config).eval()
    with torch.no_grad():
        model.tok_emb.weight[:, :2] = 0.0  # channels 0 and 1: no token carries them
        model.pos_emb.weight[:, :2] = 0.0
        model.pos_emb.weight[0, 0] = 50.0  # position 0 alone carries channel 0
        block = model.trf_blocks[0]
        block.norm1.weight[1], block.norm1.bias[1] = 0.0, 1.0  # channel 1 after the norm: 1 for every token
        qkv = block.att.qkv.weight  # (3 * 8, 8): queries, keys, values, each 2 heads of 4
        qkv[:8] = 0.0  # both heads' queries zero ...
        qkv[0, 1] = 30.0  # ... but head 0's first query dimension: 30 x channel 1, the same for every token
        qkv[8:12] = 0.0
        qkv[8, 0] = 30.0  # head 0's first key dimension: 30 x channel 0, large on token 0 alone
    return model


def test_a_model_report_marks_the_head_wired_to_token_0_and_not_the_even_one() -> None:
    from attnlab.explain.model_report import model_report

    model, tokenizer, text = _wired_gpt(), ByteTokenizer(), "abcdef"
    weights = model.attention_weights(torch.tensor([tokenizer.encode(text)]))[0, 0]  # (H, T, T)
    assert float(weights[0, 1:, 0].min()) > 0.999  # the construction: head 0 on token 0 in every row
    report = model_report(model, tokenizer, text, name="wired", figures=False)
    section = next(s for s in report.sections if s.key == "sinks")
    assert (section.value or "").splitlines() == [
        "layer 0 head 0: first-token share 1.00  ← sink head",
        f"layer 0 head 1: first-token share {BY_HAND:.2f}",
    ]
    page = report.to_html()  # the HTML report carries the section, its lines escaped as written
    assert "layer 0 head 0: first-token share 1.00  ← sink head" in page and page.count("← sink head") == 1


def test_the_models_view_carries_the_wired_heads_mark() -> None:
    from attnlab.explain.model_view import attention_view

    fragment = attention_view(_wired_gpt(), ByteTokenizer(), "abcdef").to_fragment()
    data = _data(fragment)
    assert data["first_token"][0] == pytest.approx([1.0, BY_HAND], abs=1e-4)
    assert data["sink_heads"] == [[1, 0]]


def test_a_learned_sink_is_marked_apart_from_the_first_token_share() -> None:
    """gpt-oss's learned sinks, their logits set to 5: the report's learned share is learned_sink_share of the
    recorded sink_weight (another route: the Recorder), and the first-token share is what the keys kept."""
    from attnlab.explain.model_report import model_report
    from attnlab.explain.sinks import learned_sink_share
    from attnlab.observe import Recorder

    config = GPTConfig(vocab_size=256, context_length=16, emb_dim=8, n_heads=2, n_layers=1, sinks=True, rope=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(config).eval()
    with torch.no_grad():
        model.trf_blocks[0].att.sinks.fill_(5.0)  # type: ignore[union-attr]
    tokenizer, text = ByteTokenizer(), "abcdef"
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad(), Recorder(names=["sink_weight"]) as rec:
        model(ids)
    (recorded,) = rec.all("sink_weight").values()
    expected = learned_sink_share(recorded).tolist()  # (H,)
    assert min(expected) > 0.5
    section = next(
        s for s in model_report(model, tokenizer, text, name="oss", figures=False).sections if s.key == "sinks"
    )
    lines = (section.value or "").splitlines()
    for head, line in enumerate(lines):
        assert line.endswith(f"learned sink's share {expected[head]:.2f}") and "sink head" not in line
    assert "named apart" in section.text
    data = _data(AttentionView(tokens=list(text), weights=model.attention_weights(ids)[:, 0], sinks=True).to_fragment())
    assert data["learned_share"][0] == pytest.approx(expected, abs=1e-5)
    assert max(data["first_token"][0]) < 0.5 and data["sink_heads"] == [[0, 0]]


@pytest.mark.slow  # a browser: the second stage
def test_the_mark_shows_in_headless_chromium(tmp_path: Path) -> None:
    """The wired model's view in a browser: the head on token 0 alone is outlined in red and says so under its
    pattern, in both languages; the even head shows its share and no mark."""
    from playwright.sync_api import sync_playwright

    from attnlab.explain.model_view import attention_view
    from test_report import _chromium

    executable = _chromium()
    model = _wired_gpt()
    for lang, said in (("en", "sink head"), ("zh", "汇聚头")):
        path = attention_view(model, ByteTokenizer(), "abcdef", lang=lang).save(tmp_path / f"{lang}.html")
        problems: list[str] = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_selector(".attnview[data-ready='1']", timeout=10_000)
            marked = page.locator(".cell.sinkhead")
            assert marked.count() == 1 and marked.get_attribute("data-head") == "0"
            mark = marked.locator(".mark", has_text=said)
            assert mark.is_visible()
            colour = mark.evaluate("m => getComputedStyle(m).color")
            border = marked.locator("canvas").evaluate("c => getComputedStyle(c).borderTopColor")
            assert colour == border == "rgb(197, 34, 31)"  # #c5221f
            even = page.locator(".cell[data-head='1']")
            assert said not in (even.text_content() or "") and f"{BY_HAND:.2f}" in (even.text_content() or "")
            browser.close()
        assert problems == []
