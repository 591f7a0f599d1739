"""What an attnlab cache layer's last ``update`` returned (:mod:`attnlab.hf.layer`), kept for the bridge
(:mod:`attnlab.hf.bridge`) to find by the keys tensor transformers hands it: the positions that came with them.
A module of its own, below both, so neither imports the other to reach it; it needs nothing of transformers.

Shapes: T = new tokens, S = slots returned, B = batch.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from attnlab.cache.base import Cache as AttnlabCache


@dataclass
class Returned:
    """What one layer's last ``update`` returned: the bridge finds it by the keys tensor it is handed."""

    keys: weakref.ref[torch.Tensor]
    q_pos: torch.Tensor  # (T,) the new tokens' positions
    k_pos: torch.Tensor  # (S,) or (B, S): each slot's position, -1 for an empty one
    cache: AttnlabCache
    observed: bool = False


# id(keys) -> what came with them. Held by its layer alone: an entry goes when its cache does (no cache is kept
# alive from here), and one whose keys were freed and whose id was reused fails the weakref check.
_RETURNED: weakref.WeakValueDictionary[int, Returned] = weakref.WeakValueDictionary()


def returned_with(keys: torch.Tensor) -> Returned | None:
    """The positions (and cache) that came with ``keys``, if an attnlab cache layer just returned them."""
    found = _RETURNED.get(id(keys))
    return found if found is not None and found.keys() is keys else None
