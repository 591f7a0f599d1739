"""A small, readable training loop for ``GPT``: AdamW, warm-up then cosine, clipping, held-out loss.

Seeded and reproducible: the batches come from one generator seeded by
``TrainConfig.seed``. Under ``torchrun`` (``torch.distributed`` initialized)
the model is wrapped in DistributedDataParallel and every rank draws the same
global batch and trains on its own rows of it, so N processes see exactly the
batches one process would (``tests/test_train.py`` checks the loss curves
agree). A budget in minutes stops the loop early. A checkpoint folder holds
the model (``save_pretrained``), ``train_log.json`` (the curves) and
``train_state.pt`` (step, optimizer, generator, config); ``resume=True``
continues from it exactly where it stopped.

Shapes: B = batch, T = tokens, V = vocabulary.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlab._checks import check_positive_int, check_seed
from attnlab.models.checkpoints import file_digest, read_json, write_atomic
from attnlab.models.config import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.models.tasks import Task
from attnlab.models.tokenizer import CharTokenizer
from attnlab.nn.index_loss import indexer_parameters, take_index_losses

STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.json"
STATE_KEYS = ("step", "optimizer", "generator", "config")  # what a training state must hold to resume


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 1500
    batch_size: int = 32  # the global batch, over every process
    lr: float = 3e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 4
    seed: int = 0
    minutes: float | None = None

    def __post_init__(self) -> None:
        check_positive_int("steps", self.steps, limit=10**8)
        check_positive_int("batch_size", self.batch_size, limit=1 << 20)
        check_positive_int("eval_every", self.eval_every, limit=10**8)
        check_positive_int("eval_batches", self.eval_batches, limit=10_000)
        check_seed(self.seed)
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ValueError(f"warmup must be a whole number of steps >= 0, got {self.warmup!r}")
        for name in ("lr", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if (
            isinstance(self.weight_decay, bool)
            or not isinstance(self.weight_decay, (int, float))
            or not 0 <= self.weight_decay < 1
        ):
            raise ValueError(f"weight_decay must be in [0, 1), got {self.weight_decay!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.minutes is not None and not (isinstance(self.minutes, (int, float)) and 0 < self.minutes < math.inf):
            raise ValueError(f"minutes must be a number > 0 (a time budget), got {self.minutes!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


# How each built-in task trains by default (attnlab train TASK); flags override any field.
TASK_DEFAULTS: dict[str, TrainConfig] = {
    "induction": TrainConfig(steps=2500, lr=3e-3, eval_every=50),
    "text": TrainConfig(steps=800, lr=2e-3, eval_every=100),
    "poems": TrainConfig(steps=3000, lr=3e-3, batch_size=64, eval_every=250),
}


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then a cosine down to ``lr * min_lr_ratio``."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


@dataclass
class TrainLog:
    """What the loop saw: one row per step, one per evaluation, and what ``on_eval`` callbacks added."""

    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    index_loss: list[float] = field(default_factory=list)  # the indexers' loss a step, where the model has indexers
    lr: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_seconds: list[float] = field(default_factory=list)  # training time when each evaluation began
    extra: dict[str, list[Any]] = field(default_factory=dict)  # e.g. "heads": head scores at each evaluation
    seconds: float = 0.0  # training time, evaluations included
    task: str = ""  # what it trained on ("induction", "text"), as `attnlab train TASK` names it; "" if not said
    stopped: str = ""  # why the loop ended before config.steps, if it did
    interrupted: bool = False  # stopped by Ctrl-C (SIGINT) or SIGTERM, after a whole step, and saved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainLog:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def read_log(directory: str | Path) -> TrainLog | None:
    """The training log saved beside a checkpoint, or None if it has none (or ``directory`` is a file)."""
    file = Path(directory) / LOG_FILE
    if not Path(directory).is_dir() or not file.is_file():
        return None
    return TrainLog.from_dict(read_json(file))


Progress = Callable[[int, int, float, float], None]  # (step, steps, train loss, tokens/s)
OnEval = Callable[[int, GPT, TrainLog], None]


@dataclass
class TrainState:
    """What a step moves on and a checkpoint saves for ``resume``: the step, the optimizer, the batches'
    generator and the log (its ``seconds`` is the training time of every run before this one)."""

    step: int
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    log: TrainLog


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What a checkpoint records about the run, for a later load or resume to check: the tokenizer
    (written in config.json) and what the run trains on (``run``: task, data, the data's digest; kept in the
    state, and its ``task`` names the log's)."""

    tokenizer: str | CharTokenizer | None = None
    run: Mapping[str, Any] = field(default_factory=dict)


def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless torch.distributed is initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def evaluate(model: GPT, task: Task, config: TrainConfig) -> float:
    """Mean loss on ``eval_batches`` held-out batches, the same ones at every evaluation."""
    generator = torch.Generator().manual_seed(config.seed + 1_000_003)
    was_training = model.training
    model.eval()
    losses = []
    for _ in range(config.eval_batches):
        inputs, targets = task.batch(config.batch_size, generator, split="eval")
        logits = model(inputs)  # (B, T, V)
        losses.append(F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item())
    model.train(was_training)
    return sum(losses) / len(losses)


def check_fit(model: GPT, task: Task, config: TrainConfig) -> None:
    """Refuse a task the model cannot take, and a batch the processes cannot share, before any step."""
    c = model.config
    if task.vocab_size > c.vocab_size:
        raise ValueError(f"the task has {task.vocab_size} tokens but the model's vocab_size is {c.vocab_size}")
    if task.seq_len > c.context_length:
        raise ValueError(
            f"the task's sequences have {task.seq_len} tokens, more than the model's context_length "
            f"{c.context_length}; train with a shorter seq_len or a model with a longer context"
        )
    _, size = world()
    if config.batch_size % size:
        raise ValueError(
            f"batch_size {config.batch_size} must divide evenly over {size} processes; use a multiple of {size}"
        )


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    """The training state saved in ``checkpoint``, checked: every key it needs, and the weights beside it
    the very ones it was saved with (a run stopped between two writes left a folder whose files disagree)."""
    folder = Path(checkpoint)
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise ValueError(f"nothing to resume: no {STATE_FILE} in {str(folder)!r}; train without --resume first")
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt, or not a torch file at all: say which file
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise ValueError(f"{str(state_file)!r} cannot be read as a training state ({first}); it is damaged") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{str(state_file)!r} is not a complete training state: it lacks {missing}")
    weights = folder / "model.safetensors"
    saved_with = state.get("weights_sha256")
    if saved_with is not None and (not weights.is_file() or file_digest(weights) != saved_with):
        raise ValueError(
            f"the files in {str(folder)!r} disagree: model.safetensors is not the one {STATE_FILE} was saved with "
            f"at step {state['step']} (a run stopped between two writes); resume from a consistent copy or start again"
        )
    return dict(state)


def check_memory(config: GPTConfig, batch_size: int) -> None:
    """Refuse a shape whose training would not fit in the memory available now, with the figures."""
    with torch.device("meta"):  # counts the parameters without allocating one; one and two layers, then a line
        one, two = (sum(p.numel() for p in GPT(config.with_(n_layers=n)).parameters()) for n in (1, 2))
    params = one + (two - one) * (config.n_layers - 1)
    c = config
    activations = 4 * batch_size * c.context_length * (c.n_layers * (16 * c.emb_dim + 2 * c.n_heads * c.context_length))
    need = 16 * params + activations  # float32 weights, gradients and AdamW's two moments; the forward's tensors
    free = available_memory()
    if free is not None and need > free:
        raise ValueError(
            f"this model would need about {need / 2**30:.1f} GiB to train ({params:,} parameters, batch {batch_size} "
            f"x {c.context_length} tokens) and {free / 2**30:.1f} GiB is available; choose fewer --layers, a "
            "smaller --emb-dim or --context, or a smaller --batch-size"
        )


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _resume(checkpoint: Path, state: TrainState) -> None:
    saved = read_state(checkpoint)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.generator.set_state(saved["generator"])
    state.step, state.log = int(saved["step"]), read_log(checkpoint) or TrainLog()


def save_checkpoint(
    model: GPT, directory: str | Path, *, state: TrainState, config: TrainConfig, record: RunRecord | None = None
) -> Path:
    """The model, its training log and what ``resume`` needs, in one folder.

    Each file is written whole and renamed into place, the state last, with the digest of the weights it
    belongs to: a run stopped anywhere in here leaves files that are each whole, and ``read_state`` refuses
    a folder whose weights and state are from different steps.
    """
    record = record or RunRecord()
    target = model.save_pretrained(directory, tokenizer=record.tokenizer)
    log = state.log
    write_atomic(target / LOG_FILE, lambda tmp: tmp.write_text(json.dumps(log.to_dict()) + "\n", encoding="utf-8"))
    weights = file_digest(target / "model.safetensors")
    saved = {"step": state.step, "optimizer": state.optimizer.state_dict(), "generator": state.generator.get_state()}
    saved |= {"config": config.to_dict(), "run": dict(record.run), "weights_sha256": weights}
    write_atomic(target / STATE_FILE, lambda tmp: torch.save(saved, tmp))
    return target


def train(
    model: GPT,
    task: Task,
    config: TrainConfig,
    *,
    progress: Progress | None = None,
    on_eval: OnEval | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    record: RunRecord | None = None,
) -> TrainLog:
    """Train ``model`` in place on ``task``; returns the log. ``on_eval`` runs at every evaluation.

    With ``checkpoint`` the result is saved there (rank 0 only); ``resume``
    continues from the optimizer, generator and log saved there (load the
    model from the same folder first). ``record`` says what the checkpoint records about the
    run: the tokenizer in config.json, what the run trains on (task, data) in the state, for a resume to check.

    A first Ctrl-C (SIGINT) or a SIGTERM lets the step in progress finish, then the loop stops, saves and
    returns a log with ``interrupted`` set; a second Ctrl-C interrupts at once. Resumed, an interrupted run
    ends with the weights of one never interrupted.
    """
    check_fit(model, task, config)
    rank, size = world()
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices decay; biases and norms do not
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(config.seed)
    state = TrainState(step=0, optimizer=optimizer, generator=generator, log=TrainLog())
    if resume:
        if checkpoint is None:
            raise ValueError("resume needs the checkpoint folder to continue from")
        _resume(Path(checkpoint), state)
        state.log.stopped, state.log.interrupted = "", False  # how the earlier run ended is not how this one will
    record = record or RunRecord()
    state.log.task = str(record.run.get("task") or state.log.task)
    wrapped: torch.nn.Module = model
    if size > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    model.train()
    _loop(model, wrapped, task, config, state, progress, on_eval)
    model.eval()
    if checkpoint is not None and rank == 0:
        save_checkpoint(model, checkpoint, state=state, config=config, record=record)
    return state.log


class _StopRequest:
    """While active (main thread only), the first SIGINT or SIGTERM asks the loop to stop after the step in
    progress; a second SIGINT raises KeyboardInterrupt at once. The previous handlers come back after."""

    def __init__(self) -> None:
        self.asked = ""
        self._before: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._before[sig] = signal.signal(sig, self._ask)
        return self

    def _ask(self, signum: int, frame: Any) -> None:
        if self.asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.asked = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)


def _loop(
    model: GPT,
    wrapped: torch.nn.Module,
    task: Task,
    config: TrainConfig,
    state: TrainState,
    progress: Progress | None,
    on_eval: OnEval | None,
) -> None:
    """The steps from ``state.step`` on, until ``config.steps``, the time budget or a stop request (a first
    SIGINT or SIGTERM lets the step in progress finish); moves ``state`` on, its log's ``seconds`` included."""
    optimizer, generator, log = state.optimizer, state.generator, state.log
    rank, size = world()
    rows = config.batch_size // size
    indexers = indexer_parameters(model)  # trained by their own loss alone, and clipped apart
    others = [p for p in model.parameters() if all(p is not q for q in indexers)]
    began, before = time.perf_counter(), log.seconds
    with _StopRequest() as stop:
        while state.step < config.steps:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(state.step, config)
            tick = time.perf_counter()
            inputs, targets = task.batch(config.batch_size, generator)  # the global batch, the same on every rank
            inputs, targets = inputs[rank * rows : (rank + 1) * rows], targets[rank * rows : (rank + 1) * rows]
            logits = wrapped(inputs)  # (B / size, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            index_loss = take_index_losses(model)  # DeepSeek-V3.2's indexer objective (attnlab.nn.index_loss)
            if indexers and index_loss is None:  # no query chose yet (V4, fewer tokens than a block): a 0 that
                index_loss = torch.stack([p.sum() for p in indexers]).sum() * 0.0  # reaches them (DDP waits on all)
            optimizer.zero_grad(set_to_none=True)
            (loss if index_loss is None else loss + index_loss).backward()  # DDP averages the gradients
            torch.nn.utils.clip_grad_norm_(others, config.grad_clip)
            if indexers:
                torch.nn.utils.clip_grad_norm_(indexers, config.grad_clip)
            optimizer.step()
            seen = torch.stack((loss.detach(), torch.zeros(()) if index_loss is None else index_loss.detach()))
            if size > 1:
                dist.all_reduce(seen)
                seen /= size
            if index_loss is not None:
                log.index_loss.append(float(seen[1]))
            seen = seen[0]
            state.step += 1
            step = state.step
            speed = config.batch_size * task.seq_len / max(time.perf_counter() - tick, 1e-9)
            log.step.append(step)
            log.train_loss.append(float(seen))
            log.lr.append(lr_at(step - 1, config))
            log.tokens_per_s.append(speed)
            if progress:
                progress(step, config.steps, float(seen), speed)
            out_of_time = config.minutes is not None and time.perf_counter() - began > 60 * config.minutes
            interrupted = bool(stop.asked)
            if size > 1:  # every rank stops at the same step, or DDP waits forever
                flags = torch.tensor([float(out_of_time), float(interrupted)])
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
                out_of_time, interrupted = bool(flags[0]), bool(flags[1])
            if interrupted:  # saved as it stands after this whole step; resume goes on from here
                log.interrupted = True
                log.stopped = f"interrupted ({stop.asked or 'on another rank'}) after {step} of {config.steps} steps"
                break
            if step % config.eval_every == 0 or step == config.steps or out_of_time:
                log.eval_step.append(step)
                log.eval_seconds.append(before + time.perf_counter() - began)
                log.eval_loss.append(evaluate(model, task, config))
                if on_eval:
                    on_eval(step, model, log)
                model.train()
            if out_of_time:
                log.stopped = f"the {config.minutes} minute budget ran out after {step} of {config.steps} steps"
                break
    log.seconds = before + time.perf_counter() - began
