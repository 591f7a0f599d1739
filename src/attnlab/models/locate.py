"""Where a model named on the command line or in Python lives: a path, a checkpoint that ships in the package
(``"induction"``, ``"text"``, ``"poems"``), or ``"zoo:NAME"``, a zoo run's model (:func:`attnlab.models.zoo.zoo_model`
checks the name against the zoo's variants).

It knows folders, nothing of what is in them: the checkpoints, the tokenizers and the zoo all ask it, and it
imports none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def locate(path: str | Path) -> Path:
    """``path`` itself, the shipped checkpoint of that name (``"induction"``) when no such path exists, or for
    ``"zoo:NAME"`` the zoo's model NAME (:func:`zoo_models`)."""
    if isinstance(path, str) and path.startswith(ZOO):
        return zoo_models() / path[len(ZOO) :]
    where = Path(path)
    if not where.exists() and str(path) in SHIPPED:
        return Path(__file__).resolve().parents[1] / "data" / str(path)
    return where
