"""``Sampling``: how a token is drawn, checked once, and the only place a token is drawn.

Greedy (temperature 0) takes the argmax; otherwise the logits are divided by
the temperature, cut to the ``top_k`` best and to the smallest set whose mass
reaches ``top_p``, and a token is drawn from their softmax with
``generator``. Speculative decoding's verification is here too (Leviathan et
al., 2023; Chen et al., 2023): a guess x drawn from q is kept with probability
min(1, p(x) / q(x)), and on refusal the token is drawn from (p - q)+
normalised, so every token has exactly the model's distribution p. A guess
that is a point mass (prompt lookup: q(x) = 1) is kept with probability p(x),
else the token is drawn from p without x.

Shapes: B = rows, V = vocabulary, G = guesses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnlab._checks import check_positive_int


@dataclass(frozen=True, kw_only=True, eq=False)
class Sampling:
    """temperature >= 0 (0: greedy), top_k >= 1, top_p in (0, 1], and the generator draws come from."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"temperature must be a number >= 0 (0 = greedy), got {t!r}")
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t}")
        if self.top_k is not None:
            check_positive_int("top_k", self.top_k)
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {p!r}")

    @property
    def greedy(self) -> bool:
        """0, or so small that float32 holds it as 0: the limit is greedy."""
        return self.temperature == 0.0 or self.temperature < torch.finfo(torch.float32).smallest_normal * 2**-23

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (B, V) a token is drawn from, for logits (B, V) (temperature > 0)."""
        # Subtract the max before dividing: a tiny temperature then gives -inf (never NaN) to all but the best.
        logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / self.temperature
        if self.top_k is not None:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked above each one
            drop_sorted = before >= self.top_p  # keeps the smallest set reaching top_p, and always the first
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token (B, 1) of each row, from the last position's logits (B, V)."""
        if self.greedy:  # the argmax, the first index of a tie as argmax gives it, by max's faster CPU kernel
            return logits.max(dim=-1, keepdim=True).indices
        return torch.multinomial(self.probabilities(logits), 1, generator=self.generator)

    def guess(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """A draft's guess from its logits (V,), and the distribution q (V,) it was drawn from (None: greedy)."""
        if self.greedy:
            return int(logits.argmax()), None
        q = self.probabilities(logits[None])[0]
        return int(torch.multinomial(q, 1, generator=self.generator)), q

    def verify(self, logits: torch.Tensor, guesses: list[int], qs: list[torch.Tensor] | None) -> list[int]:
        """What one pass over ``guesses`` yields: the guesses kept, then one token of the model's own.

        ``logits`` (G + 1, V): the model's at each guess and after the last; ``qs``: the distribution each guess
        was drawn from (None: point masses, or greedy). Greedy keeps a guess only if it is the argmax."""
        kept: list[int] = []
        for i, x in enumerate(guesses):
            if self.greedy:
                best = int(logits[i].argmax())
                if best != x:
                    return [*kept, best]
            else:
                instead = self.accept(self.probabilities(logits[i : i + 1])[0], qs[i] if qs else None, x)
                if instead is not None:
                    return [*kept, instead]
            kept.append(x)
        return [*kept, int(self.draw(logits[len(guesses) :][:1]))]

    def accept(self, p: torch.Tensor, q: torch.Tensor | None, x: int) -> int | None:
        """None if guess x is kept against p (V,); else the token drawn instead."""
        q_x = 1.0 if q is None else float(q[x])
        u = float(torch.rand((), generator=self.generator))
        if q_x > 0 and u < min(1.0, float(p[x]) / q_x):
            return None
        if q is None:
            rest = p.clone()
            rest[x] = 0.0
        else:
            rest = (p - q).clamp(min=0.0)
        if float(rest.sum()) <= 0:  # p == q: a refusal has probability 0; numerically, draw from p
            rest = p
        return int(torch.multinomial(rest / rest.sum(), 1, generator=self.generator))
