"""GPT-2 checkpoints: Hugging Face's ``GPT2LMHeadModel`` config and tensor names, both ways.

Hugging Face to attnlab (GPT-2's Conv1D keeps its weight as (in, out), the transpose of nn.Linear's):
    transformer.wte / wpe                    tok_emb / pos_emb
    transformer.h.N.ln_1, ln_2               trf_blocks.N.norm1, norm2
    transformer.h.N.attn.c_attn (Conv1D)     trf_blocks.N.att.qkv (rows: queries, keys, values)
    transformer.h.N.attn.c_proj (Conv1D)     trf_blocks.N.att.out_proj
    transformer.h.N.mlp.c_fc, c_proj         trf_blocks.N.ff.0, ff.2
    transformer.ln_f                         final_norm
    lm_head                                  out_head (absent when tied to the embedding)
A ``GPT2Model`` saved without its head has no ``transformer.`` prefix; the causal-mask buffers GPT-2 once saved
(``attn.bias``, ``attn.masked_bias``) are not weights. attnlab's config rides along under ``"attnlab"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig

# (name in the file, name in attnlab, stored transposed)
Names = list[tuple[str, str, bool]]
BUFFERS = (".attn.bias", ".attn.masked_bias")  # GPT-2's old causal-mask buffers: built, never read


def attention_names(theirs: str, ours: str) -> Names:
    """One ``GPT2Attention``'s tensors (prefix ``theirs``) and the attention module's (prefix ``ours``)."""
    return [
        (theirs + "c_attn.weight", ours + "qkv.weight", True),
        (theirs + "c_attn.bias", ours + "qkv.bias", False),
        (theirs + "c_proj.weight", ours + "out_proj.weight", True),
        (theirs + "c_proj.bias", ours + "out_proj.bias", False),
    ]


def names(config: GPTConfig) -> Names:
    """The whole model's names for ``config``, each with attnlab's."""
    out: Names = [
        ("transformer.wte.weight", "tok_emb.weight", False),
        ("transformer.wpe.weight", "pos_emb.weight", False),
    ]
    for i in range(config.n_layers):
        h, b = f"transformer.h.{i}.", f"trf_blocks.{i}."
        out += [(h + f"ln_1.{p}", b + f"norm1.{p}", False) for p in ("weight", "bias")]
        out += attention_names(h + "attn.", b + "att.")
        out += [(h + f"ln_2.{p}", b + f"norm2.{p}", False) for p in ("weight", "bias")]
        out += [
            (h + f"mlp.{fc}.{p}", b + f"ff.{n}.{p}", p == "weight")
            for fc, n in (("c_fc", 0), ("c_proj", 2))
            for p in ("weight", "bias")
        ]
    out += [
        ("transformer.ln_f.weight", "final_norm.weight", False),
        ("transformer.ln_f.bias", "final_norm.bias", False),
    ]
    if not config.tie_weights:
        out.append(("lm_head.weight", "out_head.weight", False))
    return out


def _need(raw: dict[str, Any], key: str, where: Path) -> Any:
    if key not in raw:
        raise ValueError(f"{str(where / 'config.json')!r} has no {key!r}; a GPT-2 config needs it")
    return raw[key]


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    """The decoder's config for GPT-2's config.json; settings the decoder does not have are refused by name."""
    unsupported = {
        "activation_function": (raw.get("activation_function", "gelu_new"), ("gelu_new", "gelu_pytorch_tanh")),
        "scale_attn_weights": (raw.get("scale_attn_weights", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (raw.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "add_cross_attention": (raw.get("add_cross_attention", False), (False,)),
        "n_inner": (raw.get("n_inner"), (None, 4 * raw.get("n_embd", 768))),
    }
    for key, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise ValueError(f"{str(where)!r}: {key}={value!r} is not supported by attnlab's GPT (it needs {allowed})")
    tie = raw.get("tie_word_embeddings", True)
    if not isinstance(tie, bool):  # "false" is a string, and bool("false") is True
        raise ValueError(f"{str(where / 'config.json')!r}: tie_word_embeddings must be true or false, got {tie!r}")
    return GPTConfig(
        vocab_size=_need(raw, "vocab_size", where),
        context_length=raw.get("n_positions", 1024),
        emb_dim=raw.get("n_embd", 768),
        n_heads=raw.get("n_head", 12),
        n_layers=raw.get("n_layer", 12),
        drop_rate=float(raw.get("resid_pdrop", 0.1)),
        qkv_bias=True,
        tie_weights=tie,
        layer_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
    )


def from_hf(tensors: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Hugging Face names to attnlab's: the tensors and, per attnlab name, the name in the file (also for a
    missing one: the name it should have had); the rest comes back as ``<unexpected>name``."""
    plain = {k.removeprefix("transformer."): k for k in tensors}  # a GPT2Model saved without the LM head
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for hf, ours, transposed in names(config):
        key = plain.get(hf.removeprefix("transformer."), hf)
        origin[ours] = key
        if key in tensors:
            out[ours] = tensors[key].T if transposed else tensors[key]
    known = set(origin.values()) | {"lm_head.weight"}  # a tied head in the file: the embedding again
    out |= {f"<unexpected>{k}": v for k, v in tensors.items() if k not in known and not k.endswith(BUFFERS)}
    return out, origin


def holds(config: GPTConfig) -> bool:
    """Whether ``GPT2LMHeadModel`` holds this model (attnlab's default layout, read from no other family)."""
    return config.is_gpt2 and config.family in (None, "gpt2")


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``transformers.GPT2LMHeadModel``, with attnlab's own config alongside."""
    eos = 50256 if config.vocab_size > 50256 else None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.emb_dim,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.drop_rate,
        "embd_pdrop": config.drop_rate,
        "attn_pdrop": config.drop_rate,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": config.tie_weights,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "attnlab": config.to_dict(),
    }


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under GPT-2's names and layout (Conv1D weights transposed; zero q/k/v biases where the
    model has none, since GPT-2 always has them), and its config.json."""
    out: dict[str, torch.Tensor] = {}
    for hf, ours, transposed in names(config):
        if ours not in state:
            out[hf] = torch.zeros(3 * config.emb_dim, dtype=state["tok_emb.weight"].dtype)
            continue
        tensor = state[ours].detach()
        out[hf] = (tensor.T if transposed else tensor).contiguous().clone()
    return out, hf_config(config)
