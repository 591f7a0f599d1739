"""OLMo-Hybrid checkpoints: ``OlmoHybridForCausalLM``, model_type "olmo_hybrid".

Gated DeltaNet layers ("linear_attention") and softmax layers ("full_attention"), each kind with its own block:

- a Gated DeltaNet layer is pre-norm (``attention_layer_norm`` before it, ``feedforward_layer_norm`` before the
  MLP); q, k, v, a, b and the output gate g are separate projections (q, k and v stacked here as the rows of one),
  each of q, k and v with its own short convolution (``q_conv1d`` ...: the channels of one convolution here),
  beta = 2 sigmoid(b) when ``linear_allow_neg_eigval`` (the default: negative eigenvalues), and the gated output
  norm ``o_norm`` has FLA's epsilon, 1e-5;
- a softmax layer is OLMo 2's: post-norm (``feedforward_layer_norm`` after attention, ``post_feedforward_layernorm``
  after the MLP), QK-norm over all heads at once (``q_norm`` over H * D, ``k_norm`` over Hkv * D), and RoPE unless
  ``rope_parameters`` sets ``rope_theta`` to null: then the model has no positions at all (NoPE). A config without
  ``rope_parameters`` runs RoPE at theta 10000, as transformers fills it in;
- norms scale by their weight as stored (no zero-centring).

These are the names of the files OLMo-core writes and transformers saves; transformers renames them when it
loads (``attention_layer_norm`` to ``input_layernorm``, the three convolutions into one ``conv1d``) and back when
it saves. The defaults of a config.json that leaves them out are ``OlmoHybridConfig``'s: the linear layers' key heads and
value heads are the attention heads, their key size 0.75 * hidden_size / key heads, their value size twice that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama
from attnlab.models.families import rope as rope_settings
from attnlab.models.families.rows import Rows

MODEL_TYPES = ("olmo_hybrid",)
KINDS: dict[str, Literal["delta", "full"]] = {"linear_attention": "delta", "full_attention": "full"}
DELTA = {  # a Gated DeltaNet layer's tensors, by attnlab's name under att. (q, k, v: the rows of qkv)
    "z_proj.weight": "g_proj.weight",
    "b_proj.weight": "b_proj.weight",
    "a_proj.weight": "a_proj.weight",
    "A_log": "A_log",
    "dt_bias": "dt_bias",
    "norm.weight": "o_norm.weight",
    "out_proj.weight": "o_proj.weight",
}
NORMS = {  # each kind's two norms, by the file's names (OLMo-core's; transformers renames them when it loads)
    "delta": {"norm1": "attention_layer_norm", "norm2": "feedforward_layer_norm"},  # before attention, the MLP
    "full": {"norm1": "feedforward_layer_norm", "norm2": "post_feedforward_layernorm"},  # after attention, the MLP
}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    layer_types = llama.hybrid_layers(raw, where, KINDS)
    llama.refuse(raw, where, attention_bias=(None, False))
    heads, emb = llama.need(raw, "num_attention_heads", where), llama.need(raw, "hidden_size", where)
    key_heads = raw.get("linear_num_key_heads") or heads
    key_dim = raw.get("linear_key_head_dim") or int(0.75 * emb / key_heads)
    given = raw.get("rope_parameters") or {"rope_type": "default"}  # none: transformers' default RoPE, theta 10000
    positions: dict[str, Any] = {"nope": True}
    if not (isinstance(given, dict) and "rope_theta" in given and given["rope_theta"] is None):  # null: NoPE
        base, scaling = rope_settings.entry(given, where, theta=10000.0, max_positions=rope_settings.max_positions(raw))
        positions = {"rope_base": base, "rope_scaling": scaling}
    common = {**llama.common(raw, where, theta=None), "rope": "nope" not in positions}
    return GPTConfig(
        **common,
        **positions,
        norm_placement="post",
        delta_norm_placement="pre",
        qk_norm=True,
        qk_norm_over="all",
        layer_types=layer_types,
        delta_heads=key_heads,
        delta_head_dim=key_dim,
        delta_value_heads=raw.get("linear_num_value_heads") or heads,
        delta_value_dim=raw.get("linear_value_head_dim") or 2 * key_dim,
        conv_kernel=raw.get("linear_conv_kernel_dim", 4),
        delta_negative_eigenvalues=bool(raw.get("linear_allow_neg_eigval", True)),
        delta_norm_eps=1e-5,  # FLA's FusedRMSNormGated, which OlmoHybridGatedDeltaNet's o_norm follows
        family="olmo_hybrid",
    )


def _names(config: GPTConfig) -> list[tuple[tuple[str, ...], str]]:
    out: list[tuple[tuple[str, ...], str]] = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    for i, kind in enumerate(config.layer_types or ()):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        out += [((h + theirs + ".weight",), f"{b}{ours}.weight") for ours, theirs in NORMS[kind].items()]
        out += [((f"{h}mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in llama.FC.items()]
        at = h + ("linear_attn." if kind == "delta" else "self_attn.")
        out.append((tuple(f"{at}{p}_proj.weight" for p in "qkv"), b + "att.qkv.weight"))  # rows: q, k, v
        if kind == "delta":  # the convolution's filters: q's, k's and v's channels, one file tensor each
            out.append((tuple(f"{at}{p}_conv1d.weight" for p in "qkv"), b + "att.conv.weight"))
            out += [((at + theirs,), b + "att." + ours) for ours, theirs in DELTA.items()]
        else:
            out += [((f"{at}{p}_norm.weight",), f"{b}att.{p}_norm.weight") for p in "qk"]
            out.append(((at + "o_proj.weight",), b + "att.out_proj.weight"))
    out.append((("model.norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


INTERNAL = {".input_layernorm.": ".attention_layer_norm.", ".post_attention_layernorm.": ".feedforward_layer_norm."}


def _as_written(tensors: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """A folder under transformers' own names (``input_layernorm``, ``post_attention_layernorm``, one ``conv1d``
    of q, k and v's channels), which transformers reads as it reads OLMo-core's: renamed to OLMo-core's here."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        for theirs, ours in INTERNAL.items():
            key = key.replace(theirs, ours)
        if key.endswith("linear_attn.conv1d.weight") and tensor.shape[0] == sum(_qkv_rows(config, True)):
            parts = tensor.split(_qkv_rows(config, True))  # (channels, 1, K): q's, k's, v's
            out |= {key.replace("conv1d", f"{p}_conv1d"): part for p, part in zip("qkv", parts, strict=True)}
            continue
        out[key] = tensor
    return out


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's (q, k and v stacked as rows); the rest as ``<unexpected>name``. OLMo-core's
    names, or transformers' own, which a folder may hold as well (:func:`_as_written`)."""
    tensors = _as_written(tensors, config)
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for theirs, ours in _names(config):
        origin[ours] = "/".join(theirs)
        present = [tensors[name] for name in theirs if name in tensors]
        if len(present) == len(theirs):
            out[ours] = present[0] if len(present) == 1 else Rows(tuple(present))
    known = {name for theirs, _ in _names(config) for name in theirs} | {"lm_head.weight"}
    out |= {f"<unexpected>{k}": v for k, v in tensors.items() if k not in known}
    if config.tie_weights and "lm_head.weight" in tensors:
        out["out_head.weight"], origin["out_head.weight"] = tensors["lm_head.weight"], "lm_head.weight"
    return out, origin


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``OlmoHybridForCausalLM``'s names, and its config.json."""
    out: dict[str, torch.Tensor] = {}
    for theirs, ours in _names(config):
        tensor = state[ours].detach()
        if len(theirs) == 3:  # rows: q, k, v
            i = int(ours.split(".")[1])
            delta = (config.layer_types or ())[i] == "delta"
            sizes = _qkv_rows(config, delta)
            pieces: tuple[torch.Tensor, ...] = tensor.split(sizes)
        else:
            pieces = (tensor,)
        out |= {name: piece.contiguous().clone() for name, piece in zip(theirs, pieces, strict=True)}
    return out, hf_config(config)


def _qkv_rows(config: GPTConfig, delta: bool) -> list[int]:
    if delta:
        heads, dk = config.delta_heads or config.n_heads, config.delta_head_dim or config.d_head
        return [heads * dk, heads * dk, (config.delta_value_heads or heads) * (config.delta_value_dim or dk)]
    d, h_kv = config.d_head, config.n_kv_heads or config.n_heads
    return [config.n_heads * d, h_kv * d, h_kv * d]


def holds(config: GPTConfig) -> bool:
    """Whether ``OlmoHybridForCausalLM`` holds this config exactly."""
    return (
        config.family == "olmo_hybrid"
        and (config.norm, config.norm_placement, config.delta_norm_placement, config.mlp)
        == ("rmsnorm", "post", "pre", "swiglu")
        and config.qk_norm
        and config.qk_norm_over == "all"
        and config.rope != config.nope
        and config.rotary_dim is None
        and config.conv_kernel is not None
        and not config.shapes_layers
        and config.delta_norm_eps == 1e-5
        and not (config.bias or config.qkv_bias or config.sinks or config.num_experts or config.attn_output_gate)
        and config.window is None
        and config.score_mod is None
        and set(config.layer_types or ()) == {"delta", "full"}
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``OlmoHybridForCausalLM`` (what :func:`config_from_hf` reads back), attnlab's config beside."""
    written = llama.hf_common(config, "olmo_hybrid", "OlmoHybridForCausalLM")
    drop = ("rope_theta", "rope_scaling", "head_dim") + (("rope_parameters",) if config.nope else ())
    return {
        **{k: v for k, v in written.items() if k not in drop},
        **({"rope_parameters": {"rope_type": "default", "rope_theta": None}} if config.nope else {}),
        "attention_bias": False,
        # OlmoHybridConfig's own token ids (100277, 100257) name tokens of its vocabulary; the model's are not known
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
        "layer_types": [{"delta": "linear_attention", "full": "full_attention"}[t] for t in config.layer_types or ()],
        "linear_num_key_heads": config.delta_heads,
        "linear_key_head_dim": config.delta_head_dim,
        "linear_num_value_heads": config.delta_value_heads,
        "linear_value_head_dim": config.delta_value_dim,
        "linear_conv_kernel_dim": config.conv_kernel,
        "linear_allow_neg_eigval": config.delta_negative_eigenvalues,
    }
