"""Massive activations set to their mean or to zero (Sun et al. 2024, arXiv 2402.17762), on a GPT that grows a
first-token sink (the zoo's ``mha`` trained on Bigram-Backcopy, ``bench.sinks_variants``).

For each seed: the layer whose output holds the largest activation over its median, and there the ``TOP``
channels of the first token with the largest mean |activation| (its massive activations, located with
``explain.sinks.residual_peak``). Then the held-out loss with those activations of the first token

- left as they are (``base``);
- set to their mean over other held-out sequences (``mean``);
- set to zero (``zero``);
- and, as a control, the same number of the first token's smallest channels set to zero (``control``): so that
  a loss that moves is seen to move because of the largest activations, not because any were touched.

The first token is BOS in every sequence and sees only itself, so its activations are the same in every
sequence: its mean is its value, and ``mean`` can only equal ``base``. What the run shows is the other half of
the claim: whether zero breaks the model, beside the control.

Shapes: B = batch, T = tokens, E = width.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.bench.sinks_result import MASSIVE_SCHEMA, MassiveResult
from attnlab.bench.sinks_toy import BigramBackcopy
from attnlab.bench.sinks_variants import CHANGES, VariantSettings, train_gpt
from attnlab.explain.sinks.measures import residual_peak

TOP = 2  # the massive activations: the first token's largest channels
WAYS = ("base", "mean", "zero", "control")


def _outputs(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output (B, T, E) on ids (B, T)."""
    kept: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda m, a, out: kept.append(out.detach())) for b in model.blocks]
    try:
        model(ids)
    finally:
        for h in handles:
            h.remove()
    return kept


@torch.no_grad()
def intervene(model: Any, seq: torch.Tensor, layer: int, channels: list[int], values: torch.Tensor | None) -> float:
    """The held-out loss of ``seq`` (B, T + 1) with the first token's ``channels`` at block ``layer``'s output
    set to ``values`` (len(channels),); None leaves them."""

    def hook(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        assert values is not None  # registered only with values
        out = out.clone()
        out[:, 0, channels] = values  # (B, len(channels)) <- (len(channels),)
        return out

    handle = model.blocks[layer].register_forward_hook(hook) if values is not None else None
    try:
        logits = model(seq[:, :-1])  # (B, T, V)
    finally:
        if handle is not None:
            handle.remove()
    return float(F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten()))


@torch.no_grad()
def losses(model: Any, held_out: torch.Tensor, others: torch.Tensor) -> tuple[dict[str, float], dict[str, Any]]:
    """(loss for each of WAYS, where the massive activations were: layer, channels, their values, the peak ratio)."""
    outputs = _outputs(model, held_out[:, :-1])
    peaks = [residual_peak(h) for h in outputs]
    layer = max(range(len(peaks)), key=lambda n: peaks[n].ratio)
    first = outputs[layer][:, 0].abs().mean(dim=0)  # (E,): the first token's mean |activation| per channel
    order = first.argsort(descending=True).tolist()
    massive, small = order[:TOP], order[-TOP:]
    mean = _outputs(model, others[:, :-1])[layer][:, 0, massive].mean(dim=0)  # (TOP,): over other sequences
    zeros = torch.zeros(TOP)
    result = {
        "base": intervene(model, held_out, layer, massive, None),
        "mean": intervene(model, held_out, layer, massive, mean),
        "zero": intervene(model, held_out, layer, massive, zeros),
        "control": intervene(model, held_out, layer, small, zeros),
    }
    where = {
        "layer": layer,
        "channels": massive,
        "values": outputs[layer][0, 0, massive].tolist(),
        "peak_ratio": peaks[layer].ratio,
        "peak_position": peaks[layer].position,
    }
    return result, where


Report = Callable[[str], None]


def run_massive(
    *, seeds: int = 3, settings: VariantSettings | None = None, report: Report | None = None
) -> MassiveResult:
    """The zoo's mha trained on Bigram-Backcopy from each seed, its massive activations set to mean and zero.

    Ctrl-C (or SIGTERM, which the CLI turns into one) stops the run: the seeds finished are kept and the result
    says ``interrupted``."""
    check_positive_int("seeds", seeds, limit=10)
    plan = settings or VariantSettings()
    say = report or (lambda line: None)
    began = time.perf_counter()
    task = BigramBackcopy.make(seed=plan.task_seed)
    held_out = task.batch(128, plan.length, torch.Generator().manual_seed(10_000))
    others = task.batch(128, plan.length, torch.Generator().manual_seed(20_000))
    finished: list[tuple[dict[str, float], dict[str, Any]]] = []  # per seed: (loss each way, where they were)
    interrupted = False
    try:
        for seed in range(seeds):
            model = train_gpt(CHANGES["mha"], plan, seed=seed, task=task)
            values, where = losses(model, held_out, others)
            finished.append((values, where))
            say(
                f"seed {seed}: layer {where['layer']}, channels {where['channels']} (peak {where['peak_ratio']:.1f}x "
                f"the median at position {where['peak_position']}): loss {values['base']:.3f}, mean "
                f"{values['mean']:.3f}, zero {values['zero']:.3f}, control {values['control']:.3f}"
            )
    except KeyboardInterrupt:
        interrupted = True
    return MassiveResult(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        settings={**vars(plan), "top": TOP},
        seeds=list(range(len(finished))),
        loss={w: [values[w] for values, _ in finished] for w in WAYS},
        found=[where for _, where in finished],
        seconds=time.perf_counter() - began,
        schema=MASSIVE_SCHEMA,
        interrupted=interrupted,
    )
