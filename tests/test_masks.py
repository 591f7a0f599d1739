"""Masks: one convention (True = may attend), alignment, windows, empty rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.functional import (
    Visibility,
    attention,
    causal_mask,
    from_torch_mha_masks,
    padding_mask,
    sliding_window_mask,
)
from conftest import tiles

BACKENDS = ["eager", "sdpa", "flash"]


def test_causal_mask_is_bottom_right_and_matches_sdpa_when_square() -> None:
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    # Two queries over five keys: the last query sees all five keys.
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    top_left = Visibility.from_lengths(2, 5, q_start=0, causal=True).tile(0, 2, 0, 5)[0]
    assert top_left is not None and top_left[0, 0].tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
    ]
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    torch.testing.assert_close(
        attention(q, k, v, is_causal=True, backend="eager"), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_left_on_request_equals_sdpa_is_causal(backend: str) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    top_left = Visibility.from_lengths(3, 7, q_start=0, causal=True)  # queries at 0, 1, 2: SDPA's convention
    got = attention(q, k, v, visibility=top_left, backend=backend)
    torch.testing.assert_close(got, expected)


def test_sliding_window_mask() -> None:
    m = sliding_window_mask(5, 5, 2)
    assert m.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [False, True, True, False, False],
        [False, False, True, True, False],
        [False, False, False, True, True],
    ]
    assert (m.sum(-1) <= 2).all()
    # Decoding one query at position 9 with window 3 sees keys 7, 8, 9.
    assert sliding_window_mask(1, 10, 3)[0].nonzero().flatten().tolist() == [7, 8, 9]


def test_padding_mask_left_and_right() -> None:
    lengths = torch.tensor([3, 1])
    assert padding_mask(lengths, 4)[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert padding_mask(lengths, 4, left=True)[:, 0, 0].tolist() == [
        [False, True, True, True],
        [False, False, False, True],
    ]
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, max_len=4\], got \[5, 1\]"):
        padding_mask(torch.tensor([5, 1]), 4)


def test_from_torch_mha_masks_inverts_booleans_and_keeps_floats() -> None:
    torch_causal = torch.ones(3, 3, dtype=torch.bool).triu(1)  # nn.MultiheadAttention: True = masked out
    assert torch.equal(from_torch_mha_masks(torch_causal), causal_mask(3, 3))
    kpm = torch.tensor([[False, False, True]])  # True = padding
    assert from_torch_mha_masks(key_padding_mask=kpm).tolist() == [[[[True, True, False]]]]
    both = from_torch_mha_masks(torch_causal, kpm)
    assert both is not None and both.shape == (1, 1, 3, 3) and not both[0, 0, 2, 2]
    additive = torch.tensor([[0.0, -1.0, float("-inf")]]).expand(3, 3)
    mixed = from_torch_mha_masks(additive, kpm)
    assert mixed is not None and mixed.dtype == torch.float32
    assert mixed[0, 0, 0].tolist() == [0.0, -1.0, float("-inf")]
    assert from_torch_mha_masks() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_masks_combine(backend: str) -> None:
    torch.manual_seed(1)
    b, h, t, d = 2, 2, 9, 8
    q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    pad = padding_mask(torch.tensor([9, 6]), t, left=True)
    extra = torch.rand(t, t) > 0.2
    expected_allowed = causal_mask(t, t) & sliding_window_mask(t, t, 4) & pad & extra
    reference = attention(q, k, v, mask=expected_allowed, backend="eager")
    got = attention(q, k, v, mask=pad & extra, is_causal=True, window=4, backend=backend)
    torch.testing.assert_close(got, reference)
    _, weights = attention(q, k, v, mask=pad & extra, window=4, backend="eager", return_weights=True)
    assert (weights[~expected_allowed.expand_as(weights)] == 0).all()
    live_rows = expected_allowed.expand(b, h, t, t).any(-1)
    torch.testing.assert_close(weights.sum(-1)[live_rows], torch.ones(int(live_rows.sum())))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "float_inf", "padding_all", "causal_more_queries"])
def test_row_with_nothing_to_attend_gives_zero_without_nan(backend: str, kind: str) -> None:
    torch.manual_seed(2)
    tq, tk = (6, 4) if kind == "causal_more_queries" else (4, 4)
    q = torch.randn(2, 2, tq, 8, requires_grad=True)
    k, v = torch.randn(2, 2, tk, 8, requires_grad=True), torch.randn(2, 2, tk, 8, requires_grad=True)
    kw: dict = {}
    dead = torch.zeros(2, 2, tq, dtype=torch.bool)
    if kind == "bool":
        m = torch.ones(tq, tk, dtype=torch.bool)
        m[1] = False
        kw["mask"], dead[:, :, 1] = m, True
    elif kind == "float_inf":
        m = torch.zeros(tq, tk)
        m[2] = float("-inf")
        kw["mask"], dead[:, :, 2] = m, True
    elif kind == "padding_all":
        kw["mask"], dead[1] = padding_mask(torch.tensor([4, 0]), tk), True
    else:  # bottom-right: queries 0 and 1 sit before the first key
        kw["is_causal"], dead[:, :, :2] = True, True
    out = attention(q, k, v, backend=tiles(backend, 2, 2), **kw)
    assert torch.isfinite(out).all()
    assert (out[dead] == 0).all()
    assert (out[~dead] != 0).any()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert (q.grad[dead] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_logits_stay_finite(backend: str) -> None:
    q = torch.tensor([[[[1e4, 0.0], [-1e4, 0.0], [0.0, 1e4]]]])  # (1, 1, 3, 2)
    k = torch.tensor([[[[1e4, 0.0], [-1e4, 0.0], [0.0, -1e4]]]])
    v = torch.randn(1, 1, 3, 2)
    out = attention(q, k, v, backend=backend)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])  # scores of 7e7 pick key 0 outright
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_emptied_only_by_combining_masks_gives_zero(backend: str) -> None:
    """Window and bool mask leave key 3 open for the last query; the float mask closes it."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    bias = torch.zeros(4, 4)
    bias[3, 3] = float("-inf")
    out = attention(q, k, v, mask=bias, window=1, backend=tiles(backend, 2, 2))
    assert torch.isfinite(out).all()
    assert (out[:, :, 3] == 0).all() and (out[:, :, :3] != 0).any()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
