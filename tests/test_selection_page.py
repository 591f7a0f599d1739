"""The selection panel in headless Chromium (issue 59 item 6): a DSA model's view marks each query's chosen keys,
the ones its recorded indices name, shows the dense and used weights and the mass kept as Python computed them, in
English and Chinese; choosing another query or layer redraws the marks. A V4-like compressed-sparse layer's panel
marks its window's tokens and its chosen entries apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import test_compressed as v4
from attnlab.explain.render.selection_panel import panel_layer, selection_fragment
from attnlab.explain.selection import LayerChoice
from attnlab.explain.selection_report import selection_panel
from attnlab.models.tokenizer import ByteTokenizer
from attnlab.nn.selection_record import spread
from attnlab.observe import Recorder
from test_selection_view import TEXT, choices_of, dsa_gpt

pytestmark = pytest.mark.slow  # a browser: the second stage


def _open(path: Path, run: object) -> list[str]:
    """Open ``path`` in headless Chromium, call run(page) once the panel is drawn; the page's errors."""
    from playwright.sync_api import sync_playwright

    from test_report import _chromium

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector(".selview[data-ready='1']", timeout=10_000)
        run(page)  # type: ignore[operator]
        browser.close()
    return problems


def _cols(page: object, kind: str) -> list[int]:
    rows = page.locator(f".selview tr.{kind}")  # type: ignore[attr-defined]
    return [int(rows.nth(n).get_attribute("data-col")) for n in range(rows.count())]


def test_the_view_marks_each_querys_chosen_keys(tmp_path: Path) -> None:
    from attnlab.explain.model_view import attention_view

    model = dsa_gpt(3)
    choices = choices_of(model)
    for lang, said in (("en", "the selection kept"), ("zh", "选择保留了")):
        path = attention_view(model, ByteTokenizer(), TEXT, lang=lang).save(tmp_path / f"{lang}.html")

        def run(page: object) -> None:
            last = choices[0].selected[-1].nonzero()[:, 0].tolist()  # the last query's recorded choice, layer 0
            assert _cols(page, "chosen") == last and len(last) == 3
            status = page.locator(".selview .status").text_content() or ""  # type: ignore[attr-defined]
            assert said in status and f"{float(choices[0].kept()[:, -1].mean()):.3f}" in status
            page.select_option(".selview select.sel-query", "1")  # type: ignore[attr-defined]
            assert _cols(page, "chosen") == [0, 1]  # query 1 sees two keys: both chosen
            page.select_option(".selview select.sel-query", "11")  # type: ignore[attr-defined]
            page.select_option(".selview select.sel-layer", "1")  # type: ignore[attr-defined]
            assert _cols(page, "chosen") == choices[1].selected[11].nonzero()[:, 0].tolist()
            used = page.locator(".selview tr.chosen td.used").first.text_content()  # type: ignore[attr-defined]
            col = int(choices[1].selected[11].nonzero()[0, 0])
            assert used == f"{float(choices[1].sparse[:, 11, col].mean()):.3f}"
            page.select_option(".attnview select.layer", "0")  # type: ignore[attr-defined]
            page.hover(".attnview .col.q div[data-i='6']")  # type: ignore[attr-defined]
            assert _cols(page, "chosen") == choices[0].selected[6].nonzero()[:, 0].tolist()  # the head view's focus

        assert _open(path, run) == []


@torch.no_grad()
def test_a_compressed_layers_panel_marks_its_window_and_its_entries(tmp_path: Path) -> None:
    """A V4 compressed-sparse layer (top 2 entries of 4 tokens, window 5) on 21 tokens: query 20 reads tokens
    16..20 (marked w) and its 2 chosen entries (marked ✓, after the tokens)."""
    m, x = v4.layer(2, seed=2), v4.inputs(t=21)
    with Recorder() as rec:
        m(x)
    t, dense = 21, rec.get("dense_weights")[0]  # (H, T, T + n)
    c = dense.shape[-1]
    read_slots = rec.get("read_slots")
    read = torch.zeros(t, c + 1, dtype=torch.bool).scatter_(1, torch.where(read_slots[0] >= 0, read_slots[0], c), 1)
    chosen = rec.get("selected_keys")[0]
    selected = torch.zeros(t, c + 1, dtype=torch.bool).scatter_(1, torch.where(chosen >= 0, chosen + t, c), True)
    labels = [f"t{i}" for i in range(t)] + [f"e{w}" for w in range(c - t)]
    sparse = spread(rec.get("attn_weights"), read_slots, c)[0]
    choice = LayerChoice(1, "compressed-sparse", labels, dense, sparse, read[:, :c], selected[:, :c])
    page_html = selection_panel([choice], lang="en", query=-1)
    path = tmp_path / "v4.html"
    path.write_text(f"<!DOCTYPE html><html><body>{page_html}</body></html>", encoding="utf-8")

    def run(page: object) -> None:
        assert _cols(page, "window") == [16, 17, 18, 19, 20]
        entries = (chosen[20][chosen[20] >= 0] + t).sort().values.tolist()
        assert _cols(page, "chosen") == entries and len(entries) == 2

    assert _open(path, run) == []
    with pytest.raises(ValueError, match="lang must be one of"):
        selection_fragment([panel_layer(layer=0, kind="", columns=[], dense=dense[0, :0], used=dense[0, :0],
                                        read=read[:0], selected=read[:0], visible=read[:0], kept=dense[0, 0, :0])],
                           lang="fr", query=0)  # fmt: skip
