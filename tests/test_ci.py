"""CI cannot skip quietly: .ci/run exports CI=true, and under it a skipped test fails (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def test_ci_run_exports_ci_true_before_make_test() -> None:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "export CI=true" in script and script.index("export CI=true") < script.index("make test")


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_a_skip_fails_under_ci_and_stays_a_skip_outside(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_a_browser.py").write_text(
        "import pytest\n\ndef test_page():\n    pytest.skip('chromium is not installed')\n", encoding="utf-8"
    )
    runs = {}
    for ci in ("true", ""):
        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
        runs[ci] = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert runs["true"].returncode == 1, runs["true"].stdout
    assert (
        "skipped under CI=true, where every prerequisite must be there: Skipped: chromium is not" in runs["true"].stdout
    )
    assert runs[""].returncode == 0 and "1 skipped" in runs[""].stdout
