"""A check shown beside a step: a label, whether it holds, and a detail (the error, the value)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    label: str
    ok: bool
    detail: str


def holds(label: str, condition: bool, detail: str = "") -> Check:
    return Check(label, bool(condition), detail)
