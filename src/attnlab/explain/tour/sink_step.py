"""Tour, part 4, before learned sinks: why softmax must put its weight somewhere, and what a sink on the first
token does with it, on the chapter's six tokens.

Three heads of the chapter's causal attention (SelfAttention_v2's weights, d_out 2, seeded 789 as 3.4 seeds it) read the
same tokens: the chapter's own; one whose queries match no key (every score 0: each row spread evenly); and
one whose keys give token 0 a score every query matches (8 added to column 0: the key bias Gu et al. describe),
with token 0's value set to zero (a value-state drain). Checked by hand in plain torch: every row of every head
sums to 1; the even head's first-token share is the mean of 1/2 .. 1/6; the sink head puts almost all of each
row on token 0, and so adds almost nothing to its tokens' context vectors: a head that "says nothing".

Shapes: T = tokens (6), D = d_out (2).
"""

from __future__ import annotations

import torch

from attnlab import book
from attnlab.explain.sinks.measures import first_token_share
from attnlab.explain.tour.core import Add, Checker, fmt

KEY_BIAS = 8.0  # added to every query's score of token 0: the key bias that makes the sink


def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """The chapter's recipe on (T, T) scaled scores: -inf above the diagonal, softmax on each row."""
    t = scores.shape[-1]
    return torch.softmax(scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -torch.inf), dim=-1)


def attention_sink(add: Add, c: Checker, x: torch.Tensor) -> None:
    inputs = x[0]  # (T, 3): the chapter's six tokens
    torch.manual_seed(789)
    head = book.SelfAttentionV2(3, 2)  # the chapter's SelfAttention_v2, seeded as 3.4 seeds it
    queries, keys = head.W_query(inputs), head.W_key(inputs)  # (T, D) each
    values = head.W_value(inputs)  # (T, D)
    scores = queries @ keys.T / 2**0.5  # (T, T)
    chapter = _causal_softmax(scores)
    even = _causal_softmax(torch.zeros_like(scores))  # a query that matches no key better than another
    biased = scores.clone()
    biased[:, 0] += KEY_BIAS  # a key bias on token 0: every query matches it
    sink = _causal_softmax(biased)
    drained = values.clone()
    drained[0] = 0.0  # token 0's value drained to nothing
    shares = {name: float(first_token_share(w)) for name, w in (("chapter", chapter), ("even", even), ("sink", sink))}
    by_hand = sum(1 / (i + 1) for i in range(1, 6)) / 5  # rows 1..5 of the even head give 1/2 .. 1/6 to token 0
    quiet = (sink @ drained)[1:].norm(dim=-1).max()  # (T - 1,): what the sink head adds to tokens 1..5
    loud = (even @ values)[1:].norm(dim=-1).min()
    add(
        "attention_sink",
        f"scores[:, 0] += {KEY_BIAS}  # " + c.say("cm_key_bias") + "\n"
        "values[0] = 0.0      # " + c.say("cm_drain") + "\n"
        "first_token_share(weights)  # " + c.say("cm_first_share"),
        "\n".join(c.say("first_share", name=name, share=share) for name, share in shares.items()) + "\n" + fmt(sink),
        c.holds("sink_rows_one", all(torch.allclose(w.sum(-1), torch.ones(6)) for w in (chapter, even, sink))),
        c.holds("sink_even", abs(shares["even"] - by_hand) < 1e-6, share=by_hand),
        c.holds("sink_on_first", shares["sink"] > 0.99),
        c.holds("sink_quiet", bool(quiet < 0.01 * loud)),
        heat=torch.stack([chapter, even, sink]),
    )
