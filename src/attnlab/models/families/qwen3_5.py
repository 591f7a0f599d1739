"""Qwen3.5 (text) checkpoints: ``Qwen3_5ForCausalLM``, model_type "qwen3_5_text", and the text model of the
multimodal ``Qwen3_5ForConditionalGeneration`` folders the hub publishes (model_type "qwen3_5").

Three Gated DeltaNet layers to one softmax layer (``layer_types``: "linear_attention", "full_attention"):

- a Gated DeltaNet layer (``linear_attn``): q, k and v from one projection (``in_proj_qkv``, rows q, k, v),
  through a short causal convolution (``conv1d``, one filter of ``linear_conv_kernel_dim`` taps a channel) and
  silu; ``linear_num_value_heads`` value heads, each query/key head serving several; the decay from ``A_log``,
  ``dt_bias`` and ``in_proj_a``, beta from ``in_proj_b``, the output normed per head and gated by silu(``in_proj_z``)
  (a plain RMSNorm: its weight is read as is);
- a softmax layer (``self_attn``): QK-norm, partial RoPE (``partial_rotary_factor`` of each head turns) and an
  output gate, stored in ``q_proj`` beside the queries: per head, D query rows then D gate rows;
- every other RMSNorm (input, post-attention, QK, final) is zero-centred: it scales by (1 + weight), so the file
  holds weight - 1 (read as 1 + w, written as w - 1, as Gemma's);
- RoPE's ``mrope_section`` splits the rotated pairs between a token's time, height and width positions, which are
  one position for text: on text it is plain RoPE over the rotated dimensions, and that is what is read.

A hub folder is the multimodal wrapper: its text model is read (``model.language_model.*``), its vision tower
(``model.visual.*``) is not loaded, and neither are the multi-token-prediction weights (``mtp.*``), which
transformers' ``Qwen3_5ForCausalLM`` skips too. A model read from a wrapper is not saved back (the wrapper it came
from cannot be written whole). Qwen3.5-MoE (``qwen3_5_moe.py``) is read and written through these functions: its
experts are named by :func:`_mlp_names`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama
from attnlab.models.families import rope as rope_settings
from attnlab.models.families.rows import Rows

MODEL_TYPES = ("qwen3_5_text", "qwen3_5")
WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # a multimodal folder's type: its text's
KINDS: dict[str, Literal["delta", "full"]] = {"linear_attention": "delta", "full_attention": "full"}
NOT_LOADED = ("mtp.", "model.visual.")  # multi-token prediction and the vision tower: read by no decoder here
MROPE = ("mrope_section", "mrope_interleaved")  # one position for text in all three sections: plain RoPE
DELTA = {  # a Gated DeltaNet layer's tensors, by attnlab's name under att.
    "qkv.weight": "in_proj_qkv.weight",
    "z_proj.weight": "in_proj_z.weight",
    "b_proj.weight": "in_proj_b.weight",
    "a_proj.weight": "in_proj_a.weight",
    "A_log": "A_log",
    "dt_bias": "dt_bias",
    "conv.weight": "conv1d.weight",
    "norm.weight": "norm.weight",
    "out_proj.weight": "out_proj.weight",
}


def text_of(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    """The text model's config: the config itself, or a wrapper's ``text_config`` with the wrapper's
    ``tie_word_embeddings`` (transformers ties the head by the top-level flag)."""
    kind = raw.get("model_type")
    if kind not in WRAPPERS:
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{str(where / 'config.json')!r} is a {kind} wrapper without a text_config object")
    tie = raw.get("tie_word_embeddings", False)  # the wrapper ties its head by its own flag, not the text config's
    return {**text, "model_type": WRAPPERS[str(kind)], "tie_word_embeddings": tie}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    return GPTConfig(**fields(raw, where, text_of(raw, where)), family=raw["model_type"])


def fields(raw: dict[str, Any], where: Path, text: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig's fields but the family, for the text model ``text`` of the folder's config ``raw`` (``raw`` itself
    or a wrapper's text_config), refused from the config alone: quantized weights, a layer type not read here."""
    quantized = raw.get("quantization_config") or text.get("quantization_config")
    layer_types = llama.hybrid_layers({**text, "quantization_config": quantized}, where, KINDS)
    llama.refuse(text, where, attention_bias=(None, False))
    common = llama.common(text, where, theta=None)
    return dict(
        **common,
        **_rope(text, where, common["head_dim"] or common["emb_dim"] // common["n_heads"]),
        qk_norm=True,
        attn_output_gate=True,
        layer_types=layer_types,
        delta_heads=llama.need(text, "linear_num_key_heads", where),
        delta_head_dim=llama.need(text, "linear_key_head_dim", where),
        delta_value_heads=llama.need(text, "linear_num_value_heads", where),
        delta_value_dim=llama.need(text, "linear_value_head_dim", where),
        conv_kernel=llama.need(text, "linear_conv_kernel_dim", where),
    )


def _rope(raw: dict[str, Any], where: Path, head_dim: int) -> dict[str, Any]:
    """RoPE's theta and scaling (``rope.py``), and the rotated dimensions: ``partial_rotary_factor`` of a head."""
    given = raw.get("rope_parameters") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{str(where / 'config.json')!r}: rope_parameters must be an object, got {given!r:.60}")
    share = given.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))  # Qwen3_5TextConfig's default
    rest = {k: v for k, v in given.items() if k not in (*MROPE, "partial_rotary_factor")}
    base, scaling = rope_settings.entry(
        rest, where, theta=raw.get("rope_theta", 10000.0), max_positions=rope_settings.max_positions(raw)
    )
    rotary = int(head_dim * share)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or rotary % 2 or not 2 <= rotary <= head_dim:
        raise ValueError(
            f"{str(where / 'config.json')!r}: partial_rotary_factor={share!r} turns {rotary} of {head_dim} dimensions; "
            "attnlab reads an even number of at least 2"
        )
    return dict(rope_base=base, rope_scaling=scaling, rotary_dim=None if rotary == head_dim else rotary)


def _names(config: GPTConfig, prefix: str) -> list[tuple[str, str]]:
    """(name in the file, attnlab's) for every tensor but the full layers' q_proj, which holds two of attnlab's."""
    out = [(prefix + "embed_tokens.weight", "tok_emb.weight"), (prefix + "norm.weight", "final_norm.weight")]
    for i, kind in enumerate(config.layer_types or ()):
        h, b = f"{prefix}layers.{i}.", f"trf_blocks.{i}."
        out += [
            (h + "input_layernorm.weight", b + "norm1.weight"),
            (h + "post_attention_layernorm.weight", b + "norm2.weight"),
        ]
        out += _mlp_names(config, h + "mlp.", b + "ff.")
        if kind == "delta":
            out += [(h + "linear_attn." + theirs, b + "att." + ours) for ours, theirs in DELTA.items()]
        else:
            out += [(h + f"self_attn.{p}_norm.weight", b + f"att.{p}_norm.weight") for p in "qk"]
            out.append((h + "self_attn.o_proj.weight", b + "att.out_proj.weight"))
    if not config.tie_weights:
        out.append(("lm_head.weight", "out_head.weight"))
    return out


def _mlp_names(config: GPTConfig, theirs: str, ours: str) -> list[tuple[str, str]]:
    """A layer's MLP: the dense SwiGLU; or (Qwen3.5-MoE) the router, the shared expert and its gate, and each
    expert by its own names, as the file keeps them (transformers fuses the experts on load, splits them on save)."""
    if not config.num_experts:
        return [(f"{theirs}{p}_proj.weight", f"{ours}{fc}.weight") for p, fc in llama.FC.items()]
    out = [(theirs + "gate.weight", ours + "gate.weight")]
    out += [(f"{theirs}shared_expert.{p}_proj.weight", f"{ours}shared.{fc}.weight") for p, fc in llama.FC.items()]
    out.append((theirs + "shared_expert_gate.weight", ours + "shared_gate.weight"))
    for e in range(config.num_experts):
        out += [(f"{theirs}experts.{e}.{p}_proj.weight", f"{ours}{fc}.{e}.weight") for p, fc in llama.FC.items()]
    return out


def _centred(ours: str) -> bool:
    """A zero-centred norm (scales by 1 + weight): every RMSNorm but the Gated DeltaNet layers' gated one."""
    return "norm" in ours.rsplit(".", 2)[-2] and not ours.endswith(".att.norm.weight")


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's: q_proj's query rows stacked with k_proj and v_proj into qkv, its gate rows
    into the output gate; zero-centred norms read as 1 + w; what no decoder here reads (``NOT_LOADED``) set aside."""
    wrapped = any(k.startswith("model.language_model.") for k in tensors)
    prefix = "model.language_model." if wrapped else "model."
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for theirs, ours in _names(config, prefix):
        origin[ours] = theirs
        if theirs in tensors:
            out[ours] = tensors[theirs] + 1.0 if _centred(ours) else tensors[theirs]
    h, d = config.n_heads, config.d_head
    for i, kind in enumerate(config.layer_types or ()):
        if kind != "full":
            continue
        at, b = f"{prefix}layers.{i}.self_attn.", f"trf_blocks.{i}.att."
        q = tensors.get(at + "q_proj.weight")
        origin[b + "qkv.weight"] = f"{at}q_proj.weight (query rows)/k_proj.weight/v_proj.weight"
        origin[b + "gate.weight"] = f"{at}q_proj.weight (gate rows)"
        if q is None or q.dim() != 2 or q.shape[0] != 2 * h * d:
            if q is not None:  # the fit's check names the shape it expected
                out[b + "gate.weight"] = q
            continue
        pairs = q.view(h, 2, d, q.shape[1])  # (H, 2, D, E): per head, D query rows then D gate rows
        out[b + "gate.weight"] = pairs[:, 1].reshape(h * d, -1)
        kv = [tensors.get(at + f"{p}_proj.weight") for p in "kv"]
        if all(t is not None for t in kv):
            out[b + "qkv.weight"] = Rows((pairs[:, 0].reshape(h * d, -1), *(t for t in kv if t is not None)))
    known = set(origin.values()) | {
        at + f"{p}_proj.weight" for at in _attention_prefixes(config, prefix) for p in "qkv"
    }
    known.add("lm_head.weight")  # a tied head in the file: the embedding again
    for key, tensor in tensors.items():
        if key not in known and not key.startswith(NOT_LOADED):
            out[f"<unexpected>{key}"] = tensor
    if config.tie_weights and "lm_head.weight" in tensors:
        out["out_head.weight"], origin["out_head.weight"] = tensors["lm_head.weight"], "lm_head.weight"
    return out, origin


def _attention_prefixes(config: GPTConfig, prefix: str) -> list[str]:
    return [f"{prefix}layers.{i}.self_attn." for i, kind in enumerate(config.layer_types or ()) if kind == "full"]


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``Qwen3_5ForCausalLM``'s names (:func:`tensors`) and its config.json."""
    return tensors(state, config), hf_config(config)


def tensors(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """The model's tensors under the text model's names, q_proj interleaved back, zero-centred norms as w - 1;
    refused, before anything is written, for a model read from a multimodal wrapper."""
    if config.family in WRAPPERS:
        raise ValueError(
            f"this model was read from a {config.family} multimodal folder whose vision tower attnlab did not load, "
            "so that folder cannot be written back whole; save it as the text model alone with "
            f"GPT(model.config.with_(family={WRAPPERS[config.family]!r})) filled from model.state_dict()"
        )
    out: dict[str, torch.Tensor] = {}
    for theirs, ours in _names(config, "model."):
        tensor = state[ours].detach()
        out[theirs] = (tensor - 1.0 if _centred(ours) else tensor).contiguous().clone()
    h, h_kv, d = config.n_heads, config.n_kv_heads or config.n_heads, config.d_head
    for i, kind in enumerate(config.layer_types or ()):
        if kind == "full":
            at, b = f"model.layers.{i}.self_attn.", f"trf_blocks.{i}.att."
            q, k, v = state[b + "qkv.weight"].detach().split([h * d, h_kv * d, h_kv * d])  # rows: q, k, v
            gate = state[b + "gate.weight"].detach()
            pairs = torch.stack([q.view(h, d, -1), gate.view(h, d, -1)], dim=1)  # (H, 2, D, E)
            out |= {at + "q_proj.weight": pairs.reshape(2 * h * d, -1).contiguous()}
            out |= {at + "k_proj.weight": k.contiguous().clone(), at + "v_proj.weight": v.contiguous().clone()}
    return out


def holds(config: GPTConfig) -> bool:
    """Whether ``Qwen3_5ForCausalLM`` holds this config exactly."""
    return config.family in MODEL_TYPES and not config.num_experts and lays_out(config)


def lays_out(config: GPTConfig) -> bool:
    """Qwen3.5's layers, dense or MoE: Gated DeltaNet with its convolution beside gated softmax layers, QK-norm."""
    delta = config.conv_kernel is not None and config.delta_heads is not None
    return (
        delta
        and (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "swiglu")
        and config.rope
        and config.qk_norm
        and config.attn_output_gate
        and not (config.bias or config.qkv_bias or config.sinks)
        and config.window is None
        and config.score_mod is None
        and not config.shapes_layers
        and set(config.layer_types or ()) <= {"delta", "full"}
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``Qwen3_5ForCausalLM`` (what :func:`config_from_hf` reads back), attnlab's config beside."""
    written = llama.hf_common(config, "qwen3_5_text", "Qwen3_5ForCausalLM")
    parameters = {
        **written["rope_parameters"],
        "partial_rotary_factor": (config.rotary_dim or config.d_head) / config.d_head,
    }
    return {
        **{k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling")},
        "rope_parameters": parameters,
        "attention_bias": False,
        "layer_types": [{"delta": "linear_attention", "full": "full_attention"}[t] for t in config.layer_types or ()],
        "linear_num_key_heads": config.delta_heads,
        "linear_key_head_dim": config.delta_head_dim,
        "linear_num_value_heads": config.delta_value_heads,
        "linear_value_head_dim": config.delta_value_dim,
        "linear_conv_kernel_dim": config.conv_kernel,
    }
