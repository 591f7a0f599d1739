"""What the benchmark scripts that save their run share: their ``--rounds``, ``--threads``, ``--json`` and
``--render`` arguments, printing a saved run, and the checks before any work starts (each refusal one line from
argparse), and the CPU's name a saved run records."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_run_arguments(parser: argparse.ArgumentParser, *, rounds: int) -> None:
    """--rounds, --threads, --json and --render, as every such script takes them."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--render", metavar="PATH", help="print the table of a saved result, no run")


def render_saved(parser: argparse.ArgumentParser, path: str, schema: str, render: Callable[[Any], str]) -> None:
    """Print ``render`` of the run saved at ``path``; a file that is not one of this script's runs is refused."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        if saved.get("schema") != schema:
            raise ValueError(f"schema {saved.get('schema')!r}, expected {schema!r}")
    except (OSError, ValueError, AttributeError) as err:
        parser.error(f"--render {path!r} is not a result of this script: {err}")
    print(render(saved))


def check_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--rounds in [1, 50], --threads in [1, 256], and a --json whose folder exists."""
    if not 1 <= args.rounds <= 50 or not 1 <= args.threads <= 256:
        parser.error(f"--rounds must be in [1, 50] and --threads in [1, 256], got {args.rounds} and {args.threads}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"cannot write --json {args.json!r}: its folder does not exist")


def finish(
    path: str | None, result: dict[str, Any], render: Callable[[Any], str], problems: list[str], tag: str
) -> int:
    """Save the run to ``path`` (if given), print its table, then each problem as "tag: problem" on stderr; the
    exit status: 1 when there is a problem."""
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(render(result))
    for line in problems:
        print(f"{tag}: {line}", file=sys.stderr)
    return 1 if problems else 0


def exit_with(main: Callable[[], int]) -> None:
    """Run ``main`` as the script's whole life: its exit code, or on Ctrl-C one line and 130 (a run is written
    only whole, so an interrupted one leaves no file); a pipe closed by its reader ends it quietly."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted: nothing written (a run is saved only when every round has finished)", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # a reader that stopped early (``| head``): what it took was written; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        code = 0
    sys.exit(code)


def cpu_name() -> str:
    """The CPU's model name and the vector extensions the kernels here choose by (Linux; else the platform's)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or platform.machine()
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)}
    model = " ".join(fields.get("model name", platform.machine()).split())
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    return f"{model} ({', '.join(f for f in wanted if f in flags) or 'no AVX2'})"
