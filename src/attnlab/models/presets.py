"""The names a ``GPTConfig`` can take instead of numbers: its built-in score_mods (``score_mod="alibi"``) and the
presets (``GPTConfig.preset("gpt2-medium")``): the book's four GPT-2 sizes (chapter 4's table) and today's
decoders by the shapes of their published config.json files (random weights wherever a model is built from them:
nothing downloads)."""

from __future__ import annotations

from typing import Any

from attnlab.functional.mods import ScoreMod, alibi, softcap
from attnlab.functional.rotary import RopeScaling

SCORE_MODS = ("alibi", "learned-alibi", "softcap:<cap>")  # what GPTConfig(score_mod=...) can name


def score_mod_from_name(name: object, n_heads: int) -> ScoreMod:
    """The built-in score_mod that ``GPTConfig.score_mod`` names, made for ``n_heads`` heads."""
    if name == "alibi":
        return alibi(n_heads)
    if name == "learned-alibi":
        return alibi(n_heads, learnable=True)
    if isinstance(name, str) and name.startswith("softcap:"):
        try:
            cap = float(name.split(":", 1)[1])
        except ValueError:
            cap = float("nan")
        return softcap(cap)
    raise ValueError(f"score_mod must name a built-in, one of {list(SCORE_MODS)} (e.g. 'softcap:50'), got {name!r}")


# The book's table of GPT-2 sizes (chapter 4): embedding size, layers, heads.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-small": {"emb_dim": 768, "n_layers": 12, "n_heads": 12},  # 124M
    "gpt2-medium": {"emb_dim": 1024, "n_layers": 24, "n_heads": 16},  # 355M
    "gpt2-large": {"emb_dim": 1280, "n_layers": 36, "n_heads": 20},  # 774M
    "gpt2-xl": {"emb_dim": 1600, "n_layers": 48, "n_heads": 25},  # 1558M
}
# Today's decoders, by the shapes of their published config.json files (random weights here: nothing downloads).
_LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "bias": False, "rope": True, "drop_rate": 0.0}
PRESETS |= {
    "llama-3.2-1b": _LLAMA
    | {"vocab_size": 128256, "context_length": 131072, "emb_dim": 2048, "n_heads": 32, "n_kv_heads": 8}
    | {"n_layers": 16, "hidden_dim": 8192, "rope_base": 500000.0, "tie_weights": True, "family": "llama"}
    | {"rope_scaling": RopeScaling(kind="llama3", factor=32.0, original_context_length=8192)},
    "llama-3.1-8b": _LLAMA
    | {"vocab_size": 128256, "context_length": 131072, "emb_dim": 4096, "n_heads": 32, "n_kv_heads": 8}
    | {"n_layers": 32, "hidden_dim": 14336, "rope_base": 500000.0, "family": "llama"}
    | {"rope_scaling": RopeScaling(kind="llama3", factor=8.0, original_context_length=8192)},
    "mistral-7b": _LLAMA
    | {"vocab_size": 32000, "context_length": 32768, "emb_dim": 4096, "n_heads": 32, "n_kv_heads": 8}
    | {"n_layers": 32, "hidden_dim": 14336, "window": 4096, "family": "mistral"},
    "qwen2.5-7b": _LLAMA
    | {"vocab_size": 152064, "context_length": 32768, "emb_dim": 3584, "n_heads": 28, "n_kv_heads": 4}
    | {"n_layers": 28, "hidden_dim": 18944, "rope_base": 1e6, "qkv_bias": True, "family": "qwen2"},
    "qwen3-0.6b": _LLAMA
    | {"vocab_size": 151936, "context_length": 40960, "emb_dim": 1024, "n_heads": 16, "n_kv_heads": 8}
    | {"head_dim": 128, "n_layers": 28, "hidden_dim": 3072, "rope_base": 1e6, "qk_norm": True}
    | {"layer_norm_eps": 1e-6, "tie_weights": True, "family": "qwen3"},
    "qwen3-8b": _LLAMA
    | {"vocab_size": 151936, "context_length": 40960, "emb_dim": 4096, "n_heads": 32, "n_kv_heads": 8}
    | {"head_dim": 128, "n_layers": 36, "hidden_dim": 12288, "rope_base": 1e6, "qk_norm": True}
    | {"layer_norm_eps": 1e-6, "family": "qwen3"},
}
