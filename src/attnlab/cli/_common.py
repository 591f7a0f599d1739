"""What the subcommands share: the error line, and output paths checked before any work starts."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from attnlab.models import GPT
    from attnlab.models.tokenizer import TextTokenizer


def error(console: Console, message: object) -> int:
    """Print one clear line on stderr (no traceback) and return the usage-error exit code."""
    stderr = Console(stderr=True, highlight=False, force_terminal=console.is_terminal, no_color=console.no_color)
    line = Text("error: ", style="red")
    line.append(str(message))
    stderr.print(line, soft_wrap=True)  # one line, whole
    return 2


def check_output(path: str | None, *, suffixes: tuple[str, ...]) -> None:
    """Refuse an output path that could not be written, before minutes of work are spent on it."""
    if path is None:
        return
    target = Path(path)
    if target.suffix.lower() not in suffixes:
        raise ValueError(f"{path!r} should end in {' or '.join(suffixes)}")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"cannot write {path!r}: the folder {str(parent)!r} does not exist")
    if target.is_dir():
        raise ValueError(f"{path!r} is a folder; give a file name")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"cannot write {path!r}: permission denied")
    _check_writable(parent, path)


def _check_writable(folder: Path, path: str) -> None:
    try:  # os.access says yes to root everywhere; writing a scratch file is the only true answer
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnlab-probe-"):
            pass
    except OSError as err:
        raise ValueError(f"cannot write {path!r}: {err.strerror or err} in {str(folder)!r}") from None


def check_folder(path: str) -> Path:
    """An output folder (made later, parents included) that could be written, checked before any work."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{path!r} is a file; give a folder")
    nearest = target
    while not nearest.exists():  # the folder that exists now, where the new ones will be made
        nearest = nearest.parent
    if not nearest.is_dir():
        raise ValueError(f"cannot make the folder {path!r}: {str(nearest)!r} is a file")
    _check_writable(nearest, path)
    return target


def model_path(model: str) -> Path:
    """Where ``--model`` points (a shipped name such as ``induction`` included), or the error that says what to give."""
    from attnlab.models.locate import SHIPPED, ZOO, locate, origin
    from attnlab.models.zoo import zoo_model

    if model.startswith(ZOO):
        return zoo_model(model[len(ZOO) :])
    try:
        where = locate(model)
    except ValueError as err:  # a hub name that cannot be had
        raise ValueError(f"--model {err}") from None
    if not where.exists():
        raise ValueError(
            f"--model {model!r} does not exist; give a checkpoint directory or a .pth file, a checkpoint that ships "
            f"with attnlab ({', '.join(SHIPPED)}), or a Hugging Face Hub name (Qwen/Qwen3-0.6B, NAME@REVISION)"
        )
    if origin(model) == "the Hugging Face Hub's cache":
        print(f"model: {model} from the Hugging Face Hub's cache ({where})", file=sys.stderr)
    return where


CHECKPOINT_FILES = (".pth", ".pt", ".bin")  # a state dict file; every other checkpoint is a folder


def load_checkpoint(model: str, tokenizer: str | None, *, backend: str = "auto") -> tuple[GPT, TextTokenizer]:
    """``--model`` and ``--tokenizer`` (default: the model's folder), each checked with a message that says the fix."""
    from attnlab.models import GPT, load_tokenizer
    from attnlab.models.locate import locate

    where = model_path(model)
    if where.is_file() and where.suffix not in CHECKPOINT_FILES:
        raise ValueError(
            f"--model {model!r} is a file but not a checkpoint ({', '.join(CHECKPOINT_FILES)}): give a checkpoint "
            "folder (config.json and model.safetensors), the book's .pth state dict, or a shipped name"
        )
    if where.is_dir() and not (where / "config.json").is_file():
        raise ValueError(
            f"no checkpoint in --model {model!r}: the folder has no config.json; give the folder that "
            "save_pretrained (attnlab's or Hugging Face's) wrote"
        )
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise ValueError(
            f"--tokenizer {tokenizer!r} is not a folder; give the folder that holds tokenizer.json "
            "(or vocab.json and merges.txt)"
        )
    token_dir = locate(tokenizer or model)
    if not token_dir.is_dir():
        raise ValueError(
            f"--model {model!r} is a checkpoint file, which carries no tokenizer: pass --tokenizer DIR "
            "(a folder with tokenizer.json, or vocab.json and merges.txt)"
        )
    try:
        text_tokenizer = load_tokenizer(token_dir)  # before the weights: a missing tokenizer is the cheaper error
    except ValueError as err:
        if tokenizer is not None or "no tokenizer in" not in str(err):
            raise
        raise ValueError(
            f"{err}; pass --tokenizer DIR, or, for a model whose ids are bytes, save it with "
            "model.save_pretrained(folder, tokenizer='bytes') (or 'ascii' for 128 ids)"
        ) from None
    return GPT.from_pretrained(model, backend=backend), text_tokenizer
