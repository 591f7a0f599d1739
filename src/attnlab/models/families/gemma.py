"""Gemma 3 (text) checkpoints: ``Gemma3ForCausalLM``, model_type "gemma3_text". Llama's tensor names
(``llama.py``) with Gemma's block:

- sandwich norms: x + post_norm1(att(norm1(x))), then x + post_norm2(ff(norm2(x)));
- Gemma's RMSNorm multiplies by (1 + weight), so its files hold weight - 1: read as 1 + w, written as w - 1;
- GeGLU (the tanh GELU on the gate), QK-norm, embeddings times sqrt(hidden_size) (as a float32 scalar);
- the softmax scale is query_pre_attn_scalar ** -0.5, not head_dim ** -0.5;
- 5 sliding layers to 1 full one (``layer_types``, or every ``sliding_window_pattern``-th layer full), each
  type with its own RoPE: theta and scaling from its ``rope_parameters`` entry (``rope.py``);
- ``final_logit_softcapping`` when set. ``attn_logit_softcapping`` is stored by transformers' Gemma 3 but never
  applied, so it is not applied here either.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families import llama, rope

MODEL_TYPES = ("gemma3_text",)
KINDS: dict[str, Literal["full", "sliding"]] = {"full_attention": "full", "sliding_attention": "sliding"}
THETAS = {"full_attention": 1e6, "sliding_attention": 1e4}  # Gemma3TextConfig's defaults


def _rope(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    """Each layer type's theta and scaling, as ``Gemma3TextConfig`` fills them in: v5's one entry per layer type,
    or v4's ``rope_theta`` and ``rope_scaling`` (the full layers') with ``rope_local_base_freq`` (the sliding)."""
    given = raw.get("rope_parameters")
    if given is None:
        given = {}
    if not isinstance(given, dict) or set(given) - set(KINDS):  # transformers reads only the entries by type
        raise ValueError(
            f"{str(where / 'config.json')!r}: a gemma3_text rope_parameters holds one entry per layer type "
            f"({list(KINDS)}), got {given!r:.120}"
        )
    entries = {kind: dict(given.get(kind) or {"rope_type": "default"}) for kind in KINDS}
    if raw.get("rope_scaling"):
        entries["full_attention"].update(raw["rope_scaling"])
    thetas = {"full_attention": raw.get("rope_theta"), "sliding_attention": raw.get("rope_local_base_freq")}
    read: dict[str, tuple[float, RopeScaling | None]] = {}
    for kind, entry in entries.items():
        if raw.get("partial_rotary_factor") is not None:
            entry.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
        theta = thetas[kind]
        theta = THETAS[kind] if theta is None else theta
        read[kind] = rope.entry(entry, where, theta=theta, max_positions=rope.max_positions(raw), layer=kind)
    (base, scaling), (local, local_scaling) = read["full_attention"], read["sliding_attention"]
    return dict(rope_base=base, rope_scaling=scaling, rope_local_base=local, rope_local_scaling=local_scaling)


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    llama.refuse(raw, where, hidden_activation=(None, "gelu_pytorch_tanh"), use_bidirectional_attention=(None, False))
    llama.refuse(raw, where, attention_bias=(None, False))
    tie = raw.get("tie_word_embeddings", True)
    common = llama.common({**raw, "hidden_act": "silu", "tie_word_embeddings": tie}, where, theta=None)
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
    scalings = (config.rope_scaling, config.rope_local_scaling)
    return (
        (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "sandwich", "geglu")
        and config.rope
        and config.qk_norm
        and not config.bias
        and not config.qkv_bias
        and config.num_experts == 0
        and config.rotary_dim is None
        and config.score_mod is None
        and all(s is None or s.truncate for s in scalings)  # an entry by layer type always truncates YaRN's ramp
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    values = llama.hf_common(config, "gemma3_text", "Gemma3ForCausalLM")
    types = config.layer_types or ((("sliding",) if config.window else ("full",)) * config.n_layers)
    local = config.layer_rope(types.index("sliding")) if "sliding" in types else (config.rope_base, None)
    assert config.emb_scale is not None and config.attn_scale is not None  # holds() saw a Gemma config
    return {
        **values,
        "hidden_act": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": values["rope_parameters"],
            "sliding_attention": rope.written(*local),
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
