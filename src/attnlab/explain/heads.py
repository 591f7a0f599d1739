"""Name every head: previous-token, duplicate-token, induction and first-token scores on a seeded probe.

The probe is ``batch`` sequences of ``n`` distinct random tokens, each
followed by the same tokens again (T = 2n). With A the attention weights of
one head, (T, T), averaged over the probe's sequences:

- previous-token:  mean over i in [1, T)  of A[i, i - 1]
- duplicate-token: mean over i in [n, T)  of A[i, i - n]      (the earlier copy of the same token)
- induction:       mean over i in [n, T)  of A[i, i - n + 1]  (the token after the earlier copy)
- first-token:     mean over i in [1, T)  of A[i, 0]          (the attention sink: ``explain.sinks``'s
                                                              first-token share, defined there once)

Each is the attention a head pays, on average, to one particular key: 1 means
all of it. The in-context-learning score is the model's mean loss on the
second copy minus on the first (Olsson et al., 2022): below zero, the model
predicts the repeat better than the first pass, by looking back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int, check_seed
from attnlab.explain.sinks.measures import first_token_share
from attnlab.models.gpt import GPT
from attnlab.models.train import OnEval, TrainLog

SCORES = ("previous_token", "duplicate_token", "induction", "first_token")
NAME_THRESHOLD = 0.4  # a head is named after its highest score when that score is at least this


@dataclass(frozen=True)
class HeadScores:
    """Scores per layer and head (each a list of n_layers lists of n_heads floats), on a probe of ``half`` tokens twice."""

    previous_token: list[list[float]]
    duplicate_token: list[list[float]]
    induction: list[list[float]]
    first_token: list[list[float]]
    loss_first_half: float
    loss_second_half: float
    half: int

    @property
    def in_context_learning(self) -> float:
        return self.loss_second_half - self.loss_first_half

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "in_context_learning": self.in_context_learning}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> HeadScores:
        return cls(**{k: v for k, v in values.items() if k != "in_context_learning"})

    def label(self, layer: int, head: int, threshold: float = NAME_THRESHOLD) -> str:
        """The pattern the head mostly follows ('induction', ...), or '' when no score reaches ``threshold``."""
        scores = {name: getattr(self, name)[layer][head] for name in SCORES}
        best = max(scores, key=lambda name: scores[name])
        return best.replace("_", "-") if scores[best] >= threshold else ""

    def best(self, score: str) -> tuple[int, int, float]:
        """(layer, head, value) of the highest ``score`` over the model."""
        table = getattr(self, score)
        layer, head = max(
            ((i, j) for i, row in enumerate(table) for j in range(len(row))), key=lambda ij: table[ij[0]][ij[1]]
        )
        return layer, head, table[layer][head]


MIN_HALF = 3  # below it the induction diagonal (offset half - 1) is the previous-token one (offset 1)


def default_half(model: GPT) -> int:
    """24 tokens twice, as long as that fills at most half of the model's context (``context // 4`` otherwise),
    and never fewer than MIN_HALF: a context too short for that is refused (``check_probe``)."""
    context = model.config.context_length
    return min(max(MIN_HALF, min(24, context // 4)), max(context // 2, 1))


def probe(vocab_size: int, *, half: int = 24, batch: int = 8, seed: int = 0) -> torch.Tensor:
    """``batch`` sequences of ``half`` distinct random tokens, each repeated once: (batch, 2 * half).

    Distinct, so that every token of the second copy has exactly one earlier
    occurrence (drawn with repeats only when the vocabulary is smaller than ``half``).
    """
    generator = torch.Generator().manual_seed(seed)
    if vocab_size >= half:
        first = torch.stack([torch.randperm(vocab_size, generator=generator)[:half] for _ in range(batch)])
    else:
        first = torch.randint(0, vocab_size, (batch, half), generator=generator)  # (batch, half)
    return torch.cat([first, first], dim=1)  # (batch, 2 * half)


def _diagonal_mean(weights: torch.Tensor, offset: int, start: int) -> torch.Tensor:
    """Mean over query rows i >= start of weights[..., i, i - offset]: (L, H)."""
    t = weights.shape[-1]
    rows = torch.arange(start, t)
    return weights[..., rows, rows - offset].mean(dim=-1)


def check_probe(model: GPT, half: int, batch: int, seed: int) -> None:
    check_positive_int("half", half, limit=1 << 20)
    check_positive_int("batch", batch, limit=4096)
    check_seed(seed)
    context = model.config.context_length
    if context < 2 * MIN_HALF:
        raise ValueError(
            f"head scores need a probe of at least {MIN_HALF} tokens twice ({2 * MIN_HALF} positions), so that "
            f"previous-token, induction and duplicate-token heads can be told apart; this model's context is "
            f"{context}: train or load one with a context of {2 * MIN_HALF} or more"
        )
    if half < MIN_HALF:
        raise ValueError(
            f"half must be >= {MIN_HALF}: with fewer tokens the induction and previous-token scores read the "
            f"same diagonal; got {half}"
        )
    if 2 * half > context:
        raise ValueError(
            f"a probe of {half} tokens twice needs {2 * half} positions; the model's context is "
            f"{context}: use half <= {context // 2}"
        )


@torch.no_grad()
def head_scores(model: GPT, *, half: int | None = None, batch: int = 8, seed: int = 0) -> HeadScores:
    """Score every head of ``model`` on the seeded probe (see the module's formulas)."""
    n = default_half(model) if half is None else half
    check_probe(model, n, batch, seed)
    tokens = probe(model.config.vocab_size, half=n, batch=batch, seed=seed)  # (B, 2n)
    weights = model.attention_weights(tokens).mean(dim=1)  # (L, B, H, T, T) -> (L, H, T, T)
    logits = model(tokens[:, :-1])  # (B, 2n - 1, V): predicts tokens 1..2n-1
    losses = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(batch, -1)
    as_lists = lambda x: [[float(v) for v in row] for row in x]
    return HeadScores(
        **{name: as_lists(value) for name, value in scores_from_weights(weights, n).items()},
        loss_first_half=float(losses[:, : n - 1].mean()),  # targets 1..n-1: nothing to look back at
        loss_second_half=float(losses[:, n:].mean()),  # targets n+1..2n-1: a repeat of what came before
        half=n,
    )


def scores_from_weights(weights: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The four scores from (L, H, 2n, 2n) weights on a probe of n tokens twice (the module's formulas): each (L, H)."""
    return {
        "previous_token": _diagonal_mean(weights, 1, 1),
        "duplicate_token": _diagonal_mean(weights, n, n),
        "induction": _diagonal_mean(weights, n - 1, n),
        "first_token": first_token_share(weights),
    }


def watch(*, half: int | None = None, seed: int = 0) -> OnEval:
    """An ``on_eval`` callback for ``train``: the head scores at every evaluation, in ``log.extra["heads"]``."""

    def record(step: int, model: GPT, log: TrainLog) -> None:
        scores = head_scores(model, half=half, seed=seed)
        log.extra.setdefault("heads", []).append({"step": step, **scores.to_dict()})

    return record


def history(log: TrainLog) -> tuple[list[int], list[HeadScores]]:
    """The steps and scores ``watch`` recorded, in order."""
    rows = log.extra.get("heads", [])
    return [int(r["step"]) for r in rows], [
        HeadScores.from_dict({k: v for k, v in r.items() if k != "step"}) for r in rows
    ]


def describe_run(log: TrainLog, txt: dict[str, str]) -> str:
    """What a training log shows, in the report's words (``txt``: one language of REPORT_TEXT), computed from the
    log alone: where the held-out loss started and ended, its steepest fall, and which head reached 0.7 first.
    Every sentence about a run comes from here, so none can say the reverse of its log."""
    parts = []
    if len(log.eval_loss) >= 2:
        falls = [log.eval_loss[i - 1] - log.eval_loss[i] for i in range(1, len(log.eval_loss))]
        i = max(range(len(falls)), key=falls.__getitem__) + 1
        parts.append(
            txt["run_loss"].format(
                first=log.eval_loss[0],
                first_step=log.eval_step[0],
                last=log.eval_loss[-1],
                last_step=log.eval_step[-1],
                before=log.eval_loss[i - 1],
                after=log.eval_loss[i],
                cliff=log.eval_step[i],
            )
        )
    prev, ind = first_step(log, score="previous_token", layer=0), first_step(log, score="induction")
    if prev is not None and ind is not None:
        order = "order_same" if prev == ind else "order_prev_first" if prev < ind else "order_ind_first"
        parts.append(txt["run_heads"].format(prev=prev, ind=ind, order=txt[order]))
    elif prev is None and ind is None:
        parts.append(txt["run_missing_both"])
    else:
        parts.append(txt["run_missing"].format(which=txt["which_prev" if prev is None else "which_ind"]))
    return txt["sep"].join(parts)


def first_step(
    log: TrainLog, *, score: str = "induction", layer: int | None = None, at_least: float = 0.7
) -> int | None:
    """The first recorded step where some head (of ``layer``, if given) reached ``at_least`` on ``score``."""
    for step, scores in zip(*history(log), strict=True):
        table = getattr(scores, score)
        rows = [table[layer]] if layer is not None else table
        if max(max(row) for row in rows) >= at_least:
            return step
    return None


def seconds_to(log: TrainLog, step: int) -> float:
    """Training seconds from the start of the run to the evaluation at ``step``."""
    return log.eval_seconds[log.eval_step.index(step)]
