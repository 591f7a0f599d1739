"""attnlab 3.B, a reference solution: scores scaled by the square root of the keys' dimension, then softmax."""

import torch


def scaled_weights(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    attn_scores = queries @ keys.T
    d_k = keys.shape[-1]
    return torch.softmax(attn_scores / d_k**0.5, dim=-1)
