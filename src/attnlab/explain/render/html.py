"""A self-contained HTML report: text, code, numbers and heatmaps side by side.

Everything is inline: the CSS, one small script, and the heatmaps as
base64 PNG data. The file makes no request to any network address and holds
no external URL, so it opens offline, from an email attachment, anywhere.
Every piece of text is HTML-escaped: a sentence like
``<script>alert(1)</script>`` shows as text and runs nothing.

>>> r = Report(title="t <b>", intro="", lang="en", sections=[Section(key="s", title="<i>", text="x")])
>>> "&lt;i&gt;" in r.to_html() and "<i>" not in r.to_html()
True
"""

from __future__ import annotations

import base64
import html
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.explain.checks import Check
from attnlab.models.graphemes import graphemes

_CSS = """
:root { --ink: #1d1d1f; --muted: #5f6368; --line: #dadce0; --ok: #137333; --bad: #a50e0e; --bg: #fafafa; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "Noto Sans", "PingFang SC", sans-serif;
       color: var(--ink); background: var(--bg); }
header { padding: 24px 32px 8px; }
header h1 { margin: 0 0 6px; font-size: 24px; }
header p { margin: 0; color: var(--muted); max-width: 70em; }
nav { padding: 8px 32px 16px; display: flex; flex-wrap: wrap; gap: 6px; }
nav a { font-size: 12px; padding: 2px 8px; border: 1px solid var(--line); border-radius: 10px;
        color: var(--ink); text-decoration: none; background: white; }
nav a.active { background: #e8f0fe; border-color: #1a73e8; }
main { padding: 0 32px 48px; }
section.step { background: white; border: 1px solid var(--line); border-radius: 8px; margin: 14px 0;
               padding: 14px 18px; display: grid; grid-template-columns: minmax(280px, 1fr) minmax(280px, 1fr);
               gap: 18px; }
section.step h2 { margin: 0 0 6px; font-size: 17px; grid-column: 1 / -1; }
section.step .n { color: var(--muted); font-weight: normal; margin-right: 6px; }
pre { background: #f1f3f4; padding: 8px 10px; border-radius: 6px; overflow-x: auto; font-size: 12.5px; margin: 6px 0; }
/* Numbers wrap, never scroll (issue 31). torch prints 80 columns, which at 11.5 px (6.9 px a column) fit half a
   section (560 px) at a 1280 px window; a block with longer lines takes the section's width (wide-text), and only
   what is longer still, a long list, wraps. */
pre.value { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 11.5px; }
pre.code { background: #202124; color: #e8eaed; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; background: white;
             cursor: zoom-in; }
#lightbox { position: fixed; inset: 0; background: rgba(0, 0, 0, .78); display: none; overflow: auto;
            z-index: 10; cursor: zoom-out; padding: 24px; }
#lightbox.open { display: block; }
#lightbox img { display: block; margin: 0 auto; background: white; max-width: 100%; border-radius: 4px; }
figcaption { font-size: 12px; color: var(--muted); }
ul.checks { list-style: none; padding: 0; margin: 6px 0 0; font-size: 13px; }
ul.checks li.ok::before { content: "\\2713  "; color: var(--ok); font-weight: bold; }
ul.checks li.bad::before { content: "\\2717  "; color: var(--bad); font-weight: bold; }
ul.checks .detail { color: var(--muted); font-size: 12px; }
.toolbar { padding: 0 32px; font-size: 13px; color: var(--muted); }
body.hide-numbers pre.value { display: none; }
section.step.text-only { grid-template-columns: 1fr; }
section.step .view { grid-column: 1 / -1; min-width: 0; }
section.step.wide .figures { grid-column: 1 / -1; display: flex; flex-wrap: wrap; gap: 12px 18px;
                             align-items: flex-start; }
section.step.wide-text .explain { grid-column: 1 / -1; min-width: 0; }
section.step.wide-text .explain > p { max-width: 60em; }
a.term { color: inherit; text-decoration: underline dotted; text-underline-offset: 3px; }
table.glossary { border-collapse: collapse; font-size: 14px; margin-top: 8px; }
table.glossary th, table.glossary td { border-bottom: 1px solid var(--line); padding: 4px 10px 4px 0; text-align: left;
                                       vertical-align: top; }
table.glossary tr:target { background: #fff7d6; }
@media (max-width: 800px) { section.step { grid-template-columns: 1fr; } }
"""

# Highlights the step in view in the navigation; toggles the number blocks.
_SCRIPT = """
(function () {
  var links = Array.prototype.slice.call(document.querySelectorAll("nav a"));
  var steps = Array.prototype.slice.call(document.querySelectorAll("section.step"));
  function mark() {
    var current = steps.length ? steps[0].id : "";
    steps.forEach(function (s) { if (s.getBoundingClientRect().top < 120) { current = s.id; } });
    links.forEach(function (a) { a.classList.toggle("active", a.getAttribute("href") === "#" + current); });
  }
  document.addEventListener("scroll", mark, { passive: true });
  var box = document.getElementById("toggle-numbers");
  if (box) { box.addEventListener("change", function () { document.body.classList.toggle("hide-numbers", !box.checked); }); }
  mark();
  // Any heatmap opens at its full size on click; a click or Esc closes it.
  var light = document.getElementById("lightbox"), big = light.querySelector("img");
  document.querySelectorAll("img.heatmap").forEach(function (img) {
    img.addEventListener("click", function () { big.src = img.src; big.alt = img.alt; light.classList.add("open"); });
  });
  function close() { light.classList.remove("open"); big.removeAttribute("src"); }
  light.addEventListener("click", close);
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") { close(); } });
  document.body.setAttribute("data-ready", "1");
})();
"""


# C0 controls other than tab, newline and carriage return are not allowed in HTML (a NUL from a user's text
# would reach the page raw): each becomes U+FFFD, as a browser shows an unreadable character.
_NOT_IN_HTML = {c: "\ufffd" for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]}


# At a 1280 px window a section's content is 1178 px wide (1280 - 2 x 32 main padding - 2 x 18 section padding
# - 2 border), and each of its two columns 580 px (an 18 px gap): a wider figure takes the whole width.
HALF_PX = 580
VALUE_COLUMNS = 80  # the characters of a value line that fit half a section (pre.value in _CSS)


def text_width(line: str) -> int:
    """A line's width in characters of a monospace font, a character as a reader sees it (e and U+0301 one): a
    wide (CJK) character takes two."""
    return sum(2 if any(unicodedata.east_asian_width(c) in "WF" for c in g) else 1 for g in graphemes(line))


@dataclass
class Figure:
    """A heatmap as PNG bytes, with alternative text and a caption; ``text_px``: its smallest text in PNG pixels
    (``render.figure_output.page_figure`` measures it), written on the page for its browser test."""

    png: bytes
    alt: str
    caption: str = ""
    text_px: float | None = None

    @property
    def width_px(self) -> int:
        """The PNG's width, from its header (bytes 16-20 of the IHDR chunk)."""
        return int.from_bytes(self.png[16:20], "big")


@dataclass
class Section:
    key: str
    title: str
    text: str = ""
    code: str | None = None
    value: str | None = None
    figures: list[Figure] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    view: str | None = None  # an interactive fragment made here (render.view.AttentionView), the section's width
    wide: bool = False  # its figures take the section's whole width, below the text (as any wider than half does)
    links: dict[str, str] = field(default_factory=dict)  # a phrase of the text -> the id its first use links to
    table: tuple[tuple[str, ...], list[tuple[str, list[str]]]] | None = None  # headings; (row id, cells) rows


def _linked(text: str, links: dict[str, str]) -> str:
    """``text`` escaped, the first use of each phrase in ``links`` a link to its id (a longer phrase first where
    two overlap: 多头注意力 before 注意力)."""
    e = html.escape
    spans: list[tuple[int, int, str]] = []
    for phrase in sorted(links, key=len, reverse=True):
        at = text.find(phrase)
        while at >= 0 and any(a < at + len(phrase) and at < b for a, b, _ in spans):
            at = text.find(phrase, at + 1)
        if at >= 0:
            spans.append((at, at + len(phrase), links[phrase]))
    out, last = [], 0
    for a, b, target in sorted(spans):
        out.append(e(text[last:a]) + f'<a class="term" href="#{e(target)}">{e(text[a:b])}</a>')
        last = b
    return "".join(out) + e(text[last:])


@dataclass
class Report:
    """An ordered list of sections; ``to_html()`` renders the whole page."""

    title: str
    intro: str
    lang: str
    sections: list[Section]
    labels: dict[str, str] = field(default_factory=dict)

    def to_html(self) -> str:
        e = html.escape
        lab = {
            "contents": "Steps",
            "numbers": "show numbers",
            "enlarge": "click a heatmap to see it full size",
            **self.labels,
        }
        nav = "".join(f'<a href="#{e(s.key)}">{n}. {e(s.title)}</a>' for n, s in enumerate(self.sections, 1))
        body = "\n".join(self._section(n, s) for n, s in enumerate(self.sections, 1))
        return (
            "<!DOCTYPE html>\n"
            f'<html lang="{e(self.lang)}"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(self.title)}</title><style>{_CSS}</style></head>\n"
            f"<body><header><h1>{e(self.title)}</h1><p>{e(self.intro)}</p></header>\n"
            f'<nav aria-label="{e(lab["contents"])}">{nav}</nav>\n'
            f'<div class="toolbar"><label><input type="checkbox" id="toggle-numbers" checked> {e(lab["numbers"])}</label>'
            f" · {e(lab['enlarge'])}</div>\n"
            f'<main>{body}</main>\n<div id="lightbox" role="dialog"><img class="enlarged" alt=""></div>\n'
            f"<script>{_SCRIPT}</script></body></html>\n"
        ).translate(_NOT_IN_HTML)

    @staticmethod
    def _section(n: int, s: Section) -> str:
        e = html.escape
        left = f"<p>{_linked(s.text, s.links)}</p>" if s.text else ""
        if s.table:
            head, body = s.table
            cells = lambda row, tag: "".join(f"<{tag}>{e(c)}</{tag}>" for c in row)
            trs = "".join(f'<tr id="{e(rid)}">{cells(row, "td")}</tr>' for rid, row in body)
            left += f'<table class="glossary"><thead><tr>{cells(head, "th")}</tr></thead><tbody>{trs}</tbody></table>'
        if s.code:
            left += f'<pre class="code">{e(s.code)}</pre>'
        if s.value:
            left += f'<pre class="value">{e(s.value)}</pre>'
        if s.checks:
            items = "".join(
                f'<li class="{"ok" if c.ok else "bad"}">{e(c.label)} <span class="detail">{e(c.detail)}</span></li>'
                for c in s.checks
            )
            left += f'<ul class="checks">{items}</ul>'
        right = "".join(
            f'<figure><img class="heatmap" alt="{e(f.alt)}"'
            + ("" if f.text_px is None else f' data-text-px="{f.text_px:.2f}"')
            + f' src="data:image/png;base64,{base64.b64encode(f.png).decode("ascii")}">'
            f"<figcaption>{e(f.caption)}</figcaption></figure>"
            for f in s.figures
        )
        long_value = max(map(text_width, (s.value or "").splitlines()), default=0) > VALUE_COLUMNS
        wide = s.wide or long_value or any(f.width_px > HALF_PX for f in s.figures)  # half a section would shrink it
        kind = ("step wide" if wide else "step") if s.figures else "step text-only"
        kind += " wide-text" if long_value else ""
        return (
            f'<section class="{kind}" id="{e(s.key)}"><h2><span class="n">{n}.</span>{e(s.title)}</h2>'
            f'<div class="explain">{left}</div>'
            + (f'<div class="figures">{right}</div>' if right else "")
            + (f'<div class="view">{s.view}</div>' if s.view else "")  # its text escaped where it was made
            + "</section>"
        )

    def _repr_html_(self) -> str:
        """Jupyter shows the report inline."""
        return self.to_html()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_html(), encoding="utf-8")
        return path
