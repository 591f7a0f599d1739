"""Argument checks that name the bad value and the fix: floor 0, imported by every layer.

The book's code meets bad input with a deep shape error (or silently, for a
dropout rate of 1.5). Each check here exists once, with one wording, so the
chapter's classes, the kernels, the module and the CLI say the same thing.

>>> check_heads(d_out=6, num_heads=4)
Traceback (most recent call last):
...
ValueError: d_out (6) must be divisible by num_heads (4); each head gets d_out // num_heads dimensions. Try num_heads in [1, 2, 3, 6]
"""

from __future__ import annotations

import math

import torch

# Sizes above this are typos, not models: 2**31 elements in one dimension would not fit any device's index space.
MAX_SIZE = 2**31 - 1


def check_positive_int(name: str, value: object, *, limit: int = MAX_SIZE) -> None:
    """An int in [1, limit]; bools are refused (True is not a size)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if value > limit:
        raise ValueError(f"{name} must be <= {limit}, got {value}; is it a typo?")


MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed; a larger or negative one is refused


def check_seed(seed: object, *, name: str = "seed") -> None:
    """A seed for torch.manual_seed: an int in [0, 2**63 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an int, got {seed!r} ({type(seed).__name__})")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be in [0, 2**63 - 1], got {seed}; any integer in that range gives its own run")


def check_dropout(dropout: object, *, name: str = "dropout") -> None:
    """A probability in [0, 1): the chance of zeroing an attention weight."""
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {dropout!r}")
    if not 0.0 <= float(dropout) < 1.0:  # NaN fails this too
        raise ValueError(
            f"{name} must be in [0, 1), got {dropout}; "
            "it is the probability of zeroing an attention weight (0.0 disables it)"
        )


def check_heads(d_out: int, num_heads: object, *, names: tuple[str, str] = ("d_out", "num_heads")) -> None:
    """num_heads divides d_out, so every head gets d_out // num_heads dimensions.

    ``names`` are the two arguments as the caller's user knows them (the CLI says d_model and heads).
    """
    width, heads = names
    check_positive_int(heads, num_heads)
    assert isinstance(num_heads, int)
    if d_out % num_heads != 0:
        raise ValueError(
            f"{width} ({d_out}) must be divisible by {heads} ({num_heads}); "
            f"each head gets {width} // {heads} dimensions. Try {heads} in "
            f"{[h for h in range(1, min(d_out, 64) + 1) if d_out % h == 0]}"
        )


def check_kv_heads(num_heads: int, num_kv_heads: object) -> None:
    """Grouped-query attention: every kv head serves the same number of query heads."""
    check_positive_int("num_kv_heads", num_kv_heads)
    assert isinstance(num_kv_heads, int)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) for grouped-query "
            f"attention; choose num_kv_heads among {[h for h in range(1, num_heads + 1) if num_heads % h == 0]}"
        )


def check_window(window: object) -> None:
    """A sliding window counts keys, the query's own included: an int >= 1, or None for no window."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int number of keys, got {window!r}")
    if window < 1:
        raise ValueError(f"window must be >= 1 (each query sees itself), got {window}; use window=None for no window")


def check_scale(scale: object) -> None:
    """The softmax scale: a positive finite number, or None for 1/sqrt(head_dim)."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number or None (1/sqrt(head_dim)), got {scale!r}")


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
