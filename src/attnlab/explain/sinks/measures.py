"""Attention sinks, measured: one definition of each measure, read by the head scores (``explain.heads``), the
zoo (``bench.zoo``) and the sink experiments (``bench.sinks_*``).

Two things are named apart everywhere:

- the **first-token share**: the attention a head's row puts on token 0, a key like any other (the "attention
  sink" of StreamingLLM, Xiao et al. 2023, arXiv 2309.17453);
- the **learned sink's share**: the mass a learned sink logit takes from a row (gpt-oss; ``sinks=True``), which
  is no token at all and has no value (``attnlab.functional.sinks``, recorded as "sink_weight").

With A one head's weights, (T, T), row i the weights of query i over keys 0..i:

- first-token share:  mean over rows i in [1, T) of A[i, 0]
  (row 0 is left out: it can see only token 0, so its share is 1 whatever the head does). With a learned sink
  a row's keys sum to 1 minus the sink's share, and A[i, 0] stays the mass of the whole row on token 0. For
  weights that are no distribution (ReLU or sigmoid attention) ``of_row=True`` divides each row by what it
  gives in all, A[i, 0] / sum_j A[i, j] (0 for a row that gives nothing), the same for softmax rows;
- Gu et al.'s score (arXiv 2410.10781, in the authors' code ``eval_sink_open_source.py``): mean over all T rows
  of A[i, 0], row 0 included; their sink rate is the share of heads whose score is above epsilon = 0.3;
- value norm ratio:   ||v_0|| / mean over j in [1, T) of ||v_j||, per key/value head (a "value-state drain"
  is a ratio well below 1: Guo et al., arXiv 2410.13835);
- residual peak:      the largest |activation| of a layer's output (the residual stream), its position and
  channel, and its ratio to the median |activation| (Sun et al.'s "massive activations", arXiv 2402.17762);
  the residual norm ratio ||h_0|| / mean ||h_j|| (Guo et al.'s "residual-state peak" is a ratio well above 1).

A head that attends only to token 0 has a share of 1; a head spread evenly over the T keys of a row has 1/T on
that row (tests/test_sinks_measures.py builds both).

Shapes: L = layers, B = batch, H = heads, T = tokens, D = head size, E = the residual's width; ``...`` any
leading dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Threshold:
    """A sink rate's threshold, the score it applies to and where it comes from."""

    value: float
    score: str  # "gu_score" or "first_token_share"
    source: str


# The thresholds a sink rate is counted with. Gu et al. is the one paper of the five that counts heads by a
# threshold; attnlab's own is the score at which ``explain`` names a head "first-token" (heads.NAME_THRESHOLD).
THRESHOLDS: dict[str, Threshold] = {
    "gu": Threshold(0.3, "gu_score", "Gu et al. 2024 (arXiv 2410.10781), epsilon = 0.3 in eval_sink_open_source.py"),
    "attnlab": Threshold(0.4, "first_token_share", "attnlab's head names (explain.heads.NAME_THRESHOLD)"),
}


def _check_weights(weights: object) -> torch.Tensor:
    if not isinstance(weights, torch.Tensor) or weights.dim() < 2 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"weights must be a tensor (..., T, T) of attention weights, queries by keys; got "
            f"{getattr(weights, 'shape', type(weights).__name__)}"
        )
    if weights.shape[-1] < 2:
        raise ValueError(
            f"a first-token share needs at least 2 tokens (row 0 sees only token 0); got T = {weights.shape[-1]}"
        )
    return weights


def row_shares(weights: torch.Tensor, *, of_row: bool = False) -> torch.Tensor:
    """(..., T - 1): each row's weight on token 0, rows 1..T-1 of weights (..., T, T); with ``of_row``, its share
    A[i, 0] / sum_j A[i, j] (a row that gives nothing, ReLU weights all zero, counts as 0)."""
    w = _check_weights(weights)[..., 1:, :]  # (..., T - 1, T): the rows that have a choice
    if not of_row:
        return w[..., 0]
    total = w.sum(dim=-1)  # (..., T - 1): 1 for softmax; what a ReLU or sigmoid row gives in all
    return torch.where(total > 0, w[..., 0] / total.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(total))


def first_token_share(weights: torch.Tensor, *, of_row: bool = False) -> torch.Tensor:
    """(...): the first-token share, the mean of :func:`row_shares` over rows 1..T-1."""
    return row_shares(weights, of_row=of_row).mean(dim=-1)


def first_token_share_loop(weights: torch.Tensor, *, of_row: bool = False) -> torch.Tensor:
    """The same, one row at a time (the readable form, tested equal to :func:`first_token_share`)."""
    w = _check_weights(weights)
    shares = []
    for i in range(1, w.shape[-1]):
        row = w[..., i, :]  # (..., T): query i's weights over every key
        if not of_row:
            shares.append(row[..., 0])
            continue
        total = row.sum(dim=-1)
        shares.append(torch.where(total > 0, row[..., 0] / total.clamp_min(1e-30), torch.zeros_like(total)))
    return torch.stack(shares).mean(dim=0)


def gu_score(weights: torch.Tensor, *, of_row: bool = False) -> torch.Tensor:
    """(...): Gu et al.'s score of token 0, the mean over all T rows of A[i, 0] (row 0 included), as their code
    computes it. For softmax rows it is (1 + (T - 1) * first_token_share) / T. With ``of_row`` each row is first
    divided by what it gives in all (their "proxy" weights for sigmoid attention; a row that gives nothing, 0)."""
    w = _check_weights(weights)
    if of_row:
        total = w.sum(dim=-1, keepdim=True)  # (..., T, 1)
        w = torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(w))
    return w[..., :, 0].mean(dim=-1)


def sink_rate(scores: torch.Tensor, threshold: str = "gu") -> float:
    """The share of heads whose score is above ``threshold``'s value (a name in THRESHOLDS): ``scores`` are the
    score that threshold applies to (``THRESHOLDS[threshold].score``), one per head, any shape."""
    if threshold not in THRESHOLDS:
        raise ValueError(f"threshold must be one of {list(THRESHOLDS)}, got {threshold!r}")
    if not isinstance(scores, torch.Tensor) or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty tensor of per-head scores, got {scores!r}")
    return float((scores > THRESHOLDS[threshold].value).float().mean())


def value_norm_ratio(values: torch.Tensor) -> torch.Tensor:
    """(..., Hkv): ||v_0|| over the mean ||v_j|| of the other tokens, from values (..., Hkv, T, D)."""
    if not isinstance(values, torch.Tensor) or values.dim() < 3 or values.shape[-2] < 2:
        raise ValueError(
            f"values must be a tensor (..., Hkv, T, D) with T >= 2, got {getattr(values, 'shape', values)!r}"
        )
    norms = values.norm(dim=-1)  # (..., Hkv, T)
    return norms[..., 0] / norms[..., 1:].mean(dim=-1)


@dataclass(frozen=True)
class Peak:
    """The largest |activation| of one layer's output, where it sits, and how far above the rest it stands."""

    value: float  # the largest |activation|
    position: int  # its token
    channel: int  # its channel (of E)
    median: float  # the median |activation| of the layer
    norm_ratio: float  # ||h_0|| / mean over j >= 1 of ||h_j||: the first token's residual norm against the rest

    @property
    def ratio(self) -> float:
        """How many times the median the largest is."""
        return self.value / self.median if self.median > 0 else float("inf")


def residual_peak(hidden: torch.Tensor) -> Peak:
    """The :class:`Peak` of one layer's output ``hidden`` (B, T, E): the largest |activation| over the batch,
    its token position and channel; the norm ratio averaged over the batch."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[1] < 2:
        raise ValueError(f"hidden must be a tensor (B, T, E) with T >= 2, got {getattr(hidden, 'shape', hidden)!r}")
    size = hidden.abs()  # (B, T, E)
    flat = int(size.flatten().argmax())
    _, t, e = size.shape
    position, channel = (flat % (t * e)) // e, flat % e
    norms = hidden.norm(dim=-1)  # (B, T)
    ratio = norms[:, 0] / norms[:, 1:].mean(dim=-1)  # (B,)
    return Peak(
        value=float(size.flatten()[flat]),
        position=int(position),
        channel=int(channel),
        median=float(size.median()),
        norm_ratio=float(ratio.mean()),
    )


def learned_sink_share(sink_weight: torch.Tensor) -> torch.Tensor:
    """(H,): the mean share of a row its learned sink took, from the recorded "sink_weight" (..., H, T) of one or
    more layers. Not a first-token share: the sink is no token."""
    if not isinstance(sink_weight, torch.Tensor) or sink_weight.dim() < 2:
        raise ValueError(
            f"sink_weight must be a recorded (..., H, T) tensor, got {getattr(sink_weight, 'shape', None)}"
        )
    h = sink_weight.shape[-2]
    return sink_weight.transpose(-1, -2).reshape(-1, h).mean(dim=0)  # (..., T, H) -> (N, H) -> (H,)
