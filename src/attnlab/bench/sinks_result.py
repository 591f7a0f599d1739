"""What the sink experiments save (``attnlab sinks``) and the verdicts computed from the files alone.

A verdict sets one paper's claim against a run: the paired differences over the seeds (texts, for the streaming
run; training seeds, for Bigram-Backcopy), their mean and spread, judged by the zoo's noise rule
(``attnlab.bench.zoo_result.verdict``: a finding when the mean is larger than the spread, which needs two seeds
or more and puts every seed on one side). Its ``status``: "held" (a finding in the claim's direction),
"reversed" (a finding the other way), "within the noise", or "one seed" (nothing judged).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.bench.zoo_result import verdict

STREAMING = "attnlab.sinks.streaming/1"
BACKCOPY = "attnlab.sinks.backcopy/1"
VARIANTS_SCHEMA = "attnlab.sinks.variants/1"
MASSIVE_SCHEMA = "attnlab.sinks.massive/1"


@dataclass(frozen=True)
class Verdict:
    """One claim against one run: the differences it rests on, seed by seed, and what they say."""

    claim: str  # a key of the report's texts
    gaps: list[float]  # per seed, signed so that the claim says > 0
    mean: float
    spread: float
    status: str  # "held", "reversed", "within the noise", "one seed"
    size: float = math.nan  # a size where the paper's is comparable (see the claim's text), else NaN


def judge(claim: str, gaps: list[float], *, size: float = math.nan) -> Verdict:
    """The verdict on ``gaps`` (each seed's difference, > 0 where the claim holds), by the zoo's noise rule."""
    mean, spread, finding = verdict(gaps)
    status = "one seed" if len(gaps) < 2 else ("held" if mean > 0 else "reversed") if finding else "within the noise"
    return Verdict(claim, list(gaps), mean, spread, status, size)


def _write(data: dict[str, Any], path: str | Path) -> Path:
    from attnlab.models.checkpoints import write_atomic

    target = Path(path)
    text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return target


def _read(path: str | Path, schema: str) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("schema") != schema:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {schema!r}: not this experiment's file")
    return dict(data)


@dataclass
class StreamingResult:
    """The streaming run (``bench.sinks_streaming``): perplexity past the first context, per arm and text."""

    date: str
    torch: str
    model: str
    context: int
    contexts: int
    texts: int
    seed: int
    bin: int
    arms: list[str]
    ppl: dict[str, list[float]]  # arm -> per text: perplexity of the bytes past the first context
    curve: dict[str, list[float]]  # arm -> mean NLL over the texts in bins of `bin` bytes
    first_token: float  # the model's first-token share on the texts' first context, mean over layers and heads
    largest_first: float  # the largest head's first-token share there
    uniform: float  # what a head spread evenly over every row of that context would give
    seconds: float
    schema: str = STREAMING
    interrupted: bool = False  # Ctrl-C or SIGTERM: the arms finished (every text each), saved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> Path:
        return _write(self.to_dict(), path)

    @classmethod
    def read(cls, path: str | Path) -> StreamingResult:
        return cls(**_read(path, STREAMING))

    def _log_gap(self, high: str, low: str) -> list[float]:
        """Per text, log ppl(high) - log ppl(low): the mean NLL per byte one arm pays above the other."""
        return [math.log(h) - math.log(w) for h, w in zip(self.ppl[high], self.ppl[low], strict=True)]

    def verdicts(self) -> list[Verdict]:
        """StreamingLLM's claims, judged from this file (an arm the run left out: its claim is not judged)."""
        out: list[Verdict] = []
        failed = None
        if "recompute" not in self.ppl:  # an interrupted run that finished no arm: nothing to judge
            return out
        if "window" in self.ppl:
            failed = judge("window_fails", self._log_gap("window", "recompute"))
            out.append(failed)
        if failed is not None and "sinks-4" in self.ppl:
            back = self._log_gap("window", "sinks-4")
            # the share of the window's extra loss won back: a size only where the window's loss is a finding
            recovered = sum(back) / sum(failed.gaps) if failed.status == "held" else math.nan
            out.append(judge("sinks_recover", back, size=recovered))
        if "dense" in self.ppl:
            out.append(judge("dense_fails", self._log_gap("dense", "recompute")))
        if "sinks-1" in self.ppl and "sinks-4" in self.ppl:
            out.append(judge("four_over_one", self._log_gap("sinks-1", "sinks-4")))
        return out


@dataclass
class Arm:
    """One Bigram-Backcopy arm (attention and optimizer), every seed: each measure at each evaluation."""

    name: str
    attention: str  # "softmax", "relu", "sigmoid"
    optimizer: str  # "adam", "sgd"
    steps: list[int]
    measures: dict[str, list[list[float]]] = field(default_factory=dict)  # measure -> per seed, per evaluation


@dataclass
class BackcopyResult:
    """The Bigram-Backcopy run (``bench.sinks_backcopy``): sinks, drains and peaks over training steps."""

    date: str
    torch: str
    settings: dict[str, Any]  # the task's and the model's sizes, steps, learning rates
    seeds: list[int]
    arms: list[Arm]
    seconds: float
    schema: str = BACKCOPY
    interrupted: bool = False  # Ctrl-C or SIGTERM: the seeds every arm finished, saved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> Path:
        return _write(self.to_dict(), path)

    @classmethod
    def read(cls, path: str | Path) -> BackcopyResult:
        data = _read(path, BACKCOPY)
        return cls(**{**data, "arms": [Arm(**a) for a in data["arms"]]})

    def arm(self, name: str) -> Arm | None:
        return next((a for a in self.arms if a.name == name), None)

    def final(self, arm: str, measure: str) -> list[float]:
        """Per seed, ``measure`` at the last evaluation of ``arm``."""
        found = self.arm(arm)
        return [] if found is None else [per_seed[-1] for per_seed in found.measures[measure]]

    def verdicts(self) -> list[Verdict]:
        """Guo et al.'s claims: softmax with Adam grows a sink, a value drain and a residual peak on token 0;
        ReLU attention, and SGD in Adam's place, do not; Gu et al.'s: sigmoid attention grows no sink (each judged
        against the softmax-Adam arm, seed by seed)."""
        out: list[Verdict] = []
        base = "softmax-adam"
        if self.arm(base) is None:
            return out
        grown = [s - d for s, d in zip(self.final(base, "sink"), self.final(base, "sink_triggers"), strict=True)]
        out.append(judge("dormant_sink", grown))
        for other, key in (("relu-adam", "relu"), ("softmax-sgd", "sgd")):
            if self.arm(other) is None:
                continue
            pairs = {
                "sink": (self.final(base, "sink"), self.final(other, "sink"), 1),
                "drain": (self.final(base, "value_ratio"), self.final(other, "value_ratio"), -1),
                "peak": (self.final(base, "residual_ratio"), self.final(other, "residual_ratio"), 1),
            }
            for what, (ours, theirs, sign) in pairs.items():
                out.append(judge(f"{key}_{what}", [sign * (a - b) for a, b in zip(ours, theirs, strict=True)]))
        if self.arm("sigmoid-adam") is not None:  # Gu et al.'s claim is of the sink alone
            ours, theirs = self.final(base, "sink"), self.final("sigmoid-adam", "sink")
            out.append(judge("sigmoid_sink", [a - b for a, b in zip(ours, theirs, strict=True)]))
        return out


@dataclass
class VariantsResult:
    """The zoo's variants on Bigram-Backcopy (``bench.sinks_variants``): each measure per variant and seed."""

    date: str
    torch: str
    settings: dict[str, Any]
    seeds: list[int]
    variants: dict[str, dict[str, Any]]  # name -> its GPTConfig changes
    measures: dict[str, dict[str, list[float]]]  # variant -> measure -> per seed
    seconds: float
    schema: str = VARIANTS_SCHEMA
    interrupted: bool = False  # Ctrl-C or SIGTERM: the seeds every variant finished, saved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> Path:
        return _write(self.to_dict(), path)

    @classmethod
    def read(cls, path: str | Path) -> VariantsResult:
        return cls(**_read(path, VARIANTS_SCHEMA))

    def verdicts(self) -> list[Verdict]:
        """Qiu et al.'s claims for the gate (the sink, its value drain, the largest activation), and a learned sink
        in the first token's place, against mha."""
        out: list[Verdict] = []
        if "mha" not in self.measures:
            return out
        base = self.measures["mha"]

        def drop(other: str, measure: str) -> list[float]:  # mha's minus the other's, seed by seed
            return [a - b for a, b in zip(base[measure], self.measures[other][measure], strict=True)]

        if "gated" in self.measures:
            out.append(judge("gated_sink", drop("gated", "first_token")))
            out.append(judge("gated_peak", drop("gated", "peak_ratio")))
            out.append(judge("gated_drain", [-g for g in drop("gated", "value_ratio")]))  # the gate's less drained
        if "sinks" in self.measures:
            out.append(judge("learned_sink", drop("sinks", "first_token")))
        return out


@dataclass
class MassiveResult:
    """Massive activations set to their mean or zero (``bench.sinks_massive``): the loss each way, per seed."""

    date: str
    torch: str
    settings: dict[str, Any]
    seeds: list[int]
    loss: dict[str, list[float]]  # "base", "mean", "zero", "control" -> per seed
    found: list[dict[str, Any]]  # per seed: the layer, the channels, their values, the peak ratio and position
    seconds: float
    schema: str = MASSIVE_SCHEMA
    interrupted: bool = False  # Ctrl-C or SIGTERM: the seeds finished, saved

    def write(self, path: str | Path) -> Path:
        return _write(asdict(self), path)

    @classmethod
    def read(cls, path: str | Path) -> MassiveResult:
        return cls(**_read(path, MASSIVE_SCHEMA))

    def verdicts(self) -> list[Verdict]:
        """Sun et al.: set to their mean, little changes; set to zero, the model breaks (zero against mean), and
        it is the massive ones that matter (zero against the control, as many small channels zeroed)."""
        zero, mean, control = self.loss["zero"], self.loss["mean"], self.loss["control"]
        return [
            judge("zero_breaks", [z - m for z, m in zip(zero, mean, strict=True)]),
            judge("zero_vs_control", [z - c for z, c in zip(zero, control, strict=True)]),
        ]
