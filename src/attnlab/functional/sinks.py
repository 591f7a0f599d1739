"""Learned sinks (gpt-oss): each row's softmax also counts exp(sink), a logit with no value, so a row may give
part of its attention to nothing. The one computation of what a sink takes, for every path that applies or
records one: ``attention(sinks=)``, the eager backend's weights, :func:`attnlab.functional.eager.head_weights`
and ``attnlab.hf``.

With s a row's scaled, masked scores and lse = logsumexp(s), the softmax over [s, sink] gives

    key j:     exp(s_j) / (exp(lse) + exp(sink)) = exp(s_j - lse) * sigmoid(lse - sink)
    the sink:  exp(sink) / (exp(lse) + exp(sink)) = sigmoid(sink - lse)

so the keys' weights of a row sum to 1 minus the sink's share (as transformers' eager gpt-oss returns them: the
sink's column dropped). A row that sees no key (lse +inf, the kernels' mark for "nothing to see") gives the sink
all of it: the keys get 0 and the sink 1, with zero gradients (no 0 * inf in the backward).

>>> import torch
>>> lse = torch.tensor([[[0.0, float("inf")]]])  # (B, H, Tq): a row whose scores sum to exp(0), and an empty row
>>> sink_share(lse, torch.tensor([0.0])), kept_share(lse, torch.tensor([0.0]))
(tensor([[[0.5000, 1.0000]]]), tensor([[[0.5000, 0.0000]]]))

Shapes: B = batch, H = query heads, Tq = queries.
"""

from __future__ import annotations

import torch


def check_sinks(sinks: object, heads: int) -> None:
    """Refuse sinks that are not one logit per query head, (H,)."""
    if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (heads,) or not torch.is_floating_point(sinks):
        raise ValueError(
            f"sinks must be one floating-point logit per query head, shape ({heads},), got "
            f"{getattr(sinks, 'shape', sinks)!r}" + (f" of {sinks.dtype}" if isinstance(sinks, torch.Tensor) else "")
        )


def _per_row(lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse - sink (B, H, Tq), the rows that see no key), in lse's dtype."""
    return lse - sinks.to(lse.dtype)[None, :, None], torch.isposinf(lse)


def kept_share(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq): the share of each row its keys get, sigmoid(lse - sink); 0 on a row that sees no key.

    ``lse`` (B, H, Tq) is the row log-sum-exp of the scores without the sink (a kernel's), ``sinks`` (H,)."""
    gap, empty = _per_row(lse, sinks)
    return torch.sigmoid(gap).masked_fill(empty, 0.0)


def sink_share(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq): the share of each row its sink takes, sigmoid(sink - lse); 1 on a row that sees no key.
    What a Recorder gets as "sink_weight"; computed apart from :func:`kept_share`, not as 1 minus it, so that a
    share near 0 keeps its digits."""
    gap, empty = _per_row(lse, sinks)
    return torch.sigmoid(-gap).masked_fill(empty, 1.0)


def logsumexp_with_sinks(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq, 1) or as ``lse``: log(exp(lse) + exp(sink)), the log-sum-exp of a row's softmax with the sink
    counted, so each key's weight is exp(s_j - it). ``lse`` is (B, H, Tq) or (B, H, Tq, 1); +inf stays +inf."""
    shaped = sinks.to(lse.dtype)[None, :, None] if lse.dim() == 3 else sinks.to(lse.dtype)[None, :, None, None]
    return torch.logaddexp(lse, shaped)
