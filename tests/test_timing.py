"""The one interleaved timing loop (issue 32): rotated rounds, warm-ups untimed, what a case prepares untimed,
and the rounds finished kept when a later one is interrupted."""

from __future__ import annotations

import time

import pytest

from attnlab.bench.timing import NOISY, interleaved, ratios, rotated, spread, timed_rounds


def test_rounds_rotate_the_order_after_untimed_warm_ups() -> None:
    calls: list[str] = []
    cases = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = interleaved(cases, rounds=4, warmup=2)
    warm, timed = calls[:6], calls[6:]
    assert warm == list("abcabc")  # each case warmed up twice, before any round
    assert timed == list("abcbcacababc")  # round r starts at case r: a busy moment touches each alike
    assert {name: len(seconds) for name, seconds in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert rotated(["a", "b", "c"], 5) == ["c", "a", "b"] and rotated([], 3) == []


def test_what_a_case_prepares_is_not_timed() -> None:
    """A case that makes a fresh cache before each call: the making (30 ms) stays out of the figure (0 ms)."""

    def prepared() -> object:
        time.sleep(0.03)
        return lambda: None

    (took,) = list(timed_rounds({"fresh": prepared}, rounds=1))
    assert took["fresh"] < 0.01


def test_the_rounds_finished_are_kept_when_a_later_one_is_interrupted() -> None:
    count = {"n": 0}

    def stops_in_round_three() -> None:
        count["n"] += 1
        if count["n"] == 3:
            raise KeyboardInterrupt

    kept: list[dict[str, float]] = []
    with pytest.raises(KeyboardInterrupt):
        for took in timed_rounds({"x": lambda: stops_in_round_three}, rounds=5):
            kept.append(took)
    assert len(kept) == 2 and all(set(k) == {"x"} for k in kept)


def test_spread_and_per_round_ratios() -> None:
    assert spread([2.0, 3.0, 2.5]) == pytest.approx(0.4) and spread([5.0]) == 0.0
    times = {"slow": [2.0, 4.0, 6.0], "base": [1.0, 2.0, 3.0]}
    assert ratios(times, "slow", "base") == [2.0, 2.0, 2.0]  # the machine slowed both: the ratio did not move
    assert spread(ratios(times, "slow", "base")) == 0.0 < NOISY < spread(times["slow"])
