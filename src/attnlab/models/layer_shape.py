"""What one type of softmax layer sets apart from the rest of its model (Gemma 4, MiMo-V2-Flash).

Gemma 3's full and sliding layers differ only in their window and their RoPE. Today's models shape each type of
layer on its own: Gemma 4's full layers have wider heads (``global_head_dim``), fewer key/value heads, keys that
serve as values and a proportional RoPE; MiMo-V2-Flash's sliding layers have twice the key/value heads of its
full ones and learned sinks the full ones lack. A :class:`LayerShape` holds what a type changes, None where it
keeps the config's own field; ``GPTConfig.full_layers`` and ``GPTConfig.sliding_layers`` hold one each, and
``GPTConfig.layer_shape(layer)`` answers for a layer, with nothing left to guess from the first layer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from attnlab._checks import check_positive_int


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """A layer type's own shape; None keeps the model's field.

    Args:
        head_dim: each query and key head's size (Gemma 4's ``global_head_dim`` on full layers).
        n_kv_heads: key/value heads (Gemma 4's ``num_global_key_value_heads``; MiMo's sliding layers: twice).
        sinks: a learned sink logit per head on this type only (MiMo-V2-Flash's sliding layers).
        keys_as_values: the key projection's output, before its norm and RoPE, is the value too (Gemma 4's
            ``attention_k_eq_v``): no value projection.
        rotary_dim: the dimensions RoPE turns on this type (partial rotation).
        rope_proportion: proportional RoPE on this type (Gemma 4's full layers): the fraction of the head's
            frequencies that turn (``attnlab.functional.rotary.RotaryEmbedding``'s ``proportion``).
    """

    head_dim: int | None = None
    n_kv_heads: int | None = None
    sinks: bool | None = None
    keys_as_values: bool = False
    rotary_dim: int | None = None
    rope_proportion: float | None = None

    def __post_init__(self) -> None:
        for name in ("head_dim", "n_kv_heads", "rotary_dim"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value, limit=2**16)
        if self.sinks is not None and not isinstance(self.sinks, bool):
            raise TypeError(f"sinks must be None or a bool, got {self.sinks!r}")
        if not isinstance(self.keys_as_values, bool):
            raise TypeError(f"keys_as_values must be a bool, got {self.keys_as_values!r}")
        p = self.rope_proportion
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1):
            raise ValueError(f"rope_proportion must be None or a fraction in [0, 1], got {p!r}")
        if p is not None and self.rotary_dim is not None:
            raise ValueError("rope_proportion keeps the whole head's frequencies: give it or rotary_dim, not both")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LayerShape:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown LayerShape fields {unknown}; known: {sorted(known)}")
        return cls(**values)


@dataclass(frozen=True)
class Resolved:
    """One layer's softmax attention shape, every field filled (``GPTConfig.layer_shape``)."""

    head_dim: int
    n_kv_heads: int
    sinks: bool
    keys_as_values: bool
    rotary_dim: int | None
    rope_proportion: float | None
    kv_source: int | None  # the earlier layer whose keys and values this one reads (KV sharing), or None
