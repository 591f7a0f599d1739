"""benchmarks/engines.py's floor: the bytes one decode step reads over the rate this machine streams a weight at.

The rate is measured like a row: once a round, in the run's own process between the rounds' rows, and the floor
divides by the median of the rounds. Its spread is kept and judged with the row's: a fraction of the floor is a
ratio of two measurements, and between the runs of 2026-12-07 a single measurement of the rate moved more than the
rows did (each run's ``stream_gb_s`` in its file), so that one rate taken once decided a verdict on "80% of its floor".
"""

from __future__ import annotations

import statistics
from typing import Any

BYTES_A_WEIGHT = {"float32": 4, "bfloat16": 2, "int8": 1, "f32": 4, "f16": 2, "q8_0": 34 / 32}  # q8_0: a scale a 32


def stream_rate(config: Any, threads: int) -> float:
    """GB/s: the fastest rate this machine streams a weight matrix of the model's width at, measured now on
    ``threads`` threads (the layouts' batch-1 products over copies that exceed the caches, each layout's median of
    its passes)."""
    import torch

    from attnlab.bench.roofline import probe_rates

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return max(probe_rates(config.emb_dim, 4 * config.emb_dim).values())
    finally:
        torch.set_num_threads(before)


def summarized_rates(rates: list[float]) -> dict[str, Any]:
    """The floor's rate from the rounds' measurements: their median, their spread ((max - min) / median, as a
    row's), and the measurements themselves."""
    median = statistics.median(rates)
    return {"stream_gb_s": median, "stream_spread": (max(rates) - min(rates)) / median, "stream_rounds": rates}


def floor_seconds(config: Any, precision: str, position: int, rate: float) -> float:
    """The bytes one decode step of attnlab's ``config`` reads at ``precision`` over ``rate`` GB/s."""
    from attnlab.bench.roofline import decode_bytes

    step = decode_bytes(config, position, element=4)
    bytes_read = step.weights / 4 * BYTES_A_WEIGHT[precision.split()[0]] + step.kv
    return bytes_read / (rate * 1e9)
