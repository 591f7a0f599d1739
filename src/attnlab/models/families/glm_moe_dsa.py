"""GLM-5 checkpoints: ``GlmMoeDsaForCausalLM``, DeepSeek-V3.2's layout (``deepseek_v32.py``: latent attention, a
lightning indexer on each layer, the grouped router) with the indexer's RoPE on interleaved pairs.

GLM-5's ``indexer_types`` (or ``index_topk_pattern``, or the schedule of ``index_topk_freq`` and
``index_skip_topk_offset``) may mark a layer "shared": it has no indexer and reuses the top-k of the layer before it
(``attnlab.nn.indexed_shared``; ``GPTConfig.index_shared``). A first layer marked shared has nothing to reuse and is
refused by name, as transformers refuses it when it runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import deepseek_v32
from attnlab.models.families.named import Names, read_names, write_names

MODEL_TYPES = ("glm_moe_dsa",)


def indexer_types(raw: dict[str, Any]) -> list[str] | None:
    """Each layer's "full" or "shared", as transformers' config derives them (None: no layer count to go by)."""
    layers, kinds, pattern = raw.get("num_hidden_layers"), raw.get("indexer_types"), raw.get("index_topk_pattern")
    freq, offset = raw.get("index_topk_freq", 1), raw.get("index_skip_topk_offset", 2)
    if kinds is None and pattern is not None:
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    if isinstance(layers, int) and kinds is None:  # transformers' schedule from freq, offset
        kinds = ["full" if max(i - offset + 1, 0) % max(freq, 1) == 0 else "shared" for i in range(layers)]
    return None if kinds is None else list(kinds)


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    kinds = indexer_types(raw)
    if kinds is not None and (any(k not in ("full", "shared") for k in kinds) or kinds[:1] == ["shared"]):
        raise ValueError(
            f"{str(where / 'config.json')!r}: indexer_types {kinds!r}: each layer is 'full' (its own indexer) or "
            "'shared' (the choice of the layer before it), and the first has none before it to share"
        )
    config = deepseek_v32.read(raw, where, family="glm_moe_dsa", interleave=True)
    shared = tuple(i for i, kind in enumerate(kinds or []) if kind == "shared")
    return replace(config, index_shared=shared) if shared else config


def names(config: GPTConfig) -> Names:
    """DeepSeek-V3.2's names, a shared layer's indexer left out (it has none)."""
    left_out = tuple(f"trf_blocks.{i}.att.indexer." for i in config.index_shared)
    return [(theirs, ours) for theirs, ours in deepseek_v32.names(config) if not ours.startswith(left_out)]


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    return read_names(tensors, names(config), tie=config.tie_weights)


def hf_config(config: GPTConfig) -> dict[str, Any]:
    kinds = ["shared" if i in config.index_shared else "full" for i in range(config.n_layers)]
    return {**deepseek_v32.hf_config(config, "glm_moe_dsa"), "indexer_types": kinds}


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return write_names(state, names(config), rows=[]), hf_config(config)


def holds(config: GPTConfig) -> bool:
    return deepseek_v32.holds(replace(config, index_shared=()), "glm_moe_dsa")
