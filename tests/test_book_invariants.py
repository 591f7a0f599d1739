"""Invariants the chapter states, on its classes: beyond the printed numbers."""

from __future__ import annotations

import pytest
import torch

from attnlab import book


def test_softmax_naive_overflows_where_stable_does_not() -> None:
    scores = torch.tensor([1000.0, 999.0, 998.0])
    assert torch.isnan(book.softmax_naive(scores)).any()
    stable = book.softmax_stable(scores)
    assert torch.isfinite(stable).all()
    torch.testing.assert_close(stable, torch.softmax(scores, dim=0))


def test_weight_rows_sum_to_one() -> None:
    torch.manual_seed(0)
    x = torch.rand(3, 7, 5)
    _, attn_weights, _ = book.all_context_vectors(x[0])
    torch.testing.assert_close(attn_weights.sum(-1), torch.ones(7))
    mha = book.MultiHeadAttention(5, 8, 7, 0.0, num_heads=2)
    from attnlab.observe import Recorder

    with Recorder() as rec:
        mha(x)
    weights = rec.get("attn_weights")
    assert weights.shape == (3, 2, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 7))


@pytest.mark.parametrize("cls", ["CausalAttention", "MultiHeadAttention"])
def test_causal_upper_triangle_is_exactly_zero(cls: str) -> None:
    from attnlab.observe import Recorder

    torch.manual_seed(1)
    module = (
        book.CausalAttention(4, 6, 10, 0.0) if cls == "CausalAttention" else book.MultiHeadAttention(4, 6, 10, 0.0, 3)
    )
    with Recorder() as rec:
        module(torch.rand(2, 8, 4))
    weights = rec.get("attn_weights")
    upper = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)
    assert (weights[..., upper] == 0).all()
    assert (weights[..., ~upper] > 0).all()


@pytest.mark.parametrize("t", [0, 3, 6])
def test_future_tokens_do_not_change_the_past(t: int) -> None:
    torch.manual_seed(2)
    x = torch.rand(2, 8, 4)
    changed = x.clone()
    changed[:, t + 1 :] = torch.rand_like(changed[:, t + 1 :]) * 10
    for module in (
        book.CausalAttention(4, 6, 8, 0.0),
        book.MultiHeadAttentionWrapper(4, 3, 8, 0.0, num_heads=2),
        book.MultiHeadAttention(4, 6, 8, 0.0, num_heads=2),
    ):
        before, after = module(x), module(changed)
        assert torch.equal(before[:, : t + 1], after[:, : t + 1])
        assert not torch.allclose(before[:, t + 1 :], after[:, t + 1 :])


def test_dropout_identity_in_eval_and_scaled_in_train() -> None:
    torch.manual_seed(3)
    p = 0.3
    mha = book.MultiHeadAttention(8, 8, 64, p, num_heads=2)
    x = torch.rand(4, 64, 8)
    mha.eval()
    mha_ref = book.MultiHeadAttention(8, 8, 64, 0.0, num_heads=2)
    mha_ref.load_state_dict(mha.state_dict())
    torch.testing.assert_close(mha(x), mha_ref(x))

    from attnlab.observe import Recorder

    mha.train()
    with Recorder() as rec:
        mha(x)
    weights, dropped = rec.get("attn_weights"), rec.get("dropped_weights")
    visible = weights > 0  # dropout only matters where the causal mask lets weight through
    zeroed = (dropped == 0) & visible
    fraction = zeroed.sum().item() / visible.sum().item()
    assert abs(fraction - p) < 0.02  # ~33k visible weights: 4 sigma is about 0.01
    survivors = visible & ~zeroed
    torch.testing.assert_close(dropped[survivors], weights[survivors] / (1 - p))


def test_state_dict_names_shapes_and_order_match_the_book() -> None:
    mha = book.MultiHeadAttention(3, 4, 6, 0.0, num_heads=2)
    # Creation order, which fixes what a seed draws: W_query, W_key, W_value, out_proj.
    assert [name for name, _ in mha.named_parameters()] == [
        "W_query.weight",
        "W_key.weight",
        "W_value.weight",
        "out_proj.weight",
        "out_proj.bias",
    ]
    # PyTorch lists a module's own buffers before its children's entries.
    assert list(mha.state_dict()) == [
        "mask",
        "W_query.weight",
        "W_key.weight",
        "W_value.weight",
        "out_proj.weight",
        "out_proj.bias",
    ]
    assert mha.state_dict()["mask"].shape == (6, 6)
    ca = book.CausalAttention(3, 2, 6, 0.0, qkv_bias=True)
    assert list(ca.state_dict()) == [
        "mask",
        "W_query.weight",
        "W_query.bias",
        "W_key.weight",
        "W_key.bias",
        "W_value.weight",
        "W_value.bias",
    ]
    wrapper = book.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
    assert list(wrapper.state_dict())[:4] == [
        "heads.0.mask",
        "heads.0.W_query.weight",
        "heads.0.W_key.weight",
        "heads.0.W_value.weight",
    ]


def test_state_dicts_load_both_ways() -> None:
    torch.manual_seed(4)
    a = book.MultiHeadAttention(6, 6, 12, 0.0, num_heads=3)
    b = book.MultiHeadAttention(6, 6, 12, 0.0, num_heads=3)
    x = torch.rand(2, 12, 6)
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x))
    a.load_state_dict(b.state_dict(), strict=True)


def test_mha_with_one_head_equals_causal_attention_plus_projection() -> None:
    torch.manual_seed(5)
    ca = book.CausalAttention(4, 6, 8, 0.0)
    mha = book.MultiHeadAttention(4, 6, 8, 0.0, num_heads=1)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(getattr(ca, name).weight)
        mha.out_proj.weight.copy_(torch.eye(6))
        mha.out_proj.bias.zero_()
    x = torch.rand(2, 8, 4)
    torch.testing.assert_close(mha(x), ca(x))


def test_weight_transfer_v2_to_v1() -> None:
    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    sa_v1 = book.SelfAttentionV1(3, 2)
    inputs = book.embedded_inputs()
    assert not torch.allclose(sa_v1(inputs), sa_v2(inputs))
    book.transfer_v2_to_v1(sa_v2, sa_v1)
    torch.testing.assert_close(sa_v1(inputs), sa_v2(inputs))


def test_weight_transfer_refuses_bias_and_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="qkv_bias=False"):
        book.transfer_v2_to_v1(book.SelfAttentionV2(3, 2, qkv_bias=True), book.SelfAttentionV1(3, 2))
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(3, 2\)"):
        book.transfer_v2_to_v1(book.SelfAttentionV2(3, 4), book.SelfAttentionV1(3, 2))


def test_seed_gives_same_weights_across_classes() -> None:
    torch.manual_seed(123)
    w = book.trainable_walkthrough(book.embedded_inputs(), seed=123)
    torch.manual_seed(123)
    sa_v1 = book.SelfAttentionV1(3, 2)
    assert torch.equal(sa_v1.W_query.data, w.W_query)
    assert torch.equal(sa_v1.W_value.data, w.W_value)
