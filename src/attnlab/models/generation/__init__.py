"""Generation: a checked ``Request`` (prompts, stop, ``Sampling``, cache, proposer, slots, compile), ``decode``
the one loop over one model cache, ``Sampling`` draws every token, and the proposers guess for it
(``GPT.generate``, ``stream`` and ``generate_many`` are its front doors)."""

from attnlab.models.generation.decode import Counts, Decoding, Row, decode, feed, prefill, reference_greedy
from attnlab.models.generation.proposers import Draft, Lookup, Proposer, lookup_guess
from attnlab.models.generation.request import GenerateOptions, ManyOptions, Options, Request, Stop, request_for
from attnlab.models.generation.sampling import Sampling

__all__ = [
    "Counts",
    "Decoding",
    "Draft",
    "GenerateOptions",
    "Lookup",
    "ManyOptions",
    "Options",
    "Proposer",
    "Request",
    "Row",
    "Sampling",
    "Stop",
    "decode",
    "feed",
    "lookup_guess",
    "prefill",
    "reference_greedy",
    "request_for",
]
