"""The shapes of published checkpoints whose families attnlab reads from a Hugging Face config.json: the fields
of their config.json that fix the shape, by name, read by the family's own reader (``config_from_hf``) exactly
as a downloaded folder would be. Nothing is downloaded: these are numbers, with random weights wherever a model
is built from them. ``attnlab memory --model gemma-3-27b`` sizes a cache from them.

The parameter counts they give are checked against the published ones (tests/test_kv_bytes.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.models.config import GPTConfig

SHAPES: dict[str, dict[str, Any]] = {
    "gemma-3-1b": {  # google/gemma-3-1b-pt
        "model_type": "gemma3_text",
        "vocab_size": 262144,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 256,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma-3-27b": {  # google/gemma-3-27b-pt, its text_config
        "model_type": "gemma3_text",
        "vocab_size": 262208,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 168,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gpt-oss-20b": {  # openai/gpt-oss-20b
        "model_type": "gpt_oss",
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "rope_theta": 150000,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "max_position_embeddings": 131072,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "swiglu_limit": 7.0,
    },
    "deepseek-v3": {  # deepseek-ai/DeepSeek-V3 (its multi-token-prediction layer aside)
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "norm_topk_prob": True,
        "max_position_embeddings": 163840,
        "rope_theta": 10000,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
    },
}


def shape(name: str) -> GPTConfig:
    """The decoder config of a published checkpoint in ``SHAPES``, through its family's reader."""
    from attnlab.models.families import config_from_hf

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {list(SHAPES)}")
    return config_from_hf(SHAPES[name], Path(name))
