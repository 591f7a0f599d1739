"""Tokenizers, offline: GPT-2's byte-level BPE read from a checkpoint directory, and 256 bytes.

Read from disk (a hub name's folder is fetched by ``attnlab.models.hub``). ``Tokenizer.from_dir`` reads ``tokenizer.json`` or
``vocab.json`` + ``merges.txt`` (the two ways Hugging Face saves GPT-2's);
``ByteTokenizer`` maps text to its UTF-8 bytes, for attnlab's own small
models. Both decode a stream of ids piece by piece without splitting a
character (``Decoder``).

Characters, not bytes: a Chinese character is 3 UTF-8 bytes, an emoji 4, so a
byte-level tokenizer gives it 3 or 4 tokens, and BPE may give it 2. ``character_groups``
gathers the tokens of each character as a reader sees it (by decoding: any
tokenizer, any ids, generated ones too; then whole grapheme clusters,
``models.graphemes``: a flag, e and U+0301, a family joined by U+200D are one
character each); ``tokens`` labels a token that is a part of a character by the
character and its place, "字 1/3", "字 2/3", "字 3/3", never by a byte; a view can
merge each group into one label (``attnlab.explain``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from attnlab.models.graphemes import graphemes, visible, whole_graphemes
from attnlab.models.locate import locate


class TextTokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def tokens(self, text: str) -> list[str]: ...


def character_groups(tokenizer: TextTokenizer, ids: list[int]) -> list[tuple[list[int], str]]:
    """The positions of ``ids`` gathered into whole characters as a reader sees them (extended grapheme
    clusters), each group with its text: a token that is whole characters alone is a group of one; tokens that
    make them only together (the bytes of one character, e and U+0301, the halves of a flag, or a BPE token
    holding the end of one character and the start of the next) form one group. A token that does not combine
    with the run before it (a stray byte, a character left unfinished) ends that run, which stays a group as it
    decodes (with U+FFFD), and never swallows the text after it."""
    return whole_graphemes(_code_point_groups(tokenizer, ids))


def _code_point_groups(tokenizer: TextTokenizer, ids: list[int]) -> list[tuple[list[int], str]]:
    """The positions of ``ids`` gathered by decoding into runs that make whole code points (or a stray byte's
    U+FFFD)."""
    groups: list[tuple[list[int], str]] = []
    run: list[int] = []
    for n, token in enumerate(ids):
        piece = tokenizer.decode([token])
        if run:
            before = tokenizer.decode([ids[m] for m in run])
            text = tokenizer.decode([ids[m] for m in [*run, n]])
            if text.count("\ufffd") < before.count("\ufffd") + piece.count("\ufffd"):  # they combine
                run.append(n)
                if "\ufffd" not in text:  # the run makes whole characters now
                    groups.append((run, text))
                    run = []
                continue
            groups.append((run, before))  # the run ends unfinished: a group as it decodes
            run = []
        if "\ufffd" in piece:
            run = [n]
        else:
            groups.append(([n], piece))
    if run:
        groups.append((run, tokenizer.decode([ids[m] for m in run])))
    return groups


def part_labels(groups: list[tuple[list[int], str]], *, unknown: Collection[int] = ()) -> list[str]:
    """A label per token from its group: its own text, or the character(s) it is a part of and its place among
    their tokens ("字 2/3"); a token in ``unknown`` (one the vocabulary lacks) marked "字?", "é? 2/2". A group
    that draws nothing alone (a text that starts with U+0301) is shown visibly, "◌́" (``graphemes.visible``)."""
    return [
        f"{visible(text)}{'?' if n in unknown else ''}" + ("" if len(members) == 1 else f" {k}/{len(members)}")
        for members, text in groups
        for k, n in enumerate(members, 1)
    ]


class Tokenizer:
    """GPT-2's byte-level BPE from files on disk (a thin wrapper on the ``tokenizers`` library)."""

    def __init__(self, bpe: HFTokenizer) -> None:
        self._bpe = bpe
        self.vocab_size = bpe.get_vocab_size()

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        where = Path(directory)
        if (where / "tokenizer.json").is_file():
            try:
                return cls(HFTokenizer.from_file(str(where / "tokenizer.json")))
            except Exception as err:  # the tokenizers library raises its own Exception on a damaged file
                raise ValueError(f"{str(where / 'tokenizer.json')!r} cannot be read as a tokenizer: {err}") from None
        if (where / "vocab.json").is_file() and (where / "merges.txt").is_file():
            try:
                bpe = HFTokenizer(models.BPE.from_file(str(where / "vocab.json"), str(where / "merges.txt")))
            except Exception as err:
                raise ValueError(f"vocab.json and merges.txt in {str(where)!r} cannot be read: {err}") from None
            bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            bpe.decoder = decoders.ByteLevel()
            if bpe.token_to_id(END_OF_TEXT) is not None:  # one token, as tokenizer.json and transformers have it
                bpe.add_special_tokens([END_OF_TEXT])
            return cls(bpe)
        raise ValueError(
            f"no tokenizer in {str(where)!r}: it needs tokenizer.json, or vocab.json and merges.txt "
            "(what Hugging Face saves for GPT-2): give the folder that has them"
        )

    def encode(self, text: str) -> list[int]:
        return list(self._bpe.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._bpe.decode(ids, skip_special_tokens=False))

    def tokens(self, text: str) -> list[str]:
        """A label per token, e.g. ['Hello', ' world']; a character split over several tokens is labelled
        by the character and each token's place in it ('😀 1/2', '😀 2/2')."""
        return part_labels(character_groups(self, self.encode(text)))

    def save(self, directory: str | Path) -> None:
        self._bpe.save(str(Path(directory) / "tokenizer.json"))


class ByteTokenizer:
    """Text as its UTF-8 bytes: 256 symbols, nothing to learn, nothing unknown.

    ``ascii=True`` keeps the first 128 (plain ASCII), for models trained on
    128 tokens, such as ``attnlab train induction``'s; other characters are refused by name.
    """

    def __init__(self, *, ascii: bool = False) -> None:
        self.ascii = ascii
        self.vocab_size = 128 if ascii else 256

    @property
    def name(self) -> str:
        return "ascii" if self.ascii else "bytes"

    def encode(self, text: str) -> list[int]:
        if self.ascii:
            outside = sorted({c for c in text if ord(c) >= 128})
            if outside:
                raise ValueError(
                    f"this model knows the 128 ASCII characters only; the text has {''.join(outside[:8])!r}: "
                    "write it in plain ASCII"
                )
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"byte ids lie in [0, {self.vocab_size}), got {bad[:8]}")
        return bytes(ids).decode("utf-8", errors="replace")

    def tokens(self, text: str) -> list[str]:
        """A label per byte: an ASCII character as itself, a byte of a longer character as the character and
        the byte's place in it ('字 1/3')."""
        return part_labels(character_groups(self, self.encode(text)))


CHARS_FILE = "chars.json"
MISSING = "\u25a1"  # □: id 0, any character outside the vocabulary (how Chinese editions mark a lost character)


class CharTokenizer:
    """One token per character from a fixed vocabulary (``attnlab train poems`` builds one from its corpus): a
    view of Chinese text shows 字, never bytes. Id 0 is □, any character outside the vocabulary; ``tokens``
    labels such a character as typed, with a mark (字?). Saved as ``chars.json`` beside the weights (``to_json``)."""

    name = "chars"

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1 or c == MISSING]
        if bad or len(set(chars)) != len(chars):
            raise ValueError(
                f"a character vocabulary holds distinct single characters, {MISSING!r} aside (id 0 is it); got "
                f"{bad[:5] or sorted({c for c in chars if chars.count(c) > 1})[:5]}"
            )
        self.chars = [MISSING, *chars]
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(c, 0) for c in text]

    def decode(self, ids: list[int]) -> str:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"character ids lie in [0, {self.vocab_size}), got {bad[:8]}")
        return "".join(self.chars[i] for i in ids)

    def tokens(self, text: str) -> list[str]:
        """A label per character: itself, or itself marked 字? when the vocabulary lacks it (the model reads □);
        a character a reader sees as one with the next (e and U+0301) labelled as a part of it, "é 1/2"."""
        groups: list[tuple[list[int], str]] = []
        at = 0
        for cluster in graphemes(text):
            groups.append((list(range(at, at + len(cluster))), cluster))
            at += len(cluster)
        return part_labels(groups, unknown={n for n, c in enumerate(text) if c not in self.index})

    def to_json(self) -> str:
        """What ``chars.json`` holds (``save_gpt`` writes it beside the weights, whole or not at all)."""
        return json.dumps({"chars": self.chars[1:]}, ensure_ascii=False) + "\n"

    @classmethod
    def from_file(cls, path: str | Path) -> CharTokenizer:
        file = Path(path)
        try:
            values = json.loads(file.read_text(encoding="utf-8"))
            return cls(values["chars"])
        except FileNotFoundError:
            raise ValueError(
                f"{str(file)!r} is missing: a checkpoint that reads characters keeps its vocabulary there"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{str(file)!r} is not a character vocabulary ({err})") from None


END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token


class Decoder:
    """Turns ids arriving one at a time into text, holding back a character until all its bytes are in."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = 0  # characters of the decoded text already given out

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next byte
            return ""
        new, self.shown = text[self.shown :], len(text)
        return new

    def flush(self) -> str:
        """What is still held back at the end (an incomplete character, shown as U+FFFD): never lost."""
        text = self.tokenizer.decode(self.ids)
        rest, self.shown = text[self.shown :], len(text)
        return rest


def load_tokenizer(directory: str | Path) -> TextTokenizer:
    """The tokenizer beside a checkpoint: ``"tokenizer": "bytes"`` (or ``"ascii"``) in its config.json, else GPT-2's BPE files."""
    where = locate(directory)
    config = where / "config.json"
    named = None
    if config.is_file():
        try:
            values = json.loads(config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{str(config)!r} is not valid JSON: {err}") from None
        named = values.get("tokenizer") if isinstance(values, dict) else None
    if named in ("bytes", "ascii"):
        return ByteTokenizer(ascii=named == "ascii")
    if named == "chars":
        return CharTokenizer.from_file(where / CHARS_FILE)
    return Tokenizer.from_dir(where)
