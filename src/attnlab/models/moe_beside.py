"""A mixture of experts beside the MLP (Gemma 4's ``enable_moe_block``), not in its place.

Qwen3-MoE and DeepSeek-V3 replace a layer's MLP with experts (``parts.MoEFeedForward``). Gemma 4 keeps the dense
MLP and adds experts next to it, both read off the same residual stream x after attention:

    mlp     = post_norm_mlp(MLP(norm2(x)))                       the dense MLP, normed once more
    chosen, weights = router(x)                                  on x itself, before any norm of the block's
    experts = post_norm_experts(sum_k weights_k * expert_k(pre_norm(x)))
    x + post_norm2(mlp + experts)                                the block's own post-feedforward norm after

The router (:class:`Router`) RMS-normalizes x without a weight, multiplies it by a learned ``scale`` and by
E^-0.5, scores the experts with ``proj``, keeps the top k of the softmax, renormalizes them to sum to 1 and
multiplies each by its expert's ``per_expert_scale``. The experts (:class:`FusedExperts`) keep their weights fused
as the checkpoints do: ``gate_up_proj`` (N, 2F, E), the gate rows then the up rows of each expert, and
``down_proj`` (N, E, F); each is a GeGLU: down(gelu_tanh(gate x) * up x).

``FusedExperts.forward`` runs each expert on the tokens routed to it; :meth:`FusedExperts.every_expert` is the
readable form, every expert on every token and the unchosen weighted 0, tested equal.

Shapes: B = batch, T = tokens, E = emb_dim, N = experts, k = experts a token, F = an expert's hidden width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int


class Router(nn.Module):
    """Gemma 4's router: the top ``k`` of ``num_experts`` for each token, weighted as the module docstring says."""

    def __init__(self, *, emb_dim: int, num_experts: int, k: int, eps: float = 1e-6) -> None:
        super().__init__()
        check_positive_int("emb_dim", emb_dim, limit=2**16)
        check_positive_int("num_experts", num_experts, limit=4096)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_experts:
            raise ValueError(f"k must be an int in [1, num_experts={num_experts}], got {k!r}")
        self.k = k
        self.norm = nn.RMSNorm(emb_dim, eps=eps, elementwise_affine=False)
        self.proj = nn.Linear(emb_dim, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(emb_dim))  # (E,)
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))  # (N,)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen experts (B, T, k) of each token of x (B, T, E) and their weights (B, T, k), in x's dtype."""
        scores = self.proj(self.norm(x) * self.scale * x.shape[-1] ** -0.5)  # (B, T, N)
        probs = torch.softmax(scores.float(), dim=-1)  # in float32, as the checkpoints' code does
        weights, chosen = probs.topk(self.k, dim=-1)  # (B, T, k)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.per_expert_scale[chosen]
        return chosen, weights.to(x.dtype)


class FusedExperts(nn.Module):
    """``num_experts`` GeGLU experts in two fused tensors, ``gate_up_proj`` (N, 2F, E) and ``down_proj`` (N, E, F)."""

    def __init__(self, *, emb_dim: int, hidden_dim: int, num_experts: int) -> None:
        super().__init__()
        check_positive_int("hidden_dim", hidden_dim, limit=2**20)
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, emb_dim))  # (N, 2F, E)
        self.down_proj = nn.Parameter(torch.empty(num_experts, emb_dim, hidden_dim))  # (N, E, F)
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)
        self.act = nn.GELU(approximate="tanh")

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on x (..., E) -> (..., E)."""
        gate, up = nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)  # (..., F) each
        return nn.functional.linear(self.act(gate) * up, self.down_proj[e])

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x (B, T, E), each token's ``chosen`` experts (B, T, k) and their ``weights`` (B, T, k) -> (B, T, E)."""
        flat, out = x.reshape(-1, x.shape[-1]), torch.zeros_like(x).reshape(-1, x.shape[-1])  # (B*T, E)
        chosen, weights = chosen.reshape(-1, chosen.shape[-1]), weights.reshape(-1, weights.shape[-1])  # (B*T, k)
        for e in range(self.num_experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)  # the tokens routed to e, and where in their top-k
            if token.numel():
                out.index_add_(0, token, self.expert(e, flat[token]) * weights[token, slot, None])
        return out.reshape(x.shape)  # (B, T, E)

    def every_expert(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The readable form: every expert on every token, weighted by the router (0 for the unchosen)."""
        gating = torch.zeros(*x.shape[:-1], self.num_experts, dtype=x.dtype, device=x.device)  # (B, T, N)
        gating.scatter_(-1, chosen, weights)
        outputs = torch.stack([self.expert(e, x) for e in range(self.num_experts)], dim=-2)  # (B, T, N, E)
        return (gating[..., None] * outputs).sum(dim=-2)


class MoEBeside(nn.Module):
    """The experts beside a layer's MLP, with their router and three norms: :meth:`forward` (x, mlp) gives what the
    block's ``post_norm2`` takes in place of the MLP's output alone."""

    def __init__(self, *, emb_dim: int, hidden_dim: int, num_experts: int, k: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.router = Router(emb_dim=emb_dim, num_experts=num_experts, k=k, eps=eps)
        self.experts = FusedExperts(emb_dim=emb_dim, hidden_dim=hidden_dim, num_experts=num_experts)
        self.pre_norm = nn.RMSNorm(emb_dim, eps=eps)  # Gemma 4's pre_feedforward_layernorm_2
        self.post_norm_mlp = nn.RMSNorm(emb_dim, eps=eps)  # post_feedforward_layernorm_1
        self.post_norm_experts = nn.RMSNorm(emb_dim, eps=eps)  # post_feedforward_layernorm_2

    def forward(self, x: torch.Tensor, mlp: torch.Tensor) -> torch.Tensor:
        """x (B, T, E), the residual stream after attention, and the MLP's output on it (B, T, E) -> (B, T, E)."""
        chosen, weights = self.router(x)
        experts = self.experts(self.pre_norm(x), chosen, weights)
        return self.post_norm_mlp(mlp) + self.post_norm_experts(experts)
