"""Ctrl-C during `attnlab bench --caches` keeps what it finished (issue 31): a real process, a real SIGINT.

It used to throw every finished row away with a traceback. Now it prints the rows finished, writes them to
--json, names what was left, and exits 130 with one line; and before any work it forecasts its length, then
says each step as a line on a pipe.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def _attnlab() -> str:
    found = Path(sys.executable).parent / "attnlab"
    return str(found) if found.exists() else str(shutil.which("attnlab"))


def _as_in_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a suite run as a background job starts its children with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_ctrl_c_prints_the_rows_finished_writes_them_and_names_what_was_left(tmp_path: Path) -> None:
    out = tmp_path / "caches.json"
    argv = [_attnlab(), "bench", "--caches", "int8", "int4", "h2o", "--model", "text", "--quick", "--json", str(out)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal
    )
    assert proc.stdout is not None
    said = [proc.stdout.readline()]
    while said[-1] and not said[-1].startswith("[1/"):  # the first row (plain) is finished: the next one runs
        said.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert said[-1].startswith("[1/7] text: int8 ("), said
    assert said[0].startswith("about ") and " by a rough forecast (text " in said[0]  # before any work
    assert said[1].startswith("[0/7] text: recomputing, the reference")  # then one line a step, on a pipe
    assert proc.returncode == 130, (rest, err)
    assert "Traceback" not in rest + err
    rows = [line.split("│")[1].strip() for line in rest.splitlines() if line.startswith("│")]
    assert rows[0] == "plain" and "h2o 50%" not in rows  # the table of the rows finished
    assert err.count("\n") == 1 and err.startswith("error: interrupted; left unmeasured: text: ")
    left = err.removeprefix("error: interrupted; left unmeasured: text: ").strip().split(", ")
    assert left[-2:] == ["timing round 1 of 1", "shared prefix"] and "h2o 50%" in left  # named, in order
    assert f"wrote {out} (what was finished)" in rest
    data = json.loads(out.read_text())
    assert [r["cache"] for r in data["tables"][0]["rows"]] == rows
    assert data["tables"][0]["left"] == left and data["left"] == [f"text: {', '.join(left)}"]
