"""The shapes of published checkpoints whose families attnlab reads from a Hugging Face config.json: the fields
of their config.json that fix the shape, by name, read by the family's own reader (``config_from_hf``) exactly
as a downloaded folder would be. Nothing is downloaded: these are numbers, with random weights wherever a model
is built from them. ``attnlab memory --model gemma-3-27b`` sizes a cache from them; ``benchmarks/kv_shapes.py``
counts the hybrids' state on them.

The table is data: ``attnlab/data/shapes/published.json``, each entry its config fields (``SHAPES``), the hub
folder they come from (``SOURCES``) and how they are read (``NOTES``). The parameter counts they give are checked
against the published ones (tests/test_kv_bytes.py, tests/test_kv_shapes.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig

TABLE = Path(__file__).resolve().parents[2] / "data" / "shapes" / "published.json"
SCHEMA = "attnlab.shapes/1"


def _load(path: Path) -> dict[str, dict[str, Any]]:
    """The table's entries by shape name, each with its ``config`` object and its ``source``."""
    table = json.loads(path.read_text(encoding="utf-8"))
    if table.get("schema") != SCHEMA:
        raise ValueError(f"{path} has schema {table.get('schema')!r}, expected {SCHEMA!r}")
    entries: dict[str, dict[str, Any]] = table["shapes"]
    for name, entry in entries.items():
        if not isinstance(entry.get("config"), dict) or not isinstance(entry.get("source"), str):
            raise ValueError(f"{path}: shape {name!r} needs a config object and a source string")
    return entries


_ENTRIES = _load(TABLE)
SHAPES: dict[str, dict[str, Any]] = {name: entry["config"] for name, entry in _ENTRIES.items()}
SOURCES: dict[str, str] = {name: entry["source"] for name, entry in _ENTRIES.items()}
NOTES: dict[str, str] = {name: entry.get("note", "") for name, entry in _ENTRIES.items()}


def shape(name: str) -> GPTConfig:
    """The decoder config of a published checkpoint in ``SHAPES``, through its family's reader."""
    from attnlab.models.families import config_from_hf

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {list(SHAPES)}")
    return config_from_hf(json.loads(json.dumps(SHAPES[name])), Path(name))  # a copy: no reader edits the table
