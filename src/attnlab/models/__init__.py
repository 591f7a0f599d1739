"""Whole models on attnlab's attention: GPT (the book's GPTModel, and with GQA, RoPE, windows and score mods
the decoders after it) with checkpoints and generation, the loaders of peers' attention weights, and offline
tokenizers."""

from attnlab.models.config import PRESETS, GPTConfig
from attnlab.models.gpt import GPT
from attnlab.models.loaders import from_book_mha, from_hf_gpt2, from_hf_llama, from_torch_mha
from attnlab.models.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "GPT",
    "PRESETS",
    "ByteTokenizer",
    "GPTConfig",
    "Tokenizer",
    "from_book_mha",
    "from_hf_gpt2",
    "from_hf_llama",
    "from_torch_mha",
    "load_tokenizer",
]
