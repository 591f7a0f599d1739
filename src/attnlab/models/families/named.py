"""Reading and writing a family's tensors by a list of names: the loop every family of its own names shares.

A family lists ``(names in the file, name in attnlab)``; several file names stack as the rows of one attnlab
tensor (q, k and v into the fused qkv, as :class:`~attnlab.models.families.rows.Rows`). What the file holds beyond
the list comes back as ``<unexpected>name``; a tied head in the file is kept (the model's fit checks it equals the
embedding).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.models.families.rows import Rows

Names = list[tuple[tuple[str, ...], str]]


def read_names(tensors: dict[str, torch.Tensor], names: Names, *, tie: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """attnlab's tensors from the file's, by ``names``, and where each came from."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for theirs, ours in names:
        origin[ours] = "/".join(theirs)
        present = [tensors[name] for name in theirs if name in tensors]
        if len(present) == len(theirs):
            out[ours] = present[0] if len(present) == 1 else Rows(tuple(present))
    known = {name for theirs, _ in names for name in theirs} | {"lm_head.weight"}
    out |= {f"<unexpected>{k}": v for k, v in tensors.items() if k not in known}
    if tie and "lm_head.weight" in tensors:
        out["out_head.weight"], origin["out_head.weight"] = tensors["lm_head.weight"], "lm_head.weight"
    return out, origin


def write_names(state: dict[str, torch.Tensor], names: Names, *, rows: list[int]) -> dict[str, torch.Tensor]:
    """The file's tensors from attnlab's ``state`` by ``names``; a stacked tensor split into ``rows`` (q, k, v)."""
    out: dict[str, torch.Tensor] = {}
    for theirs, ours in names:
        tensor = state[ours].detach()
        pieces = tensor.split(rows) if len(theirs) > 1 else (tensor,)
        out |= {name: piece.contiguous().clone() for name, piece in zip(theirs, pieces, strict=True)}
    return out
