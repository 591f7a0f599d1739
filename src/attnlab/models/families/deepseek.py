"""DeepSeek-V3 checkpoints: ``DeepseekV3ForCausalLM``. Llama's pre-norm block with

- multi-head latent attention on every layer (``attnlab.nn.latent``): ``self_attn.q_proj`` or ``q_a_proj``,
  ``q_a_layernorm``, ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``; ``o_proj`` (attnlab's
  ``out_proj``); RoPE on interleaved pairs (``rope_interleave``), YaRN with its ``mscale``: cos and sin times
  mscale(factor, mscale) / mscale(factor, mscale_all_dim), the softmax scale times mscale(factor, mscale_all_dim)^2;
- dense SwiGLU MLPs on the first ``first_k_dense_replace`` layers, then a mixture of ``n_routed_experts``
  routed in groups (``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias``; per expert e on disk,
  ``mlp.experts.e.{gate,up,down}_proj``) and ``n_shared_experts`` always run (``mlp.shared_experts``).

The multi-token-prediction layers some checkpoints add (``num_nextn_predict_layers``) are not part of
``ForCausalLM`` and are ignored by transformers; here they are unexpected tensors, refused by name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families import llama
from attnlab.models.families import rope as rope_settings

MODEL_TYPES = ("deepseek_v3",)


def _rope(raw: dict[str, Any], where: Path, qk_head_dim: int) -> dict[str, Any]:
    """RoPE as every family reads it (``rope.py``), and the softmax scale: times mscale(factor, mscale_all_dim)^2
    when a scaled RoPE sets mscale_all_dim (transformers' ``yarn_apply_mscale``)."""
    values = rope_settings.flat(raw, where)
    scaling: RopeScaling | None = values["rope_scaling"]
    given = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    m_all = given.get("mscale_all_dim")  # only a YaRN entry may hold it (rope_settings.KEYS)
    scale = qk_head_dim**-0.5
    if scaling is not None and m_all:
        scale *= rope_settings.mscale(scaling.factor, m_all) ** 2
    return {**values, "attn_scale": scale}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    common = llama.common(raw, where, theta=None)
    nope, rope = llama.need(raw, "qk_nope_head_dim", where), llama.need(raw, "qk_rope_head_dim", where)
    dense = raw.get("first_k_dense_replace", 3)
    return GPTConfig(
        **{**common, "head_dim": None, "n_kv_heads": None, **_rope(raw, where, nope + rope)},
        kv_lora_rank=llama.need(raw, "kv_lora_rank", where),
        q_lora_rank=raw.get("q_lora_rank"),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=llama.need(raw, "v_head_dim", where),
        rope_interleave=bool(raw.get("rope_interleave", True)),
        num_experts=llama.need(raw, "n_routed_experts", where),
        num_experts_per_tok=llama.need(raw, "num_experts_per_tok", where),
        moe_intermediate_size=llama.need(raw, "moe_intermediate_size", where),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        dense_layers=tuple(range(min(dense, common["n_layers"]))),
        router="grouped_sigmoid",
        n_group=raw.get("n_group", 1),
        topk_group=raw.get("topk_group", 1),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        n_shared_experts=raw.get("n_shared_experts") or 0,
        family="deepseek_v3",
    )


def names(config: GPTConfig) -> llama.Names:
    out: llama.Names = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        att = ["kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"]
        att = (["q_proj"] if config.q_lora_rank is None else ["q_a_proj", "q_a_layernorm", "q_b_proj"]) + att
        out += [((f"{h}self_attn.{n}.weight",), f"{b}att.{n}.weight") for n in att]
        out += [
            ((h + "self_attn.o_proj.weight",), b + "att.out_proj.weight"),
            ((h + "input_layernorm.weight",), b + "norm1.weight"),
            ((h + "post_attention_layernorm.weight",), b + "norm2.weight"),
        ]
        if i in config.dense_layers:
            out += [((f"{h}mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in llama.FC.items()]
            continue
        out += routed_names(h, b, config)
        if config.n_shared_experts:
            out += [
                ((f"{h}mlp.shared_experts.{p}_proj.weight",), f"{b}ff.shared.{fc}.weight") for p, fc in llama.FC.items()
            ]
    out.append((("model.norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


def routed_names(h: str, b: str, config: GPTConfig) -> llama.Names:
    """A layer's router and routed experts (prefix ``h`` in the file, ``b`` in attnlab): the gate, its correction
    bias, and per expert e ``mlp.experts.e.{gate,up,down}_proj`` (MiMo-V2-Flash's too)."""
    out: llama.Names = [
        ((h + "mlp.gate.weight",), b + "ff.gate.weight"),
        ((h + "mlp.gate.e_score_correction_bias",), b + "ff.e_score_correction_bias"),
    ]
    for e in range(config.num_experts):
        out += [((f"{h}mlp.experts.{e}.{p}_proj.weight",), f"{b}ff.{fc}.{e}.weight") for p, fc in llama.FC.items()]
    return out


def holds(config: GPTConfig) -> bool:
    return (
        config.kv_lora_rank is not None
        and config.router == "grouped_sigmoid"
        and (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "swiglu")
        and not config.bias
        and config.window is None
        and config.dense_layers == tuple(range(len(config.dense_layers)))
        and config.rope_local_base is None
        and _scale_written(config)
    )


def _scale_written(config: GPTConfig) -> bool:
    """Whether config.json can give the softmax scale back: the head's own, or YaRN's mscale_all_dim on it."""
    s, qk = config.rope_scaling, config.qk_nope_head_dim + config.qk_rope_head_dim
    return config.attn_scale in (None, qk**-0.5) or (s is not None and s.kind == "yarn" and s.factor > 1)


def hf_config(config: GPTConfig) -> dict[str, Any]:
    values = llama.hf_common(config, "deepseek_v3", "DeepseekV3ForCausalLM")
    parameters = values["rope_parameters"]
    s, qk = config.rope_scaling, config.qk_nope_head_dim + config.qk_rope_head_dim
    if config.attn_scale is not None and config.attn_scale != qk**-0.5:  # _scale_written: YaRN stretches
        assert s is not None and s.kind == "yarn"
        m_all = math.sqrt(config.attn_scale / qk**-0.5)  # = mscale(factor, mscale_all_dim), given back as such
        parameters = {**parameters, "mscale_all_dim": (m_all - 1) / (0.1 * math.log(s.factor))}
    return {
        **values,
        "rope_parameters": parameters,
        "rope_scaling": None,
        "head_dim": config.qk_rope_head_dim,
        "num_key_value_heads": config.n_heads,
        "kv_lora_rank": config.kv_lora_rank,
        "q_lora_rank": config.q_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "rope_interleave": config.rope_interleave,
        "n_routed_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_intermediate_size": config.moe_intermediate_size,
        "norm_topk_prob": config.norm_topk_prob,
        "first_k_dense_replace": len(config.dense_layers),
        "n_group": config.n_group,
        "topk_group": config.topk_group,
        "routed_scaling_factor": config.routed_scaling_factor,
        "n_shared_experts": config.n_shared_experts,
        "num_nextn_predict_layers": 0,
    }
