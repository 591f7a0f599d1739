"""Where a model named on the command line or in Python lives: a path, a checkpoint that ships in the package
(``"induction"``, ``"text"``, ``"poems"``), ``"zoo:NAME"``, a zoo run's model (:func:`attnlab.models.zoo.zoo_model`
checks the name against the zoo's variants), or a Hugging Face Hub name (``attnlab.models.hub``), in that order:
a local folder or file of that name comes first.

It knows folders, nothing of what is in them: the checkpoints, the tokenizers and the zoo all ask it, and it
imports none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.models.hub import from_hub, hub_name

SHIPPED = (
    "induction",
    "text",
    "poems",
)  # in the package: attnlab/data/<name>/ (docs/heads.md, docs/caches.md: how each was made)


ZOO = "zoo:"  # --model zoo:NAME: the zoo's variant NAME as `attnlab zoo` saved it (attnlab.bench.zoo)
ZOO_RUN = "runs/zoo"  # where `attnlab zoo` writes unless --out says otherwise; ATTNLAB_ZOO names another run's


def zoo_models() -> Path:
    """The folder of the zoo run whose models ``zoo:NAME`` names: ``$ATTNLAB_ZOO/models``, else ``runs/zoo/models``."""
    return Path(os.environ.get("ATTNLAB_ZOO") or ZOO_RUN) / "models"


def locate(path: str | Path, *, revision: str | None = None) -> Path:
    """``path`` itself; the shipped checkpoint of that name (``"induction"``) when no such path exists; for
    ``"zoo:NAME"`` the zoo's model NAME (:func:`zoo_models`); else, for a hub name (``"Qwen/Qwen3-0.6B"``,
    ``"gpt2@main"``), its folder in huggingface_hub's cache (fetched first where the hub can be reached)."""
    if isinstance(path, str) and path.startswith(ZOO):
        return zoo_models() / path[len(ZOO) :]
    where = Path(path)
    if where.exists():
        return where
    if str(path) in SHIPPED:
        return Path(__file__).resolve().parents[1] / "data" / str(path)
    if hub_name(path):
        return from_hub(str(path), revision=revision)
    return where


def origin(path: str | Path) -> str:
    """Which of :func:`locate`'s places ``path`` names: a local path, a shipped checkpoint, a zoo model or the hub."""
    if isinstance(path, str) and path.startswith(ZOO):
        return "a zoo run's model"
    if Path(path).exists():
        return "a local path"
    if str(path) in SHIPPED:
        return "a checkpoint that ships with attnlab"
    return "the Hugging Face Hub's cache" if hub_name(path) else "nowhere"
