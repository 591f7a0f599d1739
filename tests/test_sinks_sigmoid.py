"""attnlab sinks sigmoid (bench/sinks_sigmoid.py), trained for real at a quick size (second stage): the sigmoid
arm is sigmoid attention (softmax trained in its place turns every gap to exactly zero, so the verdict on the
claim could not read the same), an even head's share is the one the measures give, and the quick form writes a
file its report reads."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.sinks_sigmoid import SigmoidSettings, run_sigmoid, uniform_share
from attnlab.explain.sinks import first_token_share

pytestmark = pytest.mark.slow

QUICK = SigmoidSettings(steps=5, batch=4, seq_len=32, probe=4)


def _claim(result: object, claim: str) -> object:
    return next(v for v in result.verdicts() if v.claim == claim)  # type: ignore[attr-defined]


def test_the_sigmoid_arm_differs_and_softmax_in_its_place_gives_no_gap() -> None:
    real = run_sigmoid(seeds=2, settings=QUICK)
    gaps = _claim(real, "sigmoid_text_sink").gaps  # type: ignore[attr-defined]
    assert min(abs(g) for g in gaps) > 1e-4
    assert real.measures["sigmoid"]["loss"] != real.measures["softmax"]["loss"]
    inverted = run_sigmoid(seeds=2, settings=QUICK, arms={"softmax": "softmax", "sigmoid": "softmax"})
    verdict = _claim(inverted, "sigmoid_text_sink")
    assert verdict.gaps == [0.0, 0.0] and verdict.status == "within the noise"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"arms must name \['softmax', 'sigmoid'\]"):
        run_sigmoid(seeds=1, settings=QUICK, arms={"relu": "softmax"})


def test_an_even_heads_share_is_the_measures_own() -> None:
    even = torch.ones(32, 32).tril() / torch.arange(1, 33)[:, None]  # row i spread over keys 0..i
    assert uniform_share(32) == pytest.approx(float(first_token_share(even)), rel=1e-6)


def test_the_quick_form_writes_a_file_its_report_reads(tmp_path: object) -> None:
    from pathlib import Path

    from attnlab.bench.sinks_report import sigmoid_report
    from attnlab.bench.sinks_sigmoid import SigmoidResult

    result = run_sigmoid(seeds=1, settings=QUICK)
    saved = SigmoidResult.read(result.write(Path(str(tmp_path)) / "g.json"))
    assert saved == result
    assert all(v.status == "one seed" for v in saved.verdicts())
    assert "| sigmoid |" in sigmoid_report(saved, "en")
