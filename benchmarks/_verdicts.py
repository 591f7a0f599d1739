"""A target's verdict from a measured ratio and its spread, said one way by every benchmark script.

A ratio whose rounds (or rows) spread past ``NOISY`` judges nothing. One that meets or misses its target by less
than its own spread is said with the caveat that another run may fall on the other side.
"""

from __future__ import annotations

from attnlab.bench.timing import NOISY


def judged(ratio: float, target: float, spread: float, *, at_most: bool = False, whose: str = "the rows") -> str:
    """ "met" or "not met" for ``ratio`` against ``target`` (at least the target; ``at_most``: at most it),
    "not established" past ``NOISY``, and a margin inside ``spread`` said ("met (by 5%, inside the rows' 15%
    spread: another run may say otherwise)")."""
    if spread > NOISY:
        return "not established (a spread too wide to trust)"
    met = ratio <= target if at_most else ratio >= target
    margin = abs((target / ratio if at_most else ratio / target) - 1)
    verdict = "met" if met else "not met"
    if margin < spread:
        owner = whose + ("'" if whose.endswith("s") else "'s")  # the rows', the row's
        verdict += f" (by {margin:.0%}, inside {owner} {spread:.0%} spread: another run may say otherwise)"
    return verdict
