"""Traces, heatmaps and the self-contained HTML report, checked in a real Chromium."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import Attention, book, cli
from attnlab.explain.model_report import model_report
from attnlab.explain.render.figure_output import save
from attnlab.explain.render.heatmap import head_grid, heatmap
from attnlab.explain.report import explain_report, tokenize
from attnlab.explain.tour import build_tour, kv_cache_steps
from attnlab.models import GPT, ByteTokenizer
from attnlab.models.locate import locate
from attnlab.models.train import read_log
from attnlab.observe import Recorder

XSS = '<script>alert(1)</script> and "><img src=x onerror=alert(1)>'
SCREENSHOTS = Path(__file__).resolve().parents[1] / "out" / "screenshots"
CACHE_TEXT = "for x in range(10): print(x)"  # 28 tokens and 8 generated: 36 columns, two panels of 18 in h2o's figure


def test_trace_records_every_step_per_head_without_copying_the_model() -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=8, num_heads=2, dropout=0.5, backend="eager").train()
    with Recorder() as rec:
        out = attn(torch.randn(1, 5, 8))
    names = ["attn_scores", "scaled_scores", "masked_scores", "attn_weights", "dropped_weights", "context_vec"]
    assert rec.names() == names
    assert rec.get("attn_weights").shape == (1, 2, 5, 5) and rec.get("context_vec").shape == (1, 2, 5, 4)
    torch.testing.assert_close(rec.get("scaled_scores"), rec.get("attn_scores") * 4**-0.5)
    assert torch.isneginf(rec.get("masked_scores")[..., 0, 1:]).all()
    assert out.requires_grad  # recording detaches copies; the forward pass is untouched
    with pytest.raises(KeyError, match=r"no step named 'nope' was recorded; recorded: \['attn_scores'"):
        rec.get("nope")

    torch.manual_seed(123)
    mha = book.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    with Recorder() as rec:
        mha(book.batched_inputs())
    assert rec.names() == [
        "attn_scores",
        "scaled_scores",
        "masked_scores",
        "attn_weights",
        "dropped_weights",
        "context_vec",
    ]
    assert {s.source for s in rec.steps} == {"MultiHeadAttention"}


def test_kv_cache_step_through_rebuilds_the_causal_weights() -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=8, num_heads=2, backend="eager").eval()
    x = torch.randn(1, 6, 8)
    rows, stacked = kv_cache_steps(attn, x)
    assert [tuple(r.shape) for r in rows] == [(2, t) for t in range(1, 7)]
    with Recorder() as rec, torch.no_grad():
        attn(x)
    torch.testing.assert_close(stacked, rec.get("attn_weights")[0])
    with pytest.raises(ValueError, match=r"only the eager backend forms; got 'sdpa'"):
        kv_cache_steps(Attention(d_in=8, num_heads=2, backend="sdpa"), x)


def test_heatmaps_save_png_and_svg(tmp_path: Path) -> None:
    w = torch.softmax(torch.randn(4, 4), -1)
    png = save(heatmap(w, ["a", "$b$", "c", "d"], title="w"), tmp_path / "w.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = save(head_grid(torch.stack([w, w, w]), list("abcd")), tmp_path / "g.svg")
    assert "<svg" in svg.read_text()
    with pytest.raises(ValueError, match=r"save heatmaps as .png or .svg, got 'w.jpg'"):
        save(heatmap(w, list("abcd")), tmp_path / "w.jpg")
    with pytest.raises(ValueError, match=r"labels do not fit the matrix \(4, 4\): 3 row and 3 column labels"):
        heatmap(w, list("abc"))


def test_tokenize_words_and_punctuation() -> None:
    assert tokenize("Hi, you! 你好。") == ["Hi", ",", "you", "!", "你好", "。"]


def test_tokenize_keeps_what_a_reader_sees_as_one_character_whole() -> None:
    """A decomposed accent stays on its word; a flag, a ZWJ family and a keycap are one token each; kana with a
    combining voicing mark and conjoining Hangul jamo stay one word (issue 54: each was cut into pieces)."""
    text = "cafe\u0301 \U0001f1e8\U0001f1f3 \U0001f468\u200d\U0001f469 1\ufe0f\u20e3 \u304b\u3099\u304d \u1100\u1161\u11a8!"
    assert tokenize(text) == [
        "cafe\u0301",
        "\U0001f1e8\U0001f1f3",
        "\U0001f468\u200d\U0001f469",
        "1\ufe0f\u20e3",
        "\u304b\u3099\u304d",
        "\u1100\u1161\u11a8",
        "!",
    ]


def _assert_self_contained(html: str) -> None:
    srcs = re.findall(r'src="([^"]*)"', html)
    assert srcs and all(re.fullmatch(r"data:image/png;base64,[A-Za-z0-9+/=]+", s) for s in srcs)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)  # base64 may contain '//'
    assert not re.search(r"https?:|//[a-z0-9]|<link|<iframe|@import|url\(|ftp:|wss?:", text, flags=re.IGNORECASE)
    assert html.count("<script>") == 1 and "<script src" not in html


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, tour_pages: dict[str, Path]) -> dict[str, Path]:
    """The Chinese tour and an explain report of hostile text, written once by the command, read by several tests."""
    folder = tmp_path_factory.mktemp("reports")
    assert cli.main(["explain", XSS, "--html", str(folder / "x.html"), "--heads", "2", "--dropout", "0.2"]) == 0
    return {"tour-zh": tour_pages["zh"], "explain-xss": folder / "x.html"}


def test_reports_are_self_contained_and_escape_user_text(written: dict[str, Path]) -> None:
    tour_html = written["tour-zh"].read_text(encoding="utf-8")
    xss_html = written["explain-xss"].read_text(encoding="utf-8")
    for html in (tour_html, xss_html):
        _assert_self_contained(html)
    assert "<script>alert" not in xss_html and "<img src=x" not in xss_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in xss_html
    assert "1.8524" in tour_html and "0.3061" in tour_html  # the book's numbers beside the pictures
    assert "not trained embeddings" in xss_html
    assert report_has_sections(explain_report("a b c", causal=False)) == [
        "tokens",
        "scores",
        "scaled",
        "weights",
        "sinks",
        "context",
        "kv-cache",
    ]


def report_has_sections(report: object) -> list[str]:
    return [s.key for s in report.sections]


def test_explain_errors_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"no words or punctuation to attend over: '   '"):
        explain_report("   ")
    with pytest.raises(ValueError, match=r"d_model \(16\) must be divisible by heads \(3\)"):
        explain_report("a b", heads=3)
    assert cli.main(["explain", "a b", "--heads", "3"]) == 2
    assert "must be divisible by heads (3)" in capsys.readouterr().err
    assert cli.main(["explain", "a b", "--dropout", "1.5"]) == 2
    assert "dropout must be in [0, 1), got 1.5" in capsys.readouterr().err
    assert cli.main(["explain", "a b", "--html", "/no/such/dir/r.html"]) == 2
    assert "the folder '/no/such/dir' does not exist" in capsys.readouterr().err
    assert cli.main(["tour", "--html", "report.txt"]) == 2
    assert "'report.txt' should end in .html or .htm" in capsys.readouterr().err


def test_jupyter_shows_the_chinese_report_inline() -> None:
    page = explain_report("注意力机制", lang="zh", figures=False)._repr_html_()
    assert page.startswith("<!DOCTYPE html>") and '<html lang="zh">' in page
    assert re.search(r"<h1>[^<]*[\u4e00-\u9fff]", page)  # the title itself is Chinese


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = "Debian's chromium is not installed (make test installs it with apt-get; it needs root)"
    if os.environ.get("CI"):
        pytest.fail(message + ": CI must run the browser test")
    pytest.skip(message)


@pytest.fixture(scope="module")
def heads_en(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The shipped trained model's report (every head named, the training curves, the text escaped), written once,
    and its number of sections."""
    report = model_report(
        GPT.from_pretrained("induction"),
        ByteTokenizer(ascii=True),
        "<b>a</b> <b>a</b>",
        name="induction",
        log=read_log(locate("induction")),
        cache="sink",  # the view strikes out the keys a sink cache lets go (none: the text is shorter than it)
    )
    return report.save(tmp_path_factory.mktemp("heads") / "report.html"), len(report.sections)


@pytest.fixture(scope="module")
def cache_h2o(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped text model's report with its h2o cache, as the command writes it (issue 31's figure), once."""
    path = tmp_path_factory.mktemp("h2o") / "report.html"
    assert cli.main(["explain", "--model", "text", CACHE_TEXT, "--cache", "h2o", "--html", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def tour_en(tour_pages: dict[str, Path]) -> Path:
    """The English tour, as the command writes it, once."""
    return tour_pages["en"]


def _open(p: Any, executable: str) -> Any:
    """A 1280 x 900 page in headless Chromium, which reaches for no network of its own."""
    browser = p.chromium.launch(
        executable_path=executable,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )
    return browser.new_page(viewport={"width": 1280, "height": 900})


@pytest.mark.parametrize(
    "kind",
    [  # tour-zh and heads-en: a browser over a whole report (the zh tour's 19 s is most of its drawing)
        pytest.param("tour-zh", marks=pytest.mark.slow),
        "explain-xss",
        pytest.param("heads-en", marks=pytest.mark.slow),
    ],
)
def test_report_in_headless_chromium(kind: str, written: dict[str, Path], request: pytest.FixtureRequest) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    if kind == "tour-zh":  # one section per step of the tour, as the command wrote it, and the glossary
        page_path, expected_steps = written[kind], len(build_tour("zh")) + 1
    elif kind == "heads-en":
        page_path, expected_steps = request.getfixturevalue("heads_en")
    else:  # without figures the sections are the same, and cheap to count
        page_path = written[kind]
        expected_steps = len(explain_report(XSS, heads=2, dropout=0.2, figures=False).sections)
    problems: list[str] = []
    with sync_playwright() as p:
        page = _open(p, executable)
        browser = page.context.browser
        page.on(
            "console",
            lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None,
        )
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("dialog", lambda d: (problems.append(f"dialog opened: {d.message}"), d.dismiss()))
        page.on(
            "request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(f"request: {r.url}")
        )
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("section.step").count() == expected_steps
        images = page.locator("img.heatmap")
        assert images.count() >= 3
        widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert all(w > 100 for w in widths), widths  # every heatmap decoded
        views = page.locator(".attnview").count()  # the model report holds one interactive view: its data, its script
        assert page.locator("script").count() == 1 + 2 * views  # the report's own, and no injected one
        # a grid of heads (the tour's ends on the cache lab's single grid): full size on click, Esc closes it
        grid = page.locator("section#kv_steps img.heatmap").last if kind == "tour-zh" else images.last
        shown, natural = grid.evaluate("i => [i.getBoundingClientRect().width, i.naturalWidth]")
        grid.scroll_into_view_if_needed()
        grid.click()
        assert page.locator("#lightbox.open").is_visible()
        full = page.locator("#lightbox img").evaluate("i => i.getBoundingClientRect().width")
        room = page.locator("#lightbox").evaluate("b => b.clientWidth - 48")  # inside its 24 px padding
        assert 0.98 * shown <= full <= 1280, (shown, full)  # no smaller, and never past the window (2907 px spilled)
        assert abs(full - min(natural, room)) <= 2, (full, natural, room)  # its own size, as far as the window goes
        if kind == "tour-zh":
            page.screenshot(path=str(SCREENSHOTS.parent / "lightbox.png"))
        page.keyboard.press("Escape")
        assert not page.locator("#lightbox.open").is_visible()
        if kind == "tour-zh":  # a term's first use leads to its row of the glossary, in view
            term = page.locator('section#dot a.term[href="#term-attention_scores"]')
            assert term.inner_text() == "注意力分数"
            term.click()
            row = page.locator("tr#term-attention_scores")
            assert page.evaluate("() => location.hash") == "#term-attention_scores" and row.is_visible()
            assert "注意力得分" in row.inner_text() and "attn_scores" in row.inner_text()
            assert row.evaluate(
                "r => r.getBoundingClientRect().top > -2 && r.getBoundingClientRect().top < innerHeight"
            )
        if kind == "explain-xss":
            assert XSS in page.locator("h1").inner_text()  # shown as text
            assert page.locator("img:not(.heatmap):not(.enlarged)").count() == 0
        elif kind == "heads-en":
            assert "<b>a</b>" in page.locator("h1").inner_text()  # the user's markup shown, not obeyed
            assert page.locator("h1 b").count() == 0
            assert page.locator("section#heads img.heatmap").count() == 5  # the names and the four scores
            assert page.locator("section#training img.heatmap").count() == 1  # the loss and scores by step
            assert "Every head, named" in page.locator("section#heads h2").inner_text()
            # each layer's grid of heads spans the page and is shown at its own size, not shrunk past reading
            scale = "i => i.naturalWidth / i.getBoundingClientRect().width"
            ratios = page.locator("section.wide img.heatmap").evaluate_all(f"imgs => imgs.map({scale})")
            assert ratios and all(r <= 1.1 for r in ratios), ratios
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)  # the README's pictures of the trained model
            page.locator("section#heads").screenshot(path=str(SCREENSHOTS / "heads-names.png"))
            page.locator("section#training").screenshot(path=str(SCREENSHOTS / "heads-training.png"))
            _drive_the_view(page)
        else:
            shown = page.locator("main").inner_text()  # what the browser shows, step titles computed by the tour
            zh, en = build_tour("zh"), build_tour("en")
            assert all(step.title in shown for step in zh[:5]) and not any(step.title in shown for step in en[:5])
            page.uncheck("#toggle-numbers")
            assert not page.locator("pre.value").first.is_visible()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{kind}.png"))
        browser.close()
    assert problems == []
    assert (SCREENSHOTS / f"{kind}.png").stat().st_size > 10_000


# The smallest text a figure may show, in CSS px at a 1280 px window. At 7 px a Latin x-height is about 3.7 px,
# four pixel rows of a plain (1x) screen: about the least that keeps letters and digits apart (the page's own
# smallest text, its captions, is 12 px; the h2o strip of issue 31 showed its labels at 1.9 px). The figures draw
# nothing below heatmap.SMALLEST_PT (7.5 px in the PNG), so a figure passes only when the page shows it at 93% of
# its size or more.
TEXT_FLOOR_PX = 7.0
_FIGURE_TEXT = """imgs => imgs.map(i => {
  const s = getComputedStyle(i), box = i.getBoundingClientRect();
  const frame = ["borderLeftWidth", "borderRightWidth", "paddingLeft", "paddingRight"].map(k => parseFloat(s[k]));
  return {section: i.closest("section").id, text: i.dataset.textPx, natural: i.complete ? i.naturalWidth : 0,
          shown: box.width - frame.reduce((a, b) => a + b, 0)};  // the picture's own width on the page
})"""


@pytest.mark.parametrize(
    "kind",
    [
        "tour-zh",
        "tour-en",
        "explain-xss",
        pytest.param("heads-en", marks=pytest.mark.slow),  # slow by nature: whole model reports
        pytest.param("cache-h2o", marks=pytest.mark.slow),
    ],
)
def test_every_figure_is_legible_at_the_pages_width(kind: str, request: pytest.FixtureRequest) -> None:
    """In Chromium at a 1280 px window, every figure's smallest text is at least TEXT_FLOOR_PX: its size in the PNG
    (as matplotlib drew it, after layout, at the PNG's dpi: data-text-px) times the scale the page shows the PNG at.
    No block of numbers scrolls sideways (issue 31)."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    if kind in ("tour-zh", "explain-xss"):
        page_path = request.getfixturevalue("written")[kind]
    elif kind == "heads-en":
        page_path = request.getfixturevalue("heads_en")[0]
    else:
        page_path = request.getfixturevalue(kind.replace("-", "_"))
    with sync_playwright() as p:
        page = _open(p, executable)
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-ready='1']")
        figures = page.locator("img.heatmap").evaluate_all(_FIGURE_TEXT)
        blocks = page.locator("pre.value").evaluate_all(
            "ps => ps.map(p => [p.closest('section').id, p.scrollWidth > p.clientWidth])"
        )
        if kind == "cache-h2o":
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.locator("section#cache-h2o").screenshot(path=str(SCREENSHOTS / "cache-h2o.png"))
        page.context.browser.close()
    assert len(figures) >= 3 and len(blocks) >= 3
    unmeasured = [f for f in figures if f["natural"] <= 100 or not f["text"]]
    assert unmeasured == []  # every figure decoded, and its text measured when it was drawn
    shown = {f"{f['section']} #{n}": float(f["text"]) * f["shown"] / f["natural"] for n, f in enumerate(figures)}
    small = {name: round(px, 2) for name, px in shown.items() if px < TEXT_FLOOR_PX}
    assert small == {}, f"figure text below {TEXT_FLOOR_PX} px at a 1280 px window: {small}"
    assert [section for section, scrolls in blocks if scrolls] == []
    if kind == "cache-h2o":
        assert any(name.startswith("cache-h2o") for name in shown)


def _drive_the_view(page: object) -> None:
    """The model report's interactive view, as a user drives it: hover a token, open a head, use the keyboard."""
    from attnlab.explain.render.view import VIEW_TEXT

    view = page.locator(".attnview")  # type: ignore[attr-defined]
    assert view.count() == 1 and view.get_attribute("data-ready") == "1"
    tokens = page.locator(".attnview .col.q div")  # type: ignore[attr-defined]
    assert tokens.count() == len("<b>a</b> <b>a</b>") and tokens.nth(0).inner_text() == "<"  # markup shown as text
    tokens.nth(12).hover()
    assert view.get_attribute("data-focus") == "12" and int(view.get_attribute("data-lines")) > 0
    cells = page.locator(".attnview .cell")  # type: ignore[attr-defined]
    config = GPT.from_pretrained("induction").config
    assert cells.count() == config.n_layers * config.n_heads
    names = page.locator(".attnview .grid").inner_text()  # type: ignore[attr-defined]
    assert "induction" in names and "previous" in names  # the shipped model's named heads (docs/heads.md)
    cells.nth(config.n_heads + 1).click()  # layer 1, head 1: only that head is shown
    assert view.get_attribute("data-layer") == "1"
    boxes = page.locator(".attnview input.head")  # type: ignore[attr-defined]
    checked = [boxes.nth(h).is_checked() for h in range(config.n_heads)]
    assert checked == [h == 1 for h in range(config.n_heads)]
    view.focus()
    page.keyboard.press("ArrowUp")  # type: ignore[attr-defined]
    page.keyboard.press("ArrowLeft")  # type: ignore[attr-defined]
    assert view.get_attribute("data-focus") == "11" and view.get_attribute("data-layer") == "0"
    assert VIEW_TEXT["en"]["head_view"] in view.inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    view.screenshot(path=str(SCREENSHOTS / "heads-view.png"))


def test_the_colours_the_cache_sentences_name_are_the_colours_drawn() -> None:
    """The cache figures draw 1 (kept), 0.5 (let go) and 0 (not read yet) with the heatmaps' colour map; the
    sentences under them, in both languages and in the tour, name those colours."""
    import matplotlib

    from attnlab.explain.render.heatmap import CMAP
    from attnlab.explain.report_text import REPORT_TEXT
    from attnlab.explain.tour import en_steps, zh_steps

    colours = matplotlib.colormaps[CMAP]
    kept, gone, unseen = (colours(v)[:3] for v in (1.0, 0.5, 0.0))
    assert kept[0] > 0.8 and kept[1] > 0.8 and kept[2] < 0.3  # yellow
    assert gone[1] > gone[0] + 0.3 and gone[2] > gone[0] + 0.3 and abs(gone[1] - gone[2]) < 0.15  # teal
    assert sum(unseen) / 3 < 0.35  # dark
    for name in ("cache_sink", "cache_h2o", "cache_snapkv"):
        assert "teal; yellow = kept, dark = not read yet" in REPORT_TEXT["en"][name]
        assert "青色；黄色 = 保留，深色 = 尚未读到" in REPORT_TEXT["zh"][name]
        assert "grey" not in REPORT_TEXT["en"][name] and "灰" not in REPORT_TEXT["zh"][name]
    assert "teal = let go" in Path(en_steps.__file__).read_text(encoding="utf-8")  # the tour's steps
    assert "青色 = 丢弃" in Path(zh_steps.__file__).read_text(encoding="utf-8")


def test_a_model_reports_title_says_the_text_is_the_users_own(tmp_path: Path) -> None:
    """Markup in the text shows as typed (escaped) and the title says it is the user's text, in both languages."""
    from attnlab.explain.report_text import REPORT_TEXT

    for lang, said in (("en", "on your text, as typed: "), ("zh", "(你输入的原文) ")):
        title = REPORT_TEXT[lang]["model_title"].format(name="induction", text="<b>a</b>")
        assert title.endswith(said + "'<b>a</b>'"), title
