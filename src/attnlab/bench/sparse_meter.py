"""Keys read and state bytes a token, measured on a model's real cache: what ``attnlab zoo`` and
``benchmarks/sparse.py`` record for every variant, sparse or dense.

- **Keys read** by one decoded token, layer by layer. A layer that meters its own reads (``keys_read``: DSA's
  ``IndexedAttention``, V4's ``CompressedAttention`` with its ``window_read`` beside it, MoBA's and NSA's layers)
  is read off that meter, zeroed first: the slots its gathers read, counted from the kernel's own indices, never
  from the config's top-k, a key once for a query however many heads gathered it (NSA's also counts the keys its
  compression and window read: ``attnlab.functional.nsa.nsa_keys_read``).
  Any other attention layer's keys are those its kernel scored and left unmasked: the finite entries of the
  ``masked_scores`` the eager kernel hands the :class:`~attnlab.observe.Recorder`, a key counted once however
  many heads read it (as the gathers count a latent or a shared key once). A recurrent or convolution layer
  scores no keys (it reads a state of fixed size): 0.
- **State bytes**: what the cache's tensors hold (``attnlab.cache.stored_bytes``), read off the cache after it
  was filled, divided by the tokens it holds where a figure a token is wanted.

Shapes: B = batch, H = heads, Tq = queries, S = key slots.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.cache import stored_bytes
from attnlab.observe import Recorder

METERED = ("keys_read", "window_read")  # the buffers a gathering layer counts its reads in


def _metered(att: torch.nn.Module) -> list[torch.Tensor]:
    return [b for name, b in att.named_buffers(recurse=False) if name in METERED]


def keys_read(model: Any, caches: Any, token: torch.Tensor) -> list[int]:
    """Keys each layer of ``model`` read to decode ``token`` (1, 1) after what ``caches`` holds (the caches take
    the token). Runs under a Recorder, so dense layers run the eager kernel; time nothing with it."""
    if token.shape != (1, 1):
        raise ValueError(
            f"keys_read meters one decoded token of one row: token of shape (1, 1), got {tuple(token.shape)}"
        )
    blocks = list(model.blocks)
    for block in blocks:
        for meter in _metered(block.att):
            meter.zero_()
    with torch.no_grad(), Recorder(names=["masked_scores"]) as rec:
        model(token, caches=caches, last_only=True)
    counted = [0] * len(blocks)
    where = {id(block.att): i for i, block in enumerate(blocks)}
    layers = {name: where[id(m)] for name, m in model.named_modules() if id(m) in where}  # "trf_blocks.3.att": 3
    for step in rec.steps:  # the module as the state dict names it: a layer's attention, or a module inside it
        layer = next(
            (i for name, i in layers.items() if step.module == name or step.module.startswith(name + ".")), None
        )
        if layer is None or _metered(blocks[layer].att):
            continue  # not a layer's attention, or its own meter says it, from its indices
        finite = torch.isfinite(step.tensor).any(dim=1)  # (B, H, Tq, S) -> (B, Tq, S): a key read by any head
        counted[layer] += int(finite.sum())
    for i, block in enumerate(blocks):
        meters = _metered(block.att)
        if meters:
            counted[i] = sum(int(m) for m in meters)
    return counted


def state_bytes(caches: Any) -> int:
    """Bytes the caches' tensors hold (``attnlab.cache.stored_bytes``), batch and capacity as built."""
    return stored_bytes(caches)
