"""Modules: the production Attention, rotary embedding, loaders from peers."""

from attnlab.nn.attention import Attention
from attnlab.nn.decoder import DecoderConfig, TinyDecoder
from attnlab.nn.loaders import from_book, from_hf_gpt2, from_hf_llama, from_torch_mha
from attnlab.nn.rotary import RotaryEmbedding, apply_rotary, rotate_half

__all__ = [
    "Attention",
    "DecoderConfig",
    "RotaryEmbedding",
    "TinyDecoder",
    "apply_rotary",
    "from_book",
    "from_hf_gpt2",
    "from_hf_llama",
    "from_torch_mha",
    "rotate_half",
]
