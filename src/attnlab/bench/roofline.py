"""How fast decoding could go here: the bytes a decode step must read, and this machine's rate of reading them.

A decode step of batch 1 is a chain of matrix-vector products: every weight
is read once and used for two flops, so the step is bound by memory, not by
arithmetic (gpt-fast reports decode the same way, as achieved bandwidth).
:func:`decode_bytes` counts what one step reads for a GPT config of any
family: every weight matrix, bias and norm (of the experts, those a token is
routed to), the vocabulary projection, one row of each embedding, and the
keys and values of the positions so far (a sliding layer's within its
window, a latent layer's latent). :func:`probe_rates` measures, in this run, how fast this
machine streams weights from memory through the product in each layout:
``nn.Linear``'s (out, in) stored row by row, stored column by column,
as Hugging Face GPT-2's Conv1D stores it, and row by row through oneDNN's
product instead of the BLAS (``attnlab.linear.layout``). The floor of a
step is its bytes at the fastest measured rate; a generator's step time as a
fraction of that floor says how close it runs to this machine's limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.linear.layout import stream_rates
from attnlab.models.config import GPTConfig


@dataclass(frozen=True)
class StepBytes:
    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def decode_bytes(config: GPTConfig, position: float, *, element: int = 4) -> StepBytes:
    """Bytes one decode step (batch 1) reads at ``position`` (tokens already cached), ``element`` bytes a number:
    the model's parameters, built on the meta device so any family counts as it is, less what a step leaves
    unread (each embedding table but one row, unless the head is tied to it and reads it whole; the experts
    a token is not routed to), and each layer's keys and values (a sliding layer's within its window; a recurrent layer's state;
    a layer that shares keys reads its source's again)."""
    from attnlab.bench.kv_bytes import layer_kinds, softmax_bytes
    from attnlab.models.gpt import GPT
    from attnlab.models.mlp import MoEFeedForward
    from attnlab.models.moe_beside import MoEBeside
    from attnlab.models.per_layer import PerLayerEmbedding

    with torch.device("meta"):  # shapes only
        model = GPT(config)
    weights = sum(p.numel() for p in model.parameters())  # a tied head once
    tables = [model.tok_emb] if model.out_head.weight is not model.tok_emb.weight else []
    tables += [model.pos_emb] if model.pos_emb is not None else []
    ple = model.ple if isinstance(model.ple, PerLayerEmbedding) else None  # not V4's TokenIds, which holds none
    tables += [ple.embed] if ple is not None else []  # Gemma 4's per-layer table: a token's row
    weights -= sum(t.weight.numel() - t.weight.shape[1] for t in tables)  # one row each
    for moe in (m for m in model.modules() if isinstance(m, MoEFeedForward)):
        experts = sum(p.numel() for part in (moe.fc1, moe.fc2, moe.fc3) for p in part.parameters())
        weights -= experts * (moe.num_experts - moe.num_experts_per_tok) // moe.num_experts
    for beside in (m for m in model.modules() if isinstance(m, MoEBeside)):  # Gemma 4's experts beside the MLP
        fused = beside.experts.gate_up_proj.numel() + beside.experts.down_proj.numel()
        weights -= fused * (beside.experts.num_experts - beside.router.k) // beside.experts.num_experts
    kinds = layer_kinds(config, dtype="float32")  # 4 bytes a value: bytes_per_token // 4 values
    kv = sum(  # a recurrent layer reads its whole state, whatever the position
        k.layers
        * (k.state_bytes or (position if k.window is None else min(position, k.window)) * k.bytes_per_token)
        / 4
        for k in kinds
    )
    for layer in range(config.n_layers - config.kv_shared_layers, config.n_layers):  # KV sharing: stored once,
        source = config.kv_source(layer)  # read again by every layer that shares them
        assert source is not None
        window = config.layer_window(source)
        kv += (position if window is None else min(position, window)) * softmax_bytes(config, source, 4) / 4
    return StepBytes(weights=weights * element, kv=int(kv * element))


def probe_rates(d_in: int, d_out: int) -> dict[str, float]:
    """GB/s of a batch-1 product with a d_in x d_out weight, per layout, streamed from memory as decoding streams
    it (``attnlab.linear.layout.stream_rates``, what ``GPT.set_layout("auto")`` chooses by)."""
    names = {"rows": "(out, in) rows", "columns": "(in, out) columns", "onednn": "(out, in) rows, oneDNN"}
    names["gemv"] = "(out, in) rows, a compiled loop"
    names["packed"] = "(out, in) rows, oneDNN's packed copy"
    names["prefetch"] = "(out, in) rows, a loop that prefetches"
    return {names[layout]: rate for layout, rate in stream_rates(d_in, d_out).items()}
