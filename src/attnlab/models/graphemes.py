"""What a reader sees as one character: an extended grapheme cluster (Unicode UAX #29).

A code point is not a character to a reader. 🇨🇳 is two regional indicators, 👍🏽 a hand and a skin tone,
👨‍👩‍👧 three people joined by U+200D, 1️⃣ a digit, a variation selector and a keycap; é may be e and U+0301,
が か and U+3099, 각 three conjoining jamo. ``graphemes`` cuts text into such clusters (the ``regex``
package's ``\\X``, its implementation of UAX #29's extended grapheme clusters). Every label attnlab makes from a
text's tokens goes through it (``tokenizer.character_groups``, ``CharTokenizer.tokens``, the terminal's
wrapping), so no label holds half of what a reader sees as one character.

``visible`` is for the label that is still only marks (a text that starts with U+0301, a lone U+200D): such
a cluster draws nothing alone, so it is shown on a dotted circle (how Unicode's charts show a mark alone) or,
for a joiner or a variation selector, which draw nothing even there, by its name.
"""

from __future__ import annotations

import unicodedata

import regex

_CLUSTER = regex.compile(r"\X")
DOTTED_CIRCLE = "\u25cc"  # ◌: where a combining mark shown alone sits
_DRAW_NOTHING_ALONE = ("Mn", "Me", "Cf")  # combining marks, enclosing marks, format characters (U+200D)


def graphemes(text: str) -> list[str]:
    """The text's extended grapheme clusters, in order: ``"".join(graphemes(text)) == text``."""
    return list(_CLUSTER.findall(text))


def whole_graphemes(groups: list[tuple[list[int], str]]) -> list[tuple[list[int], str]]:
    """Groups of tokens, each with its text (in order, the texts joined make the whole text), joined until each
    ends where a grapheme cluster ends: e and U+0301 one group, the two halves of a flag one group.

    A group's positions and text are kept whole, never cut: a group that ends inside a cluster takes the next."""
    ends, at = {0}, 0  # offsets in the joined text where a cluster ends (0: a token with no text stays apart)
    for cluster in graphemes("".join(text for _, text in groups)):
        at += len(cluster)
        ends.add(at)
    joined: list[tuple[list[int], str]] = []
    members: list[int] = []
    text, at = "", 0
    for positions, piece in groups:
        members, text, at = [*members, *positions], text + piece, at + len(piece)
        if at in ends:
            joined.append((members, text))
            members, text = [], ""
    assert not members, "the joined text ends where its last cluster ends"
    return joined


def _is_selector(ch: str) -> bool:
    return "VARIATION SELECTOR" in unicodedata.name(ch, "")


def visible(label: str) -> str:
    """``label`` with each cluster that draws nothing alone made visible: a combining mark on ◌ ("◌́"), a
    joiner, a variation selector or another format character by its name ("[ZERO WIDTH JOINER]")."""
    out = []
    for cluster in graphemes(label):
        if any(unicodedata.category(ch) not in _DRAW_NOTHING_ALONE for ch in cluster):
            out.append(cluster)  # it has a character that draws: its marks sit on it
            continue
        for ch in cluster:
            if unicodedata.category(ch) in ("Mn", "Me") and not _is_selector(ch):
                out.append(DOTTED_CIRCLE + ch)
            else:
                out.append(f"[{unicodedata.name(ch, f'U+{ord(ch):04X}')}]")
    return "".join(out)
