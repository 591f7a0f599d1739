"""A left-padded batch on every cache: each row gets what it gets alone (issue 54, item 7).

The key padding mask ``generate`` builds is over positions; a cache that returns each sequence's own key
positions (an evicting cache keeps the keys it chooses, a paged layer beside a sliding one runs rows together)
reads it row by row.
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab.cache import CACHES
from attnlab.models import GPT, GPTConfig


def model(*, sliding: bool) -> GPT:
    torch.manual_seed(0)
    layers = {"layer_types": ("full", "sliding"), "window": 4} if sliding else {}
    config = GPTConfig(
        vocab_size=64,
        context_length=64,
        emb_dim=32,
        n_heads=4,
        n_layers=2,
        rope=True,
        drop_rate=0.0,
        backend="eager",
        **layers,
    )
    return GPT(config).eval()


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding-and-full"])
@pytest.mark.parametrize("name", list(CACHES))
@torch.no_grad()
def test_a_left_padded_batch_generates_what_each_row_generates_alone(name: str, sliding: bool) -> None:
    m = model(sliding=sliding)
    # an evicting cache's budget as a number of tokens: a fraction of max_len would differ with the batch's width
    cache = functools.partial(CACHES[name], budget=6) if name in ("h2o", "snapkv") else name
    short, long = prompt(5, seed=3), prompt(11, seed=4)
    idx = torch.tensor([[0] * 6 + short, long])
    mask = torch.tensor([[0] * 6 + [1] * 5, [1] * 11])
    alone = [m.generate(torch.tensor([p]), 6, cache=cache)[0, len(p) :].tolist() for p in (short, long)]
    out = m.generate(idx, 6, attention_mask=mask, cache=cache)[:, 11:].tolist()
    assert out == alone, name


@torch.no_grad()
def test_evicting_caches_evict_the_padding_first() -> None:
    """H2O over a padded row: the pads get no attention, so they go before any real token; the short row keeps
    every real token it would keep alone."""
    m = model(sliding=False)
    short, long = prompt(5, seed=3), prompt(11, seed=4)
    caches = m.make_caches(batch_size=2, max_len=16, cache="h2o")
    mask = torch.tensor([[0] * 6 + [1] * 5, [1] * 11])
    m(torch.tensor([[0] * 6 + short, long]), attention_mask=mask, caches=caches)
    layer = caches[0]
    assert layer.keys.shape[2] == 8  # half of max_len: the budget
    assert sorted(layer.evicted[0]) == [0, 1, 2]  # three of the six pad slots went, no real token
