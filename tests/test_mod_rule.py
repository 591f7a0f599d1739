"""How a model's own mask and a user's mask_mod compose (docs/mods.md, "A model's own mask and yours"; issue 54
item 3): a mod restricts the causal rule (AND), unless it declares that it shows keys the causal rule hides
(``prefix_lm``, ``or_masks``/``and_masks`` holding one, a function with ``sees_future = True``); then it takes
the causal rule's place on a forward without a cache, and is refused by name where it cannot (a cache, a
transformers model)."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention
from attnlab.functional import mods
from attnlab.models import GPT, GPTConfig

T, PREFIX = 8, 5


def by_hand(window: int | None = None) -> torch.Tensor:
    """(T, T) bool, True = may attend: the first PREFIX keys seen by every query, the rest causal; written out
    row by row, not computed by attnlab."""
    rows = []
    for i in range(T):
        row = [j < PREFIX or j <= i for j in range(T)]
        if window is not None:
            row = [ok and i - j < window for j, ok in enumerate(row)]
        rows.append(row)
    return torch.tensor(rows)


def plain_attention(module: Attention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The module's projections, then softmax(q k^T / sqrt(D) masked) v in float64, then out_proj: plain torch."""
    q, k, v = (t.double() for t in module.split_qkv(x))  # (B, H, T, D)
    scores = q @ k.transpose(-1, -2) / module.head_dim**0.5
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    context = (weights @ v).transpose(1, 2).reshape(x.shape[0], T, -1)  # (B, T, H * D)
    return module.out_proj(context.float())


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash"])
@pytest.mark.parametrize("window", [None, 3])
def test_prefix_lm_takes_the_causal_rules_place_in_a_causal_layer(backend: str, window: int | None) -> None:
    torch.manual_seed(0)
    module = Attention(d_in=16, num_heads=2, window=window, backend=backend)
    x = torch.randn(2, T, 16)
    got = module(x, mask_mod=mods.prefix_lm(PREFIX))
    torch.testing.assert_close(got, plain_attention(module, x, by_hand(window)), rtol=1e-5, atol=1e-5)
    causal = plain_attention(module, x, by_hand(window) & torch.ones(T, T, dtype=torch.bool).tril())
    assert not torch.allclose(got[:, :PREFIX], causal[:, :PREFIX], atol=1e-3)  # it did show the later prefix keys


def test_a_mod_that_restricts_still_composes_with_causal_and_a_declared_function_replaces_it() -> None:
    torch.manual_seed(0)
    module = Attention(d_in=16, num_heads=2, backend="eager")
    x = torch.randn(1, T, 16)
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def near(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx - kv_idx).abs() < 3  # shows two later keys, but says nothing: it restricts causal

    near_by_hand = torch.tensor([[abs(i - j) < 3 for j in range(T)] for i in range(T)])
    torch.testing.assert_close(module(x, mask_mod=near), plain_attention(module, x, near_by_hand & causal))
    near.sees_future = True  # type: ignore[attr-defined]  # declared: it is the rule now
    torch.testing.assert_close(module(x, mask_mod=near), plain_attention(module, x, near_by_hand))
    pad = mods.padding(torch.tensor([6]))  # a restriction, and with prefix_lm the pair shows the prefix
    both = mods.and_masks(mods.prefix_lm(PREFIX), pad)
    padded_by_hand = by_hand() & torch.tensor([j < 6 for j in range(T)])
    torch.testing.assert_close(module(x, mask_mod=both), plain_attention(module, x, padded_by_hand))
    assert mods.sees_future(mods.or_masks(mods.prefix_lm(2), mods.sliding_window(2)))
    assert not mods.sees_future(mods.or_masks(mods.padding(torch.tensor([3])), mods.causal()))


def gpt() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


@torch.no_grad()
def test_a_gpt_forward_honours_prefix_lm_and_a_cache_refuses_it_by_name() -> None:
    m, twin = gpt(), gpt()
    for block in twin.blocks:  # the same weights, not causal: the hand-written table is the whole rule
        block.att.is_causal = False
    table = by_hand()
    ids = torch.randint(0, 32, (2, T))
    got = m(ids, mask_mod=mods.prefix_lm(PREFIX))
    expected = twin(ids, mask_mod=lambda b, h, q_idx, kv_idx: table[q_idx, kv_idx])
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, m(ids), atol=1e-4)  # not the causal logits
    caches = m.make_caches(batch_size=2, max_len=16)
    with pytest.raises(ValueError, match=r"mask_mod prefix_lm\(prefix_len=5\) shows queries keys after them"):
        m(ids, caches=caches, mask_mod=mods.prefix_lm(PREFIX))
    assert caches[0].length == 0 and caches[1].length == 0


@pytest.mark.parametrize("rule", [{"is_causal": True}, {"window": 3}])
def test_the_functions_refuse_is_causal_beside_a_mod_that_sees_the_future(rule: dict[str, object]) -> None:
    """``attention(is_causal=True, mask_mod=prefix_lm(5))`` gave exactly the causal output (the two ANDed): a
    silent no-op. The functions, like the models, refuse it by name; without is_causal the mod acts."""
    q = k = v = torch.randn(1, 2, T, 4)
    from attnlab.functional import attention

    with pytest.raises(ValueError, match=r"mask_mod prefix_lm\(prefix_len=5\) shows queries keys after them.*ANDed"):
        attention(q, k, v, mask_mod=mods.prefix_lm(PREFIX), **rule)  # type: ignore[arg-type]
    alone = attention(q, k, v, mask_mod=mods.prefix_lm(PREFIX))
    causal = attention(q, k, v, is_causal=True)
    assert (alone - causal)[:, :, :PREFIX].abs().max() > 1e-3  # the prefix's rows see their later prefix keys
