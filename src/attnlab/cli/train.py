"""``attnlab train [induction|text]``: train a small GPT here, offline, and watch its heads form.

Under ``torchrun --nproc-per-node N`` the same command trains data-parallel
(DDP over gloo on CPU, nccl on GPU); only rank 0 prints and saves.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from attnlab.cli._common import check_folder, error

if TYPE_CHECKING:
    from attnlab.models import GPT
    from attnlab.models.tasks import Task
    from attnlab.models.train import TrainConfig

SHAPE_FLAGS = {"layers": "n_layers", "heads": "n_heads", "emb_dim": "emb_dim", "context": "context_length"}
TRAIN_FLAGS = ("steps", "batch_size", "lr", "warmup", "seed", "minutes", "eval_every")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = sub.add_parser(
        "train",
        help="train a small GPT here (induction or text task), with a checkpoint, curves and named heads",
        description="Train a small GPT on this machine, offline: 'induction' (random tokens repeated; an induction "
        "head forms within a minute or two; the whole run about 2 minutes on 2 cores), 'text' (Python's own "
        "documentation, or --data FILE, as bytes; about 15 minutes on 2 cores) or 'poems' (Tang poems, one token a "
        "character, fetched with npm as the chinese-poetry package, or --data its tarball or a JSON file; whole poems "
        "held out, 静夜思 among them). Under torchrun --nproc-per-node N it trains data-parallel.",
    )
    train.add_argument(
        "task",
        nargs="?",
        choices=["induction", "text", "poems"],
        default=None,
        help="default induction; --resume: the run's own",
    )
    train.add_argument(
        "--data",
        metavar="FILE",
        help="text: a local UTF-8 text file instead of Python's docs; poems: the chinese-poetry tarball or a JSON file",
    )
    train.add_argument("--out", metavar="DIR", help="checkpoint folder (default runs/TASK)")
    train.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    train.add_argument("--steps", type=int, help="optimizer steps (induction 2500, text 800, poems 3000)")
    train.add_argument("--batch-size", type=int, help="sequences per step, over all processes (default 32)")
    train.add_argument("--lr", type=float, help="peak learning rate (induction 3e-3, text 2e-3, poems 3e-3)")
    train.add_argument("--warmup", type=int, help="warm-up steps (default 100)")
    train.add_argument("--seed", type=int, help="seed of the weights and the batches (default 0)")
    train.add_argument("--minutes", type=float, help="stop after this many minutes (and save; --resume goes on)")
    train.add_argument("--eval-every", type=int, help="steps between held-out losses and head scores")
    train.add_argument("--layers", type=int, help="model layers (induction 2, text and poems 4)")
    train.add_argument("--heads", type=int, help="heads per layer (default 4)")
    train.add_argument(
        "--emb-dim", type=int, help="model width (induction 64, text and poems 128; text and poems use RoPE)"
    )
    train.add_argument(
        "--context",
        type=int,
        help="context length = training sequence length (induction 64, text 256, poems 64; text and poems use RoPE)",
    )


POSITIVE_FLAGS = ("steps", "batch_size", "eval_every", "layers", "heads", "emb_dim", "context")


def check_flags(args: argparse.Namespace) -> None:
    """Every number a flag gives, checked before torch is imported or a model is built, named as typed."""
    for name in POSITIVE_FLAGS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be a number of steps >= 0, got {args.warmup}")
    for name in ("lr", "minutes"):
        value = getattr(args, name)
        if value is not None and not 0 < value < float("inf"):
            raise ValueError(f"--{name} must be a number > 0, got {value}")


def _settings(args: argparse.Namespace, out: Path) -> tuple[GPT, TrainConfig, Task, dict[str, Any]]:
    """The model (new and seeded, or the saved one), train config, task and what the run trains on (task, data:
    path and content digest); every check before any training. A resume takes its task and data from its own
    state, and refuses a flag that contradicts them, naming both."""
    import torch

    from attnlab.models import GPT, GPTConfig, load_tokenizer
    from attnlab.models.tasks import TASK_MODELS, make_task
    from attnlab.models.train import STATE_FILE, TASK_DEFAULTS, TrainConfig, check_memory, read_state

    given = {f: getattr(args, f) for f in TRAIN_FLAGS if getattr(args, f) is not None}
    shape = {field: getattr(args, flag) for flag, field in SHAPE_FLAGS.items() if getattr(args, flag) is not None}
    if args.resume:
        state_file = out / STATE_FILE
        if not state_file.is_file():
            raise ValueError(f"--resume: no {STATE_FILE} in {str(out)!r}; train into it first (without --resume)")
        if shape:
            flags = ", ".join("--" + f.replace("_", "-") for f in SHAPE_FLAGS if getattr(args, f) is not None)
            raise ValueError(f"--resume continues the saved model; {flags} would change its shape: drop them")
        changed = sorted(set(given) - {"steps", "minutes"})
        if changed:
            raise ValueError(
                f"--resume keeps the saved settings; only --steps and --minutes may change (got {changed})"
            )
        saved = read_state(out)  # every key, and weights that are the ones it was saved with
        run_info = _resumed_run(args, saved.get("run") or {}, out)
        config = TrainConfig.from_dict({**saved["config"], "minutes": None, **given})
        if config.steps <= int(saved["step"]):
            raise ValueError(f"the run in {str(out)!r} already did {saved['step']} steps; pass --steps above that")
        model = GPT.from_pretrained(out, backend="auto")  # the saved shape: the task's sequences must fit it
    else:
        if (out / "config.json").exists():
            raise ValueError(f"{str(out)!r} already holds a checkpoint: pass --resume to continue it, or another --out")
        if out.is_dir() and any(out.iterdir()):  # a new run would overwrite what is there (a loss.png, say)
            held = sorted(p.name for p in out.iterdir())
            raise ValueError(f"{str(out)!r} already holds {held[:5]}; give an empty or new --out")
        name = args.task or "induction"
        run_info = {"task": name, "data": args.data}  # checked by make_task below, then recorded with its digest
        config = TrainConfig.from_dict({**TASK_DEFAULTS[name].to_dict(), **given})
        model_config = GPTConfig.from_dict({**TASK_MODELS[name].to_dict(), **shape})
        if name == "poems":  # the vocabulary comes from the corpus (fetched now if not given): the model's size
            from attnlab.models.poems import fetch_corpus

            data = args.data if args.data is not None else str(fetch_corpus())
            run_info["data"] = data
            task = make_task(name, seq_len=model_config.context_length, data=data)
            model_config = model_config.with_(vocab_size=task.vocab_size)
        check_memory(model_config, config.batch_size)  # before a weight is allocated
        torch.manual_seed(config.seed)  # every process builds the same weights (DDP also broadcasts rank 0's)
        model = GPT(model_config)
    from attnlab.explain.heads import check_probe, default_half

    check_probe(model, default_half(model), 8, 0)  # the heads are scored at every evaluation: before, not after
    if run_info["task"] != "poems" or args.resume:
        saved_vocabulary = load_tokenizer(out) if run_info["task"] == "poems" else None
        task = make_task(
            run_info["task"], seq_len=model.config.context_length, data=run_info.get("data"), tokenizer=saved_vocabulary
        )
    if not args.resume:
        run_info |= _data_info(run_info.get("data"))
    return model, config, task, run_info


def _data_info(data: str | None) -> dict[str, Any]:
    """The text file a run trains on, by absolute path and content digest (None: the built-in text)."""
    if data is None:
        return {"data": None, "data_sha256": None}
    from attnlab.models.checkpoints import file_digest

    path = Path(data).resolve()
    if not path.is_file():
        raise ValueError(f"--data {data!r} is not a file; give a UTF-8 text file")
    return {"data": str(path), "data_sha256": file_digest(path)}


def _resumed_run(args: argparse.Namespace, run: dict[str, Any], out: Path) -> dict[str, Any]:
    """The saved run's task and data; a flag that says otherwise, or data that changed since, is refused."""
    saved_task = run.get("task")
    if saved_task is None:  # a state saved before runs recorded their task
        if args.task is None:
            raise ValueError(f"the run in {str(out)!r} does not record its task: name it (attnlab train TASK --resume)")
        return {"task": args.task, **_data_info(args.data)}
    if args.task is not None and args.task != saved_task:
        raise ValueError(
            f"the run in {str(out)!r} trains on {saved_task!r}, not {args.task!r}: drop the task or use another --out"
        )
    data = run.get("data")
    if args.data is not None and (data is None or Path(args.data).resolve() != Path(data)):
        raise ValueError(
            f"the run in {str(out)!r} trains on {data or 'the built-in text'!r}, not --data {args.data!r}: drop --data"
        )
    if data is not None:
        now = _data_info(data)
        if now["data_sha256"] != run.get("data_sha256"):
            raise ValueError(f"{data!r} changed since the run in {str(out)!r} began (its content differs): restore it")
    return {"task": saved_task, "data": data, "data_sha256": run.get("data_sha256")}


def run(args: argparse.Namespace, console: Console) -> int:

    from attnlab.distributed.launch import join_from_environment
    from attnlab.explain.heads import head_scores, watch
    from attnlab.models.train import RunRecord, train, world

    try:
        check_flags(args)
        out = check_folder(args.out or f"runs/{args.task or 'induction'}")
        model, config, task, run_info = _settings(args, out)
    except (ValueError, TypeError) as err:
        if os.environ.get("RANK", "0") != "0":  # under torchrun every rank gets the same error: rank 0 says it
            return 2
        return error(console, err)
    name = run_info["task"]
    import torch

    threads_before = torch.get_num_threads()  # given back at the end (the command may run inside a process)
    started = join_from_environment()
    try:
        rank, size = world()
        loud = rank == 0
        threads = free_threads(size)
        if threads is not None and loud:
            console.print(threads, markup=False, soft_wrap=True)
        params = sum(p.numel() for p in model.parameters())
        if loud:
            c = model.config
            where = f" on {size} processes" if size > 1 else ""
            console.print(
                f"training {name}: {c.n_layers} layers, {c.n_heads} heads, {c.emb_dim} dims, "
                f"{params:,} parameters; {config.steps} steps of {config.batch_size} x {task.seq_len} tokens{where}",
                markup=False,
            )
        with Progress(
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not loud,
            transient=True,
        ) as bar:
            job = bar.add_task("", total=config.steps)

            def progress(step: int, steps: int, loss: float, tokens_per_s: float) -> None:
                bar.update(job, completed=step, description=f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s")

            tokenizer: Any = {"induction": "ascii", "text": "bytes"}.get(name) or getattr(task, "tokenizer", None)
            log = train(
                model,
                task,
                config,
                progress=progress,
                on_eval=watch(),
                checkpoint=out,
                resume=args.resume,
                record=RunRecord(tokenizer=tokenizer, run=run_info),
            )
        if not loud:
            return 130 if log.interrupted else 0
        if log.interrupted:
            line = f"{log.stopped}; saved to {out}/; attnlab train --out {out} --resume goes on"
            console.print(line, markup=False, soft_wrap=True)  # one line, whole
            return 130
        from attnlab.cli.heads import summary, table
        from attnlab.explain.render.curves import training_curves
        from attnlab.explain.render.figure_output import save

        save(training_curves(log), out / "loss.png")
        if log.stopped:
            console.print(log.stopped + f"; attnlab train --out {out} --resume goes on", markup=False)
        console.print(
            f"{log.step[-1] if log.step else 0} steps in {log.seconds:.0f} s; held-out loss "
            f"{log.eval_loss[-1]:.3f}; saved to {out}/ (model, train_log.json, loss.png)",
            markup=False,
        )
        scores = head_scores(model)
        console.print(table(scores, title="the heads it learned"))
        console.print(summary(scores), markup=False)
        console.print(f'next: attnlab explain --model {out} "..." --html report.html', markup=False)
        return 0
    finally:
        torch.set_num_threads(threads_before)
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()


def free_threads(processes: int) -> str | None:
    """Train on the cores that are free: with other work on the machine, one thread per core oversubscribes it
    (a run went 30x slower). Sets torch's thread count from the cores this process may use, less the load
    (1-minute average) and shared by the local processes; returns what it did, when it changed anything."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    share = max(1, round(cores - load) // processes)  # whole cores free, shared by the local processes
    share = min(share, max(1, cores // processes))
    if share >= torch.get_num_threads():
        return None
    torch.set_num_threads(share)
    return f"{cores} cores, load {load:.1f}: training on {share} thread{'s' if share > 1 else ''} per process"
