"""Gemma 3 (text) checkpoints: ``Gemma3ForCausalLM``, model_type "gemma3_text". Llama's tensor names
(``llama.py``) with Gemma's block:

- sandwich norms: x + post_norm1(att(norm1(x))), then x + post_norm2(ff(norm2(x)));
- Gemma's RMSNorm multiplies by (1 + weight), so its files hold weight - 1: read as 1 + w, written as w - 1;
- GeGLU (the tanh GELU on the gate), QK-norm, embeddings times sqrt(hidden_size) (as a float32 scalar);
- the softmax scale is query_pre_attn_scalar ** -0.5, not head_dim ** -0.5;
- 5 sliding layers to 1 full one (``layer_types``, or every ``sliding_window_pattern``-th layer full), with
  their own RoPE: the full layers' theta and scaling, the sliding layers' ``rope_local_base_freq`` unscaled;
- ``final_logit_softcapping`` when set. ``attn_logit_softcapping`` is stored by transformers' Gemma 3 but never
  applied, so it is not applied here either.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama

MODEL_TYPES = ("gemma3_text",)
KINDS: dict[str, Literal["full", "sliding"]] = {"full_attention": "full", "sliding_attention": "sliding"}


def _rope(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    given = raw.get("rope_parameters")
    if isinstance(given, dict) and "full_attention" in given:  # transformers v5: one entry per layer type
        full = llama.rope({"rope_parameters": given["full_attention"]}, where)
        local = given.get("sliding_attention", {}).get("rope_theta", 10000.0)
        return {**full, "rope_local_base": float(local)}
    full = llama.rope({**raw, "rope_theta": raw.get("rope_theta", 1e6)}, where)
    return {**full, "rope_local_base": float(raw.get("rope_local_base_freq", 10000.0))}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    llama.refuse(raw, where, hidden_activation=(None, "gelu_pytorch_tanh"), use_bidirectional_attention=(None, False))
    llama.refuse(raw, where, attention_bias=(None, False))
    common = {
        **llama.common(
            {**raw, "hidden_act": "silu", "tie_word_embeddings": raw.get("tie_word_embeddings", True)}, where
        )
    }
    n = common["n_layers"]
    named = raw.get("layer_types")
    if named is None:
        every = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        named = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    if not isinstance(named, list) or len(named) != n or any(t not in KINDS for t in named):
        raise ValueError(
            f"{str(where / 'config.json')!r}: layer_types must list {n} of {list(KINDS)}, got {named!r:.80}"
        )
    types = tuple(KINDS[t] for t in named)
    head_dim = raw.get("head_dim") or common["emb_dim"] // common["n_heads"]
    common |= _rope(raw, where)
    return GPTConfig(
        **{**common, "head_dim": head_dim, "mlp": "geglu"},
        norm_placement="sandwich",
        qk_norm=True,
        emb_scale=float(math.sqrt(common["emb_dim"])),
        attn_scale=float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        final_softcap=raw.get("final_logit_softcapping"),
        window=raw.get("sliding_window", 4096) if "sliding" in types else None,
        layer_types=types if "sliding" in types else None,
        family="gemma3_text",
    )


def holds(config: GPTConfig) -> bool:
    return (
        (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "sandwich", "geglu")
        and config.rope
        and config.qk_norm
        and not config.bias
        and not config.qkv_bias
        and config.num_experts == 0
        and config.rotary_dim is None
        and config.score_mod is None
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    values = llama.hf_common(config, "gemma3_text", "Gemma3ForCausalLM")
    full = values.pop("rope_parameters")
    types = config.layer_types or ((("sliding",) if config.window else ("full",)) * config.n_layers)
    local = config.rope_local_base if config.rope_local_base is not None else config.rope_base
    assert config.emb_scale is not None and config.attn_scale is not None  # holds() saw a Gemma config
    return {
        **values,
        "hidden_act": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_theta": float(local), "rope_type": "default"},
        },
        "rope_theta": None,
        "rope_scaling": None,
        "query_pre_attn_scalar": round(config.attn_scale**-2),  # an int in transformers
        "sliding_window": config.window,
        "layer_types": [f"{t}_attention" for t in types],
        "final_logit_softcapping": config.final_softcap,
        "attn_logit_softcapping": None,
        "attention_bias": False,
    }
