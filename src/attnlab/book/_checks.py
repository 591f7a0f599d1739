"""Argument checks shared by the chapter's classes.

The book's code meets bad input with a deep shape error (or silently, for a
dropout rate of 1.5). These checks raise early with the values and the fix.
"""

from __future__ import annotations

import torch


def check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_dropout(dropout: object) -> None:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a float in [0, 1), got {dropout!r}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(
            f"dropout must be in [0, 1), got {dropout}; "
            "it is the probability of zeroing an attention weight (0.0 disables it)"
        )


def check_heads(d_out: int, num_heads: int) -> None:
    check_positive_int("num_heads", num_heads)
    if d_out % num_heads != 0:
        raise ValueError(
            f"d_out ({d_out}) must be divisible by num_heads ({num_heads}); "
            f"each head gets d_out // num_heads dimensions. Try num_heads in "
            f"{[h for h in range(1, min(d_out, 64) + 1) if d_out % h == 0]}"
        )


def check_tokens(x: object, *, d_in: int, rank: int, context_length: int | None = None) -> None:
    """Check an input for a book class: a tensor of ``rank`` dims ending in ``d_in``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor of token embeddings, got {type(x).__name__}")
    layout = "(num_tokens, d_in)" if rank == 2 else "(batch, num_tokens, d_in)"
    if x.dim() != rank:
        hint = ""
        if rank == 3 and x.dim() == 2:
            hint = "; for a single sequence add a batch dimension: x.unsqueeze(0)"
        elif rank == 2 and x.dim() == 3:
            hint = "; this class takes one unbatched sequence, use CausalAttention for batches"
        raise ValueError(
            f"expected input of shape {layout} with {rank} dims, got {x.dim()} dims {tuple(x.shape)}{hint}"
        )
    if x.shape[-1] != d_in:
        raise ValueError(
            f"the last dimension of the input must be d_in={d_in}, got {x.shape[-1]} "
            f"(input shape {tuple(x.shape)}); build the module with d_in={x.shape[-1]} "
            "or project the input first"
        )
    if not torch.is_floating_point(x):
        raise TypeError(f"expected a floating-point input, got dtype {x.dtype}; try x.float()")
    if context_length is not None and x.shape[-2] > context_length:
        raise ValueError(
            f"the input has {x.shape[-2]} tokens but context_length is {context_length}; "
            f"build the module with context_length >= {x.shape[-2]} or truncate the input"
        )
