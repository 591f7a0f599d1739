"""DeepSeek-V4 checkpoints: ``DeepseekV4ForCausalLM`` (transformers 5.24), in the names its ``save_pretrained``
writes (DeepSeek's own: ``attn.wq_a``, ``attn.compressor.ape``, ``ffn.experts.e.w1``, ``hc_attn_fn``, ``head``).

Every layer is compressed-sparse, heavily compressed (``layer_types``, blocks of ``compress_rates``) or sliding
alone (at the main RoPE, ``rope_theta``), over a sliding window with a sink a head (``attnlab.nn.compressed``); a query latent, one key-value head, a grouped
output projection; RoPE on each head's trailing ``partial_rotary_factor`` channels at ``compress_rope_theta``
with the YaRN of ``rope_parameters["compress"]`` (cos and sin unscaled). The residual is ``hc_mult`` streams
(hyper-connections, ``attnlab.models.hyper``); each MLP is a mixture with one shared expert, routed on the
``hash_moe`` layers by a table of token ids (``attnlab.models.moe_v4``).

Refused by name, from config.json alone: a layer type V4 does not ship, a scaled main RoPE, a
``quantization_config`` (FP8 experts), biases, an activation other than SiLU, more than one key-value head,
tied embeddings, scaled cos and sin on the compressed RoPE.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families.named import Names, read_names, write_names
from attnlab.models.v4_spec import SCORINGS, DeepseekV4Spec

MODEL_TYPES = ("deepseek_v4",)
KIND = {"compressed_sparse_attention": "compressed_sparse", "heavily_compressed_attention": "heavily_compressed"}
KIND["sliding_attention"] = "sliding"
RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
ATTENTION = {  # the file's names under attn. -> attnlab's under att.
    "wq_a.weight": "q_a_proj.weight",
    "q_norm.weight": "q_a_norm.weight",
    "wq_b.weight": "q_b_proj.weight",
    "wkv.weight": "kv_proj.weight",
    "norm.weight": "kv_norm.weight",
    "wo_a.weight": "o_a_proj.weight",
    "wo_b.weight": "o_b_proj.weight",
    "attn_sink": "sinks",
}
COMPRESSOR = {"wkv.weight": "kv_proj.weight", "wgate.weight": "gate_proj.weight", "ape": "position_bias"}
COMPRESSOR |= {"norm.weight": "kv_norm.weight"}
SWIGLU = {"w1": "gate", "w2": "down", "w3": "up"}
YARN = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate", "attention_factor"}


def _bad(where: Path, what: str) -> ValueError:
    return ValueError(f"{str(where / 'config.json')!r}: {what}")


def _kinds(raw: dict[str, Any], where: Path, n: int) -> tuple[Any, ...]:
    kinds = raw.get("layer_types")
    if kinds is None and raw.get("compress_ratios") is not None:
        kinds = [RATIO.get(r, r) for r in raw["compress_ratios"]]
    if kinds is None:
        kinds = ["heavily_compressed_attention"] * min(n, 2)
        kinds += ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(n - 2)]
    odd = sorted({k for k in kinds[:n] if k not in KIND}, key=str)
    if odd:
        raise _bad(
            where,
            f"layer_types {odd}: DeepSeek-V4's layers are {sorted(KIND)}",
        )
    return tuple(KIND[k] for k in kinds[:n])


def _hash_layers(raw: dict[str, Any], n: int) -> tuple[int, ...]:
    mlp = raw.get("mlp_layer_types")
    if mlp is None:
        k = raw.get("num_hash_layers", 3)
        mlp = ["hash_moe"] * min(n, k) + ["moe"] * max(0, n - k)
    return tuple(i for i, kind in enumerate(mlp[:n]) if kind == "hash_moe")


def _compress_rope(raw: dict[str, Any], where: Path) -> tuple[float, RopeScaling | None]:
    """The compressed layers' theta and YaRN, from ``rope_parameters["compress"]`` (or the flat form)."""
    given = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    nested = isinstance(given.get("compress"), dict)
    compress = given["compress"] if nested else {k: v for k, v in given.items() if k != "main"}
    theta = float(compress.get("rope_theta", raw.get("compress_rope_theta", 160000.0))) if nested else None
    theta = float(raw.get("compress_rope_theta", 160000.0)) if theta is None else theta
    kind = compress.get("rope_type", compress.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise _bad(where, f"rope_parameters['compress'] rope_type {kind!r}: attnlab reads 'default' and 'yarn'")
    values = {k: v for k, v in compress.items() if k in YARN}
    odd = sorted(set(compress) - YARN - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    if odd or values.get("attention_factor", 1.0) != 1.0:
        raise _bad(where, f"rope_parameters['compress'] {compress!r}: attnlab reads YaRN's {sorted(YARN)}, cos and "
                          "sin unscaled (attention_factor 1.0)")  # fmt: skip
    original = values.pop("original_max_position_embeddings", raw.get("max_position_embeddings"))
    values["attention_factor"] = 1.0
    return theta, RopeScaling(kind="yarn", original_context_length=int(original), **values)


def _refuse(raw: dict[str, Any], where: Path) -> None:
    for key, allowed in (
        ("attention_bias", (None, False)),
        ("mlp_bias", (None, False)),
        ("hidden_act", (None, "silu")),
        ("num_key_value_heads", (None, 1)),
        ("tie_word_embeddings", (None, False)),
        ("quantization_config", (None,)),
        ("scoring_func", (None, *SCORINGS)),
    ):
        if raw.get(key) not in allowed:
            raise _bad(where, f"{key} {raw.get(key)!r}: attnlab reads DeepSeek-V4 with {key} in {list(allowed)}")


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    _refuse(raw, where)
    n, head_dim = int(raw.get("num_hidden_layers", 43)), int(raw.get("head_dim", 512))
    factor = raw.get("partial_rotary_factor")
    rope_dim = int(raw["qk_rope_head_dim"]) if factor is None and "qk_rope_head_dim" in raw else None
    rope_dim = int(head_dim * (factor if factor is not None else 64 / 512)) if rope_dim is None else rope_dim
    rates: dict[str, Any] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128} | (
        raw.get("compress_rates") or {}
    )
    theta, scaling = _compress_rope(raw, where)
    main = (raw.get("rope_parameters") or {}).get("main") or {}
    if main.get("rope_type", "default") != "default":
        raise _bad(where, f"rope_parameters['main'] {main!r}: attnlab reads V4's main RoPE unscaled ('default')")
    spec = DeepseekV4Spec(
        layer_kinds=_kinds(raw, where, n),
        sparse_block=int(raw.get("compress_rate_csa", rates["compressed_sparse_attention"])),
        heavy_block=int(raw.get("compress_rate_hca", rates["heavily_compressed_attention"])),
        index_topk=int(raw.get("index_topk", 512)),
        index_heads=int(raw.get("index_n_heads", 64)),
        index_head_dim=int(raw.get("index_head_dim", 128)),
        q_lora_rank=int(raw.get("q_lora_rank", 1024)),
        rope_dim=rope_dim,
        o_groups=int(raw.get("o_groups", 8)),
        o_lora_rank=int(raw.get("o_lora_rank", 1024)),
        compress_theta=theta,
        compress_scaling=scaling,
        hc_mult=int(raw.get("hc_mult", 4)),
        hc_sinkhorn_iters=int(raw.get("hc_sinkhorn_iters", 20)),
        hc_eps=float(raw.get("hc_eps", 1e-6)),
        scoring=raw.get("scoring_func") or "sqrtsoftplus",
        hash_layers=_hash_layers(raw, n),
        swiglu_limit=float(raw.get("swiglu_limit", 10.0)),
    )
    return GPTConfig(
        vocab_size=int(raw.get("vocab_size", 129280)),
        context_length=int(raw.get("max_position_embeddings", 1048576)),
        emb_dim=int(raw.get("hidden_size", 4096)),
        n_heads=int(raw.get("num_attention_heads", 64)),
        n_layers=n,
        drop_rate=0.0,
        qkv_bias=False,
        layer_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=True,
        rope_base=float(main.get("rope_theta", raw.get("rope_theta", 10000.0))),
        window=int(raw.get("sliding_window", 128)),
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        head_dim=head_dim,
        num_experts=int(raw.get("n_routed_experts", 256)),
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 6)),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 2048)),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.5)),
        n_shared_experts=1,
        family="deepseek_v4",
        deepseek_v4=spec,
    )


def names(config: GPTConfig) -> Names:
    spec = config.deepseek_v4
    assert spec is not None
    out: Names = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        out += [((f"{h}attn.{theirs}",), f"{b}att.{ours}") for theirs, ours in ATTENTION.items()]
        compressors = [] if spec.layer_kinds[i] == "sliding" else ["compressor."]
        if spec.layer_kinds[i] == "compressed_sparse":
            compressors.append("indexer.compressor.")
            out += [((f"{h}attn.indexer.wq_b.weight",), f"{b}att.indexer.q_b_proj.weight")]
            out += [((f"{h}attn.indexer.weights_proj.weight",), f"{b}att.indexer.weights_proj.weight")]
        for c in compressors:
            out += [((f"{h}attn.{c}{theirs}",), f"{b}att.{c}{ours}") for theirs, ours in COMPRESSOR.items()]
        out += [((f"{h}attn_norm.weight",), f"{b}norm1.weight"), ((f"{h}ffn_norm.weight",), f"{b}norm2.weight")]
        for part in ("attn", "ffn"):
            out += [((f"{h}hc_{part}_{p}",), f"{b}hyper.{part}.{p}") for p in ("fn", "base", "scale")]
        gate = "tid2eid" if i in spec.hash_layers else "bias"
        out += [((f"{h}ffn.gate.weight",), f"{b}ff.gate.weight"), ((f"{h}ffn.gate.{gate}",), f"{b}ff.gate.{gate}")]
        for e in range(config.num_experts):
            out += [((f"{h}ffn.experts.{e}.{w}.weight",), f"{b}ff.experts.{e}.{p}.weight") for w, p in SWIGLU.items()]
        out += [((f"{h}ffn.shared_experts.{w}.weight",), f"{b}ff.shared.{p}.weight") for w, p in SWIGLU.items()]
    last = f"trf_blocks.{config.n_layers - 1}.hyper.head."
    out += [((f"model.hc_head.hc_{p}",), last + p) for p in ("fn", "base", "scale")]
    return [*out, (("model.norm.weight",), "final_norm.weight"), (("head.weight",), "out_head.weight")]


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    return read_names(tensors, names(config), tie=False)


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json as transformers' ``DeepseekV4Config`` reads it."""
    spec = config.deepseek_v4
    assert spec is not None
    kinds = {v: k for k, v in KIND.items()}
    factor = spec.rope_dim / config.d_head
    compress: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.compress_theta}
    s = spec.compress_scaling
    if s is not None:
        compress = {"rope_type": "yarn", "rope_theta": spec.compress_theta, "factor": s.factor}
        compress |= {"original_max_position_embeddings": s.original_context_length, "beta_fast": s.beta_fast}
        compress |= {"beta_slow": s.beta_slow, "truncate": s.truncate, "attention_factor": 1.0}
    main = {"rope_type": "default", "rope_theta": config.rope_base, "partial_rotary_factor": factor}
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.context_length,
        "hidden_size": config.emb_dim,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": 1,
        "num_hidden_layers": config.n_layers,
        "head_dim": config.d_head,
        "partial_rotary_factor": factor,
        "rms_norm_eps": config.layer_norm_eps,
        "sliding_window": config.window,
        "moe_intermediate_size": config.moe_intermediate_size,
        "n_routed_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "n_shared_experts": 1,
        "routed_scaling_factor": config.routed_scaling_factor,
        "scoring_func": spec.scoring,
        "swiglu_limit": spec.swiglu_limit,
        "layer_types": [kinds[k] for k in spec.layer_kinds],
        "compress_rates": {
            "compressed_sparse_attention": spec.sparse_block,
            "heavily_compressed_attention": spec.heavy_block,
        },
        "mlp_layer_types": ["hash_moe" if i in spec.hash_layers else "moe" for i in range(config.n_layers)],
        "index_topk": spec.index_topk,
        "index_n_heads": spec.index_heads,
        "index_head_dim": spec.index_head_dim,
        "q_lora_rank": spec.q_lora_rank,
        "o_groups": spec.o_groups,
        "o_lora_rank": spec.o_lora_rank,
        "hc_mult": spec.hc_mult,
        "hc_sinkhorn_iters": spec.hc_sinkhorn_iters,
        "hc_eps": spec.hc_eps,
        "rope_theta": config.rope_base,
        "compress_rope_theta": spec.compress_theta,
        "rope_parameters": {"main": main, "compress": {**compress, "partial_rotary_factor": factor}},
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
    }


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return write_names(state, names(config), rows=[]), hf_config(config)


def holds(config: GPTConfig) -> bool:
    """Whether the family holds this config exactly: its config.json reads back as the same config."""
    if config.family != "deepseek_v4" or config.deepseek_v4 is None:
        return False
    try:
        again = config_from_hf(hf_config(config), Path("."))
    except (ValueError, TypeError):
        return False
    return again == replace(config, drop_rate=0.0, backend="auto")
