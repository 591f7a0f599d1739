"""Training tasks that ship with attnlab (nothing is downloaded): repeated random tokens, and text as bytes.

- ``InductionTask``: each sequence is a block of random tokens repeated over
  and over, the task of the induction-heads literature (Olsson et al., 2022).
  The first pass of the block cannot be predicted; every later token can, by
  looking back for the previous occurrence of the current token and copying
  what came after it.
- ``TextTask``: a text as UTF-8 bytes (256 symbols), in random windows; by
  default Python's own ``pydoc_data.topics`` (about 465k characters of
  English documentation, part of the standard library).

A batch is ``(inputs, targets)``, both (B, T) token ids, targets shifted by one.
Batches come from a ``torch.Generator`` the caller seeds, so a run is reproducible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from attnlab._checks import check_positive_int
from attnlab.models.config import GPTConfig

SPLITS = ("train", "eval")


class Task(Protocol):
    vocab_size: int
    seq_len: int  # tokens per training sequence (inputs)

    def batch(
        self, batch_size: int, generator: torch.Generator, *, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class InductionTask:
    """Two blocks of distinct random tokens, each repeated: block A from position 0, block B from a random cut.

    Block A (``a`` tokens) repeats from position 0 until a cut drawn at
    random in [2a, L - 2b], where block B (``b`` other tokens) starts and
    repeats to the end; ``a`` and ``b`` are drawn per row from [min_period,
    max_period]. So the distance back to the earlier copy changes from row to
    row ("look back a fixed number of positions" does not work): the model has
    to find the earlier occurrence of the current token and copy what followed
    it, which is what an induction head does. The tokens are distinct, so that
    earlier occurrence is unique. Because B's first copy can sit anywhere, the
    previous-token head it needs works at every position, not only near the
    start (with one block from position 0 it looked back only below position
    32); A from position 0 keeps the phase change within a CPU budget
    (docs/heads.md tells what else was tried).

    >>> InductionTask(vocab_size=10, seq_len=9, min_period=2, max_period=2).sequences(1, torch.Generator().manual_seed(0)).shape
    torch.Size([1, 10])
    """

    def __init__(self, *, vocab_size: int = 128, seq_len: int = 64, min_period: int = 6, max_period: int = 16) -> None:
        check_positive_int("vocab_size", vocab_size, limit=1 << 20)
        check_positive_int("seq_len", seq_len, limit=1 << 16)
        check_positive_int("min_period", min_period, limit=1 << 16)
        check_positive_int("max_period", max_period, limit=1 << 16)
        if not 2 <= min_period <= max_period:
            raise ValueError(
                f"need 2 <= min_period <= max_period, got min_period={min_period}, max_period={max_period}"
            )
        if 2 * max_period > vocab_size:
            raise ValueError(
                f"two blocks of up to max_period={max_period} distinct tokens need {2 * max_period} tokens, more than "
                f"vocab_size {vocab_size}; use max_period <= {vocab_size // 2}"
            )
        if 4 * max_period > seq_len + 1:
            raise ValueError(
                f"seq_len {seq_len} is too short to repeat two blocks of max_period={max_period} twice each; "
                f"use seq_len >= {4 * max_period - 1} or a smaller max_period"
            )
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.min_period, self.max_period = min_period, max_period

    def sequences(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """(B, seq_len + 1) token ids."""
        length = self.seq_len + 1
        rows = []
        for _ in range(batch_size):
            a, b = torch.randint(self.min_period, self.max_period + 1, (2,), generator=generator).tolist()
            cut = int(torch.randint(2 * a, length - 2 * b + 1, (1,), generator=generator))
            tokens = torch.randperm(self.vocab_size, generator=generator)[: a + b]  # (a + b,) distinct
            first = tokens[:a].repeat(-(-cut // a))[:cut]  # (cut,): block A from position 0
            second = tokens[a:].repeat(-(-(length - cut) // b))[: length - cut]  # block B from the cut
            rows.append(torch.cat([first, second]))  # (seq_len + 1,)
        return torch.stack(rows)  # (B, seq_len + 1)

    def batch(
        self, batch_size: int, generator: torch.Generator, *, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_split(split)  # both splits are fresh random blocks; the caller's generator keeps them apart
        seq = self.sequences(batch_size, generator)
        return seq[:, :-1], seq[:, 1:]


def stdlib_text() -> str:
    """Python's own documentation topics: English text that every Python installation carries."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def read_text(path: str | Path) -> str:
    """A local text file, for ``TextTask``; a clear error if it is missing or not UTF-8."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--data {str(path)!r} is not a file; give the path of a local text file")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--data {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


class TextTask:
    """A text as bytes, 90% for training and 10% held out, in random windows of ``seq_len + 1`` bytes."""

    vocab_size = 256

    def __init__(self, text: str, *, seq_len: int = 128) -> None:
        check_positive_int("seq_len", seq_len, limit=1 << 16)
        data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
        if data.numel() < 10 * (seq_len + 2):
            raise ValueError(
                f"the text has {data.numel()} bytes; training windows of {seq_len + 1} need at least "
                f"{10 * (seq_len + 2)} (a tenth is held out): give a longer text or a shorter seq_len"
            )
        cut = int(0.9 * data.numel())
        self.splits = {"train": data[:cut], "eval": data[cut:]}
        self.seq_len = seq_len

    def batch(
        self, batch_size: int, generator: torch.Generator, *, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_split(split)
        data = self.splits[split]
        starts = torch.randint(0, data.numel() - self.seq_len, (batch_size,), generator=generator)
        offsets = torch.arange(self.seq_len + 1)
        windows = data[starts[:, None] + offsets]  # (B, seq_len + 1)
        return windows[:, :-1], windows[:, 1:]


TASKS = ("induction", "text", "poems")

# The model each built-in task trains by default: small enough for minutes on two CPU cores.
TASK_MODELS: dict[str, GPTConfig] = {
    "induction": GPTConfig(vocab_size=128, context_length=64, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0),
    "text": GPTConfig(vocab_size=256, context_length=256, emb_dim=128, n_heads=4, n_layers=4, drop_rate=0.0, rope=True),
    # one token per character; vocab_size is the vocabulary's, set when the task is built from its corpus
    "poems": GPTConfig(
        vocab_size=3001,
        context_length=64,
        emb_dim=128,
        n_heads=4,
        n_layers=4,
        drop_rate=0.0,
        rope=True,
        tie_weights=True,
    ),
}


def make_task(
    name: str, *, seq_len: int | None = None, data: str | Path | None = None, tokenizer: object = None
) -> Task:
    """A built-in task by name; ``data``: a local UTF-8 file instead of Python's own docs (text), the
    chinese-poetry tarball or a JSON file of poems (poems; fetched with npm when not given). ``tokenizer``
    (poems): the vocabulary a resumed run saved."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; the built-in tasks are {list(TASKS)}")
    if data is not None and name == "induction":
        raise ValueError("--data is text for the 'text' task or poems for 'poems'; 'induction' makes its own sequences")
    length = seq_len if seq_len is not None else TASK_MODELS[name].context_length
    if name == "induction":
        longest = max(2, min(16, (length + 1) // 4))  # two blocks, each repeated twice, fit the sequence
        return InductionTask(seq_len=length, max_period=longest, min_period=min(6, longest))
    if name == "poems":
        from attnlab.models.poems import PoemsTask, fetch_corpus, read_poems
        from attnlab.models.tokenizer import CharTokenizer

        saved = tokenizer if isinstance(tokenizer, CharTokenizer) else None
        return PoemsTask(read_poems(data if data is not None else fetch_corpus()), seq_len=length, tokenizer=saved)
    return TextTask(read_text(data) if data is not None else stdlib_text(), seq_len=length)
