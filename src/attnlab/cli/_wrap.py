"""Wrap prose for the terminal, Chinese included: break between Chinese characters, never inside a word.

rich wraps at spaces, so a Chinese sentence with one English word in it broke
at that word's space and left half a line empty. Here each Chinese character
is a place to break, Latin words stay whole (a word wider than the line is
folded), and a line never starts with closing punctuation (，。：；！？）”).
Widths are terminal cells: a Chinese character takes two. A character is what a
reader sees as one (a grapheme cluster): か and U+3099, e and U+0301 are never
split between lines.
"""

from __future__ import annotations

import re

from rich.cells import cell_len

from attnlab.models.graphemes import graphemes

_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef\u201c\u201d]")
_NO_LINE_START = set("，。、：；！？）》」』”,.;:!?)")


def wrap(text: str, width: int) -> list[str]:
    """The text's lines, each at most ``width`` cells (paragraphs kept); nothing is cut."""
    if width < 8:
        raise ValueError(f"width must be at least 8 cells, got {width}")
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines.extend(_wrap_paragraph(paragraph, width))
    return lines


def _wrap_paragraph(paragraph: str, width: int) -> list[str]:
    lines: list[str] = []
    line: list[str] = []  # the tokens of the line being filled; a space is the token " "

    def used() -> int:
        return cell_len("".join(line))

    for token in _tokens(paragraph):
        if token.isspace():
            if line and line[-1] != " ":
                line.append(" ")
            continue
        if used() + cell_len(token) <= width:
            line.append(token)
            continue
        carried: list[str] = []
        if token in _NO_LINE_START and len(line) > 1 and line[-1] != " ":
            carried = [line.pop()]  # take the last word along, so punctuation never leads a line
        if "".join(line).strip():
            lines.append("".join(line).rstrip())
        line = carried
        while used() + cell_len(token) > width:  # a word wider than the line: fold it
            cut = _fit(token, width - used())
            lines.append("".join(line) + token[:cut])
            line, token = [], token[cut:]
        line.append(token)
    lines.append("".join(line).rstrip())
    return lines


def _tokens(paragraph: str) -> list[str]:
    """The places a line may break around: each Chinese character, each word whole, each run of spaces; a
    character with its marks (か and U+3099) is one."""
    tokens: list[str] = []
    kinds: list[str] = []
    for cluster in graphemes(paragraph):
        kind = "space" if cluster.isspace() else "cjk" if _CJK.match(cluster) else "word"
        if kinds and kind != "cjk" and kinds[-1] == kind:
            tokens[-1] += cluster
        else:
            tokens.append(cluster)
            kinds.append(kind)
    return tokens


def _fit(token: str, width: int) -> int:
    """How much of ``token`` (in code points, whole characters) fits ``width`` cells: at least one character."""
    clusters = graphemes(token)
    n = 0
    for cluster in clusters:
        if cell_len(token[: n + len(cluster)]) > width:
            break
        n += len(cluster)
    return max(n, len(clusters[0]))
