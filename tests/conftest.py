from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED_DIR = REPO.parent / "shared" / "seed"


@pytest.fixture
def seed_text() -> str:
    """The reading notes the golden numbers were transcribed from."""
    files = sorted(SEED_DIR.glob("*.txt"))
    if not files:
        message = f"the reading notes are not beside this checkout ({SEED_DIR}); the golden numbers come from them"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # in CI a missing prerequisite is a failure, never a silent skip
        pytest.skip(message)
    return "\n".join(f.read_text(encoding="utf-8") for f in files)
