"""The book's exercises 3.1 to 3.3, and one of attnlab's own per tour section, checked against the book.

A reader writes one function in a file (``template`` shows which) and :func:`check` runs the file in a
subprocess with a time limit (:mod:`attnlab.exercises.collect`: the reader's code never runs in this process),
then judges what it did against the book's printed numbers and the book's own classes
(:mod:`attnlab.exercises.judge`). A wrong answer gets the hint written for its mistake, in English or Chinese
(:mod:`attnlab.exercises.text`), not only "wrong". Each exercise has a reference solution beside it
(``solutions/``) that the test suite runs through the same checker.

Shortcuts fail (issue 54): an answer that imports the reference solution, the book's printed numbers or the
book's own function for the exercise is refused before it runs (:mod:`attnlab.exercises.refuse`); each answer
is judged on the book's input and on inputs drawn afresh for every check (:mod:`attnlab.exercises.given`), so
numbers typed in fail; and the record the answer's process sends back must carry a nonce that only reached the
collector, so a record the answer writes itself is not trusted.

This package's top level imports nothing but the standard library and the texts: the collector's process
imports it, and must hold neither the book, its numbers, the judge nor the solutions.
"""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.exercises.finding import Finding
from attnlab.exercises.text import HINTS, TASKS

SOLUTIONS = Path(__file__).parent / "solutions"
TIMEOUT = 60.0  # seconds for one run of a reader's file (importing torch takes a few)


@dataclass(frozen=True)
class Exercise:
    id: str
    section: str  # the book's section it follows
    function: str  # what the reader writes
    signature: str
    solution: str  # its file in solutions/
    imports: str = "import torch"  # what a reader's file starts with

    def title(self, lang: str) -> str:
        return TASKS[_lang(lang)][self.id][0]

    def task(self, lang: str) -> str:
        return TASKS[_lang(lang)][self.id][1]

    def template(self) -> str:
        """A file to start from: the imports a reader needs and the function to fill in."""
        return f"{self.imports}\n\n\ndef {self.signature}:\n    ...\n"

    def solution_text(self) -> str:
        return (SOLUTIONS / self.solution).read_text(encoding="utf-8")


EXERCISES: dict[str, Exercise] = {
    e.id: e
    for e in (
        Exercise("3.1", "3.4.2", "transfer", "transfer(sa_v1, sa_v2)", "ex_3_1.py"),
        Exercise(
            "3.2",
            "3.6.1",
            "build",
            "build(d_in, context_length)",
            "ex_3_2.py",
            "from attnlab.book import MultiHeadAttentionWrapper  # the book's class (llms_from_scratch.ch03 has it too)",
        ),
        Exercise(
            "3.3",
            "3.6.2",
            "build",
            "build()",
            "ex_3_3.py",
            "from attnlab.book import MultiHeadAttention  # the book's class (llms_from_scratch.ch03 has it too)",
        ),
        Exercise("3.A", "3.3", "attention_weights", "attention_weights(inputs)", "ex_3_a.py"),
        Exercise("3.B", "3.4", "scaled_weights", "scaled_weights(queries, keys)", "ex_3_b.py"),
        Exercise("3.C", "3.5", "causal_weights", "causal_weights(attn_scores)", "ex_3_c.py"),
    )
}


@dataclass(frozen=True)
class Result:
    exercise: str
    path: Path
    findings: list[Finding]

    @property
    def passed(self) -> bool:
        return bool(self.findings) and all(f.ok for f in self.findings)

    def lines(self, lang: str) -> list[str]:
        """Each finding as a sentence in ``lang``."""
        hints = HINTS[_lang(lang)]
        return [hints[f.key].format(**f.values) for f in self.findings]


def _lang(lang: str) -> str:
    if lang not in TASKS:
        raise ValueError(f"lang must be one of {sorted(TASKS)}, got {lang!r}")
    return lang


def exercise(id: str) -> Exercise:
    """The exercise called ``id`` (3.1, 3.2, 3.3, 3.A, 3.B, 3.C)."""
    if id not in EXERCISES:
        raise ValueError(f"no exercise {id!r}; the exercises are {', '.join(EXERCISES)} (attnlab exercise lists them)")
    return EXERCISES[id]


def check(id: str, path: str | Path, *, timeout: float = TIMEOUT) -> Result:
    """Run the answer at ``path`` for exercise ``id`` in a subprocess, at most ``timeout`` seconds, and judge it."""
    return check_many([(id, path)], timeout=timeout)[0]


def check_many(answers: list[tuple[str, str | Path]], *, timeout: float = TIMEOUT) -> list[Result]:
    """Several answers run in one subprocess (each file a module of its own), then judged here, in order.

    An answer the refusal names (the reference solution, the book's numbers or own function) is not run."""
    import torch  # here, not above: see the module's docstring

    from attnlab.exercises.given import given
    from attnlab.exercises.judge import judge
    from attnlab.exercises.refuse import refusal

    items = []
    for id, path_given in answers:
        exercise(id)
        path = Path(path_given)
        if path.suffix != ".py" or not path.is_file():
            raise ValueError(f"the answer must be a Python file (.py) that exists, got {str(path_given)!r}")
        items.append((id, path.resolve()))
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be a number of seconds in (0, 3600], got {timeout!r}")
    findings: list[list[Finding] | None] = [None] * len(items)
    for n, (id, path) in enumerate(items):
        if (refused := refusal(id, path.read_text(encoding="utf-8", errors="replace"))) is not None:
            findings[n] = [refused]
    run = [n for n, f in enumerate(findings) if f is None]
    generator = torch.Generator().manual_seed(secrets.randbits(62))  # a fresh draw each check: nothing to type in
    inputs = {id: given(id, generator) for id in {items[n][0] for n in run}}
    observed = _observe([items[n] for n in run], inputs, timeout) if run else []
    for n, seen in zip(run, observed, strict=True):
        findings[n] = seen if isinstance(seen, list) else judge(items[n][0], seen, inputs[items[n][0]])
    return [Result(id, path, f or []) for (id, path), f in zip(items, findings, strict=True)]


def _observe(items: list[tuple[str, Path]], inputs: dict[str, Any], timeout: float) -> list[Any]:
    """What each answer did, as the collector's process recorded it; or, for a run without a trusted record, the
    same finding for every answer (stopped at its time limit, crashed, or its record forged)."""
    import torch

    nonce = secrets.token_hex(16)  # reaches the collector on its stdin, never its arguments, files or globals
    payload = io.BytesIO()
    torch.save({"nonce": nonce, "given": inputs}, payload)
    with tempfile.TemporaryDirectory(prefix="attnlab-exercise-") as tmp:
        out = Path(tmp) / "observed.pt"
        command = [sys.executable, "-m", "attnlab.exercises.collect", str(out), *(f"{i}={p}" for i, p in items)]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                command,
                cwd=tmp,
                env=env,
                input=payload.getvalue(),  # read to its end before any answer runs: an input() there ends at once
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return _every(items, Finding(False, "timeout", {"seconds": f"{timeout:g}"}))
        if done.returncode != 0 or not out.is_file():
            stderr = done.stderr.decode("utf-8", errors="replace")  # whatever the answer printed
            detail = (stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
            return _every(items, Finding(False, "crashed", {"detail": detail}))
        try:
            record = torch.load(out, weights_only=True)  # data only: tensors, numbers, strings
        except Exception as err:  # a file the answer's process wrote otherwise: never trusted, never run
            detail = f"its result could not be read as data ({type(err).__name__})"
            return _every(items, Finding(False, "crashed", {"detail": detail}))
    if not isinstance(record, dict) or record.get("nonce") != nonce or len(record.get("results", ())) != len(items):
        return _every(items, Finding(False, "forged", {}))
    return list(record["results"])


def _every(items: list[tuple[str, Path]], finding: Finding) -> list[Any]:
    """The same finding for every answer of a run without a trusted record."""
    return [[finding] for _ in items]


__all__ = ["EXERCISES", "Exercise", "Finding", "Result", "check", "check_many", "exercise"]
