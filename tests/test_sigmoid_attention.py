"""Sigmoid attention without normalisation (functional/sigmoid.py; Gu et al. 2024): the fast form against the
readable one, a known answer by hand, the option's path through Attention and GPTConfig, its effect on a model's
logits, and the refusals."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention
from attnlab.functional.sigmoid import sigmoid_attention, sigmoid_attention_loop
from attnlab.models import GPT, GPTConfig
from attnlab.observe import Recorder

SMALL = GPTConfig(vocab_size=32, context_length=16, emb_dim=16, n_heads=4, n_layers=2, drop_rate=0.0, rope=True)


def _causal(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def test_the_fast_form_is_the_readable_one_with_grouped_heads() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 6, 8, dtype=torch.float64), torch.randn(2, 2, 6, 5, dtype=torch.float64)
    fast = sigmoid_attention(q, k, v, is_causal=True)
    slow = sigmoid_attention_loop(q, k, v, allowed=_causal(6), scale=8**-0.5)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)


def test_zero_scores_give_each_visible_key_one_half_and_rows_are_not_normalised() -> None:
    """q = 0: every score is 0, every visible key weighs sigmoid(0) = 1/2, a hidden one 0; row i's context is
    half the sum of values 0..i (a softmax row would be their mean)."""
    v = torch.arange(1.0, 6.0).reshape(1, 1, 5, 1)  # values 1..5
    q = k = torch.zeros(1, 1, 5, 3)
    with Recorder(names=["attn_weights"]) as rec:
        out = sigmoid_attention(q, k, v, is_causal=True)
    assert out[0, 0, :, 0].tolist() == [0.5, 1.5, 3.0, 5.0, 7.5]
    weights = rec.get("attn_weights")[0, 0]
    assert torch.equal(weights, 0.5 * _causal(5).float())
    assert weights.sum(dim=-1).tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]


def test_attention_with_sigmoid_is_the_readable_form_through_its_projections() -> None:
    torch.manual_seed(1)
    att = Attention(d_in=16, num_heads=4, num_kv_heads=2, normalize="sigmoid").double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    q, k, v = att.split_qkv(x)  # (B, H, T, D), (B, Hkv, T, D) each
    context = sigmoid_attention_loop(q, k, v, allowed=_causal(7), scale=4**-0.5)  # (B, H, T, D)
    expected = att.out_proj(context.transpose(1, 2).reshape(2, 7, 16))  # (B, T, H * D)
    torch.testing.assert_close(att(x), expected, rtol=1e-10, atol=1e-10)


def test_a_gpt_with_sigmoid_moves_its_logits_and_shows_unnormalised_weights() -> None:
    """The option's effect: the same weights with softmax and with sigmoid give other logits; the sigmoid model's
    recorded rows do not sum to 1 and row 0 is the sigmoid of its one score, not 1."""
    torch.manual_seed(2)
    soft = GPT(SMALL)
    sig = GPT(SMALL.with_(attn_normalize="sigmoid"))
    sig.load_state_dict(soft.state_dict())  # the same parameters: sigmoid adds none
    ids = torch.randint(0, 32, (2, 9))
    with torch.no_grad():
        assert (soft(ids) - sig(ids)).abs().max() > 1e-3
        weights = sig.attention_weights(ids)  # (L, B, H, T, T)
    assert torch.allclose(soft.attention_weights(ids).sum(dim=-1), torch.ones(2, 2, 4, 9))
    assert (weights.sum(dim=-1) - 1).abs().max() > 0.1
    assert bool(((weights[..., 0, 0] > 0) & (weights[..., 0, 0] < 1)).all())
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # the future still hidden


def test_sigmoid_trains_with_finite_gradients_and_round_trips_its_config() -> None:
    torch.manual_seed(3)
    model = GPT(SMALL.with_(attn_normalize="sigmoid"))
    ids = torch.randint(0, 32, (2, 12))
    model(ids).logsumexp(dim=-1).mean().backward()
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in model.parameters())
    assert GPTConfig.from_dict(model.config.to_dict()).attn_normalize == "sigmoid"


def test_bad_normalisations_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match=r"attn_normalize must be 'softmax' or 'sigmoid', got 'relu'"):
        GPTConfig(vocab_size=8, context_length=8, emb_dim=8, n_heads=2, n_layers=1, attn_normalize="relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"attn_normalize='sigmoid' is attnlab's own.*sinks=True"):
        SMALL.with_(attn_normalize="sigmoid", sinks=True)
    with pytest.raises(ValueError, match=r"normalize must be one of \['softmax', 'sigmoid'\].*got 'exp'"):
        Attention(d_in=8, num_heads=2, normalize="exp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"backend='sdpa'"):
        Attention(d_in=8, num_heads=2, normalize="sigmoid", backend="sdpa")
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        sigmoid_attention(torch.zeros(2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))


def test_a_sigmoid_gpt_generates_with_its_cache_what_its_full_forward_picks() -> None:
    """The cache path reaches the sigmoid kernel too: 8 greedy tokens decoded with the KV cache are the argmax of
    the full forward at each step (a cache read as softmax would pick others)."""
    torch.manual_seed(4)
    model = GPT(SMALL.with_(attn_normalize="sigmoid")).eval()
    prompt = torch.randint(0, 32, (1, 4))
    out = model.generate(prompt, 8)
    ids = prompt
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_the_ring_refuses_sigmoid_attention_rather_than_run_softmax() -> None:
    from attnlab.distributed import ContextParallelAttention

    ring = ContextParallelAttention.from_attention(Attention(d_in=16, num_heads=2, normalize="sigmoid"))
    with pytest.raises(ValueError, match=r"runs softmax attention only: run sigmoid attention in one process"):
        ring(torch.randn(1, 4, 16))


@torch.no_grad()
def test_an_evicting_cache_on_a_sigmoid_model_weighs_its_keys_by_the_sigmoid_weights_the_layer_gave() -> None:
    """H2O keeps the keys that earned the most attention: on a sigmoid layer that is the sigmoid weights the layer
    gave (a Recorder's "attn_weights"), not the softmax of the same scores, whose rows sum to 1."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)
    model = GPT(config.with_(attn_normalize="sigmoid")).eval()
    caches = model.make_caches(batch_size=1, max_len=32, cache="h2o")
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    with Recorder(names=["attn_weights"]) as rec:
        model(ids, caches=caches)
    weights = rec.get("attn_weights")  # (B, H, T, T): what the sigmoid layer gave each key
    scores = caches[0].scores[:, :12]  # (B, S): the attention each key earned, as the cache summed it
    torch.testing.assert_close(scores, weights.float().sum(dim=(1, 2)), rtol=1e-5, atol=1e-5)
    assert float(scores.sum()) != pytest.approx(12 * 4)  # softmax rows would give each query's heads 1 apiece
