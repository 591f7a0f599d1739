"""GLM-5 checkpoints: ``GlmMoeDsaForCausalLM``, DeepSeek-V3.2's layout (``deepseek_v32.py``: latent attention, a
lightning indexer on each layer, the grouped router) with the indexer's RoPE on interleaved pairs.

GLM-5's ``indexer_types`` may mark a layer "shared", reusing the previous layer's top-k instead of running an
indexer of its own; attnlab reads checkpoints whose every layer is "full" (the default schedule) and refuses the
others by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import deepseek_v32

MODEL_TYPES = ("glm_moe_dsa",)


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    layers = raw.get("num_hidden_layers")
    kinds = raw.get("indexer_types")
    pattern = raw.get("index_topk_pattern")
    freq, offset = raw.get("index_topk_freq", 1), raw.get("index_skip_topk_offset", 2)
    if isinstance(layers, int) and kinds is None and pattern is None:  # transformers' schedule from freq, offset
        kinds = ["full" if max(i - offset + 1, 0) % max(freq, 1) == 0 else "shared" for i in range(layers)]
    if pattern is not None and kinds is None:
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    if kinds is not None and any(kind != "full" for kind in kinds):
        raise ValueError(
            f"{str(where / 'config.json')!r}: indexer_types {list(kinds)!r}: a 'shared' layer reuses the previous "
            "layer's top-k, which attnlab does not read yet; it reads GLM-5 checkpoints whose every layer is 'full'"
        )
    return deepseek_v32.read(raw, where, family="glm_moe_dsa", interleave=True)


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, Any], dict[str, str]]:
    return deepseek_v32.from_hf(tensors, config)


def hf_config(config: GPTConfig) -> dict[str, Any]:
    return {**deepseek_v32.hf_config(config, "glm_moe_dsa"), "indexer_types": ["full"] * config.n_layers}


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, _ = deepseek_v32.to_hf(state, config)
    return tensors, hf_config(config)


def holds(config: GPTConfig) -> bool:
    return deepseek_v32.holds(config, "glm_moe_dsa")
