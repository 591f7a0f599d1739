"""How fast decoding could go here: the bytes a decode step must read, and this machine's rate of reading them.

A decode step of batch 1 is a chain of matrix-vector products: every weight
is read once and used for two flops, so the step is bound by memory, not by
arithmetic (gpt-fast reports decode the same way, as achieved bandwidth).
:func:`decode_bytes` counts what one step reads for a GPT config: every
weight matrix, bias and norm of the blocks, the final norm and the vocabulary
projection, one row of each embedding, and the keys and values of the
positions so far. :func:`probe_rates` measures, in this run, how fast this
machine streams weights from memory through the product in each layout:
``nn.Linear``'s (out, in) stored row by row, and stored column by column,
as Hugging Face GPT-2's Conv1D stores it. The floor of a
step is its bytes at the fastest measured rate; a generator's step time as a
fraction of that floor says how close it runs to this machine's limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models.config import GPTConfig
from attnlab.nn.layout import stream_rates


@dataclass(frozen=True)
class StepBytes:
    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def decode_bytes(config: GPTConfig, position: float, *, element: int = 4) -> StepBytes:
    """Bytes one decode step reads at ``position`` (tokens already cached), ``element`` bytes a number."""
    e, layers, v = config.emb_dim, config.n_layers, config.vocab_size
    heads = config.n_heads
    kv_heads = config.n_kv_heads or heads
    d = e // heads
    qkv = e * (heads + 2 * kv_heads) * d + (heads + 2 * kv_heads) * d  # weight, and bias (read if present)
    block = qkv + (e * e + e) + (e * 4 * e + 4 * e) + (4 * e * e + e) + 4 * e  # out_proj, ff, two norms
    embeddings = e if config.rope else 2 * e  # one row of tok_emb (and of pos_emb)
    weights = layers * block + 2 * e + v * e + embeddings
    kv = int(2 * layers * kv_heads * d * position)
    return StepBytes(weights=weights * element, kv=kv * element)


def probe_rates(d_in: int, d_out: int) -> dict[str, float]:
    """GB/s of a batch-1 product with a d_in x d_out weight, per layout, streamed from memory as decoding streams
    it (``attnlab.nn.layout.stream_rates``, what ``GPT.set_layout("auto")`` chooses by)."""
    names = {"rows": "(out, in) rows", "columns": "(in, out) columns"}
    return {names[layout]: rate for layout, rate in stream_rates(d_in, d_out).items()}
