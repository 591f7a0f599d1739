"""Mistral checkpoints: Llama's block and names (``llama.py``), with a sliding window on every layer.

Hugging Face's ``sliding_window`` is the number of keys a query sees, its own included: query - key < window,
which is attnlab's ``window``. ``sliding_window: null`` (Mistral 7B v0.2 on) is full attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama

MODEL_TYPES = ("mistral",)


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    llama.refuse(raw, where, attention_bias=(None, False))
    return GPTConfig(**llama.common(raw, where), window=raw.get("sliding_window"), family="mistral")


def holds(config: GPTConfig) -> bool:
    return llama.lays_out(config) and not config.qkv_bias and not config.qk_norm and config.layer_types is None


def hf_config(config: GPTConfig) -> dict[str, Any]:
    return {**llama.hf_common(config, "mistral", "MistralForCausalLM"), "sliding_window": config.window}
