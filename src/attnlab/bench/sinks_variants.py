"""The zoo's ``mha``, ``gated`` and ``sinks`` trained on Bigram-Backcopy, where a first-token sink grows: does
the output gate (Qiu et al. 2025, arXiv 2505.06708) or a learned sink (gpt-oss) take its place?

The zoo's own runs on text grow no sink to remove (their first-token share sits below an even head's, in
``attnlab zoo --show``), so the variants are set side by side on the task that grows one: attnlab's GPT
(rotary positions, each variant the zoo's change of ``GPTConfig``: ``attn_output_gate=True``,
``sinks=True``) trained on ``bench.sinks_toy``'s Bigram-Backcopy sequences, every variant and seed on the same
batches. Measured on a held-out batch with ``explain.sinks.read_gpt``: the largest first-token share of any
head, the learned sink's largest share (a sink variant only, named apart), the smallest value norm ratio, and
the largest activation of any layer's output over its median.

Shapes: B = batch, T = tokens.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.bench.sinks_result import VARIANTS_SCHEMA, VariantsResult
from attnlab.bench.sinks_toy import BOS, BigramBackcopy
from attnlab.explain.sinks.reading import read_gpt

CHANGES: dict[str, dict[str, Any]] = {"mha": {}, "gated": {"attn_output_gate": True}, "sinks": {"sinks": True}}
MEASURES = ("loss", "first_token", "learned_sink", "value_ratio", "peak_ratio")


@dataclass(frozen=True)
class VariantSettings:
    """The GPT's shape and the schedule of a variants run."""

    layers: int = 2
    heads: int = 2
    width: int = 64
    length: int = 48
    batch: int = 32
    steps: int = 1000
    lr: float = 3e-3
    task_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "width", "length", "batch", "steps"):
            check_positive_int(name, getattr(self, name), limit=1 << 16)


def gpt_for(changes: dict[str, Any], settings: VariantSettings) -> Any:
    """A GPT of the run's shape with a zoo variant's ``changes``, vocabulary Bigram-Backcopy's (tokens and BOS)."""
    from attnlab.models import GPT, GPTConfig

    return GPT(
        GPTConfig(
            vocab_size=BOS + 1,
            context_length=settings.length,
            emb_dim=settings.width,
            n_heads=settings.heads,
            n_layers=settings.layers,
            drop_rate=0.0,
            rope=True,
            **changes,
        )
    )


def train_gpt(changes: dict[str, Any], settings: VariantSettings, *, seed: int, task: BigramBackcopy) -> Any:
    """A GPT with ``changes`` trained on Bigram-Backcopy from ``seed`` (weights and batches), in eval mode."""
    torch.manual_seed(seed)
    model = gpt_for(changes, settings)
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
    batches = torch.Generator().manual_seed(seed)
    for _ in range(settings.steps):
        seq = task.batch(settings.batch, settings.length, batches)  # (B, T + 1)
        logits = model(seq[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def measure(model: Any, seq: torch.Tensor) -> dict[str, float]:
    """The module's measures of ``model`` on held-out sequences ``seq`` (B, T + 1)."""
    logits = model(seq[:, :-1])
    reading = read_gpt(model, seq[:, :-1])
    return {
        "loss": float(F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())),
        "first_token": max(max(row) for row in reading.first_token),
        "learned_sink": max(max(row) for row in reading.learned_sink) if reading.learned_sink else 0.0,
        "value_ratio": min(min(row) for row in reading.value_ratio),
        "peak_ratio": max(p.ratio for p in reading.peaks),
    }


Report = Callable[[str], None]


def run_variants(
    *,
    seeds: int = 3,
    settings: VariantSettings | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    report: Report | None = None,
) -> VariantsResult:
    """Every variant (``CHANGES`` unless given: name -> GPTConfig changes) over ``seeds`` seeds, seed by seed.

    Ctrl-C (or SIGTERM, which the CLI turns into one) stops the run: the seeds every variant finished are kept and
    the result says ``interrupted``."""
    check_positive_int("seeds", seeds, limit=10)
    plan = settings or VariantSettings()
    chosen = CHANGES if variants is None else variants
    say = report or (lambda line: None)
    began = time.perf_counter()
    task = BigramBackcopy.make(seed=plan.task_seed)
    held_out = task.batch(128, plan.length, torch.Generator().manual_seed(10_000))
    finished: list[dict[str, dict[str, float]]] = []  # per seed: variant -> its measures
    interrupted = False
    try:
        for seed in range(seeds):
            trained = {}
            for name, changes in chosen.items():
                start = time.perf_counter()
                trained[name] = values = measure(train_gpt(changes, plan, seed=seed, task=task), held_out)
                say(
                    f"{name} seed {seed}: loss {values['loss']:.3f}, first-token share {values['first_token']:.2f}, "
                    f"learned sink {values['learned_sink']:.2f}, peak ratio {values['peak_ratio']:.1f} "
                    f"({time.perf_counter() - start:.0f} s)"
                )
            finished.append(trained)  # a seed counts once every variant has it
            say(f"seed {seed} finished: {len(finished)} of {seeds} kept")
    except KeyboardInterrupt:
        interrupted = True
    measures = {name: {m: [trained[name][m] for trained in finished] for m in MEASURES} for name in chosen}
    return VariantsResult(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        settings={**asdict(plan), "triggers": list(task.triggers)},
        seeds=list(range(len(finished))),
        variants={name: dict(changes) for name, changes in chosen.items()},
        measures=measures,
        seconds=time.perf_counter() - began,
        schema=VARIANTS_SCHEMA,
        interrupted=interrupted,
    )


def backcopy_stream(*, contexts: int, texts: int, seed: int = 0) -> tuple[Any, torch.Tensor]:
    """The zoo's mha trained on Bigram-Backcopy (the run's settings, ``seed``), and ``texts`` held-out sequences of
    ``contexts`` x its context, BOS first: (model, (texts, contexts x context))."""
    plan = VariantSettings()
    task = BigramBackcopy.make(seed=plan.task_seed)
    model = train_gpt(CHANGES["mha"], plan, seed=seed, task=task)
    text = task.batch(texts, contexts * plan.length - 1, torch.Generator().manual_seed(30_000 + seed))
    return model, text
