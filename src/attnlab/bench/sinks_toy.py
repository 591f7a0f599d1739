"""The Bigram-Backcopy task and the small transformer it trains (Guo et al. 2024, arXiv 2410.13835).

The task, as attnlab draws it (the paper's name and setting; its bigram table and sizes are ours):

- ``VOCAB`` ordinary tokens and a beginning-of-sequence token ``BOS`` (= VOCAB), which starts every sequence;
- a bigram table: row a is the next-token distribution after token a, the softmax of Gaussian logits (scale 2),
  drawn once from the task's seed;
- ``TRIGGERS`` trigger tokens, the most frequent under the table (the authors' README: "fixed triggers,
  chosen as the most frequent tokens", k = 3);
- after a trigger the next token copies the token before the trigger ("backcopy"); after any other token it
  is drawn from the bigram table. The first token after BOS is drawn evenly from the tokens that are not
  triggers.

So a head has work only at a trigger (look one token back and copy); everywhere else the bigram of the
current token, which the MLP can hold, says all. The paper's claim is that with softmax such a head, with
nothing to do, pours its weight on BOS (an attention sink, "dormant"), and BOS's value shrinks (a value
drain) while its residual norm grows (a residual peak).

The model: ``layers`` pre-norm blocks of one head each, learned positions, an MLP of 4x, written out by hand
so that the attention's normalisation is one switch (``ATTENTIONS``): softmax; ReLU of the scores, no
normalisation (a row may give nothing); sigmoid of the scores, no normalisation (Gu et al.'s "sigmoid
attention without normalization"; their bias term is left out here).

Shapes: B = batch, T = tokens, E = width, V = vocabulary (VOCAB + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32
BOS = VOCAB
TRIGGERS = 3
ATTENTIONS = ("softmax", "relu", "sigmoid")


@dataclass(frozen=True)
class BigramBackcopy:
    """The task: its bigram table (V - 1, V - 1) and trigger tokens, drawn from ``seed``."""

    table: torch.Tensor
    triggers: tuple[int, ...]

    @classmethod
    def make(cls, *, seed: int = 0) -> BigramBackcopy:
        generator = torch.Generator().manual_seed(seed)
        table = torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, generator=generator), dim=-1)  # (V - 1, V - 1)
        stationary = torch.full((VOCAB,), 1.0 / VOCAB)
        for _ in range(200):  # the chain's long-run frequencies, by power iteration
            stationary = stationary @ table
        triggers = tuple(sorted(stationary.topk(TRIGGERS).indices.tolist()))
        return cls(table, triggers)

    def is_trigger(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.isin(tokens, torch.tensor(self.triggers))

    def batch(self, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """(B, length + 1) sequences: BOS, then ``length`` tokens by the task's rule."""
        plain = torch.tensor([t for t in range(VOCAB) if t not in self.triggers])
        seq = torch.empty(batch, length + 1, dtype=torch.long)
        seq[:, 0] = BOS
        seq[:, 1] = plain[torch.randint(0, plain.numel(), (batch,), generator=generator)]
        for t in range(1, length):
            drawn = torch.multinomial(self.table[seq[:, t]], 1, generator=generator)[:, 0]  # (B,)
            seq[:, t + 1] = torch.where(self.is_trigger(seq[:, t]), seq[:, t - 1], drawn)
        return seq


def normalise(scores: torch.Tensor, attention: str) -> torch.Tensor:
    """Causal weights (B, T, T) from scores (B, T, T): softmax, or ReLU or sigmoid with no normalisation."""
    t = scores.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    if attention == "softmax":
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    if attention == "relu":
        return torch.relu(scores).masked_fill(future, 0.0)
    if attention == "sigmoid":
        return torch.sigmoid(scores).masked_fill(future, 0.0)
    raise ValueError(f"attention must be one of {list(ATTENTIONS)}, got {attention!r}")


class Block(nn.Module):
    """One pre-norm block: one head of attention, then an MLP; each added to the residual stream."""

    def __init__(self, *, width: int, attention: str) -> None:
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.W_query = nn.Linear(width, width, bias=False)
        self.W_key = nn.Linear(width, width, bias=False)
        self.W_value = nn.Linear(width, width, bias=False)
        self.out_proj = nn.Linear(width, width, bias=False)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def attend(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(context (B, T, E), weights (B, T, T), values (B, T, E)) of x (B, T, E)."""
        h = self.norm1(x)
        queries, keys, values = self.W_query(h), self.W_key(h), self.W_value(h)  # each (B, T, E)
        scores = queries @ keys.transpose(1, 2) / keys.shape[-1] ** 0.5  # (B, T, T)
        weights = normalise(scores, self.attention)
        return weights @ values, weights, values

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the block's output (B, T, E), its weights (B, T, T), its values (B, T, E))."""
        context, weights, values = self.attend(x)
        x = x + self.out_proj(context)
        return x + self.ff(self.norm2(x)), weights, values


class Toy(nn.Module):
    """The small transformer of the Bigram-Backcopy runs."""

    def __init__(self, *, layers: int, width: int, length: int, attention: str) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {list(ATTENTIONS)}, got {attention!r}")
        self.tok_emb = nn.Embedding(VOCAB + 1, width)
        self.pos_emb = nn.Embedding(length, width)
        self.blocks = nn.ModuleList([Block(width=width, attention=attention) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(width)
        self.out_head = nn.Linear(width, VOCAB + 1, bias=False)

    def forward(
        self, ids: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """(logits (B, T, V), and per layer: weights (B, T, T), values (B, T, E), the output (B, T, E))."""
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1], device=ids.device))  # (B, T, E)
        weights, values, outputs = [], [], []
        for block in self.blocks:
            x, w, v = block(x)
            weights.append(w)
            values.append(v)
            outputs.append(x)
        return self.out_head(self.final_norm(x)), weights, values, outputs

    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        logits = self(seq[:, :-1])[0]  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
