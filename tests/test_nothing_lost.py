"""Nothing a user made is lost, nothing is silently wrong (issue 21): interrupts, atomic saves, resume that
refuses what contradicts its state, and files whose tensors are the truth."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.models import GPT, GPTConfig
from attnlab.models import checkpoints as ckpt
from attnlab.models.tasks import InductionTask, make_task
from attnlab.models.train import STATE_FILE, TrainConfig, read_log, train

TINY = GPTConfig(vocab_size=128, context_length=32, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


def _interrupt_at(step: int):  # type: ignore[no-untyped-def]
    """A progress callback that sends this process a Ctrl-C (SIGINT) when ``step`` has been taken."""

    def progress(done: int, steps: int, loss: float, speed: float) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGINT)

    return progress


def test_ctrl_c_saves_a_whole_step_and_the_resumed_run_ends_as_one_never_interrupted(tmp_path: Path) -> None:
    task = make_task("induction", seq_len=32)
    config = TrainConfig(steps=12, batch_size=8, eval_every=4)
    whole = tiny_model()
    train(whole, task, config, checkpoint=tmp_path / "whole")
    cut = tiny_model()
    log = train(cut, task, config, checkpoint=tmp_path / "cut", progress=_interrupt_at(5))
    assert log.interrupted and log.stopped == "interrupted (SIGINT) after 5 of 12 steps"
    assert read_log(tmp_path / "cut").step == [1, 2, 3, 4, 5]  # saved as it stopped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
    resumed = GPT.from_pretrained(tmp_path / "cut")
    train(resumed, task, config, checkpoint=tmp_path / "cut", resume=True)
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_a_folder_whose_weights_and_state_disagree_is_refused_on_resume(tmp_path: Path) -> None:
    """Weights from a later save beside the state of an earlier one (a run stopped between two writes)."""
    task = make_task("induction", seq_len=32)
    train(tiny_model(), task, TrainConfig(steps=2, batch_size=8, eval_every=2), checkpoint=tmp_path / "a")
    train(tiny_model(1), task, TrainConfig(steps=3, batch_size=8, eval_every=3), checkpoint=tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").replace(tmp_path / "a" / "model.safetensors")
    with pytest.raises(ValueError, match=r"disagree: model.safetensors is not the one train_state.pt was saved with"):
        train(GPT.from_pretrained(tmp_path / "a"), task, TrainConfig(steps=4), checkpoint=tmp_path / "a", resume=True)


def test_a_save_that_fails_halfway_leaves_the_old_files_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def half_then_fail(tensors: dict, filename: str, metadata: dict) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("no space left on device")

    monkeypatch.setattr(ckpt, "save_file", half_then_fail)
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)
    with pytest.raises(OSError, match="no space left"):
        model.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no partial file, nothing changed


def _run_text(tmp_path: Path, data: Path, steps: int) -> Path:
    out = tmp_path / "run"
    argv = ["train", "text", "--data", str(data), "--out", str(out), "--steps", str(steps)]
    argv += ["--layers", "1", "--emb-dim", "32", "--context", "32", "--batch-size", "4", "--eval-every", str(steps)]
    assert cli.main(argv) == 0
    return out


def test_a_resume_takes_its_task_and_data_from_its_state_and_refuses_what_contradicts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "notes.txt"
    data.write_text("attention is all you need. " * 40)
    out = _run_text(tmp_path, data, 2)
    capsys.readouterr()
    slips = [
        (["train", "induction", "--out", str(out), "--resume", "--steps", "3"], "trains on 'text', not 'induction'"),
        (
            ["train", "text", "--out", str(out), "--resume", "--steps", "3", "--data", str(tmp_path / "x.txt")],
            f"trains on '{data}', not --data",
        ),
    ]
    state = (out / STATE_FILE).read_bytes()
    for argv, message in slips:
        assert cli.main(argv) == 2
        assert message in capsys.readouterr().err
    data.write_text("other text entirely. " * 40)
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 2
    assert "changed since the run" in capsys.readouterr().err
    assert (out / STATE_FILE).read_bytes() == state  # every refusal left the run as it was
    data.write_text("attention is all you need. " * 40)
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 0  # no task named: the run's own
    assert json.loads((out / "config.json").read_text())["tokenizer"] == "bytes"  # still the text run's
    assert read_log(out).step == [1, 2, 3]


def test_ctrl_c_in_attnlab_train_saves_and_exits_130_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    original = InductionTask.batch

    def batch(self: InductionTask, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C while the third step is being computed
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(InductionTask, "batch", batch)
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--steps", "50", "--layers", "1", "--emb-dim", "32", "--context", "32"]
    assert cli.main([*argv, "--batch-size", "4", "--eval-every", "50"]) == 130
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-1].startswith("interrupted (SIGINT) after 3 of 50 steps; saved to") and "--resume goes on" in said[-1]
    assert read_log(out).step == [1, 2, 3] and (out / STATE_FILE).is_file()
