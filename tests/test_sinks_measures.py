"""The sink measures (explain/sinks/measures.py) on constructions whose answers are known by hand, and a whole
model read by them (explain/sinks/reading.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.explain.heads import head_scores, probe
from attnlab.explain.sinks import (
    THRESHOLDS,
    first_token_share,
    first_token_share_loop,
    gu_score,
    learned_sink_share,
    read_gpt,
    residual_peak,
    sink_rate,
    value_norm_ratio,
)
from attnlab.models import GPT, GPTConfig


def _on_first(t: int) -> torch.Tensor:
    """A head wired to attend only to token 0: every row puts all of its weight there."""
    w = torch.zeros(t, t)
    w[:, 0] = 1.0
    return w


def _uniform_causal(t: int) -> torch.Tensor:
    """A causal head spread evenly: row i gives 1 / (i + 1) to each of keys 0..i."""
    return torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]


def test_a_head_on_the_first_token_has_a_share_of_1() -> None:
    assert first_token_share(_on_first(7)).item() == 1.0
    assert gu_score(_on_first(7)).item() == 1.0


def test_a_uniform_row_of_t_keys_gives_1_over_t() -> None:
    # every row sees all T keys evenly (no mask): each row's share is 1/T, so the mean is too
    t = 8
    assert first_token_share(torch.full((t, t), 1 / t)).item() == pytest.approx(1 / 8)
    # causal and uniform: row i gives 1/(i + 1); the mean over rows 1..7 of 1/2, 1/3, ..., 1/8, by hand
    by_hand = (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5 + 1 / 6 + 1 / 7 + 1 / 8) / 7
    assert first_token_share(_uniform_causal(t)).item() == pytest.approx(by_hand)
    # Gu et al.'s score counts row 0 (1) among all 8 rows
    assert gu_score(_uniform_causal(t)).item() == pytest.approx((1 + 7 * by_hand) / 8)


def test_a_head_on_the_previous_token_has_a_share_of_only_its_first_row() -> None:
    w = torch.zeros(5, 5)
    w[0, 0] = 1.0
    w[torch.arange(1, 5), torch.arange(0, 4)] = 1.0  # row i on key i - 1: only row 1 lands on token 0
    assert first_token_share(w).item() == pytest.approx(1 / 4)


def test_of_row_divides_weights_that_are_no_distribution() -> None:
    w = torch.tensor([[2.0, 0.0, 0.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # ReLU-like rows: sums 4 and 0
    assert first_token_share(w, of_row=True).item() == pytest.approx((3 / 4 + 0.0) / 2)
    assert first_token_share(w).item() == pytest.approx((3.0 + 0.0) / 2)  # the raw mass, as the heads read it
    soft = torch.softmax(torch.randn(2, 3, 6, 6), dim=-1)
    assert torch.allclose(first_token_share(soft, of_row=True), first_token_share(soft))


@pytest.mark.parametrize("of_row", [False, True])
def test_the_fast_form_agrees_with_the_loop(of_row: bool) -> None:
    w = torch.relu(torch.randn(3, 2, 9, 9, generator=torch.Generator().manual_seed(0))).tril()
    assert torch.allclose(first_token_share(w, of_row=of_row), first_token_share_loop(w, of_row=of_row))


def test_sink_rate_counts_heads_above_each_papers_threshold() -> None:
    assert THRESHOLDS["gu"].value == 0.3  # Gu et al.'s epsilon, from their code
    scores = torch.tensor([[0.1, 0.31], [0.29, 0.9]])
    assert sink_rate(scores, "gu") == 0.5
    assert sink_rate(scores, "attnlab") == 0.25  # above 0.4: one head


def test_value_norm_ratio_and_residual_peak_by_construction() -> None:
    values = torch.ones(1, 2, 4, 3)  # (B, Hkv, T, D)
    values[0, 0, 0] *= 0.1  # head 0: the first token's value a tenth of the others'
    assert value_norm_ratio(values)[0].tolist() == pytest.approx([0.1, 1.0])
    hidden = torch.ones(2, 5, 6)
    hidden[1, 0, 4] = -300.0  # a massive activation on token 0, channel 4, second row
    peak = residual_peak(hidden)
    assert (peak.value, peak.position, peak.channel, peak.median) == (300.0, 0, 4, 1.0)
    assert peak.ratio == 300.0
    row_norm = math.sqrt(5 + 300.0**2)
    assert peak.norm_ratio == pytest.approx((1.0 + row_norm / math.sqrt(6)) / 2)


def test_learned_sink_share_is_the_mean_per_head() -> None:
    recorded = torch.tensor([[[0.2, 0.4], [0.0, 1.0]]])  # (B, H, T)
    assert learned_sink_share(recorded).tolist() == pytest.approx([0.3, 0.5])


def test_bad_input_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"\(\.\.\., T, T\)"):
        first_token_share(torch.ones(3, 4))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        first_token_share(torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"threshold must be one of \['gu', 'attnlab'\]"):
        sink_rate(torch.ones(2), "xiao")
    with pytest.raises(ValueError, match=r"T >= 2"):
        residual_peak(torch.ones(1, 1, 4))
    with pytest.raises(ValueError, match="tokens must be"):
        read_gpt(GPT(GPTConfig(vocab_size=16, context_length=8, emb_dim=8, n_heads=2, n_layers=1)), torch.ones(4))


def test_a_model_read_whole_agrees_with_the_head_scores_and_its_own_parts() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0, rope=True)
    model = GPT(config).eval()
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    reading = read_gpt(model, tokens)
    weights = model.attention_weights(tokens)  # (L, B, H, T, T)
    torch.testing.assert_close(torch.tensor(reading.first_token), first_token_share(weights).mean(dim=1))
    scores = head_scores(model, half=6, batch=2)  # the head scores' first-token column is the same measure
    on_probe = model.attention_weights(probe(32, half=6, batch=2)).mean(dim=1)  # (L, H, T, T), as heads.py averages
    torch.testing.assert_close(torch.tensor(scores.first_token), first_token_share(on_probe))
    # the values the hook read are the layer's own: layer 0's from its input, by hand
    x = model.trf_blocks[0].norm1(model.tok_emb(tokens))  # (B, T, E): what layer 0's attention receives
    _, _, v = model.trf_blocks[0].att.split_qkv(x)  # (B, Hkv, T, D)
    torch.testing.assert_close(torch.tensor(reading.value_ratio[0]), value_norm_ratio(v).mean(dim=0))
    assert len(reading.peaks) == 2 and reading.learned_sink is None


def test_a_learned_sink_is_read_apart_from_the_first_token() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=1, sinks=True, rope=True)
    model = GPT(config).eval()
    with torch.no_grad():
        model.trf_blocks[0].att.sinks.fill_(5.0)  # a sink logit far above the scores: it takes most of each row
    reading = read_gpt(model, torch.randint(0, 32, (1, 10), generator=torch.Generator().manual_seed(2)))
    assert reading.learned_sink is not None and min(reading.learned_sink[0]) > 0.5
    assert max(reading.first_token[0]) < 0.5  # the token-0 mass is what is left, not the sink's


def test_gus_score_on_proxy_weights_divides_each_row_by_its_sum() -> None:
    """Gu et al.'s proxy weights for sigmoid heads: rows scaled any way give the score of the normalised rows
    ((1 + 1/2 + 1/4) / 3 here), and a row that gives nothing counts 0."""
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.5, 0.25]])
    scaled = rows * torch.tensor([[0.3], [1.7], [2.0]])
    assert gu_score(scaled, of_row=True).item() == pytest.approx(1.75 / 3)
    assert gu_score(scaled).item() == pytest.approx((0.3 + 0.85 + 0.5) / 3)
    assert gu_score(rows * torch.tensor([[1.0], [0.0], [1.0]]), of_row=True).item() == pytest.approx(1.25 / 3)
