"""The decoder's parts: its norms, its MLPs and the block that holds them, each chosen by ``GPTConfig``.

A block is the book's ``TransformerBlock`` in its names (``norm1``, ``att``, ``drop_resid``, ``norm2``, ``ff``),
whatever the family:

- GPT-2 (chapter 4): LayerNorm before each sublayer, a 4x GELU MLP (``ff.0``, ``ff.2``) with biases;
- Llama 3, Mistral, Qwen2 and Qwen3 (the book's Llama 3 and Qwen3 chapters): RMSNorm before each sublayer and
  the gated ``FeedForward`` (``fc1`` the gate, ``fc2`` up, ``fc3`` down), no biases;
- ``norm_placement="post"`` (OLMo 2): each sublayer's output is normed before it is added back.

The attention is ``attnlab.Attention`` with the layer's own window from the config's pattern, so every backend,
cache and the Recorder work in every family.

Shapes: B = batch, T = tokens, E = emb_dim, F = the MLP's hidden width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.cache import Cache
from attnlab.functional.visibility import Visibility
from attnlab.models.config import GPTConfig
from attnlab.nn.attention import Attention, SharedKV
from attnlab.nn.convolution import GatedShortConvolution
from attnlab.nn.kda import KimiDeltaAttention
from attnlab.nn.latent import LatentAttention
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention


def make_norm(config: GPTConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` (emb_dim): LayerNorm (GPT-2's, with a shift) or RMSNorm (scale only)."""
    size = config.emb_dim if size is None else size
    if config.norm == "rmsnorm":
        return nn.RMSNorm(size, eps=config.layer_norm_eps)
    return nn.LayerNorm(size, eps=config.layer_norm_eps)


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

    A shared expert (``shared_dim``: DeepSeek's, Qwen3.5-MoE's) runs on every token beside the routed ones; with
    ``shared_gate`` (Qwen3.5-MoE's ``shared_expert_gate``) its output is scaled per token by sigmoid(shared_gate(x)).

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
        shared_dim: int = 0,
        shared_gate: bool = False,
    ) -> None:
        super().__init__()
        if shared_gate and not shared_dim:
            raise ValueError(f"shared_gate=True opens a shared expert, and shared_dim={shared_dim!r}: give its width")
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


def make_mlp(config: GPTConfig, layer: int = 0) -> nn.Module:
    """GPT-2's GELU MLP (``ff.0``, ``ff.2``: the names its checkpoints keep), the gated FeedForward, or on a
    sparse layer the mixture of experts."""
    e, f = config.emb_dim, config.ff_dim
    if config.double_wide_shared and config.kv_source(layer) is not None:
        f = 2 * f  # Gemma 4's layers that share keys: an MLP twice as wide (use_double_wide_mlp)
    if config.num_experts and layer not in config.dense_layers:
        return MoEFeedForward(
            emb_dim=e,
            hidden_dim=config.moe_intermediate_size or f,
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            norm_topk_prob=config.norm_topk_prob,
            clamped=config.mlp == "clamped_swiglu",
            grouped=(config.n_group, config.topk_group, config.routed_scaling_factor)
            if config.router == "grouped_sigmoid"
            else None,
            shared_dim=config.n_shared_experts * (config.shared_expert_dim or config.moe_intermediate_size or f),
            shared_gate=config.shared_expert_gate,
        )
    if config.mlp in ("swiglu", "geglu"):
        return FeedForward(emb_dim=e, hidden_dim=f, bias=config.bias, gelu=config.mlp == "geglu")
    return nn.Sequential(
        nn.Linear(e, f, bias=config.bias), nn.GELU(approximate="tanh"), nn.Linear(f, e, bias=config.bias)
    )


def make_attention(config: GPTConfig, layer: int) -> LatentAttention:
    """A layer's latent attention (DeepSeek-V3), its RoPE and window from the config's pattern."""
    assert config.kv_lora_rank is not None
    rope_base, rope_scaling = config.layer_rope(layer)
    return LatentAttention(
        d_in=config.emb_dim,
        num_heads=config.n_heads,
        kv_lora_rank=config.kv_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim,
        q_lora_rank=config.q_lora_rank,
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        rope_interleave=config.rope_interleave,
        rope=config.rope,
        window=config.layer_window(layer),
        scale=config.attn_scale,
        backend=config.backend,
    )


def make_kda(config: GPTConfig) -> KimiDeltaAttention:
    """A "kda" layer (Kimi Linear): its heads, head size, convolution and output norm's epsilon from the config's
    delta_* fields and conv_kernel."""
    return KimiDeltaAttention(
        d_in=config.emb_dim,
        num_heads=config.delta_heads or config.n_heads,
        head_dim=config.delta_head_dim or config.d_head,
        out_bias=config.bias,
        norm_eps=config.delta_norm_eps or config.layer_norm_eps,
        conv_kernel=config.conv_kernel,
    )


def make_softmax(config: GPTConfig, layer: int) -> Attention:
    """Layer ``layer``'s softmax attention: its type's own shape (``GPTConfig.layer_shape``), window and RoPE."""
    shape, (rope_base, rope_scaling) = config.layer_shape(layer), config.layer_rope(layer)
    return Attention(
        d_in=config.emb_dim,
        num_heads=config.n_heads,
        num_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        qkv_bias=config.qkv_bias,
        out_bias=config.bias,
        dropout=config.drop_rate,
        is_causal=True,
        window=config.layer_window(layer),
        rope=config.rope,
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        rotary_dim=shape.rotary_dim,
        qk_norm=config.qk_norm,
        qk_norm_over=config.qk_norm_over,
        norm_eps=config.layer_norm_eps,
        sinks=shape.sinks,
        scale=config.attn_scale,
        backend=config.backend,
        output_gate=config.attn_output_gate,
        head_gate=config.attn_head_gate,
        value_dim=config.v_head_dim or None,
        value_scale=config.value_scale,
        keys_as_values=shape.keys_as_values,
        v_norm=config.v_norm,
        rope_proportion=shape.rope_proportion,
        kv_source=shape.kv_source,
    )


class TransformerBlock(nn.Module):
    """Pre-norm: x + drop(att(norm1(x))), then x + drop(ff(norm2(x))); post-norm: x + drop(norm1(att(x))), then
    x + drop(norm2(ff(x))); sandwich: x + drop(post_norm1(att(norm1(x)))), then x + drop(post_norm2(ff(norm2(x)))).
    Layer ``layer`` of the config's pattern: full attention or its sliding window, with that kind's RoPE, and a
    dense MLP or the mixture of experts."""

    def __init__(self, config: GPTConfig, *, layer: int = 0) -> None:
        super().__init__()
        e = config.emb_dim
        kind = config.layer_type(layer)
        own = config.delta_norm_placement if kind == "delta" else None  # OLMo-Hybrid's: pre there, post elsewhere
        self.placement = own or config.norm_placement
        self.norm1 = make_norm(config)
        self.att: Attention | LinearAttention | GatedDeltaNet | KimiDeltaAttention | GatedShortConvolution = (
            make_kda(config)
            if kind == "kda"
            else make_attention(config, layer)
            if config.kv_lora_rank is not None
            else LinearAttention(d_in=e, num_heads=config.n_heads, head_dim=config.d_head, out_bias=config.bias)
            if kind == "linear"
            else GatedDeltaNet(
                d_in=e,
                num_heads=config.delta_heads or config.n_heads,
                head_dim=config.delta_head_dim or config.d_head,
                out_bias=config.bias,
                norm_eps=config.delta_norm_eps or config.layer_norm_eps,
                value_heads=config.delta_value_heads,
                value_dim=config.delta_value_dim,
                conv_kernel=config.conv_kernel,
                negative_eigenvalues=config.delta_negative_eigenvalues,
            )
            if kind == "delta"
            else GatedShortConvolution(d_in=e, kernel=config.conv_kernel or 3, bias=config.conv_bias)
            if kind == "conv"
            else make_softmax(config, layer)
        )
        self.drop_resid = nn.Dropout(config.drop_rate)
        self.norm2 = make_norm(config)
        self.ff = make_mlp(config, layer)
        if self.placement == "sandwich":  # Gemma's: a norm after each sublayer too, before it is added back
            self.post_norm1, self.post_norm2 = make_norm(config), make_norm(config)

    def forward(
        self,
        x: torch.Tensor,
        *,
        visibility: Visibility,
        positions: torch.Tensor | None,
        cache: Cache | None,
        shared: dict[int | None, SharedKV] | None = None,
    ) -> torch.Tensor:
        """``shared``: the keys the model's layers leave for the layers that share them (KV sharing), or None."""
        if self.placement == "post":
            x = x + self._resid(self.norm1(self._attend(x, visibility, positions, cache, shared)))
            return x + self._resid(self.norm2(self.ff(x)))
        if self.placement == "sandwich":
            att = self._attend(self.norm1(x), visibility, positions, cache, shared)
            x = x + self._resid(self.post_norm1(att))
            return x + self._resid(self.post_norm2(self.ff(self.norm2(x))))
        x = x + self._resid(self._attend(self.norm1(x), visibility, positions, cache, shared))
        return x + self._resid(self.ff(self.norm2(x)))

    def _attend(
        self,
        x: torch.Tensor,
        visibility: Visibility,
        positions: torch.Tensor | None,
        cache: Cache | None,
        shared: dict[int | None, SharedKV] | None,
    ) -> torch.Tensor:
        if shared is not None and isinstance(self.att, Attention):
            return self.att(x, visibility=visibility, positions=positions, cache=cache, shared=shared)
        return self.att(x, visibility=visibility, positions=positions, cache=cache)

    def _resid(self, x: torch.Tensor) -> torch.Tensor:
        """``drop_resid`` while it trains (its own flag: Monte-Carlo dropout turns on the dropouts alone); in
        evaluation, where it is the identity, not called at all (a module call costs a decode step microseconds
        per layer)."""
        return self.drop_resid(x) if self.drop_resid.training else x
