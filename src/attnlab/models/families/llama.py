"""Llama (3.x) checkpoints: Hugging Face's ``LlamaForCausalLM`` config and tensor names, both ways.

Mistral, Qwen2 and Qwen3 name their tensors as Llama does (``model.layers.N.self_attn.q_proj`` ...), so their
files use :func:`names` too and differ only in their configs (``mistral.py``, ``qwen.py``).

Hugging Face to attnlab:
    model.embed_tokens                       tok_emb
    model.layers.N.input_layernorm           trf_blocks.N.norm1
    model.layers.N.self_attn.{q,k,v}_proj    trf_blocks.N.att.qkv (rows: queries, keys, values)
    model.layers.N.self_attn.{q,k}_norm      trf_blocks.N.att.{q,k}_norm (Qwen3)
    model.layers.N.self_attn.o_proj          trf_blocks.N.att.out_proj
    model.layers.N.post_attention_layernorm  trf_blocks.N.norm2
    model.layers.N.mlp.{gate,up,down}_proj   trf_blocks.N.ff.fc1, fc2, fc3 (the book's Llama 3 names)
    model.norm                               final_norm
    lm_head                                  out_head (absent when tied to the embedding)
Gemma 3's sandwich adds pre_feedforward_layernorm (norm2 then) and post_{attention,feedforward}_layernorm
(post_norm1, post_norm2); a mixture of experts (Qwen3-MoE) has mlp.gate (ff.gate) and, per expert e,
mlp.experts.e.{gate,up,down}_proj (ff.fc1.e, fc2.e, fc3.e).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig
from attnlab.models.families import rope as rope_settings

# (names in the file, name in attnlab): several names are stacked as rows (q, k and v into the fused qkv)
Names = list[tuple[tuple[str, ...], str]]
MODEL_TYPES = ("llama",)
FC = {"gate": "fc1", "up": "fc2", "down": "fc3"}  # Hugging Face's MLP projections, by the book's names


def attention_names(theirs: str, ours: str, *, qkv_bias: bool, out_bias: bool) -> Names:
    """One attention module's tensors (prefix ``theirs`` in the file, ``ours`` in attnlab): q, k and v as the rows
    of the fused qkv, then o_proj."""
    out: Names = [(tuple(f"{theirs}{p}_proj.weight" for p in "qkv"), ours + "qkv.weight")]
    if qkv_bias:
        out.append((tuple(f"{theirs}{p}_proj.bias" for p in "qkv"), ours + "qkv.bias"))
    out.append(((theirs + "o_proj.weight",), ours + "out_proj.weight"))
    if out_bias:  # gpt-oss's
        out.append(((theirs + "o_proj.bias",), ours + "out_proj.bias"))
    return out


def names(config: GPTConfig) -> Names:
    """The Llama layout's tensor names for ``config``, each with attnlab's."""
    out: Names = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        out.append(((h + "input_layernorm.weight",), b + "norm1.weight"))
        out += attention_names(h + "self_attn.", b + "att.", qkv_bias=config.qkv_bias, out_bias=config.bias)
        if config.qk_norm:
            out += [((h + f"self_attn.{p}_norm.weight",), b + f"att.{p}_norm.weight") for p in "qk"]
        if config.sinks:
            out.append(((h + "self_attn.sinks",), b + "att.sinks"))
        if config.norm_placement == "sandwich":
            out += [
                ((h + "post_attention_layernorm.weight",), b + "post_norm1.weight"),
                ((h + "pre_feedforward_layernorm.weight",), b + "norm2.weight"),
                ((h + "post_feedforward_layernorm.weight",), b + "post_norm2.weight"),
            ]
        else:
            out.append(((h + "post_attention_layernorm.weight",), b + "norm2.weight"))
        if config.num_experts and i not in config.dense_layers:
            out.append(((h + "mlp.gate.weight",), b + "ff.gate.weight"))
            for e in range(config.num_experts):
                x = f"{h}mlp.experts.{e}."
                out += [((x + f"{p}_proj.weight",), f"{b}ff.{fc}.{e}.weight") for p, fc in FC.items()]
        else:
            out += [((h + f"mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in FC.items()]
    out.append((("model.norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


def need(raw: dict[str, Any], key: str, where: Path) -> Any:
    if key not in raw:
        raise ValueError(f"{str(where / 'config.json')!r} has no {key!r}; a {raw.get('model_type')} config needs it")
    return raw[key]


def refuse(raw: dict[str, Any], where: Path, **allowed: tuple[object, ...]) -> None:
    """Settings this decoder does not have, refused by name rather than loaded into a different model."""
    for key, values in allowed.items():
        if raw.get(key) not in values:
            raise ValueError(
                f"{str(where / 'config.json')!r}: {key}={raw.get(key)!r} is not supported by attnlab's decoder "
                f"(it reads {[v for v in values if v is not None]})"
            )


def hybrid_layers(raw: dict[str, Any], where: Path, kinds: dict[str, Any]) -> tuple[Any, ...]:
    """A hybrid's ``layer_types``, each read as attnlab's kind (``kinds``); refused before any weight is read: a
    quantized checkpoint, a list of the wrong length, a layer type attnlab does not read (named)."""
    if raw.get("quantization_config") is not None:
        raise ValueError(
            f"{str(where / 'config.json')!r} is quantized ({raw['quantization_config']!r:.80}); attnlab reads float "
            "weights: give the unquantized checkpoint"
        )
    n_layers, named = need(raw, "num_hidden_layers", where), need(raw, "layer_types", where)
    odd = sorted({t for t in named if t not in kinds}, key=str) if isinstance(named, list) else named
    if odd or len(named) != n_layers:
        raise ValueError(
            f"{str(where / 'config.json')!r}: layer_types must list {n_layers} of {list(kinds)}; "
            f"{odd!r:.80} not read by attnlab"
        )
    return tuple(kinds[t] for t in named)


def rope(raw: dict[str, Any], where: Path, *, theta: float = 10000.0) -> dict[str, Any]:
    """RoPE's theta and scaling, every key of the config read or refused by name (``rope.py``)."""
    return rope_settings.flat(raw, where, theta=theta)


def common(raw: dict[str, Any], where: Path, *, theta: float | None = 10000.0) -> dict[str, Any]:
    """The GPTConfig fields every Llama-layout family sets the same way; RoPE's with ``theta`` the family's default
    (None: the family reads RoPE itself, as Gemma 3 and DeepSeek-V3 do)."""
    refuse(raw, where, hidden_act=(None, "silu"), pretraining_tp=(None, 1))  # None: the default, silu
    heads = need(raw, "num_attention_heads", where)
    emb = need(raw, "hidden_size", where)
    head_dim = raw.get("head_dim") or emb // heads
    tie = raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"{str(where / 'config.json')!r}: tie_word_embeddings must be true or false, got {tie!r}")
    return dict(
        vocab_size=need(raw, "vocab_size", where),
        context_length=raw.get("max_position_embeddings", 2048),
        emb_dim=emb,
        n_heads=heads,
        n_layers=need(raw, "num_hidden_layers", where),
        n_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=None if head_dim * heads == emb else head_dim,
        hidden_dim=need(raw, "intermediate_size", where),
        drop_rate=0.0,
        tie_weights=tie,
        layer_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        rope=True,
        **(rope(raw, where, theta=theta) if theta is not None else {}),
    )


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    refuse(raw, where, attention_bias=(None, False), mlp_bias=(None, False))
    return GPTConfig(**common(raw, where), family="llama")


def hf_common(config: GPTConfig, model_type: str, architecture: str) -> dict[str, Any]:
    """config.json for a Llama-layout family (what :func:`common` reads back), attnlab's config alongside."""
    parameters = rope_settings.written(config.rope_base, config.rope_scaling)
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.context_length,
        "hidden_size": config.emb_dim,
        "intermediate_size": config.ff_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads or config.n_heads,
        "head_dim": config.d_head,
        "hidden_act": "silu",
        "rms_norm_eps": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_weights,
        "rope_parameters": parameters,
        "rope_theta": float(config.rope_base),  # for transformers v4, which reads these two
        "rope_scaling": None if config.rope_scaling is None else parameters,
        "attnlab": config.to_dict(),
    }


def holds(config: GPTConfig) -> bool:
    """Whether ``LlamaForCausalLM`` holds this config exactly."""
    return lays_out(config) and not config.qkv_bias and not config.qk_norm and config.window is None


def lays_out(config: GPTConfig) -> bool:
    """The block every Llama-layout family shares: pre-RMSNorm, SwiGLU, RoPE, no biases past q/k/v."""
    return (
        (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "swiglu")
        and config.rope
        and not config.bias
        and config.score_mod is None
        and config.rotary_dim is None
        and config.rope_local_base is None  # one RoPE on every layer: the families' config.json has one
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    return {**hf_common(config, "llama", "LlamaForCausalLM"), "attention_bias": False, "mlp_bias": False}
