"""The ``attnlab`` command: one module per subcommand (tour, explain, bench).

All printing lives here; the library returns values. Bad arguments get one
clear line and exit code 2, never a traceback, and are checked before any
long work starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.console import Console

from attnlab.cli import bench, explain, tour
from attnlab.cli._common import error

COMMANDS = {"tour": tour, "explain": explain, "bench": bench}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description="Learn, verify and use attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # font fallback chatter
    console = Console(highlight=False)
    try:
        return int(COMMANDS[args.command].run(args, console))
    except (ValueError, TypeError, OSError) as err:  # a slip the checks did not foresee: still one line
        return error(console, err)


if __name__ == "__main__":
    sys.exit(main())
