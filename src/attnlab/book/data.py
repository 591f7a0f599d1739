"""The chapter's running example: "Your journey starts with one step".

Six tokens, one word each, embedded in 3 dimensions. The values are the book's
(listing 3.1 and the reading notes in ``shared/seed``); they are hand-picked,
not trained.
"""

from __future__ import annotations

import torch

WORDS: tuple[str, ...] = ("Your", "journey", "starts", "with", "one", "step")

_EMBEDDINGS: tuple[tuple[float, float, float], ...] = (
    (0.43, 0.15, 0.89),  # Your     (x^1)
    (0.55, 0.87, 0.66),  # journey  (x^2)
    (0.57, 0.85, 0.64),  # starts   (x^3)
    (0.22, 0.58, 0.33),  # with     (x^4)
    (0.77, 0.25, 0.10),  # one      (x^5)
    (0.05, 0.80, 0.55),  # step     (x^6)
)


def embedded_inputs() -> torch.Tensor:
    """Return a fresh (6, 3) float32 tensor of the chapter's token embeddings.

    A new tensor each call, so a caller that modifies it in place cannot
    change what the next caller sees.

    >>> embedded_inputs()[1]
    tensor([0.5500, 0.8700, 0.6600])
    """
    return torch.tensor(_EMBEDDINGS, dtype=torch.float32)


def batched_inputs() -> torch.Tensor:
    """The book's batch of two copies of the inputs, shape (2, 6, 3).

    Section 3.5.3 stacks the same sentence twice to show that the classes
    handle a batch dimension.
    """
    inputs = embedded_inputs()
    return torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
