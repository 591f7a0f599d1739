"""DeepSeek-V3.2 checkpoints: ``DeepseekV32ForCausalLM``, DeepSeek-V3 (``deepseek.py``: latent attention, the
grouped router, dense first layers) with DeepSeek Sparse Attention on every layer (``attnlab.nn.indexed``).

Each layer's ``self_attn.indexer`` holds ``wq_b`` (from the query latent, ``index_n_heads`` heads of
``index_head_dim``), ``wk`` and ``k_norm`` (a LayerNorm with its bias) for its keys, and ``weights_proj``; each
query reads the ``index_topk`` keys it scores highest. The config has no ``rope_interleave``: the main attention
turns interleaved pairs, the indexer rotate-half (GLM-5's, ``glm_moe_dsa.py``, interleaved). Its ``layer_types``
are all "indexed_attention" and ``mlp_layer_types`` the dense first layers then "sparse": anything else refused
by name, as are biases on the attention or MLP.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import deepseek, llama
from attnlab.models.families.named import Names, read_names, write_names

MODEL_TYPES = ("deepseek_v32",)
INDEXER = ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")


def _refuse_layers(raw: dict[str, Any], where: Path, layers: int, dense: int) -> None:
    kinds = raw.get("layer_types")
    if kinds is not None and list(kinds) != ["indexed_attention"] * layers:
        raise ValueError(
            f"{str(where / 'config.json')!r}: layer_types {kinds!r}: attnlab reads DSA checkpoints whose every layer "
            "is 'indexed_attention'"
        )
    mlp = raw.get("mlp_layer_types")
    if mlp is not None and list(mlp) != ["dense"] * dense + ["sparse"] * (layers - dense):
        raise ValueError(
            f"{str(where / 'config.json')!r}: mlp_layer_types {mlp!r}: attnlab reads the first "
            f"first_k_dense_replace={dense} layers dense and the rest sparse"
        )


def read(raw: dict[str, Any], where: Path, *, family: str, interleave: bool) -> GPTConfig:
    """DeepSeek-V3's fields, then the indexer's; ``family`` and the indexer's RoPE layout are the caller's."""
    llama.refuse(raw, where, attention_bias=(None, False), mlp_bias=(None, False))
    if raw.get("q_lora_rank") is None:
        raise ValueError(f"{str(where / 'config.json')!r}: q_lora_rank is null; DSA's indexer reads the query latent")
    if "rope_interleave" in raw and raw["rope_interleave"] is not True:
        raise ValueError(f"{str(where / 'config.json')!r}: rope_interleave {raw['rope_interleave']!r}: DSA turns pairs")
    base = deepseek.config_from_hf({**raw, "rope_interleave": True}, where)
    layers = base.n_layers
    _refuse_layers(raw, where, layers, min(raw.get("first_k_dense_replace", 3), layers))
    return replace(
        base,
        index_topk=raw.get("index_topk", 2048),
        index_heads=raw.get("index_n_heads", 64),
        index_head_dim=raw.get("index_head_dim", 128),
        index_rope_interleave=interleave,
        family=family,
    )


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    return read(raw, where, family="deepseek_v32", interleave=False)


def names(config: GPTConfig) -> Names:
    """DeepSeek-V3's names and each layer's indexer."""
    out: Names = list(deepseek.names(config))
    for i in range(config.n_layers):
        h, b = f"model.layers.{i}.self_attn.indexer.", f"trf_blocks.{i}.att.indexer."
        out += [((h + n,), b + n) for n in INDEXER]
    return out


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    return read_names(tensors, names(config), tie=config.tie_weights)


def hf_config(config: GPTConfig, model_type: str = "deepseek_v32") -> dict[str, Any]:
    """config.json as transformers' ``DeepseekV32Config`` (or GLM-5's) reads it."""
    values = deepseek.hf_config(config)
    architecture = {"deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[model_type]
    del values["rope_interleave"], values["num_nextn_predict_layers"]  # neither config has them
    dense = len(config.dense_layers)
    return {
        **values,
        "architectures": [architecture],
        "model_type": model_type,
        "attention_bias": False,
        "index_topk": config.index_topk,
        "index_n_heads": config.index_heads,
        "index_head_dim": config.index_head_dim,
        "layer_types": ["indexed_attention"] * config.n_layers,
        "mlp_layer_types": ["dense"] * dense + ["sparse"] * (config.n_layers - dense),
    }


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return write_names(state, names(config), rows=[]), hf_config(config, str(config.family))


def holds(config: GPTConfig, family: str = "deepseek_v32") -> bool:
    """Whether the family holds this config exactly: its config.json reads back as the same config."""
    if config.family != family or config.index_topk is None or not deepseek.holds(config):
        return False
    interleave = family == "glm_moe_dsa"
    try:
        again = read(hf_config(config, family), Path("."), family=family, interleave=interleave)
    except (ValueError, TypeError):
        return False
    return again == replace(config, drop_rate=0.0, backend="auto")
