"""What a refused call must leave as it was, compared whole, and the mods that get a call refused: shared by
tests/test_failed_calls.py (attnlab's own models) and tests/test_bridge_calls.py (through transformers)."""

from __future__ import annotations

from typing import Any

import torch


def same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{n}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def raises(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("a bug in the user's mod")


def floats(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return (q_idx >= kv_idx).float()
