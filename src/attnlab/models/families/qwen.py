"""Qwen2 and Qwen3 checkpoints: Llama's block and names (``llama.py``), with Qwen's attention.

- Qwen2: biases on q, k and v (none on o_proj or the MLP).
- Qwen3: no biases, and QK-norm: one RMSNorm over head_dim for the queries and one for the keys, before RoPE.
- Both: a sliding window on the layers ``layer_types`` names "sliding_attention" (transformers v5), or, in older
  configs, with ``use_sliding_window`` on every layer from ``max_window_layers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama

MODEL_TYPES = ("qwen2", "qwen3")
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
    return GPTConfig(**common, qk_norm=True, **pattern, family="qwen3")


def holds(config: GPTConfig, family: str) -> bool:
    qwen2 = config.qkv_bias and not config.qk_norm
    qwen3 = config.qk_norm and not config.qkv_bias
    return llama.lays_out(config) and (qwen2 if family == "qwen2" else qwen3)


def hf_config(config: GPTConfig, family: str) -> dict[str, Any]:
    name = "Qwen2ForCausalLM" if family == "qwen2" else "Qwen3ForCausalLM"
    types = config.layer_types or (("sliding",) if config.window else ("full",)) * config.n_layers
    named = [f"{t}_attention" for t in types]
    return {
        **llama.hf_common(config, family, name),
        "attention_bias": False,
        "use_sliding_window": config.window is not None,
        "sliding_window": config.window,
        "max_window_layers": next((i for i, t in enumerate(types) if t == "sliding"), config.n_layers),
        "layer_types": named,
    }
