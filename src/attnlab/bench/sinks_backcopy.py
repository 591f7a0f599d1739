"""Bigram-Backcopy, trained in arms side by side: sinks, value drains and residual peaks over training steps
(Guo et al. 2024, arXiv 2410.13835: "replacing softmax with ReLU and Adam with SGD" mitigates them), and
sigmoid attention without normalisation beside them (Gu et al. 2024, arXiv 2410.10781: sinks do not emerge).

Each arm is an attention (softmax, ReLU) and an optimizer (Adam, SGD); every arm and seed trains the same model
shape on the same batches (the seed draws the weights and the batches; the task's table is one for all). At each
evaluation, on one fixed held-out batch, every layer is measured with ``attnlab.explain.sinks``:

- ``sink``: the first-token share, the weight each row puts on BOS (as the head scores read it: for ReLU and
  sigmoid, the weight itself, not its share of the row), on the rows of ordinary tokens, where the head has
  nothing to do ("dormant"); ``sink_triggers`` the same on the rows of triggers ("active");
- ``value_ratio``: BOS's value norm over the others' (a drain is well below 1);
- ``residual_ratio``: BOS's residual norm over the others' after the layer (a peak is well above 1);
- ``peak_ratio``: the largest |activation| of the layer's output over its median;

each taken at its most extreme layer (the largest sink, with its own layer's trigger share beside it; the
smallest value ratio; the largest residual and peak ratios), and the held-out loss.

Shapes: B = batch, T = tokens, E = width.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from attnlab._checks import check_positive_int
from attnlab.bench.sinks_result import Arm, BackcopyResult
from attnlab.bench.sinks_toy import BOS, BigramBackcopy, Toy
from attnlab.explain.sinks.measures import residual_peak, row_shares, value_norm_ratio

ARMS: dict[str, tuple[str, str]] = {
    "softmax-adam": ("softmax", "adam"),
    "relu-adam": ("relu", "adam"),
    "softmax-sgd": ("softmax", "sgd"),
    "sigmoid-adam": ("sigmoid", "adam"),
}
MEASURES = ("loss", "sink", "sink_triggers", "value_ratio", "residual_ratio", "peak_ratio")


@dataclass(frozen=True)
class BackcopySettings:
    """Sizes and schedule of a Bigram-Backcopy run."""

    layers: int = 2
    width: int = 64
    length: int = 48
    batch: int = 32
    steps: int = 1000
    evaluations: int = 10
    lr_adam: float = 1e-3
    lr_sgd: float = 0.1  # with momentum 0.9: plain SGD at Adam's rate barely moves in this many steps
    task_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "width", "length", "batch", "steps", "evaluations"):
            check_positive_int(name, getattr(self, name), limit=1 << 16)
        if self.evaluations > self.steps:
            raise ValueError(f"evaluations ({self.evaluations}) must be <= steps ({self.steps})")


@torch.no_grad()
def measure(model: Toy, task: BigramBackcopy, seq: torch.Tensor) -> dict[str, float]:
    """The module's measures of ``model`` on held-out sequences ``seq`` (B, T + 1)."""
    ids = seq[:, :-1]  # (B, T)
    logits, weights, values, outputs = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
    active = task.is_trigger(ids[:, 1:])  # (B, T - 1): rows 1..T-1, a trigger's or not
    per_layer = []
    for w, v, h in zip(weights, values, outputs, strict=True):
        shares = row_shares(w)  # (B, T - 1): each row's weight on BOS
        per_layer.append(
            {
                "sink": float(shares[~active].mean()),
                "sink_triggers": float(shares[active].mean()) if active.any() else float("nan"),
                "value_ratio": float(value_norm_ratio(v[:, None]).mean()),  # (B, 1, T, E) -> (B, 1)
                "residual_ratio": residual_peak(h).norm_ratio,
                "peak_ratio": residual_peak(h).ratio,
            }
        )
    sunk = max(per_layer, key=lambda m: m["sink"])
    return {
        "loss": float(loss),
        "sink": sunk["sink"],
        "sink_triggers": sunk["sink_triggers"],
        "value_ratio": min(m["value_ratio"] for m in per_layer),
        "residual_ratio": max(m["residual_ratio"] for m in per_layer),
        "peak_ratio": max(m["peak_ratio"] for m in per_layer),
    }


def train_arm(
    attention: str, optimizer: str, settings: BackcopySettings, *, seed: int, task: BigramBackcopy
) -> tuple[list[int], dict[str, list[float]]]:
    """Train one arm from ``seed``: (the evaluated steps, each measure at each of them)."""
    torch.manual_seed(seed)
    model = Toy(layers=settings.layers, width=settings.width, length=settings.length, attention=attention)
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr_adam)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr_sgd, momentum=0.9)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    batches = torch.Generator().manual_seed(seed)
    held_out = task.batch(256, settings.length, torch.Generator().manual_seed(10_000 + seed))
    every = settings.steps // settings.evaluations
    steps: list[int] = []
    measures: dict[str, list[float]] = {name: [] for name in MEASURES}
    for step in range(1, settings.steps + 1):
        loss = model.loss(task.batch(settings.batch, settings.length, batches))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == settings.steps:
            if steps and steps[-1] == step:
                continue
            steps.append(step)
            for name, value in measure(model, task, held_out).items():
                measures[name].append(value)
    return steps, measures


Report = Callable[[str], None]


def run_backcopy(
    *,
    seeds: int = 3,
    settings: BackcopySettings | None = None,
    arms: dict[str, tuple[str, str]] | None = None,
    report: Report | None = None,
) -> BackcopyResult:
    """Every arm (``ARMS`` unless given: name -> (attention, optimizer)) over ``seeds`` seeds, seed by seed.

    Ctrl-C (or SIGTERM, which the CLI turns into one) stops the run: the seeds every arm finished are kept and the
    result says ``interrupted`` (no seed finished: no arm holds one)."""
    check_positive_int("seeds", seeds, limit=10)
    chosen = ARMS if arms is None else arms
    plan = settings or BackcopySettings()
    say = report or (lambda line: None)
    began = time.perf_counter()
    task = BigramBackcopy.make(seed=plan.task_seed)
    finished: list[dict[str, tuple[list[int], dict[str, list[float]]]]] = []  # per seed: arm -> its training
    interrupted = False
    try:
        for seed in range(seeds):
            trained = {}
            for name, (attention, optimizer) in chosen.items():
                start = time.perf_counter()
                trained[name] = steps, measures = train_arm(attention, optimizer, plan, seed=seed, task=task)
                say(
                    f"{name} seed {seed}: loss {measures['loss'][-1]:.3f}, sink {measures['sink'][-1]:.2f}, "
                    f"value ratio {measures['value_ratio'][-1]:.2f}, residual ratio "
                    f"{measures['residual_ratio'][-1]:.2f} ({time.perf_counter() - start:.0f} s)"
                )
            finished.append(trained)  # a seed counts once every arm has it
            say(f"seed {seed} finished: {len(finished)} of {seeds} kept")
    except KeyboardInterrupt:
        interrupted = True
    results = []
    for name, (attention, optimizer) in chosen.items():
        arm = Arm(name, attention, optimizer, steps=[], measures={m: [] for m in MEASURES})
        for trained in finished:
            arm.steps, measures = trained[name]
            for m in MEASURES:
                arm.measures[m].append(measures[m])
        results.append(arm)
    return BackcopyResult(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        settings={**asdict(plan), "vocab": BOS, "triggers": list(task.triggers)},
        seeds=list(range(len(finished))),
        arms=results,
        seconds=time.perf_counter() - began,
        interrupted=interrupted,
    )
