"""The compared implementations by name, what each holds at its peak, and the memory model: plain data, no PyTorch.

``attnlab bench --help`` lists these names without loading PyTorch; ``bench.impls`` builds them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Impl:
    name: str
    description: str
    t2_copies: float  # how many (B, H, T, T) float tensors it holds at its peak, forward


IMPLEMENTATIONS: dict[str, Impl] = {
    i.name: i
    for i in (
        Impl("book-wrapper", "book MultiHeadAttentionWrapper (+ out_proj)", 3.0),
        Impl("book-mha", "book MultiHeadAttention", 3.0),
        Impl("torch-mha", "torch.nn.MultiheadAttention, need_weights=False", 1.0),
        Impl("plain-sdpa", "a plain module around F.scaled_dot_product_attention", 0.0),
        Impl("attnlab-auto", "attnlab.Attention, default backend", 0.0),
        Impl("attnlab-eager", "attnlab.Attention, eager backend", 5.0),
        Impl("attnlab-sdpa", "attnlab.Attention, sdpa backend", 0.0),
        Impl("attnlab-flash", "attnlab.Attention, flash backend", 0.0),
        Impl("attnlab-auto+kvcache", "attnlab.Attention with a KVCache (decode only)", 0.0),
    )
}


def memory_model(name: str, *, batch: int, seq: int, d: int, heads: int, dtype_bytes: int, backward: bool) -> int:
    """Predicted peak bytes: activations linear in T, plus the T^2 tensors it materializes."""
    linear = 12 * batch * seq * d * dtype_bytes  # x, q, k, v, context, output and their copies
    quadratic = IMPLEMENTATIONS[name].t2_copies * batch * heads * seq * seq * dtype_bytes
    factor = 2.5 if backward else 1.0  # saved activations and their gradients
    weights = 4 * d * d * dtype_bytes * (3 if backward else 1)
    # The book's classes keep a (T, T) float mask buffer (one per head in the wrapper) and make a
    # bool copy of it every forward pass.
    buffers = {"book-mha": 1, "book-wrapper": heads}.get(name, 0) * seq * seq * (dtype_bytes + 1)
    return int(factor * (linear + quadratic) + weights + buffers)
