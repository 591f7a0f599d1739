"""The zoo's sparse variants compared (issue 59 item 6): what a dense head would have attended to, against what
each sparse layer's selection kept, on one text.

For each layer that chooses keys (``attnlab.explain.selection.selecting_layers``: DSA, a V4 compressed-sparse
layer, MoBA, NSA's selected branch) the **dense mass kept**, averaged over the text's queries and the layer's heads:
1 where the selection reads every key each query may see (top-k covering the context), below 1 where it left
some dense weight unread. The zoo's models read bytes (``ByteTokenizer``).
"""

from __future__ import annotations

import torch

from attnlab.explain.selection import kept_mass
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import ByteTokenizer


def zoo_kept_mass(model: GPT, text: str) -> dict[int, float]:
    """Per sparse layer of a zoo ``model`` (its index), the mean dense mass kept over the queries of ``text``.

    Raises:
        ValueError: ``text`` is empty or longer than the model's context, or the model has no sparse layer.
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty string (the zoo's models read its bytes), got {text!r}")
    ids = ByteTokenizer().encode(text)
    if len(ids) > model.config.context_length:
        raise ValueError(
            f"text is {len(ids)} bytes, past the model's context_length={model.config.context_length}: pass a shorter one"
        )
    return {row.layer: row.mean for row in kept_mass(model, torch.tensor([ids]))}
