"""An interrupt during `attnlab sinks` saves (the house rule): every experiment stops at Ctrl-C or SIGTERM, keeps
the seeds (streaming: the arms) it finished, writes its file marked interrupted, and says so in one line.

In process, each experiment's loop at a tiny size, interrupted where the next seed (arm) would finish; then a
real process sent SIGTERM once its first seed is printed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.bench import sinks_backcopy, sinks_massive, sinks_sigmoid, sinks_streaming, sinks_variants
from attnlab.bench.sinks_report import REPORTS
from attnlab.cli import main


def _stop_at(calls: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, interrupted (as Ctrl-C would) at its call number ``calls``, counted from 1."""
    seen = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapped


def _kept(run: Callable[[], Any]) -> Any:
    """``run()``, failing the test (not ending the session, as a KeyboardInterrupt would) where it lets go."""
    try:
        return run()
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped the run: it kept nothing")


def test_each_seeded_experiment_keeps_the_seeds_every_arm_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted in the second seed's last arm: the first seed whole, nothing of the second, marked; its report
    says partial and judges nothing on one seed."""
    tiny_toy = sinks_backcopy.BackcopySettings(layers=1, width=8, length=8, batch=2, steps=2, evaluations=1)
    tiny_gpt = sinks_variants.VariantSettings(layers=1, heads=1, width=8, length=8, batch=2, steps=1)
    quick = sinks_sigmoid.SigmoidSettings(steps=1, batch=2, seq_len=16, probe=2)
    arms = {"softmax-adam": ("softmax", "adam"), "relu-adam": ("relu", "adam")}
    variants = {"mha": {}, "gated": {"attn_output_gate": True}}
    monkeypatch.setattr(sinks_backcopy, "train_arm", _stop_at(4, sinks_backcopy.train_arm))
    monkeypatch.setattr(sinks_variants, "train_gpt", _stop_at(4, sinks_variants.train_gpt))
    monkeypatch.setattr(sinks_massive, "train_gpt", _stop_at(2, sinks_variants.train_gpt))
    monkeypatch.setattr(sinks_sigmoid, "train_arm", _stop_at(4, sinks_sigmoid.train_arm))
    runs = {
        "backcopy": _kept(lambda: sinks_backcopy.run_backcopy(seeds=3, settings=tiny_toy, arms=arms)),
        "variants": _kept(lambda: sinks_variants.run_variants(seeds=3, settings=tiny_gpt, variants=variants)),
        "massive": _kept(lambda: sinks_massive.run_massive(seeds=3, settings=tiny_gpt)),
        "sigmoid": _kept(lambda: sinks_sigmoid.run_sigmoid(seeds=3, settings=quick)),
    }
    for name, result in runs.items():
        assert result.interrupted and result.seeds == [0], name
        assert {v.status for v in result.verdicts()} == {"one seed"}, name
        report = REPORTS[name](result, "en")
        assert "Interrupted: a partial run, the 1 seed(s) it finished" in report, name
        assert "已中断：部分运行，只有完成的 1 个种子" in REPORTS[name](result, "zh"), name
    assert [len(a.measures["sink"]) for a in runs["backcopy"].arms] == [1, 1]  # relu-adam's seed 1 left out
    assert all(len(v) == 1 for per in runs["variants"].measures.values() for v in per.values())
    assert all(len(v) == 1 for v in runs["massive"].loss.values()) and len(runs["massive"].found) == 1
    assert all(len(v) == 1 for per in runs["sigmoid"].measures.values() for v in per.values())


def test_the_streaming_run_keeps_the_arms_it_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=16, context_length=8, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0, rope=True)
    text = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(0))  # (texts, 2 contexts)
    monkeypatch.setattr(sinks_streaming, "nll_cached", _stop_at(3, sinks_streaming.nll_cached))  # in sinks-1
    result = _kept(lambda: sinks_streaming.run_streaming(GPT(config).eval(), contexts=2, texts=2, text=text))
    assert result.interrupted and result.arms == ["recompute", "dense", "window"] == list(result.ppl)
    assert all(len(result.ppl[arm]) == 2 for arm in result.arms)  # every text of each arm kept
    assert {v.claim for v in result.verdicts()} == {"window_fails", "dense_fails"}
    report = REPORTS["streaming"](result, "en")
    assert "Interrupted: a partial run, the arms it finished (recompute, dense, window)" in report
    assert report.count("Not established: the run was interrupted before its arms.") == 2  # 4 sinks' two claims


def test_an_interrupt_before_the_first_seed_writes_nothing_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(sinks_sigmoid, "train_arm", _stop_at(1, sinks_sigmoid.train_arm))  # in seed 0's 1st arm
    assert main(["sinks", "sigmoid", "--seeds", "2", "--steps", "10", "--out", str(tmp_path / "runs")]) == 130
    err = capsys.readouterr().err
    assert err == "error: interrupted before the first seed finished; nothing written\n"
    assert not (tmp_path / "runs").exists()


def _attnlab() -> str:
    found = Path(sys.executable).parent / "attnlab"
    return str(found) if found.exists() else str(shutil.which("attnlab"))


@pytest.mark.slow  # a process that trains: stage 2
def test_sigterm_after_the_first_seed_saves_it_marked_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [_attnlab(), "sinks", "massive", "--seeds", "3", "--steps", "100", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    said = [proc.stdout.readline()]
    while said[-1] and not said[-1].startswith("seed 0: "):  # said once seed 0 is kept: seed 1 trains now
        said.append(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert said[-1].startswith("seed 0: layer "), said
    assert proc.returncode == 130, (rest, err)
    assert "Traceback" not in rest + err and not rest.strip()  # no report, no other line
    saved = tmp_path / "massive.json"
    assert err == (
        f"error: interrupted; saved the 1 seed(s) finished to {saved}, marked interrupted; attnlab sinks massive "
        f"--from {saved} prints its report\n"
    )
    result = sinks_massive.MassiveResult.read(saved)
    assert result.interrupted and result.seeds == [0] and len(result.found) == 1
    assert all(len(per_seed) == 1 for per_seed in result.loss.values())
    assert [p.name for p in tmp_path.iterdir()] == ["massive.json"]  # written whole: no temporary file left
    assert main(["sinks", "massive", "--from", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "Interrupted: a partial run, the 1 seed(s) it finished" in out and "not judged: one seed" in out
