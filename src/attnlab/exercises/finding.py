"""A finding: one thing the checker saw in an answer, right or wrong, as a key into the hints and its values.
Its own module, so the package, the judge and the refusals all import it and none of them imports another."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    ok: bool
    key: str  # into text.HINTS
    values: dict[str, Any] = field(default_factory=dict)
