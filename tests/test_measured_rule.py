"""The rule a measured choice must pass before every later process trusts it (attnlab.measured): a layout
(attnlab.linear.layout) beats "rows" by the margin in the median and in every repeat but one; a layout's or an int8
kernel's (attnlab.linear.int8_choice) deciding passes were steady. A measurement taken while something else held
the machine is used, kept as unsettled, and measured again by the next process, a few times at most. The probes'
rates are given here where only the rule is under test (the real probes: tests/test_tuned_real.py, and the int8
kernels' turns below)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from attnlab import measured
from attnlab.linear import int8_choice, layout
from attnlab.linear.quantized import Int8Linear, available_kernels

QUIET = {"rows": [10.0, 10.2, 9.9, 10.1, 10.0], "onednn": [12.0, 12.1, 11.9, 12.2, 12.0]}
# What a machine kept beside a valgrind run (gpt2-small's (768, 3072) float32 weight, GB/s): every layout slowed at
# random, and the margin rule kept "columns" for every later process, where quiet passes give gemv by far.
DISTURBED = {
    "columns": [17.5, 15.4, 18.3, 15.9, 20.0],
    "gemv": [15.3, 17.5, 2.3, 13.5, 18.4],
    "rows": [12.1, 13.0, 9.8, 12.5, 7.9],
}


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, list[float]]]:
    """Nothing kept yet, measuring on, "rows" and "onednn" offered; each probe hands out the next of the rates
    the test queues (the list), and fails the test where none is queued: a measurement nobody expected."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MEASURE", "1")
    monkeypatch.setattr(layout, "ONE_COPY", ("rows", "onednn", "columns", "gemv"))
    monkeypatch.setattr(layout, "offered", lambda name, dtype: True)
    queued: list[dict[str, list[float]]] = []

    def passes(d_in: int, d_out: int, dtype: torch.dtype, layouts: list[str], repeats: int) -> dict[str, list[float]]:
        assert queued, "measured again where the kept choice should have been trusted"
        rates = queued.pop(0)
        return {name: rates.get(name, [1.0] * repeats) for name in layouts}

    monkeypatch.setattr(layout, "stream_passes", passes)
    new_process(monkeypatch)  # nothing measured by this process yet
    return queued


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new process forgets: the choices it measured itself."""
    monkeypatch.setattr(layout, "_MEASURED", {})
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})


def kept(d_in: int = 768, d_out: int = 3072) -> dict[str, object]:
    entry = measured.recall("layout", f"{d_in}x{d_out} float32")
    assert entry is not None
    return entry


def test_steady_passes_settle_and_disturbed_ones_do_not() -> None:
    assert layout.settled(QUIET, "onednn")
    assert not layout.settled(DISTURBED, "columns")  # rows' passes, all but the farthest, spread 26%
    assert not layout.settled(QUIET | {"rows": [10.0, 6.0, 10.0, 7.0, 10.0]}, "onednn")  # rows decided it too
    assert layout.settled(QUIET | {"rows": [10.0, 2.0, 10.0, 9.8, 10.0]}, "onednn")  # one repeat may stray
    # "rows" kept: the fastest other layout in the median decided it with rows
    assert layout.settled({"rows": [10.0] * 5, "onednn": [10.2] * 5, "gemv": [1.0, 9.0, 2.0, 9.0, 9.0]}, "rows")
    assert not layout.settled({"rows": [10.0] * 5, "onednn": [6.0, 7.0, 10.4, 10.4, 10.4]}, "rows")


def test_a_disturbed_measurement_is_used_then_measured_again_by_the_next_process(
    machine: list[dict[str, list[float]]], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.append(DISTURBED)
    assert layout.measured_layout(768, 3072) == "columns"  # this process uses what it measured
    assert kept()["settled"] is False and kept()["tries"] == 1
    assert layout.measured_layout(768, 3072) == "columns"  # and measures it once: the next weight of the shape
    new_process(monkeypatch)
    machine.append(QUIET | {"gemv": [30.0, 31.0, 30.5, 29.8, 30.2]})  # the next process: a quiet machine
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        model = torch.nn.Sequential(torch.nn.Linear(768, 3072))
        assert layout.set_layout(model, "measured") == {"0.weight": "gemv"}
    said = [r.getMessage() for r in caplog.records if r.name == "attnlab"]
    assert len(said) == 1 and "measuring the layout of 1 weight shape again on this machine: the last " in said[0]
    assert kept()["settled"] is True and kept()["tries"] == 2
    new_process(monkeypatch)
    assert layout.measured_layout(768, 3072) == "gemv" and not machine  # settled: trusted, nothing measured


def test_a_machine_that_never_settles_is_measured_three_times_at_most(
    machine: list[dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    machine += [DISTURBED] * measured.TRIES
    for tries in range(1, measured.TRIES + 1):
        new_process(monkeypatch)
        assert layout.measured_layout(768, 3072) == "columns"
        assert kept()["tries"] == tries and kept()["settled"] is False
    new_process(monkeypatch)
    assert layout.measured_layout(768, 3072) == "columns" and not machine  # the third is kept: nothing timed


def test_a_model_with_many_weights_of_one_shape_measures_it_once_a_process(
    machine: list[dict[str, list[float]]], caplog: pytest.LogCaptureFixture
) -> None:
    """gpt2-small has twelve (3072, 768) weights: a disturbed measurement of their shape is used for all twelve,
    kept as one try, and left for the next process; the line says "once"."""
    machine += [DISTURBED] * measured.TRIES
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        model = torch.nn.Sequential(*(torch.nn.Linear(768, 3072) for _ in range(12)))
        chosen = layout.set_layout(model, "measured")
    assert set(chosen.values()) == {"columns"} and len(machine) == measured.TRIES - 1  # one measurement
    assert kept()["tries"] == 1 and kept()["settled"] is False
    said = [r.getMessage() for r in caplog.records if r.name == "attnlab"]
    assert len(said) == 1 and "measuring the layout of 1 weight shape once on this machine" in said[0]


def test_a_steady_measurement_another_process_kept_meanwhile_is_not_replaced_and_tries_never_go_back(
    machine: list[dict[str, list[float]]],
) -> None:
    """keep() reads the store again just before it writes: an unsettled measurement does not overwrite a settled
    one another process kept while it measured, and it counts as one more try of an unsettled one kept meanwhile."""
    steady = {"choice": "gemv", "gb_s": QUIET, "margin": layout.MARGIN, "settled": True, "tries": 2}
    unsteady = {"choice": "columns", "gb_s": DISTURBED, "settled": False}
    measured.remember("layout", "768x3072 float32", steady)  # kept by another process while this one measured
    measured.keep("layout", "768x3072 float32", unsteady, read=None, usable=False)
    assert kept() == steady
    measured.remember("layout", "768x3072 float32", steady | {"settled": False})  # unsettled, 2 tries: one more
    measured.keep("layout", "768x3072 float32", unsteady, read=None, usable=False)
    assert kept()["choice"] == "columns" and kept()["tries"] == 3


def test_a_kept_choice_this_machine_cannot_run_is_replaced_even_by_an_unsteady_measurement(
    machine: list[dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settled "prefetch" kept where its toolchain existed, on a machine where it is not offered: measured anew,
    and kept even though the machine is busy (as a first try), so that later processes trust it, not remeasure it
    for ever; the process's other weights of the shape measure nothing."""
    measured.remember("layout", "768x3072 float32", {"choice": "prefetch", "settled": True, "tries": 1})
    monkeypatch.setattr(layout, "offered", lambda name, dtype: name != "prefetch")
    machine.append(DISTURBED)
    model = torch.nn.Sequential(*(torch.nn.Linear(768, 3072) for _ in range(3)))
    assert set(layout.set_layout(model, "measured").values()) == {"columns"} and not machine
    assert kept()["choice"] == "columns" and kept()["settled"] is False and kept()["tries"] == 1


def test_measuring_off_trusts_an_unsettled_choice_and_times_nothing(
    machine: list[dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.append(DISTURBED)
    assert layout.measured_layout(768, 3072) == "columns"
    monkeypatch.setenv("ATTNLAB_MEASURE", "0")
    assert layout.measured_layout(768, 3072) == "columns" and kept()["tries"] == 1


def test_an_entry_kept_before_the_rule_counts_as_settled(machine: list[dict[str, list[float]]]) -> None:
    measured.remember("layout", "768x3072 float32", {"choice": "onednn", "gb_s": QUIET, "margin": layout.MARGIN})
    assert layout.measured_layout(768, 3072) == "onednn"  # nothing queued: nothing measured


def test_a_choice_wins_only_by_the_margin_in_the_median_and_every_repeat_but_one() -> None:
    rows = [10.0, 10.0, 10.0, 10.0, 10.0]
    assert layout.margin_winner({"rows": rows, "onednn": [10.4] * 5}) == "rows"  # 4%: inside the margin
    assert layout.margin_winner({"rows": rows, "onednn": [12.0, 12.0, 12.0, 9.0, 9.0]}) == "rows"  # lost two
    assert layout.margin_winner({"rows": rows, "onednn": [12.0, 12.0, 12.0, 12.0, 9.0]}) == "onednn"  # lost one
    assert layout.margin_winner({"rows": rows, "onednn": [12.0] * 5, "gemv": [11.0] * 5}) == "onednn"
    assert layout.margin_winner({"rows": [12.0] * 5, "onednn": [11.0] * 5}) == "rows"
    # the fastest in the median lost two repeats; the next fastest won them all: the next fastest
    assert layout.margin_winner({"rows": rows, "gemv": [14.0, 14.0, 14.0, 9.0, 9.0], "prefetch": [12.0] * 5}) == (
        "prefetch"
    )


def test_one_disturbed_repeat_does_not_send_a_clear_winner_back_to_rows() -> None:
    """What a machine kept on disk (docs/benchmarks.md's, gpt2-small's MLP weight in bfloat16, GB/s): the second
    repeat ran while something else did, and gemv, 33% faster than rows in the median, lost it. Asking every
    repeat gave rows, bfloat16's slowest layout, to every later process."""
    kept = {
        "columns": [12.6, 16.6, 16.9, 17.2, 14.0],
        "gemv": [33.3, 17.1, 33.6, 26.0, 30.7],
        "onednn": [18.6, 13.4, 24.9, 19.5, 22.3],
        "prefetch": [30.2, 19.5, 27.6, 26.3, 31.4],
        "rows": [24.0, 23.7, 17.5, 23.0, 22.1],
    }
    assert layout.margin_winner(kept) == "gemv"


def test_a_kept_layout_that_is_no_longer_offered_is_measured_again(
    machine: list[dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop kept where its toolchain existed, on a machine where it is not offered any more: measured anew."""
    measured.remember("layout", "768x3072 float32", {"choice": "prefetch", "settled": True, "tries": 1})
    monkeypatch.setattr(layout, "offered", lambda name, dtype: name != "prefetch")
    machine.append(QUIET)
    assert layout.measured_layout(768, 3072) == "onednn" and not machine
    assert layout.measured_layout(768, 3072) == "onednn"  # kept now: nothing queued, nothing measured


def test_a_weight_the_caches_hold_is_trusted_however_its_passes_spread(machine: list[dict[str, list[float]]]) -> None:
    """A (96, 32) float32 weight (12 KB) stays in the caches: its probe times calls, which spread as they will, and
    its choice moves microseconds a step. It is kept as settled, never measured again."""
    machine.append(DISTURBED)
    assert layout.measured_layout(32, 96) == "columns"
    assert kept(32, 96)["settled"] is True
    assert layout.measured_layout(32, 96) == "columns" and not machine


def test_an_int8_kernel_measured_unsteadily_is_measured_again_and_a_steady_one_is_trusted(
    machine: list[dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """quantize("int8")'s choice follows the same rule: the winner's and the runner-up's passes decide it."""
    kernels = available_kernels()
    assert len(kernels) >= 2, kernels
    first, second = kernels[0], kernels[1]
    queued = [
        {first: [20.0, 9.0, 21.0, 12.0, 20.0], second: [15.0] * 5},  # the winner's, all but one, spread 45%
        {first: [20.0, 20.5, 19.8, 20.1, 20.2], second: [15.0, 15.1, 14.9, 15.0, 3.0]},  # one stray repeat: steady
    ]

    def passes(d_in: int, d_out: int, *, repeats: int = 5) -> dict[str, list[float]]:
        assert queued, "measured again where the kept kernel should have been trusted"
        rates = queued.pop(0)
        return {k: rates.get(k, [1.0] * repeats) for k in kernels}

    monkeypatch.setattr(int8_choice, "int8_stream_passes", passes)
    for tries, settled in ((1, False), (2, True)):
        new_process(monkeypatch)
        assert int8_choice.fastest_int8_kernel(768, 3072) == first
        entry = measured.recall("int8", "768x3072")
        assert entry is not None and entry["settled"] is settled and entry["tries"] == tries
    new_process(monkeypatch)
    assert int8_choice.fastest_int8_kernel(768, 3072) == first and not queued  # settled: nothing measured


def test_the_int8_kernels_take_turns_pass_by_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8_stream_passes runs every kernel's pass of a repeat before the next repeat (a warm-up pass first), so
    that a machine that slows down midway favours none: the kernels' calls, in order, come in blocks of one pass."""
    order: list[str] = []
    forward = Int8Linear.forward

    def seen(self: Int8Linear, x: torch.Tensor) -> torch.Tensor:
        order.append(self.kernel)
        return forward(self, x)

    monkeypatch.setattr(Int8Linear, "forward", seen)
    passes = int8_choice.int8_stream_passes(16, 4096, repeats=2)  # 64 KiB of int8: 32 copies a pass
    kernels = available_kernels()
    assert set(passes) == set(kernels) and all(len(rates) == 2 and min(rates) > 0 for rates in passes.values())
    blocks = [order[i] for i in range(0, len(order), 32)]
    assert order == [kernel for kernel in blocks for _ in range(32)]  # whole passes of 32 calls
    assert blocks == list(kernels) * 3  # the warm-up, then two repeats, each kernel in turn
