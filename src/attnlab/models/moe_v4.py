"""DeepSeek-V4's mixture of experts: a router's scores weigh the chosen experts, chosen by those scores plus a
correction bias, or, on a hash layer, by a fixed table of token ids (``tid2eid``: the same experts for a token
wherever it stands); one shared expert runs on every token. Each SwiGLU is clamped: the gate at most
``limit``, the up within [-limit, limit].

Scores: ``sqrtsoftplus`` sqrt(softplus(z)), ``softmax`` or ``sigmoid`` of the router's logits z; the chosen
scores are divided by their sum, then times ``routed_scaling_factor``.

``forward`` runs each expert on the tokens routed to it; :meth:`every_expert` (every expert on every token, the
unchosen weighted 0) is the readable form, tested equal.

Shapes: B = batch, T = tokens, E = emb_dim, F = an expert's width, N = experts, k = experts a token.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ClampedSwiGLU(nn.Module):
    """down(silu(min(gate(x), limit)) * clamp(up(x), -limit, limit)), (B, T, E) -> (B, T, E)."""

    def __init__(self, *, emb_dim: int, hidden_dim: int, limit: float) -> None:
        super().__init__()
        self.limit = limit
        self.gate = nn.Linear(emb_dim, hidden_dim, bias=False)
        self.up = nn.Linear(emb_dim, hidden_dim, bias=False)
        self.down = nn.Linear(hidden_dim, emb_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate(x).clamp(max=self.limit), self.up(x).clamp(-self.limit, self.limit)
        return self.down(F.silu(g) * u)


class Router(nn.Module):
    """The scores' weights (``weight``) and what chooses: the correction ``bias``, or ``tid2eid`` on a hash layer."""

    bias: torch.Tensor
    tid2eid: torch.Tensor

    def __init__(self, *, emb_dim: int, num_experts: int, k: int, vocab_size: int | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, emb_dim))
        if vocab_size is None:
            self.register_buffer("bias", torch.zeros(num_experts))
        else:  # a persistent table: the checkpoint's
            self.register_buffer("tid2eid", torch.zeros(vocab_size, k, dtype=torch.long))


class DeepseekV4MoE(nn.Module):
    """Keyword-only: emb_dim, hidden_dim (F), num_experts, k, scoring, routed_scaling_factor, limit, and
    vocab_size on a hash layer (None: routed by the scores)."""

    def __init__(
        self,
        *,
        emb_dim: int,
        hidden_dim: int,
        num_experts: int,
        k: int,
        scoring: str,
        routed_scaling_factor: float,
        limit: float,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        self.k, self.scoring, self.factor, self.hashed = k, scoring, routed_scaling_factor, vocab_size is not None
        self.gate = Router(emb_dim=emb_dim, num_experts=num_experts, k=k, vocab_size=vocab_size)
        self.experts = nn.ModuleList(
            [ClampedSwiGLU(emb_dim=emb_dim, hidden_dim=hidden_dim, limit=limit) for _ in range(num_experts)]
        )
        self.shared = ClampedSwiGLU(emb_dim=emb_dim, hidden_dim=hidden_dim, limit=limit)

    def route(self, x: torch.Tensor, ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen experts (B, T, k) and their weights (B, T, k)."""
        logits = F.linear(x, self.gate.weight)  # (B, T, N)
        if self.scoring == "softmax":
            scores = logits.softmax(dim=-1)
        elif self.scoring == "sigmoid":
            scores = logits.sigmoid()
        else:
            scores = F.softplus(logits).sqrt()
        if self.hashed:
            if ids is None:
                raise ValueError("a hash layer routes by token id: pass the ids (GPT passes them as per_layer)")
            chosen = self.gate.tid2eid[ids]  # (B, T, k)
        else:
            chosen = (scores + self.gate.bias).topk(self.k, dim=-1, sorted=False).indices  # (B, T, k)
        weights = scores.gather(-1, chosen)
        return chosen, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.factor

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, E) and the tokens' ids (B, T) -> (B, T, E): each expert on the tokens routed to it."""
        chosen, weights = self.route(x, ids)
        flat, out = x.reshape(-1, x.shape[-1]), torch.zeros_like(x).reshape(-1, x.shape[-1])  # (B * T, E)
        chosen, weights = chosen.reshape(-1, self.k), weights.reshape(-1, self.k)  # (B * T, k)
        for e in chosen.unique().tolist():
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, self.experts[e](flat[token]) * weights[token, slot, None])
        return out.view_as(x) + self.shared(x)

    def every_expert(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The readable form: every expert on every token, weighted by its weight where chosen and 0 elsewhere."""
        chosen, weights = self.route(x, ids)
        dense = torch.zeros(*x.shape[:-1], len(self.experts), dtype=x.dtype, device=x.device)  # (B, T, N)
        dense.scatter_(-1, chosen, weights)
        every = torch.stack([expert(x) for expert in self.experts], dim=-2)  # (B, T, N, E)
        return (dense[..., None] * every).sum(dim=-2) + self.shared(x)
