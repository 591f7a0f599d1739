"""Gemma 4 (text) checkpoints: ``Gemma4ForCausalLM``, model_type "gemma4_text", and the text model of the multimodal
``Gemma4ForConditionalGeneration`` folders the hub publishes (model_type "gemma4").

Gemma 3's block (sandwich norms, GeGLU, QK-norm, embeddings times sqrt(hidden_size)), and:

- the attention scale is 1 (QK-norm sets the scores' size); every RMSNorm multiplies by its weight (not 1 + w as
  Gemma 3's): the file's weights are read as they are; each value head is RMS-normed without a weight (v_norm);
- each layer type has its own shape: the full layers' ``global_head_dim`` and ``num_global_key_value_heads``
  (the latter only with ``attention_k_eq_v``), or a ``per_layer_config`` giving them per layer, as transformers
  writes it; with ``attention_k_eq_v`` a full layer has no v_proj, its raw k_proj output is its value;
- each layer type has its own RoPE: by default theta 10000 on the sliding layers and a proportional RoPE on the
  full ones (theta 1e6, a quarter of the head's frequencies turning);
- KV sharing: the last ``num_kv_shared_layers`` layers have no k_proj, v_proj or k_norm and attend over the
  keys and values of the last earlier layer of their type; ``use_double_wide_mlp`` doubles their MLP;
- per-layer embeddings (``hidden_size_per_layer_input``: ``attnlab.models.per_layer``), experts beside the MLP
  (``enable_moe_block``: ``attnlab.models.moe_beside``, fused as the file holds them: ``experts.gate_up_proj``
  (N, 2F, E) and ``experts.down_proj`` (N, E, F), no ``.weight``), a ``layer_scalar`` buffer on each layer;
- ``final_logit_softcapping``.

transformers has no conversion for gemma4: the names on disk are its modules' names, read and written here.
A hub folder is the multimodal wrapper: its text model (``model.language_model.*``) is read; its vision and audio
towers and their embedders (``NOT_LOADED``) are not loaded, and a model read from a wrapper is not saved back.
Every setting ``Gemma4TextConfig`` reads is read or refused by name from config.json alone, before any weight, by
``gemma4_config.py`` (its :func:`config_from_hf`, this family's reader).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families import llama
from attnlab.models.families import rope as rope_settings
from attnlab.models.families.gemma4_config import config_from_hf
from attnlab.models.families.named import Names, read_names, write_names
from attnlab.models.layer_shape import LayerShape

__all__ = ["MODEL_TYPES", "config_from_hf", "from_hf", "holds", "to_hf"]

MODEL_TYPES = ("gemma4_text", "gemma4")
NOT_LOADED = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
MOE = {  # Gemma 4's names under model.layers.N. -> attnlab's under trf_blocks.N.moe.
    "router.proj.weight": "router.proj.weight",
    "router.scale": "router.scale",
    "router.per_expert_scale": "router.per_expert_scale",
    "experts.gate_up_proj": "experts.gate_up_proj",
    "experts.down_proj": "experts.down_proj",
    "pre_feedforward_layernorm_2.weight": "pre_norm.weight",
    "post_feedforward_layernorm_1.weight": "post_norm_mlp.weight",
    "post_feedforward_layernorm_2.weight": "post_norm_experts.weight",
}
PLE = {  # per-layer inputs, per layer -> attnlab's under trf_blocks.N.end.per_layer.
    "per_layer_input_gate.weight": "gate.weight",
    "per_layer_projection.weight": "projection.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}
NORMS = {"norm1": "input_layernorm", "post_norm1": "post_attention_layernorm"}
NORMS |= {"norm2": "pre_feedforward_layernorm", "post_norm2": "post_feedforward_layernorm"}


def _names(config: GPTConfig, prefix: str) -> list[tuple[Names, list[int]]]:
    """Per layer (and once for the rest), the (file names, attnlab's) pairs and the rows of the stacked qkv."""
    top: Names = [
        ((prefix + "embed_tokens.weight",), "tok_emb.weight"),
        ((prefix + "norm.weight",), "final_norm.weight"),
    ]
    if config.ple_dim:
        top += [((prefix + "embed_tokens_per_layer.weight",), "ple.embed.weight")]
        top += [((prefix + "per_layer_model_projection.weight",), "ple.projection.weight")]
        top += [((prefix + "per_layer_projection_norm.weight",), "ple.norm.weight")]
    if not config.tie_weights:
        top.append((("lm_head.weight",), "out_head.weight"))
    out: list[tuple[Names, list[int]]] = [(top, [])]
    for i in range(config.n_layers):
        h, b, shape = f"{prefix}layers.{i}.", f"trf_blocks.{i}.", config.layer_shape(i)
        at, own = h + "self_attn.", shape.kv_source is None
        names: Names = [((f"{h}{theirs}.weight",), f"{b}{ours}.weight") for ours, theirs in NORMS.items()]
        names += [((f"{h}mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in llama.FC.items()]
        projections = "qkv" if own and not shape.keys_as_values else "qk" if own else "q"
        names.append((tuple(f"{at}{p}_proj.weight" for p in projections), b + "att.qkv.weight"))
        names += [((f"{at}{p}_norm.weight",), f"{b}att.{p}_norm.weight") for p in ("qk" if own else "q")]
        names += [((at + "o_proj.weight",), b + "att.out_proj.weight"), ((h + "layer_scalar",), b + "end.layer_scalar")]
        names += [((h + theirs,), f"{b}end.per_layer.{ours}") for theirs, ours in PLE.items() if config.ple_dim]
        names += [((h + theirs,), f"{b}moe.{ours}") for theirs, ours in MOE.items() if config.moe_beside]
        rows = [config.n_heads * shape.head_dim] + [shape.n_kv_heads * shape.head_dim] * (len(projections) - 1)
        out.append((names, rows))
    return out


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's (q, k and v, where the layer has them, stacked as rows); a wrapper's towers
    (``NOT_LOADED``) set aside; the rest as ``<unexpected>name``."""
    wrapped = any(k.startswith("model.language_model.") for k in tensors)
    kept = {k: v for k, v in tensors.items() if not k.startswith(NOT_LOADED)}
    names = [pair for layer, _ in _names(config, "model.language_model." if wrapped else "model.") for pair in layer]
    return read_names(kept, names, tie=config.tie_weights)


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``Gemma4ForCausalLM``'s names, and its config.json; a model read from the wrapper
    is refused before anything is written."""
    if config.family != "gemma4_text":
        raise ValueError(
            "this model was read from a Gemma 4 multimodal folder whose vision and audio towers attnlab did not "
            "load, so that folder cannot be written back whole; save it as the text model alone with "
            "GPT(model.config.with_(family='gemma4_text')) filled from model.state_dict()"
        )
    out: dict[str, torch.Tensor] = {}
    for names, rows in _names(config, "model."):
        out |= write_names(state, names, rows=rows)
    return out, hf_config(config)


def holds(config: GPTConfig) -> bool:
    """Whether ``Gemma4ForCausalLM`` holds this config exactly (the wrapper's: refused by :func:`to_hf`)."""
    full, sliding = config.full_layers or LayerShape(), config.sliding_layers or LayerShape()
    types = config.layer_types or ()
    return (
        config.family in MODEL_TYPES
        and (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "sandwich", "geglu")
        and config.rope
        and config.qk_norm
        and config.v_norm
        and config.layer_scalar
        and (config.attn_scale, config.emb_scale) == (1.0, math.sqrt(config.emb_dim))
        and not (config.bias or config.qkv_bias or config.sinks or config.attn_output_gate or config.attn_head_gate)
        and (config.rotary_dim, config.score_mod, config.value_scale, config.kv_lora_rank) == (None, None, None, None)
        and config.v_head_dim == 0
        and bool(config.num_experts) == config.moe_beside
        and config.dense_layers == ()
        and set(types) <= {"full", "sliding"}
        and types[-1:] == ("full",)
        and (config.window is not None or "sliding" not in types)
        and (full.sinks, full.rotary_dim, sliding.sinks, sliding.rotary_dim) == (None, None, None, None)
        and (sliding.head_dim, sliding.n_kv_heads, sliding.keys_as_values) == (None, None, False)
        and all(_scaling_written(s, p) for s, p in ((config.rope_scaling, full), (config.rope_local_scaling, sliding)))
        and config.qk_norm_over == "head"
        and (config.rope_local_base is not None) == ("sliding" in types)
        and (config.double_wide_shared <= (config.kv_shared_layers > 0))
    )


def _scaling_written(scaling: RopeScaling | None, shape: LayerShape) -> bool:
    """Whether a layer type's RoPE scaling has an entry that reads back as it: a proportional RoPE's a factor
    alone (linear), another's any kind, YaRN's truncated (transformers' entry by layer type always truncates)."""
    if scaling is None:
        return True
    return scaling.kind == "linear" if shape.rope_proportion is not None else scaling.kind != "yarn" or scaling.truncate


def _written(base: float, scaling: RopeScaling | None, proportion: float | None) -> dict[str, Any]:
    if proportion is None:
        return rope_settings.written(base, scaling)
    out = {"rope_type": "proportional", "rope_theta": float(base), "partial_rotary_factor": proportion}
    return out | ({"factor": scaling.factor} if scaling is not None else {})


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``Gemma4ForCausalLM`` (what :func:`config_from_hf` reads back), attnlab's config beside."""
    written = llama.hf_common(config, "gemma4_text", "Gemma4ForCausalLM")
    types = config.layer_types or ("full",) * config.n_layers
    full = config.layer_shape(types.index("full"))
    model = {"head_dim": config.d_head, "num_key_value_heads": config.n_kv_heads or config.n_heads}
    shape = {"head_dim": full.head_dim, "num_key_value_heads": full.n_kv_heads}
    apart = {k: v for k, v in shape.items() if v != model[k]}  # what the full layers set apart, as transformers writes
    proportions = [(s or LayerShape()).rope_proportion for s in (config.full_layers, config.sliding_layers)]
    local = (config.rope_local_base or config.rope_base, config.rope_local_scaling)
    return {
        **{k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling", "hidden_act")},
        "head_dim": config.d_head,
        "num_key_value_heads": config.n_kv_heads or config.n_heads,
        "per_layer_config": {str(i): apart for i, t in enumerate(types) if t == "full" and apart},
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": _written(config.rope_base, config.rope_scaling, proportions[0]),
            "sliding_attention": _written(*local, proportions[1]),
        },
        "layer_types": [f"{t}_attention" for t in types],
        "sliding_window": config.window or 512,
        "final_logit_softcapping": config.final_softcap,
        "use_bidirectional_attention": None,
        "attention_bias": False,
        "attention_k_eq_v": full.keys_as_values,
        "num_kv_shared_layers": config.kv_shared_layers,
        "use_double_wide_mlp": config.double_wide_shared,
        "hidden_size_per_layer_input": config.ple_dim,
        "vocab_size_per_layer_input": config.vocab_size,
        "enable_moe_block": config.moe_beside,
        "num_experts": config.num_experts or None,
        "top_k_experts": config.num_experts_per_tok or None,
        "moe_intermediate_size": (config.moe_intermediate_size or config.ff_dim) if config.moe_beside else None,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
