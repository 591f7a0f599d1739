"""GPTConfig: the book's names and defaults (chapter 4's GPT_CONFIG_124M), and the four GPT-2 sizes.

>>> GPTConfig.preset("gpt2-medium").emb_dim
1024
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from attnlab._checks import check_dropout, check_heads, check_positive_int
from attnlab.functional.registry import BACKENDS, Backend

# The book's table of GPT-2 sizes (chapter 4): embedding size, layers, heads.
PRESETS: dict[str, dict[str, int]] = {
    "gpt2-small": {"emb_dim": 768, "n_layers": 12, "n_heads": 12},  # 124M
    "gpt2-medium": {"emb_dim": 1024, "n_layers": 24, "n_heads": 16},  # 355M
    "gpt2-large": {"emb_dim": 1280, "n_layers": 36, "n_heads": 20},  # 774M
    "gpt2-xl": {"emb_dim": 1600, "n_layers": 48, "n_heads": 25},  # 1558M
}


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The book's GPT_CONFIG_124M by default; ``tie_weights`` shares tok_emb with out_head (as GPT-2 does)."""

    vocab_size: int = 50257
    context_length: int = 1024
    emb_dim: int = 768
    n_heads: int = 12
    n_layers: int = 12
    drop_rate: float = 0.1
    qkv_bias: bool = False
    tie_weights: bool = False
    layer_norm_eps: float = 1e-5
    backend: Backend = "auto"

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("context_length", self.context_length, limit=2**24)
        check_positive_int("emb_dim", self.emb_dim, limit=2**16)
        check_positive_int("n_layers", self.n_layers, limit=4096)
        check_heads(self.emb_dim, self.n_heads, names=("emb_dim", "n_heads"))
        check_dropout(self.drop_rate, name="drop_rate")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.layer_norm_eps, float) or not 0 < self.layer_norm_eps < 1:
            raise ValueError(f"layer_norm_eps must be a float in (0, 1), got {self.layer_norm_eps!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """One of the book's GPT-2 sizes (``gpt2-small`` ... ``gpt2-xl``), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {list(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known: {sorted(known)}")
        return cls(**values)

    def with_(self, **changes: Any) -> GPTConfig:
        return replace(self, **changes)
