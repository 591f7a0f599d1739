"""Gemma 4's config.json, read: ``Gemma4TextConfig``'s settings (or a ``gemma4`` wrapper's ``text_config``) as the
decoder's ``GPTConfig``, each one read as transformers reads it or refused by name, before any weight.

What a setting means is ``gemma4.py``'s docstring; here, how transformers resolves each: the full layers' shape
from ``per_layer_config`` (as transformers writes it) or from ``global_head_dim`` (512 when absent) and
``num_global_key_value_heads`` (only with ``attention_k_eq_v``); the last layer full whatever ``layer_types``
says; each attention type's RoPE entry (proportional by default on the full layers); every type with an earlier
layer to share keys from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama, rope
from attnlab.models.layer_shape import LayerShape

KINDS: dict[str, Literal["full", "sliding"]] = {"full_attention": "full", "sliding_attention": "sliding"}
ROPE = {  # Gemma4TextConfig's defaults, per attention type
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
OWN_KEYS = ("head_dim", "num_key_value_heads")  # what a per_layer_config entry may set
REFUSED: dict[str, tuple[object, ...]] = {  # read only at these values (None: the key absent)
    # "vision": image tokens see each other both ways, text stays causal (transformers 5.24's Gemma4Model masks
    # text-only input causally and its layers stay causal but for "all"): attnlab reads text, so it reads it
    "use_bidirectional_attention": (None, "vision"),
    "attention_bias": (None, False),
    "hidden_activation": (None, "gelu_pytorch_tanh"),
}


def _file(where: Path) -> str:
    return repr(str(where / "config.json"))


def text_of(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    """The text model's config: the config itself, or a wrapper's ``text_config`` with the wrapper's
    ``tie_word_embeddings`` (transformers ties the wrapper's head by its top-level flag) and its quantization."""
    if raw.get("model_type") != "gemma4":
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{_file(where)} is a gemma4 wrapper without a text_config object")
    extra = {"quantization_config": raw.get("quantization_config") or text.get("quantization_config")}
    return {**text, **extra, "model_type": "gemma4_text", "tie_word_embeddings": raw.get("tie_word_embeddings", True)}


def _layer_types(raw: dict[str, Any], where: Path) -> tuple[Literal["full", "sliding"], ...]:
    n = llama.need(raw, "num_hidden_layers", where)
    named = raw.get("layer_types")
    if named is None:  # Gemma4TextConfig's default: 5 sliding layers to 1 full
        named = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types = llama.hybrid_layers({**raw, "layer_types": list(named)}, where, KINDS)
    return (*types[:-1], "full")  # transformers makes the last layer full, whatever the list says


def _shapes(raw: dict[str, Any], where: Path, types: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Each layer type's (head_dim, key/value heads): the config's for the sliding layers, ``per_layer_config``'s
    or ``global_head_dim`` and ``num_global_key_value_heads`` (with ``attention_k_eq_v``) for the full ones."""
    own = (raw.get("head_dim") or 256, raw.get("num_key_value_heads") or 4)  # Gemma4TextConfig's defaults
    per_layer = raw.get("per_layer_config")
    if per_layer is None:  # the hub's form: the full layers' shape in two keys of their own
        kv = raw.get("num_global_key_value_heads") if raw.get("attention_k_eq_v", False) else None
        full = {"head_dim": raw.get("global_head_dim", 512), "num_key_value_heads": kv or own[1]}
        per_layer = {i: full for i, t in enumerate(types) if t == "full"}
    if not isinstance(per_layer, dict) or any(not isinstance(v, dict) for v in per_layer.values()):
        raise ValueError(f"{_file(where)}: per_layer_config must map layer indices to objects, got {per_layer!r:.80}")
    read: dict[str, set[tuple[int, int]]] = {"full": set(), "sliding": set()}
    entries = {str(int(k)) if str(k).isdigit() else str(k): v for k, v in per_layer.items()}
    for i, kind in enumerate(types):
        entry = entries.pop(str(i), {})
        odd = sorted(set(entry) - set(OWN_KEYS))
        if odd:
            raise ValueError(
                f"{_file(where)}: per_layer_config[{i}] sets {odd}, which attnlab does not read per layer "
                f"(it reads {list(OWN_KEYS)})"
            )
        read[kind].add((entry.get("head_dim", own[0]), entry.get("num_key_value_heads", own[1])))
    if entries:
        raise ValueError(f"{_file(where)}: per_layer_config names layers {sorted(entries)} the model does not have")
    if any(len(shapes) > 1 for shapes in read.values()):
        raise ValueError(
            f"{_file(where)}: per_layer_config gives the layers of one type different shapes ({read}); attnlab "
            "reads one shape a layer type, as transformers' RoPE does"
        )
    return {kind: next(iter(shapes)) for kind, shapes in read.items() if shapes}


def _sharing(raw: dict[str, Any], where: Path, types: tuple[str, ...]) -> int:
    shared = raw.get("num_kv_shared_layers", 0) or 0
    first = len(types) - shared
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < len(types):
        raise ValueError(
            f"{_file(where)}: num_kv_shared_layers={shared!r} must be an int in [0, {len(types)}): the last layers "
            "that read an earlier layer's keys, after at least one that computes them"
        )
    if shared and set(types[:first]) != set(types):  # transformers' own check: each type has a source
        raise ValueError(
            f"{_file(where)}: num_kv_shared_layers={shared} leaves no earlier layer of each type to read keys from "
            f"(layers 0..{first - 1} are {sorted(set(types[:first]))}, the model has {sorted(set(types))})"
        )
    return shared


def _rope(raw: dict[str, Any], where: Path, types: tuple[str, ...]) -> dict[str, Any]:
    given = raw.get("rope_parameters") or ROPE
    if not isinstance(given, dict) or set(given) - set(ROPE):
        raise ValueError(
            f"{_file(where)}: a gemma4_text rope_parameters holds one entry per attention type ({list(ROPE)}), "
            f"got {given!r:.120}"
        )
    read = {kind: rope.typed_entry(dict(given.get(kind) or ROPE[kind]), where, kind, raw) for kind in ROPE}
    (base, scaling, full), (local, local_scaling, sliding) = read["full_attention"], read["sliding_attention"]
    slides = "sliding" in types
    return dict(
        rope_base=base,
        rope_scaling=scaling,
        rope_local_base=local if slides else None,
        rope_local_scaling=local_scaling if slides else None,
        full=full,
        sliding=sliding if slides else None,
    )


def _experts(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    if not raw.get("enable_moe_block", False):
        return {}
    n, k = llama.need(raw, "num_experts", where), llama.need(raw, "top_k_experts", where)
    width = llama.need(raw, "moe_intermediate_size", where)
    return dict(moe_beside=True, num_experts=n, num_experts_per_tok=k, moe_intermediate_size=width)


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    wrapper = raw.get("model_type") == "gemma4"
    text = text_of(raw, where)
    types = _layer_types(text, where)  # refuses a quantized checkpoint and unknown layer types first
    llama.refuse(text, where, **REFUSED)
    ple = text.get("hidden_size_per_layer_input", 256) or 0
    if ple and text.get("vocab_size_per_layer_input", 262_144) != text.get("vocab_size", 262_144):
        raise ValueError(
            f"{_file(where)}: vocab_size_per_layer_input={text.get('vocab_size_per_layer_input', 262_144)!r} differs "
            f"from vocab_size={text.get('vocab_size', 262_144)!r}; attnlab reads per-layer embeddings of the model's "
            "vocabulary"
        )
    shapes, shared = _shapes(text, where, types), _sharing(text, where, types)
    rope = _rope(text, where, types)
    common = llama.common(
        {**text, "hidden_act": None, "tie_word_embeddings": text.get("tie_word_embeddings", True), "head_dim": None},
        where,
        theta=None,
    )
    emb, heads = common["emb_dim"], common["n_heads"]
    full, sliding = rope.pop("full"), rope.pop("sliding")
    d, kv = shapes.get("sliding", shapes["full"])
    big, big_kv = shapes["full"]
    keys_as_values = bool(text.get("attention_k_eq_v", False))
    return GPTConfig(
        **{
            **common,
            "head_dim": None if d * heads == emb else d,
            "n_kv_heads": kv,
            "mlp": "geglu",
            "context_length": text.get("max_position_embeddings", 131_072),
        },
        **rope,
        full_layers=LayerShape(head_dim=big, n_kv_heads=big_kv, keys_as_values=keys_as_values, rope_proportion=full),
        sliding_layers=LayerShape(rope_proportion=sliding) if sliding is not None else None,
        norm_placement="sandwich",
        qk_norm=True,
        v_norm=True,
        emb_scale=float(math.sqrt(emb)),
        attn_scale=1.0,
        final_softcap=text.get("final_logit_softcapping"),
        window=text.get("sliding_window", 512) if "sliding" in types else None,
        layer_types=types,
        kv_shared_layers=shared,
        double_wide_shared=bool(text.get("use_double_wide_mlp", False)) and shared > 0,
        ple_dim=ple,
        layer_scalar=True,
        **_experts(text, where),
        family="gemma4" if wrapper else "gemma4_text",
    )
