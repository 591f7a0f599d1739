"""The book's own from-scratch Llama 3 and Qwen3 (``llms_from_scratch.llama3``, ``llms_from_scratch.qwen3``).

Their state dicts carry no config: the book builds each model from a dict (``LLAMA32_CONFIG_1B``,
``QWEN_CONFIG_06_B``), so :func:`config_from_book` reads that same dict. Its keys, in the book's names:
vocab_size, context_length, emb_dim, n_heads, n_layers, hidden_dim, n_kv_groups (kv heads), rope_base, and
``rope_freq`` (Llama 3's scaling: factor, low_freq_factor, high_freq_factor, original_context_length) or
``head_dim`` and ``qk_norm`` (Qwen3). The book's names are already attnlab's but for three things: q, k and v
are three linears (``att.W_query``, ``W_key``, ``W_value``) where attnlab has one fused ``att.qkv``; Qwen3's
RMSNorm calls its weight ``scale``; and the head is never tied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import GPTConfig
from attnlab.models.families.rows import Rows

ROPE_FREQ = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")  # Llama 3's scaling
LLAMA3_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "hidden_dim", "n_kv_groups")


def kind_of(cfg: Mapping[str, Any]) -> str:
    """ "llama3" or "qwen3", by the keys of the book's config dict."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be the book's config dict (e.g. LLAMA32_CONFIG_1B), got {type(cfg).__name__}")
    missing = [k for k in (*LLAMA3_KEYS, "rope_base") if k not in cfg]
    if missing:
        raise ValueError(f"the book's config dict lacks {missing}; give the dict the book's model was built from")
    if "rope_freq" in cfg:
        return "llama3"
    if "qk_norm" in cfg:
        if cfg.get("num_experts", 0):
            raise ValueError("the book's Qwen3 mixture of experts (num_experts > 0) is not a dense decoder")
        return "qwen3"
    raise ValueError("the book's config dict has neither rope_freq (Llama 3) nor qk_norm (Qwen3)")


def config_from_book(cfg: Mapping[str, Any], **overrides: Any) -> GPTConfig:
    """The decoder that computes what the book's Llama3Model or Qwen3Model built from ``cfg`` computes."""
    kind = kind_of(cfg)
    values: dict[str, Any] = dict(
        vocab_size=cfg["vocab_size"],
        context_length=cfg["context_length"],
        emb_dim=cfg["emb_dim"],
        n_heads=cfg["n_heads"],
        n_layers=cfg["n_layers"],
        n_kv_heads=cfg["n_kv_groups"],
        hidden_dim=cfg["hidden_dim"],
        rope_base=float(cfg["rope_base"]),
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        rope=True,
        drop_rate=0.0,
    )
    if kind == "llama3":  # nn.RMSNorm(eps=1e-5); scaling from rope_freq, or none
        freq = cfg["rope_freq"]
        unread = sorted(set(freq) - set(ROPE_FREQ)) if isinstance(freq, Mapping) else []
        if unread or not isinstance(freq, (Mapping, type(None))):
            raise ValueError(
                f"the book's rope_freq must be None or a dict of {list(ROPE_FREQ)}, got {freq!r:.120}"
                + (f": {unread} not read" if unread else "")
            )
        scaling = None if freq is None else RopeScaling(kind="llama3", **{k: freq[k] for k in freq})
        values |= dict(layer_norm_eps=1e-5, rope_scaling=scaling)
    else:  # the book's own RMSNorm, eps 1e-6; head_dim None means emb_dim // n_heads
        head_dim = cfg.get("head_dim")
        values |= dict(layer_norm_eps=1e-6, qk_norm=bool(cfg["qk_norm"]))
        values["head_dim"] = None if head_dim is None or head_dim * cfg["n_heads"] == cfg["emb_dim"] else head_dim
    return GPTConfig(**{**values, **overrides})


def from_book(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, str]]:
    """The book's names to attnlab's: the tensors (q, k, v stacked as rows) and each one's name in the dict."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    stacked: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if key.endswith((".cos", ".sin")) or key in ("cos", "sin") or key.endswith(".mask"):
            continue  # RoPE tables and the causal mask: buffers the decoder builds itself
        parts = key.split(".")
        if len(parts) == 5 and parts[2] == "att" and parts[3] in ("W_query", "W_key", "W_value"):
            stacked.setdefault(".".join([*parts[:3], "qkv", parts[4]]), {})[parts[3]] = tensor
            continue
        ours = key.removesuffix(".scale") + ".weight" if key.endswith(".scale") else key
        out[ours], origin[ours] = tensor, key
    for ours, pieces in stacked.items():
        missing = [p for p in ("W_query", "W_key", "W_value") if p not in pieces]
        if missing:
            raise ValueError(f"the book's state dict has {sorted(pieces)} but not {missing} for {ours!r}")
        out[ours] = Rows((pieces["W_query"], pieces["W_key"], pieces["W_value"]))  # rows: q, k, v
        origin[ours] = ours.replace("qkv", "W_query/W_key/W_value")
    return out, origin
