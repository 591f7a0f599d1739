"""What the subcommands share: the error line, and output paths checked before any work starts."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console


def error(console: Console, message: object) -> int:
    """Print one clear line (no traceback) and return the usage-error exit code."""
    console.print(f"[red]error:[/red] {message}", markup=True, highlight=False, soft_wrap=True)  # one line, whole
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
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"cannot write {path!r}: permission denied")
    if target.is_dir():
        raise ValueError(f"{path!r} is a folder; give a file name")
