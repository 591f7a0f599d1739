"""Kimi Linear checkpoints: ``KimiLinearForCausalLM``, model_type "kimi_linear" (Moonshot AI, 2025).

A pre-norm decoder of two kinds of layer (``linear_attn_config``: ``kda_layers`` and ``full_attn_layers``, counted
from 1; or ``layer_types``, "linear_attention" and "full_attention"):

- Kimi Delta Attention (``attnlab.nn.kda``): ``self_attn.{q,k,v}_proj`` (the rows of attnlab's ``qkv``), each with
  its own short convolution (``{q,k,v}_conv1d``: the channels of one convolution here), the per-channel forget gate
  ``f_a_proj``, ``f_b_proj``, ``dt_bias`` and ``A_log`` (stored (1, 1, H, 1), one a head), ``b_proj`` (beta),
  the output gate ``g_a_proj``, ``g_b_proj``, the gated norm ``o_norm`` and ``o_proj``;
- latent attention (MLA, ``attnlab.nn.latent``) without RoPE: DeepSeek's tensors, its qk_rope_head_dim dimensions
  and shared key kept but turned by no position, so the model has no positions at all;
- a dense SwiGLU MLP (``mlp.{gate,up,down}_proj``) on the layers ``mlp_layer_types`` calls "dense" (else the first
  ``first_k_dense_replace``), and elsewhere DeepSeek-V3's mixture (``block_sparse_moe``): a sigmoid router with a
  correction bias that chooses, in groups (``gate``), experts of ``w1`` (gate), ``w3`` (up) and ``w2`` (down), and
  ``shared_experts`` always run.

These are the names of Moonshot's files, which transformers renames when it loads (``forget_gate.``, one
``conv1d``, ``mlp.`` for ``block_sparse_moe.``, fused experts) and back when it saves; its save writes a dense
layer under ``block_sparse_moe.`` too, read here either way. config.json keeps Moonshot's keys (``num_experts``,
``moe_renormalize``, ``num_expert_group``, ``model_max_length``...), transformers' names for them read alike; the
defaults of a key left out are ``KimiLinearConfig``'s. Every key is read, known to change nothing
(``IGNORED``), or refused by name before any weight is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama
from attnlab.models.families.rows import Rows

MODEL_TYPES = ("kimi_linear",)
KINDS: dict[str, Literal["kda", "full"]] = {"linear_attention": "kda", "full_attention": "full"}
DEFAULTS: dict[str, Any] = {  # KimiLinearConfig's, under Moonshot's names
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_shared_experts": 1, "routed_scaling_factor": 2.446,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "num_expert_group": 1, "topk_group": 1, "num_experts_per_token": 8, "moe_renormalize": True,
    "model_max_length": 1048576, "rms_norm_eps": 1e-5, "num_experts": 256, "first_k_dense_replace": 1,
    "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
}  # fmt: skip
ALIASES = {  # transformers' attribute names for Moonshot's keys (KimiLinearConfig.attribute_map)
    "max_position_embeddings": "model_max_length", "norm_topk_prob": "moe_renormalize",
    "n_group": "num_expert_group", "num_local_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
}  # fmt: skip
SETTINGS = {  # keys that must hold these values (None: absent), or the model is not the one transformers runs
    "hidden_act": (None, "silu"), "attention_bias": (None, False), "tie_word_embeddings": (None, False),
    "mla_use_nope": (None, True), "moe_router_activation_func": (None, "sigmoid"), "use_grouped_topk": (None, True),
    "moe_layer_freq": (None, 1), "num_nextn_predict_layers": (None, 0),
}  # fmt: skip
IGNORED = {  # known, and changing nothing transformers computes: bookkeeping, or what no layer here reads
    "architectures", "model_type", "auto_map", "dtype", "torch_dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "output_router_logits",
    "attention_dropout", "pretraining_tp", "head_dim", "qk_head_dim", "rope_theta", "rope_scaling", "attnlab",
    "layer_types", "mlp_layer_types", "linear_attn_config", "num_key_value_heads", "quantization_config",
}  # fmt: skip
LINEAR_KEYS = {"kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size"}
KDA = ("f_a_proj.weight", "f_b_proj.weight", "dt_bias", "b_proj.weight", "g_a_proj.weight", "g_b_proj.weight")


def _file(where: Path) -> str:
    return repr(str(where / "config.json"))


def _values(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    """Every key under Moonshot's name, defaults filled; what is not read refused by name."""
    if raw.get("quantization_config") is not None:
        raise ValueError(
            f"{_file(where)} is quantized ({raw['quantization_config']!r:.80}); attnlab reads float weights: give the "
            "unquantized checkpoint"
        )
    unread = sorted(set(raw) - set(DEFAULTS) - set(ALIASES) - set(SETTINGS) - IGNORED)
    linear = raw.get("linear_attn_config") or {}
    if not isinstance(linear, dict):
        raise ValueError(f"{_file(where)}: linear_attn_config must be an object, got {linear!r:.60}")
    unread += [f"linear_attn_config.{k}" for k in sorted(set(linear) - LINEAR_KEYS)]
    if unread:
        raise ValueError(
            f"{_file(where)}: {', '.join(unread)} not read by attnlab (a Kimi Linear variant it does not run, such as "
            "a full-rank or bounded forget gate, or an output gate on MLA): nothing is loaded"
        )
    llama.refuse(raw, where, **SETTINGS)
    heads, kv = raw.get("num_attention_heads", DEFAULTS["num_attention_heads"]), raw.get("num_key_value_heads")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < heads):
        # MLA expands its latent into a key and value for every head; transformers would repeat fewer heads (and
        # ignores more, as KimiLinearConfig's default of 32 beside fewer heads has it)
        raise ValueError(
            f"{_file(where)}: num_key_value_heads={kv!r} below num_attention_heads={heads} is not read by attnlab: "
            "latent attention keeps a key and value a head"
        )
    values = {**DEFAULTS, **{ALIASES.get(k, k): v for k, v in raw.items()}}
    values["linear_head_dim"] = linear.get("head_dim", values["linear_head_dim"])
    values["linear_num_heads"] = linear.get("num_heads", values["linear_num_heads"])
    values["linear_conv_kernel_dim"] = linear.get("short_conv_kernel_size", values["linear_conv_kernel_dim"])
    return values


def _layer_kinds(raw: dict[str, Any], values: dict[str, Any], where: Path) -> tuple[Literal["kda", "full"], ...]:
    """``layer_types``, else linear_attn_config's lists (counted from 1), else KimiLinearConfig's default: a full
    layer every fourth after the first."""
    n, linear = values["num_hidden_layers"], raw.get("linear_attn_config") or {}
    named = raw.get("layer_types")
    if named is None and "kda_layers" in linear and "full_attn_layers" in linear:
        named = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in linear[key]:
                if not (isinstance(layer, int) and 1 <= layer <= n):
                    raise ValueError(f"{_file(where)}: linear_attn_config.{key} counts layers 1..{n}, got {layer!r}")
                named[layer - 1] = kind
        if None in named:
            gaps = [i + 1 for i, kind in enumerate(named) if kind is None]
            raise ValueError(
                f"{_file(where)}: layers {gaps} (counted from 1) are in neither linear_attn_config.kda_layers nor "
                "full_attn_layers: attnlab reads a kind for every layer"
            )
    if named is None:
        named = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    return llama.hybrid_layers({"num_hidden_layers": n, "layer_types": named}, where, KINDS)


def _dense_layers(raw: dict[str, Any], values: dict[str, Any], where: Path) -> tuple[int, ...]:
    n, named = values["num_hidden_layers"], raw.get("mlp_layer_types")
    if named is None:
        named = ["dense" if i < values["first_k_dense_replace"] else "sparse" for i in range(n)]
    if not isinstance(named, list) or len(named) != n or not set(named) <= {"dense", "sparse"}:
        raise ValueError(f"{_file(where)}: mlp_layer_types must list {n} of 'dense' and 'sparse', got {named!r:.80}")
    return tuple(i for i, kind in enumerate(named) if kind == "dense")


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    """The decoder's config for a ``kimi_linear`` config.json, checked whole before any weight is read."""
    values = _values(raw, where)
    layer_types, dense = _layer_kinds(raw, values, where), _dense_layers(raw, values, where)
    emb, heads = values["hidden_size"], values["num_attention_heads"]
    nope, rope = values["qk_nope_head_dim"], values["qk_rope_head_dim"]
    return GPTConfig(
        vocab_size=values["vocab_size"],
        context_length=values["model_max_length"],
        emb_dim=emb,
        n_heads=heads,
        n_layers=values["num_hidden_layers"],
        head_dim=None if emb % heads == 0 else nope + rope,  # no softmax layer of the Llama kind reads it
        hidden_dim=values["intermediate_size"],
        drop_rate=0.0,
        layer_norm_eps=float(values["rms_norm_eps"]),
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        nope=True,  # MLA turns nothing and nothing else has positions
        layer_types=layer_types,
        kv_lora_rank=values["kv_lora_rank"],
        q_lora_rank=values["q_lora_rank"],
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=values["v_head_dim"],
        num_experts=values["num_experts"] if len(dense) < len(layer_types) else 0,
        num_experts_per_tok=values["num_experts_per_token"] if len(dense) < len(layer_types) else 0,
        moe_intermediate_size=values["moe_intermediate_size"],
        norm_topk_prob=bool(values["moe_renormalize"]),
        dense_layers=dense,
        router="grouped_sigmoid",
        n_group=values["num_expert_group"],
        topk_group=values["topk_group"],
        routed_scaling_factor=float(values["routed_scaling_factor"]),
        n_shared_experts=values["num_shared_experts"],
        delta_heads=values["linear_num_heads"],
        delta_head_dim=values["linear_head_dim"],
        conv_kernel=values["linear_conv_kernel_dim"],
        family="kimi_linear",
    )


def _names(config: GPTConfig) -> list[tuple[tuple[str, ...], str]]:
    """(names in the file, attnlab's name): several names stack as rows (q, k, v; their convolutions)."""
    out: list[tuple[tuple[str, ...], str]] = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    for i, kind in enumerate(config.layer_types or ()):
        h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
        at = h + "self_attn."
        out += [((h + "input_layernorm.weight",), b + "norm1.weight")]
        out += [((h + "post_attention_layernorm.weight",), b + "norm2.weight")]
        if kind == "kda":
            out.append((tuple(f"{at}{p}_proj.weight" for p in "qkv"), b + "att.qkv.weight"))
            out.append((tuple(f"{at}{p}_conv1d.weight" for p in "qkv"), b + "att.conv.weight"))
            out += [((at + name,), b + "att." + name) for name in (*KDA, "A_log")]
            out += [
                ((at + "o_norm.weight",), b + "att.norm.weight"),
                ((at + "o_proj.weight",), b + "att.out_proj.weight"),
            ]
        else:
            mla = ["q_proj"] if config.q_lora_rank is None else ["q_a_proj", "q_a_layernorm", "q_b_proj"]
            mla += ["kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"]
            out += [((f"{at}{n}.weight",), f"{b}att.{n}.weight") for n in mla]
            out.append(((at + "o_proj.weight",), b + "att.out_proj.weight"))
        if i in config.dense_layers:
            out += [((f"{h}mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in llama.FC.items()]
            continue
        moe = h + "block_sparse_moe."
        out += [((moe + "gate.weight",), b + "ff.gate.weight")]
        out += [((moe + "gate.e_score_correction_bias",), b + "ff.e_score_correction_bias")]
        for e in range(config.num_experts):
            out += [((f"{moe}experts.{e}.{w}.weight",), f"{b}ff.{fc}.{e}.weight") for w, fc in EXPERT.items()]
        if config.n_shared_experts:
            out += [
                ((f"{moe}shared_experts.{p}_proj.weight",), f"{b}ff.shared.{fc}.weight") for p, fc in llama.FC.items()
            ]
    out.append((("model.norm.weight",), "final_norm.weight"))
    out.append((("lm_head.weight",), "out_head.weight"))
    return out


EXPERT = {"w1": "fc1", "w3": "fc2", "w2": "fc3"}  # Moonshot's expert weights: gate, up, down


def _in_file(name: str, tensors: dict[str, torch.Tensor]) -> str:
    """A dense MLP's name as transformers' save writes it (under block_sparse_moe.) where the file holds that."""
    other = name.replace(".mlp.", ".block_sparse_moe.")
    return other if name not in tensors and other in tensors else name


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's (q, k, v and their convolutions stacked as rows, A_log one a head); the rest as
    ``<unexpected>name``."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    known = set()
    for theirs, ours in _names(config):
        theirs = tuple(_in_file(name, tensors) for name in theirs)
        known |= set(theirs)
        origin[ours] = "/".join(theirs)
        present = [tensors[name] for name in theirs if name in tensors]
        if len(present) == len(theirs):
            out[ours] = present[0] if len(present) == 1 else Rows(tuple(present))
            if ours.endswith("att.A_log"):
                out[ours] = present[0].reshape(-1)  # (1, 1, H, 1) -> (H,)
    out |= {f"<unexpected>{k}": v for k, v in tensors.items() if k not in known}
    return out, origin


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under Moonshot's names (which ``KimiLinearForCausalLM`` reads), and its config.json."""
    out: dict[str, torch.Tensor] = {}
    for theirs, ours in _names(config):
        tensor = state[ours].detach()
        if ours.endswith("att.A_log"):
            tensor = tensor.reshape(1, 1, -1, 1)
        pieces = tensor.chunk(3) if len(theirs) == 3 else (tensor,)  # rows: q, k, v, each H * D
        out |= {name: piece.contiguous().clone() for name, piece in zip(theirs, pieces, strict=True)}
    return out, hf_config(config)


def holds(config: GPTConfig) -> bool:
    """Whether ``KimiLinearForCausalLM`` holds this config exactly."""
    scale = config.attn_scale in (None, (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5)
    return (
        config.family == "kimi_linear"
        and config.kv_lora_rank is not None
        and config.nope
        and (config.norm, config.norm_placement, config.mlp) == ("rmsnorm", "pre", "swiglu")
        and set(config.layer_types or ()) <= {"kda", "full"}
        and config.conv_kernel is not None
        and config.router == "grouped_sigmoid"
        and config.delta_norm_eps in (None, config.layer_norm_eps)
        and (config.delta_value_heads, config.delta_value_dim, config.delta_norm_placement) == (None, None, None)
        and not (config.bias or config.qkv_bias or config.qk_norm or config.sinks or config.attn_output_gate)
        and not (config.tie_weights or config.delta_negative_eigenvalues or config.shapes_layers)
        and (config.window, config.score_mod, config.emb_scale, config.final_softcap) == (None, None, None, None)
        and scale
    )


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json under Moonshot's keys, as its checkpoints and transformers' save write them; attnlab's beside."""
    types, dense = config.layer_types or (), config.dense_layers
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": config.vocab_size,
        "model_max_length": config.context_length,
        "hidden_size": config.emb_dim,
        "intermediate_size": config.ff_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_heads,
        "hidden_act": "silu",
        "rms_norm_eps": config.layer_norm_eps,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "kv_lora_rank": config.kv_lora_rank,
        "q_lora_rank": config.q_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "mla_use_nope": True,
        "layer_types": [{"kda": "linear_attention", "full": "full_attention"}[t] for t in types],
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, t in enumerate(types) if t == "kda"],
            "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "full"],
            "num_heads": config.delta_heads or config.n_heads,
            "head_dim": config.delta_head_dim or config.d_head,
            "short_conv_kernel_size": config.conv_kernel,
        },
        "mlp_layer_types": ["dense" if i in config.dense_layers else "sparse" for i in range(config.n_layers)],
        # Moonshot's own code reads these two, transformers mlp_layer_types: written where they say the same
        **({"first_k_dense_replace": len(dense), "moe_layer_freq": 1} if dense == tuple(range(len(dense))) else {}),
        "num_experts": config.num_experts,
        "num_experts_per_token": config.num_experts_per_tok,
        "num_shared_experts": config.n_shared_experts,
        "moe_intermediate_size": config.moe_intermediate_size or config.ff_dim,
        "moe_renormalize": config.norm_topk_prob,
        "moe_router_activation_func": "sigmoid",
        "use_grouped_topk": True,
        "num_expert_group": config.n_group,
        "topk_group": config.topk_group,
        "routed_scaling_factor": config.routed_scaling_factor,
        "attnlab": config.to_dict(),
    }
