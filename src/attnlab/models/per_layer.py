"""Gemma 4's per-layer parts: per-layer embeddings (PLE), and a scalar on each layer's output.

Per-layer embeddings give every layer a small input of its own, P wide, besides the residual stream. The model
computes them once, for all L layers at a time (:class:`PerLayerEmbedding`), from two sources:

    tok  = embed_tokens_per_layer(ids) * sqrt(P)                           what the token is, (B, T, L, P)
    proj = norm(per_layer_model_projection(x) * E^-0.5)                  what the embedding x says, per layer
    per_layer = (proj + tok) * 2^-0.5

where x is the token embedding already scaled by sqrt(E). Layer l then adds, after its MLP (:class:`PerLayerInput`):

    x + post_norm(projection(gelu_tanh(gate(x)) * per_layer[:, :, l]))

and every layer's output is multiplied by its ``layer_scalar`` (one number a layer, a buffer the checkpoint
holds). :meth:`PerLayerEmbedding.forward` computes all layers' inputs at once; :meth:`PerLayerEmbedding.for_layer`,
the readable form, one layer's from that layer's slice of the weights alone, tested equal.

Shapes: B = batch, T = tokens, E = emb_dim, L = n_layers, P = ple_dim, V = vocab_size.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int


class PerLayerEmbedding(nn.Module):
    """Every layer's per-layer input (B, T, L, P) from the token ids and their scaled embeddings."""

    def __init__(self, *, vocab_size: int, emb_dim: int, n_layers: int, ple_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("emb_dim", emb_dim), ("n_layers", n_layers)):
            check_positive_int(name, value)
        check_positive_int("ple_dim", ple_dim, limit=2**16)
        self.n_layers, self.ple_dim = n_layers, ple_dim
        self.embed = nn.Embedding(vocab_size, n_layers * ple_dim)  # (V, L*P): every layer's table side by side
        self.projection = nn.Linear(emb_dim, n_layers * ple_dim, bias=False)
        self.norm = nn.RMSNorm(ple_dim, eps=eps)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """ids (B, T) and their embeddings x (B, T, E), already scaled -> (B, T, L, P)."""
        shape = (*ids.shape, self.n_layers, self.ple_dim)
        tok = self.embed(ids).view(shape) * self.ple_dim**0.5  # (B, T, L*P) -> (B, T, L, P)
        proj = (self.projection(x) * x.shape[-1] ** -0.5).view(shape)  # (B, T, L*P) -> (B, T, L, P)
        return (self.norm(proj) + tok) * 2**-0.5

    def for_layer(self, ids: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The readable form: layer ``layer``'s input (B, T, P) alone, from its P rows of each weight."""
        rows = slice(layer * self.ple_dim, (layer + 1) * self.ple_dim)
        tok = self.embed.weight[:, rows][ids] * self.ple_dim**0.5  # (B, T, P)
        proj = x @ self.projection.weight[rows].T * x.shape[-1] ** -0.5  # (B, T, P)
        return (self.norm(proj) + tok) * 2**-0.5


class PerLayerInput(nn.Module):
    """What layer l adds from its per-layer input: x + post_norm(projection(gelu_tanh(gate(x)) * input))."""

    def __init__(self, *, emb_dim: int, ple_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.gate = nn.Linear(emb_dim, ple_dim, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.projection = nn.Linear(ple_dim, emb_dim, bias=False)
        self.post_norm = nn.RMSNorm(emb_dim, eps=eps)

    def forward(self, x: torch.Tensor, given: torch.Tensor) -> torch.Tensor:
        """x (B, T, E) and the layer's input (B, T, P) -> (B, T, E)."""
        return x + self.post_norm(self.projection(self.act(self.gate(x)) * given))


class LayerEnd(nn.Module):
    """What Gemma 4's layer ``layer`` does after its MLP: its per-layer input (when the model has PLE), then its
    scalar."""

    def __init__(self, *, layer: int, emb_dim: int, ple_dim: int, scalar: bool, eps: float = 1e-6) -> None:
        super().__init__()
        self.layer = layer
        self.per_layer = PerLayerInput(emb_dim=emb_dim, ple_dim=ple_dim, eps=eps) if ple_dim else None
        if scalar:
            self.register_buffer("layer_scalar", torch.ones(1))  # (1,): in the checkpoint, not trained
        else:
            self.layer_scalar = None

    def forward(self, x: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, E), the block's output, and every layer's per-layer input (B, T, L, P), or None -> (B, T, E)."""
        if self.per_layer is not None:
            if given is None:
                raise ValueError("this layer adds a per-layer input (PLE): run it inside its model, which makes them")
            x = self.per_layer(x, given[:, :, self.layer])  # (B, T, P): this layer's
        return x if self.layer_scalar is None else x * self.layer_scalar
