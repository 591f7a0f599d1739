"""Typed results of ``attnlab bench``: what a case measured, the machine, the fits, the longest runs.

A worker process answers with one JSON object (the process boundary); the
runner turns it into a :class:`Case` at once, and everything after that (the
summary, the CLI's tables, the plot, the JSON file) reads typed fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA = "attnlab.bench/2"
NOISY_SPREAD = 0.25  # (max - min) / median of a case's samples, or of its paired ratios, above this: too wide to trust
NOISY_EXPONENT = 0.5  # a fitted exponent that moves by more than this from round to round says nothing


@dataclass
class Case:
    """One implementation at one length and mode; timing fields are None unless it ran."""

    impl: str
    mode: str  # "forward", "backward" or "decode"
    seq: int
    batch: int
    d_model: int
    heads: int
    dtype: str
    status: str = "ok"  # "ok", "refused: ...", "skipped: ...", "failed: ..."
    agrees: bool | None = None
    max_rel_error: float | None = None
    median_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list)
    peak_allocated_bytes: int | None = None
    peak_rss_bytes: int | None = None
    threads: int | None = None
    predicted_bytes: int | None = None
    gflops: float | None = None
    roofline_fraction: float | None = None
    ratio_to_fastest: float | None = None
    ratio_spread: float | None = None  # (max - min) / median of the per-round ratios to the fastest (interleaved)

    @classmethod
    def from_worker(cls, answer: dict[str, Any]) -> Case:
        """From a worker's JSON answer (or a spec that never ran), keeping only the known fields."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in answer.items() if k in known})

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_ms is not None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the timed samples: how much the machine wobbled during this case."""
        if not self.samples_ms or not self.median_ms:
            return None
        return (max(self.samples_ms) - min(self.samples_ms)) / self.median_ms

    @property
    def noisy(self) -> bool:
        return self.spread is not None and self.spread > NOISY_SPREAD

    @property
    def ratio_noisy(self) -> bool:
        """The ratio to the fastest moved too much from round to round to be a finding."""
        return self.ratio_spread is not None and self.ratio_spread > NOISY_SPREAD


@dataclass(frozen=True)
class Machine:
    torch: str
    cpus: int | None
    threads: int
    available_bytes: int
    matmul_gflops: float | None  # the practical roofline, measured in the same run


@dataclass(frozen=True)
class Fit:
    """Log-log slopes against T: 1 is linear, 2 quadratic."""

    time_exponent: float | None
    memory_exponent: float | None
    time_exponent_range: tuple[float, float] | None = None  # the slope fitted to each round's samples: min, max

    @property
    def time_noisy(self) -> bool:
        r = self.time_exponent_range
        return r is not None and r[1] - r[0] > NOISY_EXPONENT


@dataclass(frozen=True)
class Longest:
    impl: str
    longest_seq: int | None
    median_ms: float | None
    peak_rss_bytes: int | None
    stopped: str  # why the doubling stopped


@dataclass
class BenchResult:
    machine: Machine
    config: dict[str, Any]
    cases: list[Case] = field(default_factory=list)
    fits: dict[str, Fit] = field(default_factory=dict)
    longest: list[Longest] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what an interruption (Ctrl-C) left unmeasured

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "machine": asdict(self.machine),
            "config": self.config,
            "cases": [{**asdict(c), "spread": c.spread, "ratio_noisy": c.ratio_noisy} for c in self.cases],
            "fits": {key: {**asdict(fit), "time_noisy": fit.time_noisy} for key, fit in self.fits.items()},
            "longest": [asdict(row) for row in self.longest],
            "left": self.left,
        }
