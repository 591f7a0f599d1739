"""How a layer's lightning indexer trains: apart from the language model, by its own loss (DeepSeek-V3.2).

A top-k is a choice, so the language-model loss sends an indexer no gradient. A layer with an indexer
(``IndexedAttention``; V4's compressed-sparse ``CompressedAttention``) therefore keeps, at each call made in
training with gradients on, ``index_loss``: the KL divergence from its main attention's weights on the keys each
query chose to the indexer's softmax there (``attnlab.functional.selection.indexer_loss``). The indexer's inputs
are detached, and so is the main attention's side: the loss trains the indexer alone, and the language-model loss
everything else. ``attnlab.models.train`` adds :func:`take_index_losses` to its loss at each step and clips the
indexers' gradients apart from the rest (:func:`indexer_parameters`); a loop of your own does the same.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class TrainsIndexer:
    """Mixed into a layer with an indexer: ``index_loss`` is the last call's loss, where that call kept one (in
    training, with gradients on), and None after any other call or once taken."""

    index_loss: torch.Tensor | None = None
    training: bool  # nn.Module's

    def keeps_index_loss(self) -> bool:
        """Whether this call keeps a loss for the indexer: in training mode, with gradients on."""
        return self.training and torch.is_grad_enabled()


def take_index_losses(model: nn.Module) -> torch.Tensor | None:
    """The sum of the indexer losses ``model``'s layers kept since they were last taken (None where none was
    kept); each is taken once, so a layer holds no graph after the step that used it."""
    losses = []
    for module in model.modules():
        if isinstance(module, TrainsIndexer) and module.index_loss is not None:
            losses.append(module.index_loss)
            module.index_loss = None
    if not losses:
        return None
    return torch.stack(losses).sum()


def indexer_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every indexer in ``model`` (those only the indexer loss trains), each once."""
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        indexer = getattr(module, "indexer", None) if isinstance(module, TrainsIndexer) else None
        if isinstance(indexer, nn.Module):
            seen |= {id(p): p for p in indexer.parameters()}
    return list(seen.values())
