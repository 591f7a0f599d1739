"""gpt-oss checkpoints: ``GptOssForCausalLM``. Llama's attention names (``llama.py``) with biases on q, k, v and
o, a learned sink logit per head (``self_attn.sinks`` to ``att.sinks``), banded (sliding) layers alternating with
full ones, YaRN RoPE, and on every layer a mixture of experts:

- the router ``mlp.router`` (with a bias) is ``ff.gate``; each token's top-k router logits are softmaxed, which
  is the softmax over all experts renormalized over the chosen (``norm_topk_prob``);
- the experts are stored fused: ``mlp.experts.gate_up_proj`` (E, H, 2I) for x @ W, gate and up interleaved
  (even columns the gate, odd the up), with ``gate_up_proj_bias`` (E, 2I); ``down_proj`` (E, I, H) with
  ``down_proj_bias`` (E, H). Expert e's ``fc1``, ``fc2`` and ``fc3`` are views of these, copied in when the
  model is filled, and stacked back when it is saved;
- their SwiGLU is clamped (``mlp="clamped_swiglu"``).

The published checkpoints store the experts in MXFP4 (``*_blocks``, ``*_scales``): not read here; dequantize
them with transformers first. Official configs have ``attention_bias`` true and no QK-norm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama

MODEL_TYPES = ("gpt_oss",)
KINDS: dict[str, Any] = {"full_attention": "full", "sliding_attention": "sliding"}
ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
ROPE |= {"original_max_position_embeddings": 4096}  # GptOssConfig's RoPE when its config.json names none


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    llama.refuse(raw, where, attention_bias=(None, True), swiglu_limit=(None, 7.0), swiglu_alpha=(None, 1.702))
    if any(key.endswith(("_blocks", "_scales")) for key in raw.get("quantization_config", {}) or {}):
        raise ValueError(f"{str(where)!r} holds MXFP4 experts; dequantize them with transformers first")
    if raw.get("rope_parameters") is None and not raw.get("rope_scaling"):  # GptOssConfig's own RoPE
        raw = {**raw, "rope_parameters": ROPE}
    common = llama.common({**raw, "hidden_act": "silu"}, where, theta=150000.0)
    n = common["n_layers"]
    named = raw.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if not isinstance(named, list) or len(named) != n or any(t not in KINDS for t in named):
        raise ValueError(
            f"{str(where / 'config.json')!r}: layer_types must list {n} of {list(KINDS)}, got {named!r:.80}"
        )
    types = tuple(KINDS[t] for t in named)
    experts = raw.get("num_local_experts", raw.get("num_experts")) or llama.need(raw, "num_local_experts", where)
    return GPTConfig(
        **{**common, "mlp": "clamped_swiglu", "bias": True},
        qkv_bias=True,
        sinks=True,
        window=raw.get("sliding_window", 128) if "sliding" in types else None,
        layer_types=types if "sliding" in types else None,
        num_experts=experts,
        num_experts_per_tok=llama.need(raw, "num_experts_per_tok", where),
        moe_intermediate_size=common["hidden_dim"],
        norm_topk_prob=True,
        family="gpt_oss",
    )


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The experts' views (fc1, fc2, fc3 of each from the fused tensors) and the router, in attnlab's names."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.mlp.", f"trf_blocks.{i}.ff."
        for p in ("weight", "bias"):
            origin[b + f"gate.{p}"] = h + f"router.{p}"
            if h + f"router.{p}" in tensors:
                out[b + f"gate.{p}"] = tensors[h + f"router.{p}"]
        up, up_bias = tensors.get(h + "experts.gate_up_proj"), tensors.get(h + "experts.gate_up_proj_bias")
        down, down_bias = tensors.get(h + "experts.down_proj"), tensors.get(h + "experts.down_proj_bias")
        for e in range(config.num_experts):
            x = f"{b}fc"
            names = {
                f"{x}1.{e}.weight": ("gate_up_proj", up, lambda t, e=e: t[e][:, 0::2].T),  # (I, H): the gate
                f"{x}2.{e}.weight": ("gate_up_proj", up, lambda t, e=e: t[e][:, 1::2].T),  # the up
                f"{x}1.{e}.bias": ("gate_up_proj_bias", up_bias, lambda t, e=e: t[e][0::2]),
                f"{x}2.{e}.bias": ("gate_up_proj_bias", up_bias, lambda t, e=e: t[e][1::2]),
                f"{x}3.{e}.weight": ("down_proj", down, lambda t, e=e: t[e].T),  # (H, I)
                f"{x}3.{e}.bias": ("down_proj_bias", down_bias, lambda t, e=e: t[e]),
            }
            for ours, (theirs, tensor, view) in names.items():
                origin[ours] = f"{h}experts.{theirs}[{e}]"
                if tensor is not None and tensor.dim() >= 2 and tensor.shape[0] == config.num_experts:
                    out[ours] = view(tensor)  # a view: copied into the model when it is filled
    return out, origin


def experts_known(config: GPTConfig) -> set[str]:
    names = ["router.weight", "router.bias", "experts.gate_up_proj", "experts.gate_up_proj_bias"]
    names += ["experts.down_proj", "experts.down_proj_bias"]
    return {f"model.layers.{i}.mlp.{n}" for i in range(config.n_layers) for n in names}


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """The experts stacked back into gpt-oss's fused, interleaved tensors, and the router."""
    out: dict[str, torch.Tensor] = {}
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.mlp.", f"trf_blocks.{i}.ff."
        out[h + "router.weight"], out[h + "router.bias"] = state[b + "gate.weight"], state[b + "gate.bias"]
        e_range = range(config.num_experts)
        gate = torch.stack([state[f"{b}fc1.{e}.weight"].T for e in e_range])  # (E, H, I)
        up = torch.stack([state[f"{b}fc2.{e}.weight"].T for e in e_range])
        out[h + "experts.gate_up_proj"] = torch.stack((gate, up), dim=-1).flatten(-2)  # (E, H, 2I): interleaved
        gate_b = torch.stack([state[f"{b}fc1.{e}.bias"] for e in e_range])  # (E, I)
        up_b = torch.stack([state[f"{b}fc2.{e}.bias"] for e in e_range])
        out[h + "experts.gate_up_proj_bias"] = torch.stack((gate_b, up_b), dim=-1).flatten(-2)  # (E, 2I)
        out[h + "experts.down_proj"] = torch.stack([state[f"{b}fc3.{e}.weight"].T for e in e_range])  # (E, I, H)
        out[h + "experts.down_proj_bias"] = torch.stack([state[f"{b}fc3.{e}.bias"] for e in e_range])
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def holds(config: GPTConfig) -> bool:
    return (
        (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "clamped_swiglu")
        and config.rope
        and config.bias
        and config.qkv_bias
        and config.sinks
        and config.num_experts > 0
        and config.dense_layers == ()
        and not config.qk_norm
        and config.rotary_dim is None
        and config.rope_local_base is None
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    types = config.layer_types or ((("sliding",) if config.window else ("full",)) * config.n_layers)
    return {
        **llama.hf_common(config, "gpt_oss", "GptOssForCausalLM"),
        "intermediate_size": config.moe_intermediate_size or config.ff_dim,
        "num_local_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "attention_bias": True,
        "sliding_window": config.window,
        "layer_types": [f"{t}_attention" for t in types],
        "swiglu_limit": 7.0,
    }
