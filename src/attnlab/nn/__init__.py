"""Modules: the production Attention and rotary embedding. Whole models and loaders live in attnlab.models."""

from attnlab.functional.rotary import RotaryEmbedding, apply_rotary, rotate_half  # RoPE lives a floor below
from attnlab.nn.attention import Attention

__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "rotate_half"]
