"""The sink experiments' effects, trained for real at a small size (second stage): each verdict holds on the
real arms and turns when the technique is taken out (softmax trained in the ReLU arm; the sinks' cache given
no sinks), so a verdict that could not fail would fail here."""

from __future__ import annotations

import pytest

from attnlab.bench.sinks_backcopy import BackcopySettings, run_backcopy

pytestmark = pytest.mark.slow

SMALL = BackcopySettings(layers=1, width=32, length=32, batch=32, steps=250, evaluations=2, lr_adam=3e-3)


def test_softmax_grows_a_dormant_sink_and_a_drain_that_relu_does_not() -> None:
    result = run_backcopy(
        seeds=2, settings=SMALL, arms={"softmax-adam": ("softmax", "adam"), "relu-adam": ("relu", "adam")}
    )
    status = {v.claim: v.status for v in result.verdicts()}
    assert status["dormant_sink"] == "held"  # ordinary tokens sink on BOS, triggers do not
    assert status["relu_sink"] == "held"
    assert status["relu_drain"] == "held"
    assert min(result.final("softmax-adam", "sink")) > 0.3  # a sink, not a shade above the rest


def test_softmax_in_the_relu_arm_turns_the_verdict() -> None:
    inverted = run_backcopy(
        seeds=2, settings=SMALL, arms={"softmax-adam": ("softmax", "adam"), "relu-adam": ("softmax", "adam")}
    )
    status = {v.claim: v.status for v in inverted.verdicts()}
    assert status["dormant_sink"] == "held"  # the softmax arm still sinks
    assert status["relu_sink"] != "held" and status["relu_drain"] != "held"
