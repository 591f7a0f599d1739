"""The ``attnlab`` command: one module per subcommand (tour, explain, generate, train, heads, ring, bench, memory,
glossary, exercise, zoo).

All printing lives here; the library returns values. Bad arguments get one
clear line and exit code 2, never a traceback, and are checked before any
long work starts.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from rich.console import Console

from attnlab import __version__
from attnlab.cli import bench, exercise, explain, generate, glossary, heads, memory, ring, sinks, tour, train, zoo
from attnlab.cli._common import error

COMMANDS = {
    "tour": tour,
    "explain": explain,
    "generate": generate,
    "train": train,
    "heads": heads,
    "ring": ring,
    "bench": bench,
    "memory": memory,
    "glossary": glossary,
    "exercise": exercise,
    "zoo": zoo,
    "sinks": sinks,
}


class _Parser(argparse.ArgumentParser):
    """argparse, with a slip said in one line (not the usage block), and the nearest command for a typo."""

    def error(self, message: str) -> NoReturn:
        chosen = re.search(r"invalid choice: '([^']*)'", message)
        if chosen and self.prog == "attnlab":
            near = difflib.get_close_matches(chosen.group(1), list(COMMANDS), n=1)
            message = f"unknown command {chosen.group(1)!r}" + (f": did you mean {near[0]!r}?" if near else "")
            message += f" (commands: {', '.join(COMMANDS)})"
        else:
            message += f"; see {self.prog} --help"
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnlab",
        description="Learn, verify and use attention: chapter 3 of 'Build a Large Language Model (From Scratch)' "
        "step by step, any sentence explained, every implementation measured.",
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `attnlab` alone: what it can do
        parser.print_help()
        return 0
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # font fallback chatter
    console = Console(highlight=False)
    before = _sigterm_interrupts()
    try:
        return int(COMMANDS[args.command].run(args, console))
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) outside a loop that saves: one line, the shell's code for SIGINT
        error(console, "interrupted")
        return 130
    except (ValueError, TypeError, OSError) as err:  # a slip the checks did not foresee: still one line
        return error(console, err)
    except Exception as err:  # never a traceback: what went wrong, in one line, with its kind
        return error(console, f"{type(err).__name__}: {err}")
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _sigterm_interrupts() -> Any:
    """SIGTERM unwinds like Ctrl-C while a command runs: temporary folders are removed and a worker process is
    killed by the code that started it, instead of the command dying on the spot and leaving both behind.
    Returns the handler it replaced (None off the main thread, where signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


if __name__ == "__main__":
    sys.exit(main())
