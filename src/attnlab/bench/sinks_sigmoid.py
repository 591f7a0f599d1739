"""Softmax against sigmoid attention without normalisation on the zoo's text (Gu et al. 2024, arXiv 2410.10781:
"attention sinks do not emerge" with sigmoid attention without normalisation, the abstract).

The zoo's base model (``models.zoo``: its ``mha``, 4 layers of 4 heads, width 64, RoPE, bytes in) trained on the
zoo's text (Python's documentation as bytes, ``TextTask``, windows of ``SEQ_LEN``), once with softmax and once
with ``attn_normalize="sigmoid"`` (``attnlab.functional.sigmoid``: the authors' form, sigmoid of the scaled
scores, no bias, no normalisation), every arm and seed on the same batches with the same weights drawn (the
arms have the same parameters). Measured on held-out windows:

- ``first_token``: the first-token share, the mean over layers and heads; a sigmoid row's share is its weight
  on token 0 over what the row gives in all (the authors' code reads such heads by these "proxy" weights), which
  for softmax is the weight itself (``explain.sinks.first_token_share(of_row=True)``);
- ``largest_first``: the largest head's first-token share;
- ``sink_rate``: Gu et al.'s sink rate, the share of heads whose score (on the proxy weights) is above 0.3;
- ``peak_ratio``: the largest activation of any layer's output over its median; and the held-out loss.

A window of the zoo's text starts anywhere in a sentence: its first byte is no BOS (Gu et al. find that the sink
sits on the first token whatever it is). A head spread evenly over each row would have a first-token share of
``uniform`` (the mean over rows 1..T-1 of 1 / (i + 1)).

Shapes: L = layers, B = batch, H = heads, T = tokens.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.bench.sinks_result import Verdict, _read, _write, judge
from attnlab.explain.sinks.measures import first_token_share, gu_score, residual_peak, sink_rate

SIGMOID_SCHEMA = "attnlab.sinks.sigmoid/1"
ARMS: dict[str, str] = {"softmax": "softmax", "sigmoid": "sigmoid"}  # arm -> GPTConfig.attn_normalize
MEASURES = ("loss", "first_token", "largest_first", "sink_rate", "peak_ratio")


@dataclass(frozen=True)
class SigmoidSettings:
    """The schedule of a sigmoid run (the model is the zoo's base; ``seq_len`` its training windows)."""

    steps: int = 300
    batch: int = 16
    lr: float = 3e-3  # the zoo's
    seq_len: int = 128  # the zoo's SEQ_LEN
    probe: int = 32  # held-out windows measured

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len", "probe"):
            check_positive_int(name, getattr(self, name), limit=1 << 16)
        if not (isinstance(self.lr, float) and 0 < self.lr < 1):
            raise ValueError(f"lr must be a float in (0, 1), got {self.lr!r}")


def zoo_gpt(normalize: str, *, seed: int) -> Any:
    """The zoo's mha, its weights drawn from ``seed``, with softmax or sigmoid attention."""
    from attnlab.models import GPT
    from attnlab.models.zoo import zoo_config

    torch.manual_seed(seed)
    return GPT(zoo_config("mha").with_(attn_normalize=normalize))


def train_arm(normalize: str, settings: SigmoidSettings, *, seed: int, task: Any) -> Any:
    """The zoo's mha with ``normalize`` trained on ``task`` from ``seed`` (weights and batches), in eval mode."""
    model = zoo_gpt(normalize, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    batches = torch.Generator().manual_seed(seed)
    for _ in range(settings.steps):
        inputs, targets = task.batch(settings.batch, batches)  # each (B, T)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def measure(model: Any, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """The module's measures of ``model`` on held-out ``inputs`` and ``targets`` (B, T)."""
    outputs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, a, out: outputs.append(out.detach())) for b in model.blocks]
    try:
        weights = model.attention_weights(inputs)  # (L, B, H, T, T)
    finally:
        for hook in hooks:
            hook.remove()
    shares = first_token_share(weights, of_row=True).mean(dim=1)  # (L, B, H) -> (L, H)
    return {
        "loss": float(F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())),
        "first_token": float(shares.mean()),
        "largest_first": float(shares.max()),
        "sink_rate": sink_rate(gu_score(weights, of_row=True).mean(dim=1), "gu"),
        "peak_ratio": max(residual_peak(h).ratio for h in outputs),  # each block's output (B, T, E)
    }


def uniform_share(length: int) -> float:
    """The first-token share of a head spread evenly over each row of ``length`` tokens."""
    return sum(1 / (i + 1) for i in range(1, length)) / (length - 1)


@dataclass
class SigmoidResult:
    """The sigmoid run: each measure per arm and seed."""

    date: str
    torch: str
    settings: dict[str, Any]
    seeds: list[int]
    measures: dict[str, dict[str, list[float]]]  # arm -> measure -> per seed
    uniform: float  # an even head's first-token share on windows of settings["seq_len"]
    seconds: float
    schema: str = SIGMOID_SCHEMA
    interrupted: bool = False  # Ctrl-C or SIGTERM: the seeds both arms finished, saved

    def write(self, path: str | Path) -> Path:
        return _write(asdict(self), path)

    @classmethod
    def read(cls, path: str | Path) -> SigmoidResult:
        return cls(**_read(path, SIGMOID_SCHEMA))

    def verdicts(self) -> list[Verdict]:
        """Gu et al.: softmax grows a sink after effective optimisation (its first-token share above an even
        head's), and sigmoid without normalisation does not (softmax's share minus sigmoid's), seed by seed."""
        soft, sig = self.measures["softmax"]["first_token"], self.measures["sigmoid"]["first_token"]
        return [
            judge("softmax_text_sink", [s - self.uniform for s in soft]),
            judge("sigmoid_text_sink", [a - b for a, b in zip(soft, sig, strict=True)]),
        ]


Report = Callable[[str], None]


def run_sigmoid(
    *,
    seeds: int = 3,
    settings: SigmoidSettings | None = None,
    arms: dict[str, str] | None = None,
    report: Report | None = None,
) -> SigmoidResult:
    """Both arms (``ARMS`` unless given: the same names, each its attention) over ``seeds`` seeds, seed by seed.

    Ctrl-C (or SIGTERM, which the CLI turns into one) stops the run: the seeds both arms finished are kept and the
    result says ``interrupted``."""
    from attnlab.models.tasks import TextTask, stdlib_text

    check_positive_int("seeds", seeds, limit=10)
    plan = settings or SigmoidSettings()
    chosen = ARMS if arms is None else arms
    if set(chosen) != set(ARMS):
        raise ValueError(f"arms must name {list(ARMS)} (each its attention), got {list(chosen)}")
    say = report or (lambda line: None)
    began = time.perf_counter()
    task = TextTask(stdlib_text(), seq_len=plan.seq_len)
    inputs, targets = task.batch(plan.probe, torch.Generator().manual_seed(10_000), split="eval")
    finished: list[dict[str, dict[str, float]]] = []  # per seed: arm -> its measures
    interrupted = False
    try:
        for seed in range(seeds):
            trained = {}
            for arm, normalize in chosen.items():
                start = time.perf_counter()
                trained[arm] = values = measure(train_arm(normalize, plan, seed=seed, task=task), inputs, targets)
                say(
                    f"{arm} seed {seed}: loss {values['loss']:.3f}, first-token share {values['first_token']:.3f} "
                    f"(largest {values['largest_first']:.3f}), sink rate {values['sink_rate']:.2f} "
                    f"({time.perf_counter() - start:.0f} s)"
                )
            finished.append(trained)  # a seed counts once both arms have it
            say(f"seed {seed} finished: {len(finished)} of {seeds} kept")
    except KeyboardInterrupt:
        interrupted = True
    measures = {arm: {m: [trained[arm][m] for trained in finished] for m in MEASURES} for arm in ARMS}
    return SigmoidResult(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        settings=asdict(plan),
        seeds=list(range(len(finished))),
        measures=measures,
        uniform=uniform_share(plan.seq_len),
        seconds=time.perf_counter() - began,
        interrupted=interrupted,
    )
