"""Modules: the production Attention and rotary embedding. Whole models and loaders live in attnlab.models."""

from attnlab.nn.attention import Attention
from attnlab.nn.rotary import RotaryEmbedding, apply_rotary, rotate_half

__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "rotate_half"]
