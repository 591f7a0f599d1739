"""Generation: ``Sampling`` draws every token, ``decode`` is the one loop over one model cache, the proposers
guess for it, and ``plan`` checks a call before it runs (``GPT.generate``, ``stream`` and ``generate_many`` are
its front doors)."""

from attnlab.models.generation import plan
from attnlab.models.generation.decode import Row, Stop, decode, feed, prefill, reference_greedy
from attnlab.models.generation.proposers import Draft, Lookup, lookup_guess
from attnlab.models.generation.sampling import Sampling

__all__ = [
    "Draft",
    "Lookup",
    "Row",
    "Sampling",
    "Stop",
    "decode",
    "feed",
    "lookup_guess",
    "plan",
    "prefill",
    "reference_greedy",
]
