"""Every sink measure of a whole model on one batch of tokens: :func:`read_gpt`.

The weights come from ``GPT.attention_weights`` (the Recorder); the values from each attention module's own
``split_qkv`` on the input it received (a forward pre-hook, so they are the values the layer used: normed and
scaled as it does); the residual stream from each block's output (a forward hook). Hooks are removed when the
reading ends, whatever happens.

Shapes: L = layers, B = batch, H = heads, Hkv = key/value heads, T = tokens, E = the residual's width.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from attnlab.explain.sinks.measures import (
    Peak,
    first_token_share,
    gu_score,
    learned_sink_share,
    residual_peak,
    value_norm_ratio,
)
from attnlab.observe import Recorder


@dataclass(frozen=True)
class Reading:
    """A model's sink measures on one batch: per layer and head, each averaged over the batch."""

    first_token: list[list[float]]  # (L, H): first-token share
    gu: list[list[float]]  # (L, H): Gu et al.'s score of token 0
    value_ratio: list[list[float]]  # (L, Hkv): ||v_0|| / mean ||v_j||; NaN for a layer with no values to read
    peaks: list[Peak]  # one per layer: its output's largest |activation|
    learned_sink: list[list[float]] | None  # (layers with learned sinks, H): the sink's share; None without

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peaks": [asdict(p) for p in self.peaks]}

    @property
    def largest(self) -> Peak:
        """The largest activation of any layer."""
        return max(self.peaks, key=lambda p: p.value)


def _values_hook(store: list[torch.Tensor], layer: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _, _, values = module.split_qkv(args[0])  # type: ignore[operator]  # (B, Hkv, T, Dv)
        store[layer] = values.detach()

    return hook


def _output_hook(store: list[torch.Tensor], layer: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        store[layer] = output.detach()  # (B, T, E)

    return hook


@torch.no_grad()
def read_gpt(model: Any, tokens: torch.Tensor) -> Reading:
    """Every sink measure of ``model`` (an attnlab GPT) on ``tokens`` (B, T), T >= 2."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be (B, T) ids with T >= 2, got {getattr(tokens, 'shape', tokens)!r}")
    blocks = list(model.blocks)
    values: list[torch.Tensor] = [torch.empty(0)] * len(blocks)
    outputs: list[torch.Tensor] = [torch.empty(0)] * len(blocks)
    handles = []
    try:
        for n, block in enumerate(blocks):
            handles.append(block.register_forward_hook(_output_hook(outputs, n)))
            if hasattr(block.att, "split_qkv") and getattr(block.att, "kv_source", None) is None:
                handles.append(block.att.register_forward_pre_hook(_values_hook(values, n), with_kwargs=True))
        weights = model.attention_weights(tokens)  # (L, B, H, T, T)
    finally:
        for handle in handles:
            handle.remove()
    learned = None
    if model.config.sinks:
        with Recorder(names=["sink_weight"]) as rec:
            model(tokens)
        learned = [learned_sink_share(w).tolist() for w in rec.all("sink_weight").values()]  # each (B, H, T)
    as_lists = lambda x: [[float(v) for v in row] for row in x]
    ratios = [
        value_norm_ratio(v).mean(dim=0).tolist() if v.numel() else [math.nan] * model.config.n_heads for v in values
    ]  # each (B, Hkv) -> (Hkv,)
    return Reading(
        first_token=as_lists(first_token_share(weights).mean(dim=1)),  # (L, B, H) -> (L, H)
        gu=as_lists(gu_score(weights).mean(dim=1)),
        value_ratio=ratios,
        peaks=[residual_peak(h) for h in outputs],
        learned_sink=learned,
    )
