"""``attnlab zoo``: every variant of ``attnlab.models.zoo`` trained side by side, measured, and saved as one file.

The same text (the shipped text model's: Python's own documentation as bytes, ``TextTask``), the same number
of parameters (within 5%), the same batches, steps, learning-rate schedule and seeds for every variant. The
steps come from the time budget: a few timed steps of each variant forecast the run, and the budget is shared
out as one number of steps for all, so every variant sees the same tokens.

Measured for each variant:

- the held-out loss at each evaluation (the curve), and at the end, per seed (the spread over seeds is what
  tells a difference from noise);
- its parameters, and the KV-cache (or recurrent state) bytes per token and at 1k, 32k and 128k tokens in
  float32 (``attnlab.bench.kv_bytes``, from the config);
- decode at a long context, timed: a 1024-token prompt, then ``DECODE`` tokens one at a time, and the bytes
  the model's cache objects hold after it (what was allocated, read off the caches);
- keys read and state bytes a token, measured (``attnlab.bench.sparse_meter``): the keys each layer read to
  decode one token after a PROMPT-token prompt (a sparse layer's own meter, from its kernel's indices; a dense
  layer's unmasked scores), and the bytes the cache's tensors hold then over the tokens it holds;
- the heads it grew, on the seeded probe of ``attnlab.explain.heads`` (random tokens, repeated): the best
  previous-token and induction scores, the in-context gain (loss on the repeat below loss on the first copy),
  the mean weight on the first token, and for learned sinks the mean share of a row they take (recorded as
  "sink_weight"). Recurrent layers are read by their implicit weights (``attnlab.nn.recurrent``). A variant
  whose layers gather each query's keys (dsa, compressed) records its weights over those keys alone, no map of
  every query against every key: its heads are left unmeasured (empty), not guessed.

Everything lands in a :class:`ZooResult`, written as JSON; the table and the plot are drawn from that file.

Shapes: B = batch, T = tokens.
"""

from __future__ import annotations

import datetime
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.bench.kv_bytes import kv_report
from attnlab.bench.zoo_result import DECODE, PROMPT, SCHEMA, TOKENS, Curve, VariantResult, ZooResult
from attnlab.models.gpt import count_parameters
from attnlab.models.zoo import SEQ_LEN, VARIANTS, zoo_config

BATCH = 16
LR = 3e-3
MIN_STEPS = 50  # fewer and the curves say nothing: a budget that allows fewer is refused
SMOKE_STEPS = 3  # evaluated after each, on one batch: the run's every part, in seconds

Report = Callable[[str], None]  # a line of progress for whoever runs the zoo (the CLI prints it)


def check_names(names: Sequence[str]) -> list[str]:
    """The variants asked for, in the zoo's order (all of them for none); an unknown name is refused."""
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; the zoo holds {list(VARIANTS)}")
    return [n for n in VARIANTS if n in names] if names else list(VARIANTS)


def _model(name: str, seed: int) -> Any:
    from attnlab.models.gpt import GPT

    torch.manual_seed(seed)
    return GPT(zoo_config(name))


EVAL_BATCHES = 4  # held-out batches an evaluation reads (TrainConfig.eval_batches)
EVALUATIONS = 12  # at most, a run of MIN_STEPS or more: every steps // 10 steps, and at its last step (59: 12)


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """A variant's training on this machine, timed in the zoo's loop. An evaluation (EVAL_BATCHES forwards) costs
    1 to 2 steps: a layer that chooses keys (nsa, compressed) pays in the forward, which it repeats, not the backward."""

    step: float  # seconds a training step, forward, backward and update (median of the timed ones)
    evaluation: float  # seconds one evaluation


def probe(name: str, task: Any, *, steps: int = 5) -> StepCost:
    """Time variant ``name`` in ``train()`` itself (the zoo's optimizer, clipping and schedule): two untimed steps,
    then ``steps`` timed ones (their median) and one evaluation of EVAL_BATCHES batches."""
    from attnlab.models.train import TrainConfig, train

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1 to time, got {steps!r}")
    total = steps + 2
    recipe = TrainConfig(steps=total, batch_size=BATCH, lr=LR, warmup=1, eval_every=total, eval_batches=EVAL_BATCHES)
    log = train(_model(name, 0), task, recipe)
    timed = [BATCH * task.seq_len / speed for speed in log.tokens_per_s[2:]]  # seconds a step
    return StepCost(step=statistics.median(timed), evaluation=log.seconds - log.eval_seconds[-1])


MARGIN = 0.85  # the share of the budget planned: the timed steps are a forecast, and the run must end in time


def evaluations(steps: int) -> int:
    """How many evaluations a run of ``steps`` makes (``eval_every=max(steps // 10, 1)``, and the last step)."""
    every = max(steps // 10, 1)
    return steps // every + (1 if steps % every else 0)


def forecast(costs: dict[str, StepCost], *, steps: int, seeds: int, reserve: float) -> float:
    """Seconds a run of ``steps`` a variant takes: ``reserve`` plus every variant's steps and evaluations, each seed."""
    run = sum(steps * c.step + evaluations(steps) * c.evaluation for c in costs.values())
    return reserve + seeds * run


def plan_steps(costs: dict[str, StepCost], *, minutes: float, seeds: int, reserve: float) -> int:
    """The most steps for every variant whose forecast fits ``minutes``: MARGIN of the time left after ``reserve``
    seconds (measuring), shared by every variant and seed, each run paying its own evaluations."""
    budget = MARGIN * (minutes * 60 - reserve)
    per_step = sum(c.step for c in costs.values()) * seeds
    per_eval = sum(c.evaluation for c in costs.values()) * seeds
    steps = max(int((budget - EVALUATIONS * per_eval) / per_step), 0) if per_step > 0 else 0  # a floor: see below
    while per_step > 0 and forecast(costs, steps=steps + 1, seeds=seeds, reserve=0) <= budget:
        steps += 1  # a run evaluates 10 to 12 times: the floor assumed the most
    if steps < MIN_STEPS:
        least = (reserve + forecast(costs, steps=MIN_STEPS, seeds=seeds, reserve=0) / MARGIN) / 60
        raise ValueError(
            f"--minutes {minutes:g} leaves {steps} training steps a variant for {len(costs)} variant(s) "
            f"and {seeds} seed(s) on this machine (about {per_step / seeds:.2f} s a step for all of them, "
            f"{per_eval / seeds:.2f} s an evaluation); the curves need {MIN_STEPS}: give --minutes "
            f"{math.ceil(least)} or more, fewer variants or seeds, or --smoke"
        )
    return steps


def measure_decode(model: Any, *, rounds: int = 3) -> tuple[float, float, int]:
    """Decode tokens/s after a PROMPT-token prompt (median of ``rounds``; spread (max - min) / median) and the
    bytes the model's caches hold after PROMPT + DECODE tokens."""
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    rates, held = [], 0
    with torch.no_grad():
        for _ in range(rounds):
            caches = model.make_caches(batch_size=1, max_len=PROMPT + DECODE)
            logits = model(prompt, caches=caches, last_only=True)  # (1, 1, V)
            start = time.perf_counter()
            for _ in range(DECODE):
                token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
                logits = model(token, caches=caches, last_only=True)
            rates.append(DECODE / (time.perf_counter() - start))
            held = sum(b.numel() * b.element_size() for layer in caches for b in layer.buffers())
    median = statistics.median(rates)
    return median, (max(rates) - min(rates)) / median, held


def measure_reads(model: Any) -> tuple[list[int], float]:
    """Keys each layer read to decode one token after a PROMPT-token prompt (``attnlab.bench.sparse_meter``:
    a gathering layer's own meter, a dense layer's unmasked scores), and the state bytes a token the model's cache
    holds then (its tensors' bytes over the PROMPT + 1 tokens it was built for and holds)."""
    from attnlab.bench.sparse_meter import keys_read, state_bytes

    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT + 1), generator=torch.Generator().manual_seed(1))
    caches = model.make_caches(batch_size=1, max_len=PROMPT + 1)
    with torch.no_grad():
        model(ids[:, :PROMPT], caches=caches, last_only=True)
    read = keys_read(model, caches, ids[:, PROMPT:])
    return read, state_bytes(caches) / (PROMPT + 1)


def measure_heads(model: Any) -> dict[str, float]:
    """The heads a variant grew, on the seeded probe (``attnlab.explain.heads``)."""
    from attnlab.explain.heads import default_half, head_scores, probe
    from attnlab.explain.sinks.measures import learned_sink_share

    scores = head_scores(model)
    first = [v for row in scores.first_token for v in row]
    result = {
        "previous_token": scores.best("previous_token")[2],
        "induction": scores.best("induction")[2],
        "in_context_gain": scores.loss_first_half - scores.loss_second_half,
        "first_token": statistics.fmean(first),
    }
    if model.config.sinks:  # what each row gives its learned sink, as recorded beside the weights
        from attnlab.observe import Recorder

        # read, not inferred from the rows' sums: a recurrent layer's implicit weights do not sum to 1
        with torch.no_grad(), Recorder(names=["sink_weight"]) as rec:
            model(probe(model.config.vocab_size, half=default_half(model)))
        shares = torch.stack(list(rec.all("sink_weight").values()))  # (L with sinks, B, H, T)
        result["sink"] = float(learned_sink_share(shares).mean())  # the learned sink's share, not a token's
    return result


def run_zoo(
    names: Sequence[str] = (),
    *,
    minutes: float = 15.0,
    seeds: int = 1,
    smoke: bool = False,
    report: Report | None = None,
    models: str | Path | None = None,
) -> ZooResult:
    """Train and measure the variants ``names`` (all for none) on the shipped text within ``minutes``.

    With ``models``, each variant's seed-0 model (the one whose decode and heads are measured) is saved to
    ``models/NAME`` with its training log, as ``attnlab train`` saves one: ``attnlab explain --model zoo:NAME``
    and the interactive view read it from there. A smoke run saves only where no model is yet: its few steps
    never replace a trained one."""
    from attnlab.models.tasks import TextTask, stdlib_text
    from attnlab.models.train import RunRecord, TrainConfig, train

    chosen = check_names(names)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 10:
        raise ValueError(f"seeds must be a whole number in [1, 10], got {seeds!r}")
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes < math.inf:
        raise ValueError(f"minutes must be a number > 0, got {minutes!r}")
    say = report or (lambda line: None)
    began = time.perf_counter()
    task = TextTask(stdlib_text(), seq_len=SEQ_LEN)
    costs = {} if smoke else {name: probe(name, task) for name in chosen}  # a smoke run's steps are fixed: untimed
    reserve = len(chosen) * (2 if smoke else 8) + (time.perf_counter() - began)  # decode and heads, measured once
    steps = SMOKE_STEPS if smoke else plan_steps(costs, minutes=minutes, seeds=seeds, reserve=reserve)
    expected = {name: forecast({name: cost}, steps=steps, seeds=1, reserve=0) for name, cost in costs.items()}
    whole = forecast(costs, steps=steps, seeds=seeds, reserve=reserve) / 60
    told = f"forecast {whole:.1f} of --minutes {minutes:g}" if costs else "a smoke run"
    say(f"{len(chosen)} variants x {seeds} seed(s) x {steps} steps of {BATCH} x {SEQ_LEN} bytes; {told}")
    results = {}
    for name in chosen:
        config = zoo_config(name)
        kv = kv_report(config, name=name, tokens=TOKENS, dtype="float32")
        results[name] = VariantResult(
            name=name,
            what=VARIANTS[name].what,
            what_zh=VARIANTS[name].what_zh,
            models=VARIANTS[name].models,
            parameters=count_parameters(config),
            hidden_dim=config.ff_dim,
            layer_types=[config.layer_type(i) for i in range(config.n_layers)],
            kv_bytes_per_token=kv.per_token,
            state_bytes=sum(k.layers * k.state_bytes for k in kv.kinds),
            cache_at={str(at.tokens): at.total for at in kv.at},
            curves=[],
        )
    deadline = began + minutes * 60
    interrupted = False
    for seed in range(seeds):
        if interrupted:
            break
        for i, name in enumerate(chosen):
            left = (deadline - time.perf_counter()) / 60
            recipe = TrainConfig(
                steps=steps,
                batch_size=BATCH,
                lr=LR,
                warmup=min(100, max(steps // 10, 1)),
                eval_every=max(steps // 10, 1),
                eval_batches=1 if smoke else EVAL_BATCHES,  # a smoke run's evaluations would be most of its time
                seed=seed,
                minutes=max(left, 0.05),  # the budget holds: a variant out of time stops and says so
            )
            model = _model(name, seed)
            keep = Path(models) / name if models is not None and seed == 0 else None
            if keep is not None and smoke and (keep / "config.json").exists():
                keep = None  # a smoke run's few steps never replace a model a real run trained
            record = RunRecord(tokenizer="bytes", run={"task": "text", "zoo": name})
            log = train(model, task, recipe, checkpoint=keep, record=record)  # Ctrl-C ends the step, then returns
            done = log.step[-1] if log.step else 0
            stopped = "" if done == steps else f"{'interrupted' if log.interrupted else 'out of time'} at step {done}"
            results[name].curves.append(Curve(seed, list(log.eval_step), list(log.eval_loss), log.seconds, stopped))
            loss = f"{log.eval_loss[-1]:.3f}" if log.eval_loss else "n/a"
            took = f"{log.seconds:.0f} s" + (f" of {expected[name]:.0f} forecast" if name in expected else "")
            say(f"seed {seed} {i + 1}/{len(chosen)} {name}: held-out loss {loss} after {took} {stopped}")
            if seed == 0:
                model.eval()
                rate, spread, held = measure_decode(model, rounds=1 if smoke else 3)
                results[name].decode_tokens_per_s, results[name].decode_spread = rate, spread
                results[name].cache_bytes_held = held
                by_layer, per_token = measure_reads(model)
                results[name].keys_read_by_layer, results[name].state_bytes_per_token = by_layer, per_token
                # a layer that gathers each query's keys records weights over those alone, not a (T, T) map
                gathers = any(hasattr(block.att, "keys_read") for block in model.blocks)
                results[name].heads = {} if gathers else measure_heads(model)
            if log.interrupted:
                interrupted = True
                break
    return ZooResult(
        schema=SCHEMA,
        command=" ".join(["attnlab", *sys.argv[1:]]) if Path(sys.argv[0]).name == "attnlab" else "attnlab zoo",
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        minutes=float(minutes),
        steps=steps,
        batch_size=BATCH,
        seq_len=SEQ_LEN,
        lr=LR,
        seeds=list(range(seeds)),
        seconds=time.perf_counter() - began,
        variants=[results[name] for name in chosen if results[name].curves],
        interrupted=interrupted,
    )
