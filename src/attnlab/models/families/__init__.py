"""Checkpoint families: one small file each, mapping a family's config.json and tensor names to the decoder's.

GPT-2 (``gpt2.py``, Conv1D weights transposed), the book's own models (``book.py``: chapter 4's GPTModel and
the from-scratch Llama 3 and Qwen3, whose state dicts carry no config), the families that name their tensors as
Llama does (``llama.py``: Llama 3; ``mistral.py``; ``qwen.py``: Qwen2, Qwen3, Qwen3-MoE;
``gemma.py``: Gemma 3; ``gpt_oss.py``, whose experts are fused), DeepSeek-V3 with its latent attention
(``deepseek.py``), DeepSeek-V3.2 and GLM-5 with DeepSeek Sparse Attention (``deepseek_v32.py``,
``glm_moe_dsa.py``), the hybrids (``qwen3_5.py``, ``olmo_hybrid.py``; ``kimi_linear.py``: Kimi Delta Attention beside
MLA without RoPE). Every family reads RoPE's
settings, per layer type where the config has them so, through ``rope.py``: each key read as transformers reads
it, or refused by name (``tests/test_rope_settings.py``). A new family is one new file, its entry in ``READERS``
and its parity test (``tests/test_families.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import (
    deepseek,
    deepseek_v4,
    deepseek_v32,
    gemma,
    gemma4,
    glm_moe_dsa,
    gpt2,
    gpt_oss,
    kimi_linear,
    lfm3,
    llama,
    mimo_v2_flash,
    mistral,
    olmo_hybrid,
    qwen,
    qwen3_5,
    qwen3_5_moe,
)
from attnlab.models.families.rows import Rows

__all__ = ["READERS", "Rows", "config_from_hf", "from_hf", "holds", "to_hf"]

READERS = {"llama": llama.config_from_hf, "mistral": mistral.config_from_hf, "gemma3_text": gemma.config_from_hf}
READERS |= {kind: qwen.config_from_hf for kind in qwen.MODEL_TYPES} | {"gpt_oss": gpt_oss.config_from_hf}
READERS |= {"deepseek_v3": deepseek.config_from_hf, "gpt2": gpt2.config_from_hf}
READERS |= {kind: qwen3_5.config_from_hf for kind in qwen3_5.MODEL_TYPES} | {"olmo_hybrid": olmo_hybrid.config_from_hf}
READERS |= {"lfm3": lfm3.config_from_hf, "mimo_v2_flash": mimo_v2_flash.config_from_hf}
READERS |= {kind: qwen3_5_moe.config_from_hf for kind in qwen3_5_moe.MODEL_TYPES}
READERS |= {"kimi_linear": kimi_linear.config_from_hf}
# families whose names are their own (not the Llama layout's): each file's from_hf, to_hf and holds
OWN: dict[str | None, Any] = {None: gpt2, "gpt2": gpt2, "olmo_hybrid": olmo_hybrid, "lfm3": lfm3}
OWN |= {kind: qwen3_5 for kind in qwen3_5.MODEL_TYPES}
OWN |= {kind: qwen3_5_moe for kind in qwen3_5_moe.MODEL_TYPES}
OWN["kimi_linear"] = kimi_linear
OWN["mimo_v2_flash"] = mimo_v2_flash
READERS |= dict.fromkeys(gemma4.MODEL_TYPES, gemma4.config_from_hf)
OWN |= dict.fromkeys(gemma4.MODEL_TYPES, gemma4)
READERS |= {"deepseek_v32": deepseek_v32.config_from_hf, "glm_moe_dsa": glm_moe_dsa.config_from_hf}
OWN |= {"deepseek_v32": deepseek_v32, "glm_moe_dsa": glm_moe_dsa}
READERS["deepseek_v4"], OWN["deepseek_v4"] = deepseek_v4.config_from_hf, deepseek_v4


def _names(config: GPTConfig) -> llama.Names:
    """The family's tensor names: DeepSeek-V3's own (latent attention), or the Llama layout's."""
    return deepseek.names(config) if config.family == "deepseek_v3" else llama.names(config)


def _offset(config: GPTConfig, ours: str) -> float:
    """What the file's tensor is short of attnlab's: Gemma stores its norms' weights as w - 1 (it scales by 1 + w)."""
    return 1.0 if config.family == "gemma3_text" and "norm" in ours.rsplit(".", 2)[-2] else 0.0


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    """The decoder's config for a Hugging Face config.json of a family in ``READERS``."""
    kind = raw.get("model_type")
    if kind not in READERS:
        others = sorted(set(READERS) - {"gpt2"})
        raise ValueError(f"{str(where)!r} is a {kind!r} model; attnlab reads model_type 'gpt2' and {others}")
    return READERS[kind](raw, where)


def from_hf(
    tensors: dict[str, torch.Tensor], config: GPTConfig
) -> tuple[dict[str, torch.Tensor | Rows], dict[str, str]]:
    """Hugging Face names to attnlab's: the tensors (a :class:`Rows` where several stack) and, per attnlab name,
    the name(s) in the file; what the file holds beyond the model comes back as ``<unexpected>name``."""
    if config.family in OWN:
        own: tuple[dict[str, torch.Tensor | Rows], dict[str, str]] = OWN[config.family].from_hf(tensors, config)
        return own
    out: dict[str, torch.Tensor | Rows] = {}
    origin: dict[str, str] = {}
    fused = config.family == "gpt_oss"  # its experts in fused tensors: read by their own file
    known: set[str] = {"lm_head.weight"}
    if fused:
        out, origin = gpt_oss.from_hf(tensors, config)
        known |= gpt_oss.experts_known(config)
    for theirs, ours in _names(config):
        if fused and ".ff." in ours:
            continue
        origin[ours] = "/".join(theirs)
        present = [tensors[name] for name in theirs if name in tensors]
        if len(present) == len(theirs):
            out[ours] = present[0] if len(present) == 1 else Rows(tuple(present))
            if _offset(config, ours):
                out[ours] = present[0] + _offset(config, ours)  # a norm's weight: one small vector
    if config.tie_weights and "lm_head.weight" in tensors:  # a tied head in the file: kept if it differs
        out["out_head.weight"], origin["out_head.weight"] = tensors["lm_head.weight"], "lm_head.weight"
    known |= {name for theirs, ours in _names(config) for name in theirs if not (fused and ".ff." in ours)}
    for key in tensors:
        if key not in known:
            out[f"<unexpected>{key}"] = tensors[key]
    return out, origin


def holds(config: GPTConfig) -> bool:
    """Whether the config's ``family`` holds it exactly, so that it is saved as that family (GPT-2 where the config
    names none)."""
    if config.family in OWN:
        return bool(OWN[config.family].holds(config))
    if config.shapes_layers:  # per-type shapes, value settings, KV sharing: read by the families in OWN only
        return False
    if config.shared_expert_gate or config.shared_expert_dim is not None:  # Qwen3.5-MoE's shared expert: its file's
        return False
    if config.family in qwen.MODEL_TYPES:
        return qwen.holds(config, config.family)
    readers = {"llama": llama.holds, "mistral": mistral.holds, "gemma3_text": gemma.holds, "gpt_oss": gpt_oss.holds}
    readers["deepseek_v3"] = deepseek.holds
    return readers.get(str(config.family), lambda c: False)(config)


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under its family's names, and the family's config.json (``holds`` it first)."""
    if config.family in OWN:
        written: tuple[dict[str, torch.Tensor], dict[str, Any]] = OWN[config.family].to_hf(state, config)
        return written
    family = str(config.family)
    described = qwen.hf_config(config, family) if family in qwen.MODEL_TYPES else None
    writers = {"llama": llama.hf_config, "mistral": mistral.hf_config, "gemma3_text": gemma.hf_config}
    described = described or (writers | {"gpt_oss": gpt_oss.hf_config, "deepseek_v3": deepseek.hf_config})[family](
        config
    )
    d, h, h_kv = config.d_head, config.n_heads, config.n_kv_heads or config.n_heads
    out: dict[str, torch.Tensor] = {}
    fused = family == "gpt_oss"
    if fused:
        out |= gpt_oss.to_hf(state, config)
    for theirs, ours in _names(config):
        if fused and ".ff." in ours:
            continue
        tensor = state[ours].detach()
        pieces = tensor.split([h * d, h_kv * d, h_kv * d]) if len(theirs) == 3 else (tensor,)  # rows: q, k, v
        if _offset(config, ours):
            pieces = tuple(piece - _offset(config, ours) for piece in pieces)
        out |= {name: piece.contiguous().clone() for name, piece in zip(theirs, pieces, strict=True)}
    return out, described
