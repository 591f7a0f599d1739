"""The tour's attention-sink step (explain/tour/sink_step.py): its checks hold, and go red when the sink is
taken away (no key bias on token 0) or the share is measured the wrong way (row 0 counted)."""

from __future__ import annotations

import pytest
import torch

import attnlab.explain.tour.sink_step as sink_step
from attnlab.explain.sinks.measures import gu_score
from attnlab.explain.tour import build_tour
from attnlab.explain.tour import en as en_text

pytestmark = pytest.mark.slow  # the whole tour is built each time


def _failures() -> set[str]:
    step = next(s for s in build_tour("en") if s.key == "attention_sink")
    keys = {label.split("{")[0]: key for key, label in en_text.CHECKS.items() if key.startswith("sink_")}
    return {next(k for prefix, k in keys.items() if c.label.startswith(prefix)) for c in step.checks if not c.ok}


def test_the_sink_step_holds_and_goes_red_without_its_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _failures() == set()
    with monkeypatch.context() as m:  # no key bias: token 0 is a key like the others, the head speaks
        m.setattr(sink_step, "KEY_BIAS", 0.0)
        assert _failures() == {"sink_on_first", "sink_quiet"}
    with monkeypatch.context() as m:  # the share with row 0 counted (Gu et al.'s score): not the mean of 1/2..1/6
        m.setattr(sink_step, "first_token_share", gu_score)
        assert "sink_even" in _failures()


def test_the_sink_step_shows_three_heads_on_the_six_tokens() -> None:
    step = next(s for s in build_tour("zh") if s.key == "attention_sink")
    assert step.heat is not None and tuple(step.heat.shape) == (3, 6, 6)
    assert torch.allclose(step.heat.sum(-1), torch.ones(3, 6))
    assert "首 Token 份额" in step.text and "注意力汇聚点" in step.title
