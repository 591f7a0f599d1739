"""Every journey of README.md and docs/*.md works as written: each shell command and Python example, in page
order, in a fresh folder, as a newcomer would type them (issue 31). `make docs-test` runs this file.

A command runs as written unless its comment says otherwise, in words a reader sees:
- ``(quick try: FLAGS)``: it takes long (the comment says how long); the test runs it with FLAGS appended
  (argparse takes the last value of a flag), and FLAGS must name a quick form;
- ``(quick try: COMMAND)``: it needs what one machine cannot give (several machines); the test runs COMMAND,
  the local form the comment states;
- ``(CI runs it)``: `make test`, which runs this file;
- ``(fails: exit N)``: the command is meant to fail with that status.
A command that is none of these, and exits non-zero, fails the test; so does a long one with no quick form.
Python examples run as a reader runs them: each block alone in a fresh interpreter, or after the blocks it
says it continues ("continuing the example above"); a block the prose says needs GPUs is not run here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_docs import CONTINUES, ELSEWHERE  # one rule for which examples continue or run elsewhere

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
QUICK = re.compile(r"\(quick try: (.+?)\)\s*$")
MARK = re.compile(r"\((CI runs it|fails: exit (\d+))\)")
LONG = re.compile(r"\b(minutes?|hours?|\d+ ?min)\b", re.I)


@dataclass(frozen=True)
class Step:
    page: str
    line: int
    kind: str  # "shell" or "python"
    text: str  # the command, or the script (with the blocks it continues)
    comment: str = ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text.splitlines()[0][:100]}"


def steps(page: str) -> list[Step]:
    """The shell commands and Python examples of a page, in its order."""
    text = (REPO / page).read_text(encoding="utf-8")
    found: list[Step] = []
    script, end = "", 0
    for match in re.finditer(r"```(bash|python)\n(.*?)```", text, flags=re.S):
        prose, body, line = text[end : match.start()], match.group(2), text[: match.start()].count("\n") + 2
        end = match.end()
        if match.group(1) == "python":
            last = prose.strip().split("\n\n")[-1]
            if ELSEWHERE.search(last):  # tests/test_docs.py runs the several-process one under torchrun
                continue
            script = (script if CONTINUES in " ".join(prose.lower().split()) else "") + body
            found.append(Step(page, line, "python", script))
            continue
        lines = body.splitlines()
        n = 0
        while n < len(lines):
            first, raw = n, lines[n]
            while raw.rstrip().endswith("\\") and n + 1 < len(lines):  # a command continued on the next line
                n += 1
                raw = raw.rstrip()[:-1] + " " + lines[n].strip()
            command, _, comment = raw.partition("  #")
            if command.strip() and not command.lstrip().startswith("#"):
                found.append(Step(page, line + first, "shell", " ".join(command.split()), comment.strip()))
            n += 1
    return found


def plan(step: Step) -> tuple[list[str] | None, int]:
    """(argv to run, or None when CI runs it; the exit status it should end with)."""
    if step.kind == "python":
        return [sys.executable, "-c", step.text], 0
    mark = MARK.search(step.comment)
    if mark and mark.group(1) == "CI runs it":
        return None, 0
    expected = int(mark.group(2)) if mark and mark.group(2) else 0
    argv = shlex.split(step.text)
    quick = QUICK.search(step.comment)
    if quick:
        form = shlex.split(quick.group(1))
        argv = form if not form[0].startswith("-") else [*argv, *form]
    elif LONG.search(step.comment) or "several machines" in step.comment:
        raise AssertionError(f"{step}: says it is long or needs machines, but gives no '(quick try: ...)'")
    return argv, expected


ALL = [s for page in PAGES for s in steps(page)]


def test_the_pages_have_journeys_and_every_long_command_a_quick_form() -> None:
    shell = [s for s in ALL if s.kind == "shell"]
    assert len(shell) >= 30 and {s.page for s in shell} >= {"README.md", "docs/heads.md", "docs/ring.md"}
    for s in shell:
        plan(s)  # raises for a long command with no quick form


@pytest.mark.docs
@pytest.mark.parametrize("page", [p for p in PAGES if any(s.page == p for s in ALL)])
def test_every_command_and_example_of_a_page_works_as_written(page: str, tmp_path: Path) -> None:
    """One fresh folder per page, its steps in order (a later command may use what an earlier one made); the
    virtual environment is where the README says it is (``.venv``), and ``attnlab`` on the PATH."""
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)  # a fresh clone's root: the venv, the pages, nothing made
    shutil.copy(REPO / "README.md", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    for step in (s for s in ALL if s.page == page):
        argv, expected = plan(step)
        if argv is None:
            continue
        cwd = REPO if argv[0] == "make" else tmp_path
        started = time.perf_counter()
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
        )
        took = time.perf_counter() - started
        print(f"{took:6.1f} s  {step}")  # -s shows what each step took (the quick forms must stay quick)
        assert done.returncode == expected, (
            f"{step}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
