"""The book's own models: chapter 4's GPTModel (``llms_from_scratch.ch04``) and the from-scratch Llama 3 and
Qwen3 (``llms_from_scratch.llama3``, ``llms_from_scratch.qwen3``).

Their state dicts carry no config: the book builds each model from a dict (``GPT_CONFIG_124M``,
``LLAMA32_CONFIG_1B``, ``QWEN_CONFIG_06_B``), so :func:`config_from_book` reads that same dict. Its keys, in the
book's names: vocab_size, context_length, emb_dim, n_heads, n_layers, then drop_rate and qkv_bias (GPTModel), or
hidden_dim, n_kv_groups (kv heads), rope_base, and ``rope_freq`` (Llama 3's scaling: factor, low_freq_factor,
high_freq_factor, original_context_length) or ``head_dim`` and ``qk_norm`` (Qwen3). A GPTModel's ``.pth`` read
without its dict takes its sizes from the tensors (:func:`config_from_tensors`).

The book's names are already attnlab's but for four things (:func:`from_book_names`, :func:`book_state_dict`): q, k and
v are three linears (``att.W_query``, ``W_key``, ``W_value``) where attnlab has one fused ``att.qkv``; a norm's
weight is its ``scale`` (and a LayerNorm's bias its ``shift``); GPTModel's MLP is a Sequential
(``ff.layers.0``, ``ff.layers.2``); and the head is never tied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.functional.rotary import RopeScaling
from attnlab.models.config import PRESETS, GPTConfig
from attnlab.models.families.rows import Rows

GPT_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")
ROPE_FREQ = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")  # Llama 3's scaling
LLAMA3_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "hidden_dim", "n_kv_groups")


def kind_of(cfg: Mapping[str, Any]) -> str:
    """ "gpt", "llama3" or "qwen3", by the keys of the book's config dict."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be the book's config dict (e.g. LLAMA32_CONFIG_1B), got {type(cfg).__name__}")
    if "qkv_bias" in cfg and "rope_base" not in cfg:  # chapter 4's GPTModel
        missing = [k for k in GPT_KEYS if k not in cfg]
        if missing:
            raise ValueError(f"the book's config dict lacks {missing}; give the dict GPTModel was built from")
        return "gpt"
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
    """The decoder that computes what the book's GPTModel, Llama3Model or Qwen3Model built from ``cfg`` computes."""
    kind = kind_of(cfg)
    if kind == "gpt":  # GPT-2's layout: attnlab's default decoder, a head of its own
        sizes = {k: cfg[k] for k in GPT_KEYS}
        return GPTConfig(**{**sizes, "drop_rate": float(cfg["drop_rate"]), "tie_weights": False, **overrides})
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


def config_from_tensors(tensors: Mapping[str, torch.Tensor], overrides: dict[str, Any]) -> GPTConfig:
    """A GPTModel's ``.pth`` read without its dict: sizes from the tensors, heads from the GPT-2 presets."""
    for key in ("tok_emb.weight", "pos_emb.weight"):
        if key not in tensors:
            raise ValueError(
                f"not a state dict of the book's GPTModel: it lacks {key!r}; it holds {sorted(tensors)[:8]}"
            )
    vocab, emb = tensors["tok_emb.weight"].shape
    heads = next((p["n_heads"] for n, p in PRESETS.items() if n.startswith("gpt2") and p["emb_dim"] == emb), None)
    if heads is None and "n_heads" not in overrides:
        raise ValueError(
            f"the book's state dict does not say how many heads its attention has (emb_dim {emb} is not a GPT-2 "
            "size): pass n_heads=..."
        )
    values = dict(
        vocab_size=vocab,
        context_length=tensors["pos_emb.weight"].shape[0],
        emb_dim=emb,
        n_heads=heads,
        n_layers=len({k.split(".")[1] for k in tensors if k.startswith("trf_blocks.")}),
        qkv_bias="trf_blocks.0.att.W_query.bias" in tensors,
    )
    return GPTConfig(**{**values, "tie_weights": False, **overrides})


QKV = ("W_query", "W_key", "W_value")
RENAMED = {".scale": ".weight", ".shift": ".bias"}  # a norm's weight and bias, by the book's names


def from_book_names(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, str]]:
    """The book's names to attnlab's, for any of its models or one attention module of them: the tensors (q, k
    and v stacked as rows) and each one's name in the dict."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    stacked: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        parts = key.split(".")
        if parts[-1] in ("cos", "sin", "mask"):
            continue  # RoPE tables and the causal mask: buffers the decoder builds itself
        if len(parts) >= 2 and parts[-2] in QKV:
            stacked.setdefault(".".join([*parts[:-2], "qkv", parts[-1]]), {})[parts[-2]] = tensor
            continue
        ours = key.replace(".ff.layers.", ".ff.")  # GPTModel's MLP, a Sequential
        ours = next((ours.removesuffix(old) + new for old, new in RENAMED.items() if ours.endswith(old)), ours)
        out[ours], origin[ours] = tensor, key
    for ours, pieces in stacked.items():
        missing = [p for p in QKV if p not in pieces]
        if missing:
            raise ValueError(f"the book's state dict has {sorted(pieces)} but not {missing} for {ours!r}")
        out[ours] = Rows(tuple(pieces[p] for p in QKV))  # rows: q, k, v
        origin[ours] = ours.replace("qkv", "W_query/W_key/W_value")
    return out, origin


def book_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under the book's GPTModel names, ready for ``GPTModel.load_state_dict``."""
    c = getattr(model, "config", None)
    if not isinstance(c, GPTConfig) or not c.is_gpt2:
        raise ValueError("the book's GPTModel holds GPT-2's layout only: learned positions, full heads, no window")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key.endswith("att.qkv.weight") or key.endswith("att.qkv.bias"):
            for name, rows in zip(QKV, tensor.chunk(3, dim=0), strict=True):  # rows: W_query, W_key, W_value
                out[key.replace("qkv", name)] = rows
            continue
        theirs = key.replace(".ff.", ".ff.layers.")  # GPTModel's MLP, a Sequential
        if "norm" in key.rsplit(".", 2)[-2]:  # norm1, norm2, final_norm: the book's scale and shift
            theirs = next(theirs.removesuffix(new) + old for old, new in RENAMED.items() if key.endswith(new))
        out[theirs] = tensor
    mask = torch.triu(torch.ones(c.context_length, c.context_length), diagonal=1)  # the book's buffer
    out |= {f"trf_blocks.{i}.att.mask": mask for i in range(c.n_layers)}
    return {k: v.detach().clone() for k, v in out.items()}
