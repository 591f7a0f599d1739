"""Training here and heads named: the loop, its tasks, DDP over real gloo processes, the scores, the shipped model."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import cli
from attnlab.explain.heads import HeadScores, first_step, head_scores, probe, scores_from_weights
from attnlab.models import GPT, GPTConfig
from attnlab.models.locate import locate
from attnlab.models.tasks import TASK_MODELS, InductionTask, TextTask, make_task, stdlib_text
from attnlab.models.train import TASK_DEFAULTS, TrainConfig, TrainLog, lr_at, read_log, train

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TINY = GPTConfig(vocab_size=128, context_length=32, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


# ---- the schedule and the config ----


def test_lr_warms_up_linearly_then_follows_a_cosine_to_its_floor() -> None:
    c = TrainConfig(steps=1100, lr=1e-3, warmup=100, min_lr_ratio=0.1)
    assert lr_at(0, c) == pytest.approx(1e-5)  # 1/100 of the peak
    assert lr_at(99, c) == pytest.approx(1e-3)
    assert lr_at(100, c) == pytest.approx(1e-3)  # the cosine starts at the peak
    assert lr_at(600, c) == pytest.approx(0.55e-3)  # half way: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2 = 0.55
    assert lr_at(1100, c) == pytest.approx(1e-4)  # the floor, lr * min_lr_ratio
    assert lr_at(5000, c) == pytest.approx(1e-4)  # and it stays there


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", -1.0, r"lr must be a finite number > 0, got -1.0"),
        ("lr", math.nan, r"lr must be a finite number > 0, got nan"),
        ("steps", 0, r"steps must be >= 1, got 0"),
        ("minutes", 0, r"minutes must be a number > 0 \(a time budget\), got 0"),
        ("weight_decay", 1.5, r"weight_decay must be in \[0, 1\), got 1.5"),
        ("warmup", -3, r"warmup must be a whole number of steps >= 0, got -3"),
        ("seed", -1, r"seed"),
    ],
)
def test_train_config_names_the_bad_value(field: str, value: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        TrainConfig(**{field: value})  # type: ignore[arg-type]


def test_a_task_the_model_cannot_take_is_refused_before_any_step() -> None:
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        ValueError, match=r"the task's sequences have 64 tokens, more than the model's context_length 32"
    ):
        train(model, InductionTask(seq_len=64), TrainConfig(steps=3))
    with pytest.raises(ValueError, match=r"the task has 256 tokens but the model's vocab_size is 128"):
        train(model, TextTask(stdlib_text()[:20000], seq_len=16), TrainConfig(steps=3))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


# ---- the tasks ----


def test_induction_sequences_hold_two_repeated_blocks_of_distinct_tokens_the_second_anywhere() -> None:
    task = InductionTask(vocab_size=50, seq_len=40, min_period=3, max_period=8)
    seq = task.sequences(64, torch.Generator().manual_seed(0))
    assert seq.shape == (64, 41)
    periods, cuts = set(), set()
    for row in seq.tolist():
        a = next(p for p in range(3, 9) if all(row[i] == row[i - p] for i in range(p, 2 * p)))
        cut = next(i for i in range(a, 41) if row[i] != row[i - a])  # where block A stops repeating
        b = next(p for p in range(3, 9) if all(row[i] == row[i - p] for i in range(cut + p, 41)))
        assert 2 * a <= cut <= 41 - 2 * b  # each block at least twice
        assert len(set(row[:a]) | set(row[cut : cut + b])) == a + b  # distinct: one earlier occurrence each
        periods.add((a, b))
        cuts.add(cut)
    assert len(periods) > 8 and len(cuts) > 8  # the distances back and where B starts change row to row
    inputs, targets = task.batch(2, torch.Generator().manual_seed(1))
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one


def test_task_errors_name_the_value_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"seq_len 20 is too short to repeat two blocks of max_period=16 twice"):
        InductionTask(seq_len=20, max_period=16)
    with pytest.raises(ValueError, match=r"two blocks of up to max_period=20 distinct tokens need 40 tokens"):
        InductionTask(vocab_size=32, seq_len=100, max_period=20)
    with pytest.raises(
        ValueError, match=r"unknown task 'copy'; the built-in tasks are \['induction', 'text', 'poems'\]"
    ):
        make_task("copy")
    with pytest.raises(ValueError, match=r"--data '.*nope.txt' is not a file"):
        make_task("text", data=tmp_path / "nope.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(ValueError, match=r"is not UTF-8 text"):
        make_task("text", data=tmp_path / "bin.txt")
    with pytest.raises(ValueError, match=r"the text has 5 bytes; training windows of 129 need at least 1300"):
        TextTask("hello")
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'eval'\), got 'test'"):
        InductionTask().batch(1, torch.Generator(), split="test")


def test_text_task_reads_pythons_own_docs_and_keeps_a_tenth_apart() -> None:
    text = stdlib_text()
    assert len(text) > 400_000 and 'The "assert" statement' in text  # pydoc_data.topics, in every Python
    task = TextTask(text, seq_len=64)
    total = sum(split.numel() for split in task.splits.values())
    assert task.splits["eval"].numel() == pytest.approx(0.1 * total, abs=1)
    inputs, _ = task.batch(4, torch.Generator().manual_seed(0), split="eval")
    assert inputs.shape == (4, 64) and int(inputs.max()) < 256


# ---- the loop ----


def test_training_is_seeded_and_reproducible() -> None:
    config = TrainConfig(steps=8, batch_size=8, eval_every=4, seed=5)
    task = make_task("induction", seq_len=32)
    a, b = train(tiny_model(), task, config), train(tiny_model(), task, config)
    c = train(tiny_model(), task, TrainConfig(steps=8, batch_size=8, eval_every=4, seed=6))
    assert a.train_loss == b.train_loss and a.eval_loss == b.eval_loss
    assert a.train_loss != c.train_loss  # another seed, other batches
    assert a.eval_step == [4, 8] and len(a.train_loss) == 8


def test_a_run_cut_in_two_and_resumed_equals_the_run_in_one_go(tmp_path: Path) -> None:
    task = make_task("induction", seq_len=32)
    whole = tiny_model()
    log = train(whole, task, TrainConfig(steps=12, batch_size=8, eval_every=4), checkpoint=tmp_path / "whole")
    first = tiny_model()
    train(first, task, TrainConfig(steps=6, batch_size=8, eval_every=4), checkpoint=tmp_path / "cut")
    cut = TrainConfig(steps=12, batch_size=8, eval_every=4)  # the same run, told to go on to 12 steps
    resumed = GPT.from_pretrained(tmp_path / "cut")
    log2 = train(resumed, task, cut, checkpoint=tmp_path / "cut", resume=True)
    assert log2.step == list(range(1, 13))
    assert log2.train_loss[6:] == pytest.approx(log.train_loss[6:], rel=1e-6)
    for name, tensor in whole.state_dict().items():
        assert torch.allclose(tensor, resumed.state_dict()[name], atol=1e-6), name


def test_the_minute_budget_stops_saves_and_resume_goes_on(tmp_path: Path) -> None:
    task = make_task("induction", seq_len=32)
    log = train(tiny_model(), task, TrainConfig(steps=10_000, batch_size=8, minutes=1e-4), checkpoint=tmp_path)
    assert log.stopped.startswith("the 0.0001 minute budget ran out after") and len(log.step) < 10_000
    assert log.eval_step[-1] == log.step[-1]  # an evaluation at the stop
    assert read_log(tmp_path).step == log.step  # saved as it stopped


def test_resume_without_a_saved_run_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nothing to resume: no train_state.pt in .*; train without --resume first"):
        train(tiny_model(), make_task("induction", seq_len=32), TrainConfig(steps=2), checkpoint=tmp_path, resume=True)


def test_attnlab_train_is_the_loop() -> None:
    assert attnlab.train is train


# ---- data parallel: real torchrun, real gloo ----


@pytest.mark.slow  # slow by nature: two processes under torchrun
def test_two_gloo_processes_give_the_loss_curve_of_one(tmp_path: Path) -> None:
    """DDP over 2 processes, each on half of the same global batch, against one process on all of it."""
    args = ["train", "--steps", "12", "--batch-size", "8", "--eval-every", "6", "--layers", "1", "--emb-dim", "32"]
    args += ["--context", "32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run(
        [
            BIN / "torchrun",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "attnlab.cli",
            *args,
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert two.returncode == 0, two.stderr
    assert "Warning" not in two.stderr and "Traceback" not in two.stderr, two.stderr
    assert "on 2 processes" in two.stdout and two.stdout.count("training induction") == 1  # rank 0 alone speaks
    # one process, here, the way the command builds its run: the seed, then the model, the task and the config
    config = TrainConfig.from_dict(
        {**TASK_DEFAULTS["induction"].to_dict(), "steps": 12, "batch_size": 8, "eval_every": 6}
    )
    torch.manual_seed(config.seed)
    a = train(
        GPT(TASK_MODELS["induction"].with_(n_layers=1, emb_dim=32, context_length=32)),
        make_task("induction", seq_len=32),
        config,
    )
    b = read_log(tmp_path / "two")
    assert b is not None and len(b.train_loss) == 12
    # the same batches and the averaged gradient: equal up to the order of float32 sums (seen: 1e-6)
    assert b.train_loss == pytest.approx(a.train_loss, abs=1e-4)
    assert b.eval_loss == pytest.approx(a.eval_loss, abs=1e-4)
    assert a.train_loss[0] != pytest.approx(a.train_loss[-1], abs=1e-3)  # it did train


# ---- the scores ----


def _pattern(t: int, key: object) -> torch.Tensor:
    """(1, 1, T, T) weights where query i puts all its attention on key(i) (clamped to the causal range)."""
    w = torch.zeros(1, 1, t, t)
    for i in range(t):
        w[0, 0, i, max(0, min(i, key(i)))] = 1.0  # type: ignore[operator]
    return w


def test_each_score_is_one_on_its_own_pattern_and_zero_on_the_others() -> None:
    n, t = 8, 16
    previous = scores_from_weights(_pattern(t, lambda i: i - 1), n)
    induction = scores_from_weights(_pattern(t, lambda i: i - n + 1 if i >= n else i), n)
    duplicate = scores_from_weights(_pattern(t, lambda i: i - n if i >= n else i), n)
    sink = scores_from_weights(_pattern(t, lambda i: 0), n)
    assert previous["previous_token"].item() == 1.0 and previous["induction"].item() == 0.0
    assert induction["induction"].item() == 1.0 and induction["duplicate_token"].item() == 0.0
    assert induction["previous_token"].item() == 0.0  # for n > 2, i - n + 1 is never i - 1
    assert duplicate["duplicate_token"].item() == 1.0 and duplicate["induction"].item() == 0.0
    assert sink["first_token"].item() == 1.0
    assert sink["previous_token"].item() == pytest.approx(1 / 15)  # only query 1's key 0 is both


def test_the_probe_is_seeded_and_repeats_distinct_tokens() -> None:
    p = probe(100, half=10, batch=3, seed=4)
    assert p.shape == (3, 20) and torch.equal(p[:, :10], p[:, 10:])
    assert all(len(set(row)) == 10 for row in p[:, :10].tolist())
    assert torch.equal(p, probe(100, half=10, batch=3, seed=4)) and not torch.equal(
        p, probe(100, half=10, batch=3, seed=5)
    )


def test_a_probe_longer_than_the_context_is_refused_by_name() -> None:
    with pytest.raises(
        ValueError, match=r"a probe of 20 tokens twice needs 40 positions; the model's context is 32: use half <= 16"
    ):
        head_scores(tiny_model(), half=20)


def _shipped_scores_by_length() -> dict[int, tuple[float, float]]:
    """The shipped model's best layer-0 previous-token and best induction score on n + n tokens, n = 8..32."""
    model = GPT.from_pretrained("induction")
    found = {}
    for n in range(8, model.config.context_length // 2 + 1):
        scores = head_scores(model, half=n)
        found[n] = (max(scores.previous_token[0]), max(max(row) for row in scores.induction[1:]))
    return found


def shipped_markdown() -> str:
    """The docs' table of the shipped model's heads at every probe length, computed here from the checkpoint."""
    rows = [f"| {n} + {n} | {p:.2f} | {i:.2f} |" for n, (p, i) in _shipped_scores_by_length().items()]
    return "\n".join(["| probe | previous-token (layer 0) | induction (layer 1) |", "|---|---|---|", *rows])


def test_the_shipped_model_has_its_named_heads_at_every_probe_length_and_the_docs_say_so() -> None:
    """A real previous-token head looks at the previous token everywhere, not only near the start: both named
    heads hold (>= 0.7) on every probe n + n that fits the context, and docs/heads.md shows exactly these scores."""
    for n, (previous, induction) in _shipped_scores_by_length().items():
        assert previous >= 0.7 and induction >= 0.7, (n, previous, induction)
    table = shipped_markdown()
    assert table in (REPO / "docs" / "heads.md").read_text(encoding="utf-8"), "docs/heads.md should hold:\n" + table
    scores = head_scores(GPT.from_pretrained("induction"))
    assert scores.in_context_learning < -3.0  # nats: the repeat is read off the first copy
    assert "induction" in {scores.label(1, h) for h in range(4)}


def test_what_the_docs_say_of_the_shipped_run_is_computed_from_its_log() -> None:
    """README and docs/heads.md quote describe_run(shipped log) word for word; a log that says otherwise makes
    another sentence (the one that said the reverse of its log is gone)."""
    from attnlab.explain.heads import describe_run
    from attnlab.explain.report_text import REPORT_TEXT

    log = read_log(locate("induction"))
    assert log is not None
    said = describe_run(log, REPORT_TEXT["en"])
    for page in (REPO / "README.md", REPO / "docs" / "heads.md"):
        assert said in page.read_text(encoding="utf-8").replace("\n", " "), f"{page.name} should say: {said}"
    swapped = TrainLog.from_dict(log.to_dict())
    for row in swapped.extra["heads"]:  # the two heads' histories exchanged: the order must flip
        row["previous_token"][0], row["induction"][1] = row["induction"][1], row["previous_token"][0]
    other = describe_run(swapped, REPORT_TEXT["en"])
    assert other != said and ("came first" in other)
    swapped.eval_loss = [x + 1.0 for x in swapped.eval_loss]
    assert f"{log.eval_loss[-1] + 1.0:.2f}" in describe_run(swapped, REPORT_TEXT["en"])


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
def test_the_shipped_log_shows_the_phase_change_and_came_from_this_code() -> None:
    log = read_log(locate("induction"))
    assert log is not None
    formed = first_step(log)
    assert formed is not None and formed > log.eval_step[0]  # not there at the start; it formed
    assert log.eval_loss[-1] < log.eval_loss[0] - 2.0  # the cliff: from about ln 128 to the floor of the first copies
    # the recipe, seed 0, retraced through its warm-up and into the cosine (120 steps): the same losses, to
    # float32 differences between CPUs and thread counts
    recipe = TASK_DEFAULTS["induction"]
    assert log.step[-1] == recipe.steps and recipe.warmup < 120
    torch.manual_seed(recipe.seed)
    model = GPT(TASK_MODELS["induction"])
    cut = TrainConfig.from_dict({**recipe.to_dict(), "eval_every": 10_000})
    again = train(model, make_task("induction"), cut, progress=_stop_after(120))
    assert again.train_loss == pytest.approx(log.train_loss[:120], rel=1e-3)


def _stop_after(steps: int):  # type: ignore[no-untyped-def]
    """A progress callback that asks the loop to stop after ``steps`` (as Ctrl-C does), keeping the schedule."""
    import os
    import signal

    def progress(done: int, total: int, loss: float, speed: float) -> None:
        if done == steps:
            os.kill(os.getpid(), signal.SIGINT)

    return progress


# ---- the commands ----


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
def test_train_then_heads_then_explain_then_resume_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    small = ["--batch-size", "8", "--eval-every", "5", "--layers", "1", "--emb-dim", "32", "--context", "32"]
    assert cli.main(["train", "--steps", "10", "--out", str(out), *small]) == 0
    said = capsys.readouterr().out
    assert "training induction: 1 layers, 4 heads, 32 dims" in said and "10 steps in" in said
    assert "the heads it learned" in said and "in-context learning score" in said
    assert {"config.json", "model.safetensors", "train_log.json", "train_state.pt", "loss.png"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = read_log(out)
    assert log is not None and [row["step"] for row in log.extra["heads"]] == [5, 10]  # scores at each evaluation
    assert log.task == "induction"  # the report names the command that made it from this

    assert cli.main(["heads", "--model", str(out), "--json", str(tmp_path / "scores.json")]) == 0
    table = capsys.readouterr().out
    assert "layer" in table and "head 3" in table and "prev = previous-token" in table
    assert "(in brackets) = unnamed" in table and re.search(r"\((prev|dup|ind|first) 0\.\d\d\)", table)
    saved = json.loads((tmp_path / "scores.json").read_text())
    assert set(saved) >= {"previous_token", "duplicate_token", "induction", "first_token", "in_context_learning"}
    assert HeadScores.from_dict(saved) == head_scores(GPT.from_pretrained(out))

    page = tmp_path / "report.html"
    assert cli.main(["explain", "ab ab", "--model", str(out), "--html", str(page), "--lang", "zh"]) == 0
    html = page.read_text(encoding="utf-8")
    assert "为每个注意力头命名" in html and "它是怎样学会的" in html  # the names and the training curves

    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "15"]) == 0
    assert "15 steps in" in capsys.readouterr().out
    resumed = read_log(out)
    assert resumed is not None and resumed.step == list(range(1, 16)) and resumed.eval_step == [5, 10, 15]
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "15"]) == 2
    assert "already did 15 steps; pass --steps above that" in capsys.readouterr().err
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "20", "--lr", "1e-2"]) == 2
    assert "only --steps and --minutes may change (got ['lr'])" in capsys.readouterr().err
    assert read_log(out) == resumed  # the refused calls left the run as it was


TRAIN_SLIPS = [
    (["train", "--data", "{tmp}/notes.txt"], "--data is text for the 'text' task"),
    (["train", "text", "--data", "/no/such.txt"], "--data '/no/such.txt' is not a file"),
    (["train", "--steps", "0"], "steps must be >= 1, got 0"),
    (["train", "--lr", "-1"], "--lr must be a number > 0, got -1.0"),
    (["train", "--minutes", "0"], "--minutes must be a number > 0, got 0.0"),
    (["train", "--heads", "3"], "emb_dim (64) must be divisible by n_heads (3)"),
    (["train", "--resume", "--out", "{tmp}/none"], "--resume: no train_state.pt in"),
    (["train", "--resume", "--out", "{tmp}/ckpt", "--layers", "3"], "--layers would change its shape: drop them"),
    (["train", "--resume", "--out", "{tmp}/ckpt"], "train_state.pt' cannot be read as a training state (EOFError)"),
    (["train", "--out", "/proc/run"], "cannot write '/proc/run'"),
    (["train", "--out", "{tmp}/file.txt"], "is a file; give a folder"),
    (["train", "--out", "{tmp}/done"], "already holds a checkpoint: pass --resume to continue it"),
    (["heads", "--model", "induction", "--half", "40"], "a probe of 40 tokens twice needs 80 positions"),
    (["heads", "--model", "/no/such/model"], "--model '/no/such/model' does not exist"),
    (["heads", "--model", "induction", "--json", "scores.txt"], "'scores.txt' should end in .json"),
    (["heads", "--model", "induction", "--seed", "-1"], "seed must be in [0, 2**63 - 1]"),
    (["explain", "héllo", "--model", "induction"], "this model knows the 128 ASCII characters only; the text has 'é'"),
]


def test_train_and_heads_slips_get_one_line_and_status_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process (the console script's own slips are in test_reader.py): one line on stderr, nothing written."""
    monkeypatch.chdir(tmp_path)  # the default --out, runs/induction, would land here
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "train_state.pt").write_bytes(b"")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "config.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for argv, message in TRAIN_SLIPS:
        assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, out, err)
        assert message in err, (argv, err)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_shipped_model_explains_out_of_the_box(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "the cat sat. the cat sat.", "--model", "induction"]) == 0
    said = capsys.readouterr().out
    assert "Every head, named" in said and "layer 1 head" in said and ": induction" in said


def test_the_shipped_text_model_is_the_one_its_log_describes_and_the_docs_quote_its_log() -> None:
    """`--model text`: its weights give, on the recipe's own held-out batches, the held-out loss its log ends
    on; docs/caches.md quotes describe_run of that log word for word."""
    from attnlab.explain.heads import describe_run
    from attnlab.explain.report_text import REPORT_TEXT
    from attnlab.models.train import evaluate

    where = locate("text")
    log = read_log(where)
    assert log is not None and log.step[-1] == TASK_DEFAULTS["text"].steps
    model = GPT.from_pretrained(where).eval()
    assert model.config == TASK_MODELS["text"].__class__.from_dict({**TASK_MODELS["text"].to_dict(), "backend": "auto"})
    with torch.no_grad():
        loss = evaluate(model, make_task("text"), TASK_DEFAULTS["text"])
    assert loss == pytest.approx(log.eval_loss[-1], abs=2e-3)
    said = describe_run(log, REPORT_TEXT["en"])
    page = (REPO / "docs" / "caches.md").read_text(encoding="utf-8").replace("\n", " ")
    assert said in page, f"docs/caches.md should say: {said}"


@pytest.mark.parametrize("name", ["text", "induction"])
def test_a_shipped_models_report_names_the_command_that_trained_it(name: str) -> None:
    from attnlab.explain.model_report import _training_section
    from attnlab.explain.report_text import REPORT_TEXT

    log = read_log(locate(name))
    assert log is not None
    for lang in ("en", "zh"):
        assert _training_section(log, REPORT_TEXT[lang], lang, figures=False).code == f"attnlab train {name}"


def test_train_help_states_each_tasks_own_defaults() -> None:
    """`attnlab train -h` says "(induction A, text B, poems C)" for each setting (or "text and poems B" where the
    two share it): each number is what that task trains with."""
    from attnlab.cli.train import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    helps = {a.dest: a.help for a in parser._subparsers._group_actions[0].choices["train"]._actions}  # type: ignore[union-attr]
    settings = {
        "steps": ("steps", TASK_DEFAULTS),
        "lr": ("lr", TASK_DEFAULTS),
        "layers": ("n_layers", TASK_MODELS),
        "emb_dim": ("emb_dim", TASK_MODELS),
        "context": ("context_length", TASK_MODELS),
    }
    for flag, (field, table) in settings.items():
        text = helps[flag] or ""
        found = re.search(r"induction ([\de.-]+), text ([\de.-]+)(?:, poems ([\de.-]+))?", text)
        shared = re.search(r"induction ([\de.-]+), text and poems ([\de.-]+)", text)
        said = (found.groups() if found else None) or (shared and (*shared.groups(), shared.group(2)))
        assert said and said[2] is not None, (flag, text)  # every task's number is stated
        for task, value in zip(("induction", "text", "poems"), said, strict=True):
            assert float(value) == float(getattr(table[task], field)), (flag, task, value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--batch-size", "-2"], "--batch-size must be >= 1, got -2"),
        (["--warmup", "-1"], "--warmup must be a number of steps >= 0, got -1"),
        (["--lr", "0"], "--lr must be a number > 0, got 0.0"),
        (["--minutes", "nan"], "--minutes must be a number > 0, got nan"),
        (["--emb-dim", "0"], "--emb-dim must be >= 1, got 0"),
    ],
)
def test_train_flags_are_checked_by_name_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["train", "--out", str(tmp_path / "run"), *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "run").exists()
