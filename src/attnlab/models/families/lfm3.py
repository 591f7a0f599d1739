"""LFM3 checkpoints (Liquid AI): ``Lfm3ForCausalLM``, model_type "lfm3".

Three kinds of layer in one stack (``layer_types``): "conv" layers that do not attend at all (a gated short
convolution, ``attnlab.nn.convolution``), "sliding_attention" and "full_attention" layers (Qwen3's attention with
QK-norm and an output gate with one opening a head, ``gate_proj``). Every layer is sandwiched by norms
(``operator_norm`` before the mixer and ``post_operator_norm`` after it, ``ffn_norm`` and ``post_ffn_norm`` around
the MLP) when ``use_sandwich_norm``; the MLP is SwiGLU as ``w1`` (gate), ``w3`` (up), ``w2`` (down); the final norm is
``embedding_norm``. Each attention type has its own RoPE: by default theta 10000 on the sliding layers and a
proportional RoPE on the full ones (theta 1e6, half of each head's frequencies turning).

The names are the file's, which transformers keeps (it renames ``gate_proj`` to ``g_proj`` when it loads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families import llama, rope
from attnlab.models.families.named import Names, read_names, write_names
from attnlab.models.layer_shape import LayerShape

MODEL_TYPES = ("lfm3",)
KINDS: dict[str, Literal["conv", "sliding", "full"]] = {
    "conv": "conv",
    "sliding_attention": "sliding",
    "full_attention": "full",
}
ROPE = {  # Lfm3Config's defaults, per attention type
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
}
FF = {"w1": "fc1", "w3": "fc2", "w2": "fc3"}  # LFM's MLP by the book's names: gate, up, down


def _rope(raw: dict[str, Any], where: Path, types: tuple[str, ...]) -> dict[str, Any]:
    given = raw.get("rope_parameters") or ROPE
    if not isinstance(given, dict) or set(given) - set(ROPE):
        raise ValueError(
            f"{str(where / 'config.json')!r}: an lfm3 rope_parameters holds one entry per attention type "
            f"({list(ROPE)}), got {given!r:.120}"
        )
    read = {kind: rope.typed_entry(dict(given.get(kind) or ROPE[kind]), where, kind, raw) for kind in ROPE}
    (base, scaling, full), (local, local_scaling, sliding) = read["full_attention"], read["sliding_attention"]
    return dict(
        rope_base=base,
        rope_scaling=scaling,
        rope_local_base=local if "sliding" in types else None,
        rope_local_scaling=local_scaling if "sliding" in types else None,
        full_layers=LayerShape(rope_proportion=full) if full is not None else None,
        sliding_layers=LayerShape(rope_proportion=sliding) if sliding is not None and "sliding" in types else None,
    )


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    types = llama.hybrid_layers(raw, where, KINDS)
    llama.refuse(raw, where, attention_bias=(None, False), use_bidirectional_attention=(None, False))
    if "sliding" in types and not raw.get("sliding_window", 256):
        raise ValueError(f"{str(where / 'config.json')!r}: sliding_attention layers need a sliding_window, got null")
    common = llama.common(
        {**raw, "rms_norm_eps": raw.get("norm_eps", 1e-5), "tie_word_embeddings": raw.get("tie_word_embeddings", True)},
        where,
        theta=None,
    )
    return GPTConfig(
        **{**common, "context_length": raw.get("max_position_embeddings", 128_000)},
        **_rope(raw, where, types),
        norm_placement="sandwich" if raw.get("use_sandwich_norm", True) else "pre",
        qk_norm=True,
        attn_head_gate=bool(raw.get("use_attention_gate", True)),
        conv_kernel=raw.get("conv_L_cache", 7),
        conv_bias=bool(raw.get("conv_bias", False)),
        window=raw.get("sliding_window", 256) if "sliding" in types else None,
        layer_types=types,
        family="lfm3",
    )


def _names(config: GPTConfig) -> Names:
    out: Names = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    sandwich = config.norm_placement == "sandwich"
    for i, kind in enumerate(config.layer_types or ()):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        norms = {"norm1": "operator_norm", "norm2": "ffn_norm"}
        norms |= {"post_norm1": "post_operator_norm", "post_norm2": "post_ffn_norm"} if sandwich else {}
        out += [((f"{h}{theirs}.weight",), f"{b}{ours}.weight") for ours, theirs in norms.items()]
        out += [((f"{h}feed_forward.{w}.weight",), f"{b}ff.{fc}.weight") for w, fc in FF.items()]
        if kind == "conv":
            kinds = ("weight", "bias") if config.conv_bias else ("weight",)
            out += [((f"{h}conv.{p}.{k}",), f"{b}att.{p}.{k}") for p in ("in_proj", "conv", "out_proj") for k in kinds]
            continue
        at = h + "self_attn."
        out.append((tuple(f"{at}{p}_proj.weight" for p in "qkv"), b + "att.qkv.weight"))  # rows: q, k, v
        out += [((f"{at}{p}_norm.weight",), f"{b}att.{p}_norm.weight") for p in "qk"]
        out.append(((at + "o_proj.weight",), b + "att.out_proj.weight"))
        if config.attn_head_gate:
            out.append(((at + "gate_proj.weight",), b + "att.gate.weight"))
    out.append((("model.embedding_norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's (q, k and v stacked as rows); the rest as ``<unexpected>name``."""
    return read_names(tensors, _names(config), tie=config.tie_weights)


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``Lfm3ForCausalLM``'s names, and its config.json."""
    d, h_kv = config.d_head, config.n_kv_heads or config.n_heads
    return write_names(state, _names(config), rows=[config.n_heads * d, h_kv * d, h_kv * d]), hf_config(config)


def holds(config: GPTConfig) -> bool:
    """Whether ``Lfm3ForCausalLM`` holds this config exactly: its config.json reads back as the same config (training
    settings aside), so nothing the family cannot write (experts, KV sharing, values apart...) is lost."""
    if config.family != "lfm3" or config.layer_types is None:
        return False
    try:
        again = config_from_hf(hf_config(config), Path("."))
    except (ValueError, TypeError):
        return False
    return again == config.with_(drop_rate=0.0, backend="auto")


def _written(base: float, scaling: RopeScaling | None, shape: LayerShape | None) -> dict[str, Any]:
    if shape is None or shape.rope_proportion is None:
        return rope.written(base, scaling)
    out = {"rope_type": "proportional", "rope_theta": float(base), "partial_rotary_factor": shape.rope_proportion}
    return out | ({"factor": scaling.factor} if scaling is not None else {})


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``Lfm3ForCausalLM`` (what :func:`config_from_hf` reads back), attnlab's config beside."""
    written = llama.hf_common(config, "lfm3", "Lfm3ForCausalLM")
    types = config.layer_types or ()
    local = (config.rope_local_base or config.rope_base, config.rope_local_scaling)
    return {
        **{k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling", "rms_norm_eps", "hidden_act")},
        "norm_eps": config.layer_norm_eps,
        "rope_parameters": {
            "full_attention": _written(config.rope_base, config.rope_scaling, config.full_layers),
            "sliding_attention": _written(*local, config.sliding_layers),
        },
        "layer_types": [{"conv": "conv", "sliding": "sliding_attention", "full": "full_attention"}[t] for t in types],
        "sliding_window": config.window,
        "conv_L_cache": config.conv_kernel,
        "conv_bias": config.conv_bias,
        "use_sandwich_norm": config.norm_placement == "sandwich",
        "use_attention_gate": config.attn_head_gate,
        "attention_bias": False,
        # Lfm3Config's own token ids (124893...) name tokens of its 128,000; the model's are not known here
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
