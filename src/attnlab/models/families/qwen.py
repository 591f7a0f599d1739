"""Qwen2 and Qwen3 checkpoints: Llama's block and names (``llama.py``), with Qwen's attention.

- Qwen2: biases on q, k and v (none on o_proj or the MLP).
- Qwen3: no biases, and QK-norm: one RMSNorm over head_dim for the queries and one for the keys, before RoPE.
- Qwen3-MoE: Qwen3's attention, and a mixture of experts on every ``decoder_sparse_step``-th layer but those in
  ``mlp_only_layers`` (dense SwiGLU there): ``num_experts`` of ``moe_intermediate_size``, ``num_experts_per_tok``
  run per token, renormalized when ``norm_topk_prob`` (false by default); head_dim as the file says.
- All: a sliding window on the layers ``layer_types`` names "sliding_attention" (transformers v5), or, in older
  configs, with ``use_sliding_window`` on every layer from ``max_window_layers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama

MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe")
KINDS = {"full_attention": "full", "sliding_attention": "sliding"}


def _pattern(raw: dict[str, Any], where: Path, n_layers: int) -> dict[str, Any]:
    window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    named = raw.get("layer_types")
    if named is None:  # transformers v4: sliding from max_window_layers on
        start = raw.get("max_window_layers", n_layers)
        named = ["sliding_attention" if window and i >= start else "full_attention" for i in range(n_layers)]
    if not isinstance(named, list) or len(named) != n_layers or any(t not in KINDS for t in named):
        raise ValueError(
            f"{str(where / 'config.json')!r}: layer_types must list {n_layers} of {list(KINDS)}, got {named!r:.80}"
        )
    types = tuple(KINDS[t] for t in named)
    if "sliding" not in types:
        return {}
    if window is None:
        window = llama.need(raw, "sliding_window", where)
    return {"window": window, "layer_types": types}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    common = llama.common(raw, where)
    pattern = _pattern(raw, where, common["n_layers"])
    if raw.get("model_type") == "qwen2":
        return GPTConfig(**common, qkv_bias=True, **pattern, family="qwen2")
    llama.refuse(raw, where, attention_bias=(None, False))
    if raw.get("model_type") == "qwen3_moe":
        return GPTConfig(
            **common, qk_norm=True, **pattern, **_experts(raw, where, common["n_layers"]), family="qwen3_moe"
        )
    return GPTConfig(**common, qk_norm=True, **pattern, family="qwen3")


def _experts(raw: dict[str, Any], where: Path, n_layers: int) -> dict[str, Any]:
    experts = raw.get("num_experts", raw.get("num_local_experts", 0))
    step, dense = raw.get("decoder_sparse_step", 1), raw.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1 or not isinstance(dense, list):
        raise ValueError(f"{str(where / 'config.json')!r}: decoder_sparse_step {step!r}, mlp_only_layers {dense!r}")
    sparse = [i for i in range(n_layers) if experts > 0 and i not in dense and (i + 1) % step == 0]
    return dict(
        num_experts=experts,
        num_experts_per_tok=llama.need(raw, "num_experts_per_tok", where),
        moe_intermediate_size=llama.need(raw, "moe_intermediate_size", where),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        dense_layers=tuple(i for i in range(n_layers) if i not in sparse),
    )


def holds(config: GPTConfig, family: str) -> bool:
    qwen2 = config.qkv_bias and not config.qk_norm and not config.num_experts
    qwen3 = config.qk_norm and not config.qkv_bias and not config.num_experts
    moe = config.qk_norm and not config.qkv_bias and config.num_experts > 0
    return llama.lays_out(config) and {"qwen2": qwen2, "qwen3": qwen3, "qwen3_moe": moe}[family]


def hf_config(config: GPTConfig, family: str) -> dict[str, Any]:
    name = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]
    types = config.layer_types or (("sliding",) if config.window else ("full",)) * config.n_layers
    named = [f"{t}_attention" for t in types]
    return {
        **llama.hf_common(config, family, name),
        "attention_bias": False,
        "use_sliding_window": config.window is not None,
        "sliding_window": config.window,
        "max_window_layers": next((i for i, t in enumerate(types) if t == "sliding"), config.n_layers),
        "layer_types": named,
        **(
            {
                "num_experts": config.num_experts,
                "num_experts_per_tok": config.num_experts_per_tok,
                "moe_intermediate_size": config.moe_intermediate_size or config.ff_dim,
                "norm_topk_prob": config.norm_topk_prob,
                "decoder_sparse_step": 1,
                "mlp_only_layers": list(config.dense_layers),
            }
            if family == "qwen3_moe"
            else {}
        ),
    }
