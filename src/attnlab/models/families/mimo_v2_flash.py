"""MiMo-V2-Flash checkpoints (Xiaomi): ``MiMoV2FlashForCausalLM``, model_type "mimo_v2_flash".

Llama's pre-norm block and names, with each layer type shaped on its own (``GPTConfig.full_layers`` and
``sliding_layers``, ``attnlab.models.layer_shape``):

- "sliding_attention" layers have twice the key/value heads of the "full_attention" ones
  (``num_key_value_heads`` on full layers, twice that on sliding ones) and a learned sink per query head, which
  the file names ``self_attn.attention_sink_bias`` (transformers renames it ``sinks`` when it loads);
- queries and keys have heads of ``head_dim`` (192 on the hub), values of their own ``v_head_dim`` (128), each
  value times ``attention_value_scale`` (null: 1) before it is attended or cached; the softmax scale is
  ``head_dim ** -0.5``; ``attention_bias`` puts biases on q, k and v, never on ``o_proj``;
- each type has its own RoPE (``rope_parameters[layer_type]``: a "default" entry's ``rope_theta`` and
  ``partial_rotary_factor``, 0.334 when absent): the first int(head_dim * partial_rotary_factor) dimensions of a
  head turn, an odd count refused (attnlab turns pairs);
- the window is ``sliding_window`` keys, the query's own included, or ``sliding_window_size`` + 1 when the config
  holds that (as transformers' config reads it);
- ``mlp_layer_types`` says which layers are "dense" (a SwiGLU MLP) and which "sparse": DeepSeek-V3's router
  (``mlp.gate``: sigmoid scores, ``e_score_correction_bias`` that only chooses, the best ``topk_group`` of
  ``n_group`` groups, weights times ``routed_scaling_factor``) over ``n_routed_experts`` experts, stored one by one
  (``mlp.experts.e.{gate,up,down}_proj``), without shared experts.

The multi-token-prediction layers of the hub's folder (``model.mtp.*``) are not part of ``ForCausalLM``: transformers
skips them and so does attnlab; they are not loaded. Every setting of ``MiMoV2FlashConfig`` is read, with its
default where the file has none, or refused by name before any weight is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import deepseek, llama
from attnlab.models.families.named import Names, read_names, write_names
from attnlab.models.layer_shape import LayerShape

MODEL_TYPES = ("mimo_v2_flash",)
KINDS: dict[str, Literal["full", "sliding"]] = {"full_attention": "full", "sliding_attention": "sliding"}
NOT_LOADED = ("model.mtp.",)  # multi-token prediction: skipped by transformers' ForCausalLM and here
DEFAULTS: dict[str, Any] = {  # MiMoV2FlashConfig's, for a key the file leaves out
    "vocab_size": 152576,
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "moe_intermediate_size": 2048,
    "num_experts_per_tok": 8,
    "n_routed_experts": 256,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "head_dim": 192,
    "v_head_dim": 128,
    "sliding_window": 129,
    "attention_bias": False,
}
ROPE = {"full_attention": 5_000_000.0, "sliding_attention": 10_000.0}  # the default thetas, 0.334 of a head turning
SHARE = 0.334  # the partial_rotary_factor an entry without one turns
ENTRY_KEYS = {"rope_type", "rope_theta", "partial_rotary_factor"}


def _file(where: Path) -> str:
    return repr(str(where / "config.json"))


def _filled(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    """The config with MiMoV2FlashConfig's defaults where a key is absent; a null that transformers cannot run
    refused by name."""
    out = {**DEFAULTS, **{k: v for k, v in raw.items() if k != "num_local_experts"}}
    if raw.get("num_local_experts") is not None:  # transformers' alias of n_routed_experts
        out["n_routed_experts"] = raw["num_local_experts"]
    nulls = sorted(k for k in DEFAULTS if out[k] is None and k != "sliding_window")
    if nulls:
        raise ValueError(f"{_file(where)}: {nulls} are null; a mimo_v2_flash config needs a value for each")
    n = out["num_hidden_layers"]
    if out.get("layer_types") is None:  # the first layer and every sixth full, the rest sliding
        out["layer_types"] = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    if out.get("mlp_layer_types") is None:  # the first layer dense, the rest sparse
        out["mlp_layer_types"] = ["dense"] + ["sparse"] * (n - 1)
    return out


def _window(raw: dict[str, Any], where: Path) -> int:
    """The keys a sliding layer's query sees, its own included: sliding_window_size + 1 where the config has it."""
    size = raw.get("sliding_window_size")
    window = raw["sliding_window"] if size is None else size + 1 if isinstance(size, int) else None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(
            f"{_file(where)}: sliding layers need an int sliding_window (or sliding_window_size), got "
            f"sliding_window={raw['sliding_window']!r}, sliding_window_size={size!r}"
        )
    return window


def _rope(raw: dict[str, Any], where: Path, kind: str, head_dim: int) -> tuple[float, int]:
    """One layer type's theta and rotated dimensions: int(head_dim * partial_rotary_factor), as transformers counts."""
    given = raw.get("rope_parameters") or {k: {"rope_type": "default", "rope_theta": t} for k, t in ROPE.items()}
    entry = given.get(kind) if isinstance(given, dict) else None
    at = f"{_file(where)}: rope_parameters[{kind!r}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{at} is missing: a mimo_v2_flash config holds one entry per layer type, got {given!r:.120}")
    unread = sorted(set(entry) - ENTRY_KEYS)
    if entry.get("rope_type") != "default" or unread:
        raise ValueError(
            f"{at}: attnlab reads a 'default' RoPE entry of {sorted(ENTRY_KEYS)} only, got rope_type="
            f"{entry.get('rope_type')!r}" + (f" and {unread}" if unread else "")
        )
    theta, share = entry.get("rope_theta"), entry.get("partial_rotary_factor", SHARE)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"{at}: rope_theta must be a number > 1, got {theta!r}")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"{at}: partial_rotary_factor must be in (0, 1], got {share!r}")
    rotary = int(head_dim * share)
    if rotary < 2 or rotary % 2:
        raise ValueError(
            f"{at}: partial_rotary_factor={share!r} turns int({head_dim} * {share!r}) = {rotary} dimensions of each "
            "head; attnlab's RoPE turns pairs (an even count >= 2): give a factor whose count is even"
        )
    return float(theta), rotary


def _refuse(raw: dict[str, Any], where: Path, types: tuple[str, ...]) -> None:
    """What MiMoV2FlashConfig holds and attnlab does not read, by name."""
    n_layers, dense = raw["num_hidden_layers"], raw["mlp_layer_types"]
    odd = sorted({t for t in dense if t not in ("dense", "sparse")}, key=str) if isinstance(dense, list) else dense
    if odd or len(dense) != n_layers:
        raise ValueError(
            f"{_file(where)}: mlp_layer_types must list {n_layers} of ['dense', 'sparse']; {odd!r:.80} not read by "
            "attnlab"
        )
    if raw.get("n_shared_experts"):
        raise ValueError(
            f"{_file(where)}: n_shared_experts={raw['n_shared_experts']!r}: MiMo-V2-Flash's mixture runs no shared "
            "experts (transformers' MiMoV2FlashMoE has none), so a config that asks for some is another model"
        )
    heads, kv = raw["num_attention_heads"], raw["num_key_value_heads"]
    if "sliding" in types and heads % (2 * kv):
        raise ValueError(
            f"{_file(where)}: sliding layers have 2 * num_key_value_heads = {2 * kv} key/value heads, which must "
            f"divide num_attention_heads={heads}"
        )


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    """The decoder's config for a mimo_v2_flash config.json; refused by name before any weight is read."""
    raw = _filled(raw, where)
    types = llama.hybrid_layers(raw, where, KINDS)  # a quantized checkpoint, an unknown layer type: refused
    _refuse(raw, where, types)
    factor = raw.get("routed_scaling_factor")
    common = llama.common({**raw, "rope_parameters": None, "rope_scaling": None, "rope_theta": None}, where, theta=None)
    head_dim, kv = raw["head_dim"], raw["num_key_value_heads"]
    full, sliding = (_rope(raw, where, kind, head_dim) if KINDS[kind] in types else None for kind in KINDS)
    scale = raw.get("attention_value_scale", 0.707)
    return GPTConfig(
        **{**common, "context_length": raw["max_position_embeddings"], "head_dim": head_dim},
        qkv_bias=bool(raw["attention_bias"]),
        v_head_dim=raw["v_head_dim"],
        value_scale=None if scale is None else float(scale),
        rope_base=full[0] if full else sliding[0] if sliding else 10000.0,
        rope_local_base=sliding[0] if sliding and full else None,
        full_layers=LayerShape(n_kv_heads=kv, sinks=False, rotary_dim=full[1]) if full else None,
        sliding_layers=LayerShape(n_kv_heads=2 * kv, sinks=True, rotary_dim=sliding[1]) if sliding else None,
        window=_window(raw, where) if sliding else None,
        layer_types=types,
        num_experts=raw["n_routed_experts"],
        num_experts_per_tok=raw["num_experts_per_tok"],
        moe_intermediate_size=raw["moe_intermediate_size"],
        norm_topk_prob=bool(raw["norm_topk_prob"]),
        dense_layers=tuple(i for i, t in enumerate(raw["mlp_layer_types"]) if t == "dense"),
        router="grouped_sigmoid",
        n_group=raw["n_group"],
        topk_group=raw["topk_group"],
        routed_scaling_factor=1.0 if factor is None else float(factor),
        family="mimo_v2_flash",
    )


def _layer_names(config: GPTConfig, i: int) -> Names:
    h, b = f"model.layers.{i}.", f"trf_blocks.{i}."
    out: Names = [((h + "input_layernorm.weight",), b + "norm1.weight")]
    out += llama.attention_names(h + "self_attn.", b + "att.", qkv_bias=config.qkv_bias, out_bias=False)
    if config.layer_shape(i).sinks:
        out.append(((h + "self_attn.attention_sink_bias",), b + "att.sinks"))
    out.append(((h + "post_attention_layernorm.weight",), b + "norm2.weight"))
    if i in config.dense_layers:
        return out + [((f"{h}mlp.{p}_proj.weight",), f"{b}ff.{fc}.weight") for p, fc in llama.FC.items()]
    return out + deepseek.routed_names(h, b, config)


def _names(config: GPTConfig) -> Names:
    out: Names = [(("model.embed_tokens.weight",), "tok_emb.weight")]
    out += [name for i in range(config.n_layers) for name in _layer_names(config, i)]
    out.append((("model.norm.weight",), "final_norm.weight"))
    if not config.tie_weights:
        out.append((("lm_head.weight",), "out_head.weight"))
    return out


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's names to attnlab's (q, k and v stacked as rows); the multi-token-prediction layers not loaded,
    anything else unknown as ``<unexpected>name``."""
    kept = {k: v for k, v in tensors.items() if not k.startswith(NOT_LOADED)}
    return read_names(kept, _names(config), tie=config.tie_weights)


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``MiMoV2FlashForCausalLM``'s on-disk names, and its config.json."""
    ends: Names = [(("model.embed_tokens.weight",), "tok_emb.weight"), (("model.norm.weight",), "final_norm.weight")]
    ends += [] if config.tie_weights else [(("lm_head.weight",), "out_head.weight")]
    out = write_names(state, ends, rows=[])
    for i in range(config.n_layers):
        shape, v = config.layer_shape(i), config.v_head_dim or config.d_head
        rows = [config.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim, shape.n_kv_heads * v]
        out |= write_names(state, _layer_names(config, i), rows=rows)  # each type's own q, k, v rows
    return out, hf_config(config)


def _factor(rotary: int, head_dim: int) -> float:
    """A partial_rotary_factor that transformers' int(head_dim * factor) reads back as ``rotary``."""
    share = rotary / head_dim
    return share if int(head_dim * share) == rotary else (rotary + 0.5) / head_dim


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``MiMoV2FlashForCausalLM`` (what :func:`config_from_hf` reads back), attnlab's beside."""
    written = llama.hf_common(config, "mimo_v2_flash", "MiMoV2FlashForCausalLM")
    types = config.layer_types or ()
    full, sliding = config.full_layers or LayerShape(), config.sliding_layers or LayerShape()
    d = config.d_head
    parameters = {
        "full_attention": (config.rope_base, full.rotary_dim),
        "sliding_attention": (config.rope_local_base or config.rope_base, sliding.rotary_dim),
    }
    return {
        **{k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling")},
        "num_key_value_heads": full.n_kv_heads or (sliding.n_kv_heads or 2) // 2,
        "head_dim": d,
        "v_head_dim": config.v_head_dim or d,
        "attention_value_scale": config.value_scale,  # null reads as 1 (absent would read as 0.707)
        "attention_bias": config.qkv_bias,
        "rope_parameters": {
            kind: {"rope_type": "default", "rope_theta": float(theta), "partial_rotary_factor": _factor(r or d, d)}
            for kind, (theta, r) in parameters.items()
        },
        "layer_types": [{"full": "full_attention", "sliding": "sliding_attention"}[t] for t in types],
        "sliding_window": config.window,
        "mlp_layer_types": ["dense" if i in config.dense_layers else "sparse" for i in range(config.n_layers)],
        "n_routed_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_intermediate_size": config.moe_intermediate_size,
        "norm_topk_prob": config.norm_topk_prob,
        "n_group": config.n_group,
        "topk_group": config.topk_group,
        "routed_scaling_factor": config.routed_scaling_factor,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def holds(config: GPTConfig) -> bool:
    """Whether ``MiMoV2FlashForCausalLM`` holds this config exactly: its config.json reads back as the same config
    (training settings aside), so nothing the family cannot write is lost."""
    if config.family != "mimo_v2_flash" or config.layer_types is None or not config.num_experts:
        return False
    try:
        again = config_from_hf(hf_config(config), Path("."))
    except (ValueError, TypeError):
        return False
    return again == config.with_(drop_rate=0.0, backend="auto")
