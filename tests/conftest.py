from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED_DIR = REPO.parent / "shared" / "seed"


@pytest.fixture
def seed_text() -> str:
    """The reading notes the golden numbers were transcribed from."""
    files = sorted(SEED_DIR.glob("*.txt"))
    if not files:
        pytest.skip(f"the reading notes are not beside this checkout ({SEED_DIR})")
    return "\n".join(f.read_text(encoding="utf-8") for f in files)
