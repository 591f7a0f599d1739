"""The sink experiments' effects, trained for real at a small size (second stage): each verdict holds on the
real arms and turns when the technique is taken out (softmax trained in the ReLU arm; the sinks' cache given
no sinks), so a verdict that could not fail would fail here."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnlab.bench.sinks_backcopy import BackcopySettings, run_backcopy
from attnlab.bench.sinks_result import BackcopyResult
from attnlab.bench.sinks_variants import VariantSettings, run_variants

pytestmark = pytest.mark.slow

SMALL = BackcopySettings(layers=1, width=32, length=32, batch=32, steps=250, evaluations=2, lr_adam=3e-3)


@pytest.fixture(scope="module")
def real_arms() -> BackcopyResult:
    """The softmax and ReLU arms, trained once for the tests that read them (none changes the result)."""
    return run_backcopy(
        seeds=2, settings=SMALL, arms={"softmax-adam": ("softmax", "adam"), "relu-adam": ("relu", "adam")}
    )


def test_softmax_grows_a_dormant_sink_and_a_drain_that_relu_does_not(real_arms: BackcopyResult) -> None:
    result = real_arms
    status = {v.claim: v.status for v in result.verdicts()}
    assert status["dormant_sink"] == "held"  # ordinary tokens sink on BOS, triggers do not
    assert status["relu_sink"] == "held"
    assert status["relu_drain"] == "held"
    assert min(result.final("softmax-adam", "sink")) > 0.3  # a sink, not a shade above the rest


def test_softmax_in_the_relu_arm_turns_the_verdict(real_arms: BackcopyResult) -> None:
    # only the relu arm is trained again, with softmax; the softmax arm is the real one (the same seeds, settings
    # and task: run_backcopy trains an arm from those alone, whatever else it trains)
    inverted = run_backcopy(seeds=2, settings=SMALL, arms={"relu-adam": ("softmax", "adam")})
    softmax = real_arms.arm("softmax-adam")
    assert softmax is not None
    inverted = replace(inverted, arms=[softmax, *inverted.arms])
    status = {v.claim: v.status for v in inverted.verdicts()}
    assert status["dormant_sink"] == "held"  # the softmax arm still sinks
    assert status["relu_sink"] != "held" and status["relu_drain"] != "held"


def test_the_sink_cache_keeps_what_the_window_lets_go_and_dense_fails_past_the_context() -> None:
    """On the shipped text model: every byte past the first context is predicted differently with 4 sinks than
    with a window of the same size (the sinks are read: take them out and the predictions move), and a plain
    cache past the context pays more than the window recomputed."""
    from attnlab.bench.sinks_streaming import cache_for, held_out_texts, nll_cached, run_streaming
    from attnlab.models.gpt import GPT

    model = GPT.from_pretrained("text")
    text = held_out_texts(model, texts=1, length=320)
    window, sinks = (nll_cached(model, text, cache_for(arm, 256)) for arm in ("window", "sinks-4"))
    assert torch.equal(window[:, :255], sinks[:, :255])  # inside the first context nothing is let go
    assert (window[:, 256:] - sinks[:, 256:]).abs().min() > 0  # past it, every prediction moves
    result = run_streaming(model, contexts=2, texts=2, arms=("recompute", "dense"))
    assert {v.claim: v.status for v in result.verdicts()} == {"dense_fails": "held"}
    assert min(result.ppl["dense"]) > max(result.ppl["recompute"])


def test_massive_activations_set_to_their_mean_change_nothing_and_zeroed_they_move_the_loss() -> None:
    """The first token is BOS in every sequence and sees only itself: its activations are the same everywhere, so
    their mean is their value (the loss to float32's rounding: a batched product may round a row apart from the
    others, so not always to the last digit); zeroed, the loss moves, by far more than that rounding and than
    zeroing as many other channels (the control) moves it; no values, no change."""
    from attnlab.bench.sinks_massive import intervene, losses
    from attnlab.bench.sinks_toy import BigramBackcopy
    from attnlab.bench.sinks_variants import CHANGES, VariantSettings, train_gpt

    task = BigramBackcopy.make(seed=0)
    settings = VariantSettings(width=32, length=32, steps=200)
    model = train_gpt(CHANGES["mha"], settings, seed=0, task=task)
    held_out = task.batch(32, 32, torch.Generator().manual_seed(1))
    result, where = losses(model, held_out, task.batch(32, 32, torch.Generator().manual_seed(2)))
    moved = {arm: abs(result[arm] - result["base"]) for arm in ("mean", "zero", "control")}
    assert moved["mean"] <= 1e-6 * result["base"], result  # the same to float32's rounding of a mean
    assert moved["zero"] > 100 * max(moved["mean"], 1e-7) and moved["zero"] > 10 * moved["control"], result
    assert intervene(model, held_out, where["layer"], where["channels"], None) == result["base"]


# A size the suite trains where the gate's effect shows past the spread (what else was tried: docs/sinks.md).
# Batch 8 for 300 steps (was 16 for 400: 2.4 times the work): on seeds 0 and 1 the drain gap is 0.128 with a
# spread of 0.046, the gate fixed open 0.025 with 0.052. Cheaper tried and refused (the real gap within the noise,
# or the gate fixed open still "held"): 200 or 250 steps at batch 16; 150 at a higher rate; 200 at batch 8; one
# layer; 16 or 24 tokens.
GATE = VariantSettings(width=64, length=32, batch=8, steps=300)
GATED = {"mha": {}, "gated": {"attn_output_gate": True}}


def _gate_fixed_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output gate opened all the way, whatever x: the gated model trains as mha with a gate it never uses."""
    from attnlab.nn.attention import Attention

    def opened(self: Attention, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.gate is None else x.new_ones(*x.shape[:-1], self.num_heads * self.value_dim)

    monkeypatch.setattr(Attention, "gate_for", opened)


def test_the_gate_keeps_the_first_tokens_value_and_fixed_open_it_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Qiu et al.'s gate against mha at a size the suite trains: mha drains the first token's value (its norm well
    below the others') and the gated model less so, past the spread over seeds (gated_drain held); trained with the
    gate fixed open, the same comparison is not a finding."""
    from dataclasses import replace

    real = run_variants(seeds=2, settings=GATE, variants=GATED)
    assert {v.claim: v.status for v in real.verdicts()}["gated_drain"] == "held"
    _gate_fixed_open(monkeypatch)
    opened = run_variants(seeds=2, settings=GATE, variants={"gated": GATED["gated"]})
    against = replace(real, measures={"mha": real.measures["mha"], "gated": opened.measures["gated"]})
    assert {v.claim: v.status for v in against.verdicts()}["gated_drain"] != "held"
