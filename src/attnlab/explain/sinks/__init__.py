"""Attention sinks: the measures (``measures``: first-token share, Gu et al.'s score and sink rate, value norm
ratio, residual peak, learned sink share, each defined once) and a whole model read by them (``reading``).

The experiments that set these against the papers' claims live in ``attnlab.bench`` (``sinks_*``), which
imports this package; this package imports nothing from ``bench``.
"""

from attnlab.explain.sinks.measures import (
    THRESHOLDS,
    Peak,
    Threshold,
    first_token_share,
    first_token_share_loop,
    gu_score,
    learned_sink_share,
    residual_peak,
    row_shares,
    sink_rate,
    value_norm_ratio,
)
from attnlab.explain.sinks.reading import Reading, read_gpt

__all__ = [
    "THRESHOLDS",
    "Peak",
    "Reading",
    "Threshold",
    "first_token_share",
    "first_token_share_loop",
    "gu_score",
    "learned_sink_share",
    "read_gpt",
    "residual_peak",
    "row_shares",
    "sink_rate",
    "value_norm_ratio",
]
