"""GPTConfig: the book's names and defaults (chapter 4's GPT_CONFIG_124M), and the four GPT-2 sizes.

>>> GPTConfig.preset("gpt2-medium").emb_dim
1024
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from attnlab._checks import check_dropout, check_heads, check_kv_heads, check_positive_int, check_window
from attnlab.functional.mods import ScoreMod, alibi, softcap
from attnlab.functional.registry import BACKENDS, Backend

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
    # Beyond GPT-2, in the book's naming style: grouped-query heads, rotary positions instead of learned ones,
    # a sliding window, and a built-in score_mod for every layer ("alibi", "learned-alibi", "softcap:<cap>").
    n_kv_heads: int | None = None
    rope: bool = False
    rope_base: float = 10000.0
    window: int | None = None
    score_mod: str | None = None

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
        if self.n_kv_heads is not None:
            check_kv_heads(self.n_heads, self.n_kv_heads)
        if not isinstance(self.rope, bool):
            raise TypeError(f"rope must be a bool, got {self.rope!r}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or self.rope_base <= 1:
            raise ValueError(
                f"rope_base must be a number > 1 (RoPE's theta, 10000 in the paper), got {self.rope_base!r}"
            )
        if self.window is not None:
            check_window(self.window)
        if self.score_mod is not None:
            score_mod_from_name(self.score_mod, self.n_heads)  # names the known ones when it is not one of them

    @property
    def is_gpt2(self) -> bool:
        """Whether Hugging Face's GPT2LMHeadModel holds this model (learned positions, full heads, no window or mod)."""
        return not self.rope and self.n_kv_heads in (None, self.n_heads) and self.window is None and not self.score_mod

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
