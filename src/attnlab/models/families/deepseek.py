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

MODEL_TYPES = ("deepseek_v3",)


def _mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _rope(raw: dict[str, Any], where: Path, qk_head_dim: int) -> dict[str, Any]:
    given = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    base = float(given.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = given.get("rope_type", given.get("type", "default"))
    if kind in ("default", None):
        return {"rope_base": base, "attn_scale": qk_head_dim**-0.5}
    if kind != "yarn":
        raise ValueError(f"{str(where / 'config.json')!r}: rope_type {kind!r} is not supported for DeepSeek-V3")
    factor = float(llama.need(given, "factor", where))
    m, m_all = given.get("mscale"), given.get("mscale_all_dim")
    attention_factor = _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else _mscale(factor, 1.0)
    scaling = RopeScaling(
        kind="yarn",
        factor=factor,
        original_context_length=int(given.get("original_max_position_embeddings", 4096)),
        beta_fast=float(given.get("beta_fast") or 32.0),
        beta_slow=float(given.get("beta_slow") or 1.0),
        truncate=bool(given.get("truncate", True)),
        attention_factor=given.get("attention_factor") or attention_factor,
    )
    scale = qk_head_dim**-0.5 * (_mscale(factor, m_all) ** 2 if m_all else 1.0)
    return {"rope_base": base, "rope_scaling": scaling, "attn_scale": scale}


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    common = llama.common({**raw, "rope_parameters": None, "rope_scaling": None}, where)
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
        out += [
            ((h + "mlp.gate.weight",), b + "ff.gate.weight"),
            ((h + "mlp.gate.e_score_correction_bias",), b + "ff.e_score_correction_bias"),
        ]
        for e in range(config.num_experts):
            out += [((f"{h}mlp.experts.{e}.{p}_proj.weight",), f"{b}ff.{fc}.{e}.weight") for p, fc in llama.FC.items()]
        if config.n_shared_experts:
            out += [
                ((f"{h}mlp.shared_experts.{p}_proj.weight",), f"{b}ff.shared.{fc}.weight") for p, fc in llama.FC.items()
            ]
    out.append((("model.norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


def holds(config: GPTConfig) -> bool:
    return (
        config.kv_lora_rank is not None
        and config.router == "grouped_sigmoid"
        and (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "swiglu")
        and not config.bias
        and config.window is None
        and config.dense_layers == tuple(range(len(config.dense_layers)))
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    values = llama.hf_common(config, "deepseek_v3", "DeepseekV3ForCausalLM")
    parameters: dict[str, Any] = {"rope_theta": float(config.rope_base), "rope_type": "default"}
    s = config.rope_scaling
    if s is not None:  # written with attention_factor and mscale_all_dim that give back the same scales
        qk = config.qk_nope_head_dim + config.qk_rope_head_dim
        assert config.attn_scale is not None
        m_all = math.sqrt(config.attn_scale / qk**-0.5)  # = mscale(factor, mscale_all_dim)
        parameters |= {"rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow}
        parameters |= {"original_max_position_embeddings": s.original_context_length, "truncate": s.truncate}
        parameters |= {"attention_factor": s.mscale, "mscale_all_dim": (m_all - 1) / (0.1 * math.log(s.factor))}
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
