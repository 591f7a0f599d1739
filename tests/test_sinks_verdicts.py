"""The sink experiments' verdicts, reports and command, on results typed in by hand (fast): the zoo's noise
rule decides, the report says what the file says, bad arguments are refused before any work."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attnlab.bench.sinks_report import backcopy_report, streaming_report
from attnlab.bench.sinks_result import Arm, BackcopyResult, StreamingResult, judge
from attnlab.bench.sinks_toy import BOS, BigramBackcopy, normalise
from attnlab.cli import main


def test_judge_follows_the_zoos_noise_rule() -> None:
    assert judge("x", [0.5, 0.7]).status == "held"  # mean 0.6 > spread 0.2, both > 0
    assert judge("x", [-0.5, -0.7]).status == "reversed"
    assert judge("x", [0.5, -0.1]).status == "within the noise"  # mean 0.2 < spread 0.6
    assert judge("x", [0.0, 0.0]).status == "within the noise"  # two identical arms: nothing to tell apart
    assert judge("x", [3.0]).status == "one seed"


def _streaming(window: list[float], sinks4: list[float]) -> StreamingResult:
    arms = ["recompute", "window", "sinks-4"]
    return StreamingResult(
        date="2026-12-07",
        torch="x",
        model="text",
        context=256,
        contexts=4,
        texts=2,
        seed=0,
        bin=64,
        arms=arms,
        ppl={"recompute": [3.0, 2.0], "window": window, "sinks-4": sinks4},
        curve={a: [1.0] for a in arms},
        first_token=0.5,
        largest_first=0.9,
        uniform=0.02,
        seconds=1.0,
    )


def test_streaming_verdicts_read_the_file() -> None:
    collapsed = _streaming(window=[30.0, 20.0], sinks4=[3.3, 2.2])
    verdicts = {v.claim: v for v in collapsed.verdicts()}
    assert verdicts["window_fails"].status == "held"
    assert verdicts["window_fails"].gaps == pytest.approx([math.log(10), math.log(10)])
    assert verdicts["sinks_recover"].status == "held"
    # 4 sinks win back log(30/3.3) + log(20/2.2) of log(10) + log(10)
    assert verdicts["sinks_recover"].size == pytest.approx(2 * math.log(10 / 1.1) / (2 * math.log(10)))
    flat = _streaming(window=[3.0, 2.0], sinks4=[3.0, 2.0])  # nothing evicted mattered
    assert {v.status for v in flat.verdicts()} == {"within the noise"}


def test_the_reports_say_what_the_file_says_in_both_languages() -> None:
    result = _streaming(window=[30.0, 20.0], sinks4=[3.3, 2.2])
    en, zh = streaming_report(result, "en"), streaming_report(result, "zh")
    assert "| window | 25.000 ± 5.000 |" in en and "| window | 25.000 ± 5.000 |" in zh
    assert "held here" in en and "在此成立" in zh
    assert "Size: 96%" in en  # log(10 / 1.1) / log(10) = 0.958, from the file
    steps = [10, 20]
    arms = [
        Arm(
            "softmax-adam",
            "softmax",
            "adam",
            steps,
            {m: [[0.1, v], [0.2, v + 0.02]] for m, v in _FINAL_SOFTMAX.items()},
        ),
        Arm("relu-adam", "relu", "adam", steps, {m: [[0.1, v], [0.2, v + 0.02]] for m, v in _FINAL_RELU.items()}),
    ]
    settings = {"layers": 1, "width": 8, "length": 8, "batch": 2, "steps": 20, "lr_adam": 1e-3, "lr_sgd": 0.1}
    trained = BackcopyResult("2026-12-07", "x", settings, [0, 1], arms, 1.0)
    report = backcopy_report(trained, "en")
    assert "| softmax-adam | 1.010 ± 0.010 | 0.610 ± 0.010 |" in report
    statuses = {v.claim: v.status for v in trained.verdicts()}
    assert statuses == {
        "dormant_sink": "held",
        "relu_sink": "held",
        "relu_drain": "held",
        "relu_peak": "held",
    }
    assert "活跃-休眠" in backcopy_report(trained, "zh")


_FINAL_SOFTMAX = {
    "loss": 1.0,
    "sink": 0.6,
    "sink_triggers": 0.05,
    "value_ratio": 0.3,
    "residual_ratio": 1.5,
    "peak_ratio": 8.0,
}
_FINAL_RELU = {**_FINAL_SOFTMAX, "sink": 0.1, "value_ratio": 0.9, "residual_ratio": 1.0}


def test_a_saved_file_reads_back_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    result = _streaming(window=[30.0, 20.0], sinks4=[3.3, 2.2])
    path = result.write(tmp_path / "s.json")
    assert StreamingResult.read(path) == result
    with pytest.raises(ValueError, match="schema"):
        BackcopyResult.read(path)


def test_the_task_backcopies_after_every_trigger() -> None:
    task = BigramBackcopy.make(seed=0)
    import torch

    seq = task.batch(16, 40, torch.Generator().manual_seed(0))
    assert (seq[:, 0] == BOS).all() and not task.is_trigger(seq[:, 1]).any()
    after = task.is_trigger(seq[:, 1:-1])  # (B, T - 1): token t a trigger, for t in 1..T-1
    assert after.any()
    assert torch.equal(seq[:, 2:][after], seq[:, :-2][after])  # the token after a trigger is the one before it


def test_relu_and_sigmoid_rows_are_not_normalised() -> None:
    import torch

    scores = torch.tensor([[[1.0, -2.0], [0.5, 2.0]]])
    assert normalise(scores, "relu").tolist() == [[[1.0, 0.0], [0.5, 2.0]]]
    assert normalise(scores, "softmax")[0, 0].tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"attention must be one of \['softmax', 'relu', 'sigmoid'\]"):
        normalise(scores, "tanh")


def test_the_command_refuses_bad_arguments_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sinks", "backcopy", "--seeds", "0"]) == 2
    assert "--seeds must be in [1, 10], got 0" in capsys.readouterr().err
    assert main(["sinks", "streaming", "--contexts", "1"]) == 2
    assert "--contexts must be in [2, 16]" in capsys.readouterr().err
    assert main(["sinks", "backcopy", "--model", "backcopy"]) == 2
    assert "--model chooses the streaming run's model; 'backcopy' trains its own" in capsys.readouterr().err
    assert main(["sinks", "streaming", "--from", str(tmp_path / "none.json")]) == 2
    assert "is not a file" in capsys.readouterr().err
    saved = _streaming(window=[30.0, 20.0], sinks4=[3.3, 2.2]).write(tmp_path / "s.json")
    assert main(["sinks", "streaming", "--from", str(saved), "--lang", "zh"]) == 0
    assert "在此成立" in capsys.readouterr().out
    assert main(["sinks", "backcopy", "--from", str(saved)]) == 2
    assert "schema" in capsys.readouterr().err


def test_the_variants_verdicts_and_report_read_the_file(tmp_path: Path) -> None:
    from attnlab.bench.sinks_report import variants_report
    from attnlab.bench.sinks_result import VariantsResult

    row = {"loss": [1.4, 1.4], "learned_sink": [0.0, 0.0], "value_ratio": [0.5, 0.6]}
    measures = {
        "mha": {**row, "first_token": [0.30, 0.34], "peak_ratio": [9.0, 9.5]},
        "gated": {**row, "first_token": [0.31, 0.20], "peak_ratio": [6.0, 6.5], "value_ratio": [0.8, 0.85]},
        "sinks": {**row, "first_token": [0.10, 0.12], "peak_ratio": [9.0, 9.0], "learned_sink": [0.4, 0.6]},
    }
    settings = {"layers": 2, "heads": 2, "width": 8, "length": 8, "batch": 2, "steps": 10, "lr": 3e-3}
    result = VariantsResult("2026-12-07", "x", settings, [0, 1], {"mha": {}}, measures, 1.0)
    status = {v.claim: v.status for v in result.verdicts()}
    assert status == {
        "gated_sink": "within the noise",
        "gated_peak": "held",
        "gated_drain": "held",  # the gate's value ratio 0.3 and 0.25 above mha's
        "learned_sink": "held",
    }
    report = variants_report(result, "en")
    assert "| sinks | 1.400 ± 0.000 | 0.110 ± 0.010 | 0.500 ± 0.100 |" in report
    assert VariantsResult.read(result.write(tmp_path / "v.json")) == result
    assert "可学习的注意力汇聚点" in variants_report(result, "zh")


def test_the_massive_verdicts_and_report_read_the_file(tmp_path: Path) -> None:
    from attnlab.bench.sinks_report import massive_report
    from attnlab.bench.sinks_result import MassiveResult

    found = {"layer": 1, "channels": [3, 5], "values": [4.0, -3.5], "peak_ratio": 9.25, "peak_position": 0}
    loss = {"base": [1.40, 1.41], "mean": [1.40, 1.41], "zero": [1.60, 1.66], "control": [1.40, 1.42]}
    settings = {"layers": 2, "heads": 2, "width": 8, "steps": 10, "top": 2}
    result = MassiveResult("2026-12-07", "x", settings, [0, 1], loss, [found, found], 1.0)
    assert {v.claim: v.status for v in result.verdicts()} == {"zero_breaks": "held", "zero_vs_control": "held"}
    report = massive_report(result, "en")
    assert "| set to zero | 1.630 ± 0.030 |" in report
    assert "Seed 1: layer 1, channels [3, 5], values 4.00, -3.50; the layer's largest activation is 9.2 times" in report
    assert MassiveResult.read(result.write(tmp_path / "m.json")) == result
    assert "| 置零 | 1.630 ± 0.030 |" in massive_report(result, "zh")


def test_the_sigmoid_verdicts_and_report_read_the_file(tmp_path: Path) -> None:
    from attnlab.bench.sinks_report import sigmoid_report
    from attnlab.bench.sinks_sigmoid import SigmoidResult

    row = {"loss": [1.4, 1.5], "largest_first": [0.5, 0.6], "sink_rate": [0.25, 0.5], "peak_ratio": [8.0, 9.0]}
    measures = {"softmax": {**row, "first_token": [0.30, 0.34]}, "sigmoid": {**row, "first_token": [0.05, 0.03]}}
    settings = {"steps": 10, "batch": 2, "lr": 3e-3, "seq_len": 8, "probe": 2}
    result = SigmoidResult("2026-12-07", "x", settings, [0, 1], measures, 0.2, 1.0)
    verdicts = {v.claim: v for v in result.verdicts()}
    assert verdicts["softmax_text_sink"].status == "held"  # 0.10 and 0.14 above an even head's 0.2
    assert verdicts["sigmoid_text_sink"].gaps == pytest.approx([0.25, 0.31])
    assert verdicts["sigmoid_text_sink"].status == "held"
    report = sigmoid_report(result, "en")
    assert "| sigmoid | 1.450 ± 0.050 | 0.040 ± 0.010 | 0.550 ± 0.050 | 0.375 ± 0.125 | 8.500 ± 0.500 |" in report
    assert "first-token share of 0.200" in report
    assert SigmoidResult.read(result.write(tmp_path / "g.json")) == result
    assert "在此成立" in sigmoid_report(result, "zh")
    flat = {"softmax": {**row, "first_token": [0.19, 0.18]}, "sigmoid": {**row, "first_token": [0.19, 0.17]}}
    status = {v.claim: v.status for v in SigmoidResult("d", "x", settings, [0, 1], flat, 0.2, 1.0).verdicts()}
    assert status == {"softmax_text_sink": "reversed", "sigmoid_text_sink": "within the noise"}


def test_the_sigmoid_command_reads_a_saved_run_and_refuses_another(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from attnlab.bench.sinks_sigmoid import SigmoidResult, SigmoidSettings

    row = {"loss": [1.4], "first_token": [0.02], "largest_first": [0.05], "sink_rate": [0.0], "peak_ratio": [6.0]}
    saved = SigmoidResult(
        "d",
        "x",
        {"steps": 10, "batch": 2, "lr": 3e-3, "seq_len": 8, "probe": 2},
        [0],
        {"softmax": row, "sigmoid": row},
        0.2,
        1.0,
    ).write(tmp_path / "g.json")
    assert main(["sinks", "sigmoid", "--from", str(saved), "--lang", "zh"]) == 0
    assert "未判定：只有一个种子" in capsys.readouterr().out
    assert main(["sinks", "variants", "--from", str(saved)]) == 2
    assert "schema" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lr must be a float in"):
        SigmoidSettings(lr=3)
