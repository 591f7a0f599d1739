"""The decoder's MLPs: the gated FeedForward (SwiGLU, GeGLU) and a mixture of experts in its place (Qwen3-MoE,
gpt-oss, DeepSeek-V3), in the names of the book's Llama 3 ``FeedForward`` and Qwen3 ``MoEFeedForward``. Gemma 4's
experts beside the MLP are ``moe_beside.py``'s.

Shapes: B = batch, T = tokens, E = emb_dim, F = the MLP's (an expert's) hidden width, k = experts a token.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class FeedForward(nn.Module):
    """The book's Llama 3 FeedForward, SwiGLU (Shazeer, 2020): fc3(silu(fc1(x)) * fc2(x)), (B, T, E) -> (B, T, E);
    ``gelu=True``: GeGLU, with the tanh GELU on the gate (Gemma's)."""

    def __init__(self, *, emb_dim: int, hidden_dim: int, bias: bool = False, gelu: bool = False) -> None:
        super().__init__()
        self.act = nn.GELU(approximate="tanh") if gelu else nn.SiLU()
        self.fc1 = nn.Linear(emb_dim, hidden_dim, bias=bias)  # the gate (Hugging Face's gate_proj)
        self.fc2 = nn.Linear(emb_dim, hidden_dim, bias=bias)  # up_proj
        self.fc3 = nn.Linear(hidden_dim, emb_dim, bias=bias)  # down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act(self.fc1(x)) * self.fc2(x))  # (B, T, F) -> (B, T, E)


class MoEFeedForward(nn.Module):
    """A mixture of experts, in the names of the book's Qwen3 ``MoEFeedForward``: a router (``gate``) scores the
    ``num_experts`` experts for each token, the ``num_experts_per_tok`` best run, and their outputs are summed
    weighted by the softmax of the router's scores (over all experts, then renormalized over the chosen ones
    when ``norm_topk_prob``: the softmax of the chosen scores, as the book computes it). Expert e is a SwiGLU
    of ``fc1[e]`` (gate), ``fc2[e]`` (up) and ``fc3[e]`` (down).

    A shared expert (``shared``'s width: DeepSeek's, Qwen3.5-MoE's) runs on every token beside the routed ones;
    gated (Qwen3.5-MoE's ``shared_expert_gate``), its output is scaled per token by sigmoid(shared_gate(x)).

    gpt-oss's experts (``clamped=True``) have biases, a router with a bias, and clamp their SwiGLU: the gate g
    at most 7, the up u within [-7, 7], then (u + 1) * g * sigmoid(1.702 g).

    ``forward`` runs each expert on the tokens routed to it; :meth:`every_expert` is the book's readable form,
    every expert on every token and the unchosen weighted 0, tested equal.
    """

    def __init__(
        self,
        *,
        emb_dim: int,
        hidden_dim: int,
        num_experts: int,
        num_experts_per_tok: int,
        norm_topk_prob: bool = True,
        clamped: bool = False,
        grouped: tuple[int, int, float] | None = None,
        shared: tuple[int, bool] = (0, False),
    ) -> None:
        super().__init__()
        shared_dim, shared_gate = shared  # the shared expert's width (0: none) and whether a gate opens it
        if shared_gate and not shared_dim:
            raise ValueError(
                f"shared={shared!r}: a gate opens a shared expert, which needs a width: give (width, True)"
            )
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.norm_topk_prob, self.clamped = norm_topk_prob, clamped
        self.grouped = grouped  # DeepSeek-V3's router: (n_group, topk_group, routed_scaling_factor)
        bias = clamped  # gpt-oss's experts and router have biases; Qwen3-MoE's and DeepSeek's none
        self.gate = nn.Linear(emb_dim, num_experts, bias=bias)
        if grouped is not None:  # chooses, never weighs; float32 as the checkpoints keep it
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))
        self.shared = FeedForward(emb_dim=emb_dim, hidden_dim=shared_dim) if shared_dim else None
        self.shared_gate = nn.Linear(emb_dim, 1, bias=False) if shared_gate else None  # one opening a token
        self.fc1 = nn.ModuleList([nn.Linear(emb_dim, hidden_dim, bias=bias) for _ in range(num_experts)])
        self.fc2 = nn.ModuleList([nn.Linear(emb_dim, hidden_dim, bias=bias) for _ in range(num_experts)])
        self.fc3 = nn.ModuleList([nn.Linear(hidden_dim, emb_dim, bias=bias) for _ in range(num_experts)])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen experts (B, T, k) of each token and their weights (B, T, k), in x's dtype."""
        if self.grouped is not None:
            return self._route_in_groups(x)
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # (B, T, num_experts), in float32 as Qwen3-MoE
        weights, chosen = probs.topk(self.num_experts_per_tok, dim=-1)  # (B, T, k)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights.to(x.dtype)

    def _route_in_groups(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V3: sigmoid scores; the correction bias added to choose (the best topk_group groups by the sum
        of their two best, then the best k experts in them), the unbiased scores to weigh, times the factor."""
        assert self.grouped is not None
        n_group, topk_group, factor = self.grouped
        scores = torch.sigmoid(self.gate(x).float())  # (B, T, experts)
        correction = self.get_buffer("e_score_correction_bias")  # (experts,)
        choice = scores + correction.float()
        groups = choice.unflatten(-1, (n_group, -1))  # (B, T, n_group, experts / n_group)
        best = groups.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices  # (B, T, topk_group)
        kept = torch.zeros(groups.shape[:-1], dtype=torch.bool, device=x.device).scatter_(-1, best, True)
        choice = groups.masked_fill(~kept[..., None], float("-inf")).flatten(-2)  # (B, T, experts)
        chosen = choice.topk(self.num_experts_per_tok, dim=-1).indices  # (B, T, k)
        weights = scores.gather(-1, chosen)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return chosen, (weights * factor).to(x.dtype)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if self.clamped:  # gpt-oss
            g, u = self.fc1[e](x).clamp(max=7.0), self.fc2[e](x).clamp(-7.0, 7.0)
            return self.fc3[e]((u + 1) * (g * torch.sigmoid(1.702 * g)))
        return self.fc3[e](nn.functional.silu(self.fc1[e](x)) * self.fc2[e](x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(x)
        flat, out = x.reshape(-1, x.shape[-1]), torch.zeros_like(x).reshape(-1, x.shape[-1])  # (B*T, E)
        chosen, weights = chosen.reshape(-1, chosen.shape[-1]), weights.reshape(-1, weights.shape[-1])  # (B*T, k)
        for e in range(self.num_experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)  # the tokens routed to e, and where in their top-k
            if token.numel():
                out.index_add_(0, token, self.expert(e, flat[token]) * weights[token, slot, None])
        out = out.reshape(x.shape)  # (B, T, E)
        return self._plus_shared(out, x)

    def every_expert(self, x: torch.Tensor) -> torch.Tensor:
        """The readable form: every expert on every token, weighted by the router (0 for the unchosen)."""
        chosen, weights = self.route(x)
        gating = torch.zeros(*x.shape[:-1], self.num_experts, dtype=x.dtype, device=x.device)  # (B, T, experts)
        gating.scatter_(-1, chosen, weights)
        outputs = torch.stack([self.expert(e, x) for e in range(self.num_experts)], dim=-2)  # (B, T, experts, E)
        out = (gating[..., None] * outputs).sum(dim=-2)
        return self._plus_shared(out, x)

    def _plus_shared(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The routed experts' ``out`` plus the shared expert's output, opened by sigmoid(shared_gate(x)) if gated."""
        if self.shared is None:
            return out
        shared = self.shared(x)  # (B, T, E)
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(x)) * shared  # (B, T, 1) times (B, T, E)
        return out + shared
