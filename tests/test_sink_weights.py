"""Learned sinks (gpt-oss), issue 54 item 6: every recorded weight is what the softmax gave the key, and the sink's
share is recorded beside it as "sink_weight" (B, H, Tq), so each row sums to 1 - sink_weight. The same truth on
every path: the eager backend, ``attention(return_weights=True)``, ``head_weights`` from a fused kernel's
log-sum-exp, attnlab's own models (``GPT.attention_weights``), gpt-oss read by ``GPT.from_pretrained`` and run
through ``attnlab.hf``; each against the sink as gpt-oss writes it (a column appended to the scores, softmaxed,
dropped), in float64 here or in transformers' eager attention.

Also: a row that sees no key has a finite backward on the eager backend (no 0 * inf), zero for that row.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnlab.hf
from attnlab import Recorder
from attnlab.functional.attention import attention, flash_attention
from attnlab.functional.eager import head_weights
from attnlab.functional.visibility import Visibility
from attnlab.models import GPT, GPTConfig
from test_families import FAMILIES, IDS, hf_dir

G = torch.Generator().manual_seed(0)
Q = torch.randn(2, 4, 9, 8, dtype=torch.float64, generator=G)
K, V = (torch.randn(2, 2, 9, 8, dtype=torch.float64, generator=G) for _ in range(2))
SINKS = torch.randn(4, dtype=torch.float64, generator=G) + 1.0  # shares well inside (0, 1)
CAUSAL = torch.ones(9, 9, dtype=torch.bool).tril()


def appended(q: torch.Tensor, k: torch.Tensor, sinks: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """gpt-oss's softmax, written out: (B, H, Tq, Tk + 1), the last column the sink's share."""
    scores = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).mT / q.shape[-1] ** 0.5  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~allowed, float("-inf"))
    column = sinks[None, :, None, None].expand(*scores.shape[:3], 1)  # (B, H, Tq, 1)
    return torch.cat([scores, column], dim=-1).softmax(-1)


def test_eager_records_the_weights_the_softmax_gave_the_keys_and_the_sinks_share_beside() -> None:
    want = appended(Q, K, SINKS, CAUSAL)
    with Recorder(names=["attn_weights", "sink_weight"]) as rec:
        attention(Q, K, V, is_causal=True, sinks=SINKS, backend="eager")
    torch.testing.assert_close(rec.get("attn_weights"), want[..., :-1])
    torch.testing.assert_close(rec.get("sink_weight"), want[..., -1])
    assert rec.names() == ["sink_weight", "attn_weights"]  # the share first, as every path records it
    rows = rec.get("attn_weights").sum(-1)
    torch.testing.assert_close(rows, 1 - rec.get("sink_weight"))
    assert float(rows.max()) < 0.99  # the sinks act: no row keeps all its attention


def test_a_fused_backend_records_the_same_share() -> None:
    with Recorder(names=["sink_weight"]) as rec:
        attention(Q, K, V, is_causal=True, sinks=SINKS, backend="flash")
    torch.testing.assert_close(rec.get("sink_weight"), appended(Q, K, SINKS, CAUSAL)[..., -1])


def test_return_weights_with_sinks_gives_the_context_and_the_true_weights() -> None:
    want = appended(Q, K, SINKS, CAUSAL)
    out, weights = attention(Q, K, V, is_causal=True, sinks=SINKS, return_weights=True)
    torch.testing.assert_close(weights, want[..., :-1])
    torch.testing.assert_close(out, want[..., :-1] @ V.repeat_interleave(2, 1))


def test_head_weights_with_sinks_equal_the_appended_column_from_the_kernels_lse_or_alone() -> None:
    want = appended(Q, K, SINKS, CAUSAL)
    _, lse = flash_attention(Q, K, V, is_causal=True)  # the fused kernel's row log-sum-exp, without the sinks
    vis = Visibility.from_lengths(9, 9, causal=True).bound_to(2, 4, Q.device)
    for given in (lse, None):
        got = head_weights(Q, K, vis, scale=8**-0.5, heads=[1, 3], lse=given, sinks=SINKS)
        torch.testing.assert_close(got, want[:, [1, 3], :, :-1])


def test_sink_share_of_a_row_that_sees_no_key_is_all_of_it() -> None:
    from attnlab.functional.sinks import sink_share  # the one computation of a sink's share, for every path

    lse = torch.tensor([[[0.5, float("inf")]]], dtype=torch.float64)  # (1, 1, 2): a row, and one that sees nothing
    share = sink_share(lse, torch.tensor([0.25], dtype=torch.float64))
    torch.testing.assert_close(share, torch.tensor([[[1 / (1 + math.exp(0.25)), 1.0]]], dtype=torch.float64))


def _own_sink_model() -> GPT:
    config = GPTConfig(
        vocab_size=64, context_length=16, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0, rope=True,
        sinks=True, layer_types=("sliding", "full"), window=4, norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(config).eval()
        for block in model.trf_blocks:
            block.att.sinks.data.normal_(1.0, 0.5)  # type: ignore[union-attr, operator]
    return model


@torch.no_grad()
def test_own_sink_models_record_what_attention_weights_give_rows_short_of_one_by_the_sink() -> None:
    model = _own_sink_model()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with Recorder(names=["attn_weights", "sink_weight"]) as rec:
        model(ids)
    shown = model.attention_weights(ids)  # (L, B, H, T, T)
    for n in range(2):
        recorded = rec.get("attn_weights", module=f"trf_blocks.{n}.att")
        sink = rec.get("sink_weight", module=f"trf_blocks.{n}.att")
        torch.testing.assert_close(recorded, shown[n], rtol=0, atol=1e-7)
        torch.testing.assert_close(recorded.sum(-1), 1 - sink, rtol=0, atol=1e-6)
        assert float(sink.min()) > 0.05  # the sinks act


@torch.no_grad()
def test_an_attention_module_with_sinks_records_the_weights_written_out_by_hand() -> None:
    from attnlab.nn import Attention

    torch.manual_seed(0)
    att = Attention(d_in=8, d_out=16, num_heads=4, num_kv_heads=2, window=4, sinks=True, backend="eager").double()
    att.sinks.copy_(SINKS)  # type: ignore[union-attr]
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    with Recorder(names=["attn_weights", "sink_weight"]) as rec:
        att(x)
    q, k, _ = att.split_qkv(x)
    band = CAUSAL & ~torch.ones(9, 9, dtype=torch.bool).tril(-4)  # each query sees its last 4 keys
    want = appended(q, k, SINKS, band)
    torch.testing.assert_close(rec.get("attn_weights"), want[..., :-1])
    torch.testing.assert_close(rec.get("sink_weight"), want[..., -1])


@torch.no_grad()
def test_gpt_oss_recorded_weights_equal_transformers_eager_weights(root: str) -> None:
    """GPT.from_pretrained: the weights a Recorder takes equal transformers' output_attentions to 1e-6."""
    theirs = FAMILIES["gpt_oss"][0].from_pretrained(hf_dir("gpt_oss", root), attn_implementation="eager").eval()
    want = theirs(IDS, output_attentions=True).attentions  # L x (B, H, T, T), the sink's column dropped
    model = GPT.from_pretrained(hf_dir("gpt_oss", root))
    with Recorder(names=["attn_weights", "sink_weight"]) as rec:
        model(IDS)
    shown = model.attention_weights(IDS)
    for n, expected in enumerate(want):
        recorded = rec.get("attn_weights", module=f"trf_blocks.{n}.att")
        assert float((recorded - expected).abs().max()) < 1e-6, n
        assert float((shown[n] - expected).abs().max()) < 1e-6, n
        sums = recorded.sum(-1)
        assert float((sums - (1 - rec.get("sink_weight", module=f"trf_blocks.{n}.att"))).abs().max()) < 1e-6
        assert float(sums.max()) < 0.999  # every row gave some of its attention to its sink


PADDED = torch.tensor([[0, 0, 0, 5, 9, 17, 33, 2, 8, 41, 7, 3], [4, 11, 19, 23, 6, 1, 30, 12, 27, 15, 38, 9]])
PADDING = torch.tensor([[0, 0, 0] + [1] * 9, [1] * 12])  # the first row left-padded by 3


@torch.no_grad()
@pytest.mark.parametrize("backend", ["flash", "eager"])
def test_gpt_oss_through_attnlab_hf_records_transformers_eager_weights(backend: str, root: str) -> None:
    """attnlab.hf: chosen heads from the fused kernel's lse (flash), every head from the eager backend; each
    equals transformers' eager weights to 1e-6, rows short of 1 by the recorded sink_weight."""
    cls = FAMILIES["gpt_oss"][0]
    out = cls.from_pretrained(hf_dir("gpt_oss", root), attn_implementation="eager").eval()(
        PADDED, attention_mask=PADDING, output_attentions=True
    )
    ours = cls.from_pretrained(hf_dir("gpt_oss", root), attn_implementation="attnlab").eval()
    chosen = [(0, 1), (1, 0), (3, 3)]
    attnlab.hf.use(ours, backend=backend)  # type: ignore[arg-type]
    with Recorder(heads=chosen if backend == "flash" else None) as rec:
        ours(PADDED, attention_mask=PADDING)
    rows = PADDING.bool()[:, :, None]  # (B, Tq, 1): a padded query's own row is not compared
    for layer, head in chosen:
        module = f"model.layers.{layer}.self_attn"
        weights = rec.head(layer, head) if backend == "flash" else rec.get("attn_weights", module=module)[:, head]
        want = out.attentions[layer][:, head]  # (B, Tq, Tk)
        assert float(((weights - want) * rows).abs().max()) < 1e-6, (layer, head)
        sink = rec.get("sink_weight", module=module)[:, head]  # (B, Tq)
        assert float(((weights.sum(-1) - (1 - sink)) * rows[..., 0]).abs().max()) < 1e-6
        assert float(sink[PADDING.bool()].min()) > 1e-3  # the sinks act


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("sinks"))


def _dead_row_grads(sinks: torch.Tensor | None, **where: object) -> list[torch.Tensor]:
    q, k, v = (t.clone().requires_grad_(True) for t in (Q[:1], K[:1], V[:1]))
    bias = where.pop("bias", None)
    inputs = [q, k, v] + ([bias] if isinstance(bias, torch.Tensor) else [])
    out = attention(q, k, v, mask=bias, backend="eager", sinks=sinks, **where)  # type: ignore[arg-type]
    return list(torch.autograd.grad((out * torch.linspace(-1, 1, 8, dtype=out.dtype)).sum(), inputs))


@pytest.mark.parametrize("sinks", [None, SINKS], ids=["plain", "sinks"])
def test_a_row_that_sees_no_key_has_a_finite_backward_zero_for_that_row(sinks: torch.Tensor | None) -> None:
    """Row 2 sees nothing: by a float mask of -inf that takes gradients, and by a score_mod's -inf."""
    bias = torch.randn(9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    bias[2] = float("-inf")
    bias[5, :3] = float("-inf")  # a row that sees some keys
    bias.requires_grad_(True)
    gq, gk, gv, gbias = _dead_row_grads(sinks, bias=bias)
    for grad in (gq, gk, gv, gbias):
        assert bool(grad.isfinite().all())
    assert float(gq[:, :, 2].abs().max()) == 0.0 and float(gbias[2].abs().max()) == 0.0
    assert float(gq[:, :, 5].abs().max()) > 0.0  # the other rows learn
    table = torch.zeros(9, 9, dtype=torch.float64)
    table[2] = float("-inf")
    table.requires_grad_(True)
    mod = lambda score, b, h, qi, ki: score + table[qi, ki]
    gq, gk, gv = _dead_row_grads(sinks, score_mod=mod)
    for grad in (gq, gk, gv):
        assert bool(grad.isfinite().all())
    assert float(gq[:, :, 2].abs().max()) == 0.0


@torch.no_grad()
def test_the_zoo_reads_what_the_sinks_take_not_one_minus_every_layers_row_sums() -> None:
    """A recurrent layer's implicit weights do not sum to 1: the share is the recorded one, of the sink layers."""
    from attnlab.bench.zoo import measure_heads
    from attnlab.explain.heads import default_half, probe

    config = GPTConfig(
        vocab_size=64, context_length=32, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0, rope=True,
        sinks=True, layer_types=("delta", "full"),
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(config).eval()
    model.trf_blocks[1].att.sinks.fill_(1.0)  # type: ignore[union-attr, operator]
    with Recorder(names=["attn_weights"], modules=["trf_blocks.1.att"]) as rec:
        model(probe(64, half=default_half(model)))
    full = rec.get("attn_weights")  # (B, H, T, T): the softmax layer's, each row 1 - its sink's share
    assert measure_heads(model)["sink"] == pytest.approx(float(1 - full.sum(-1).mean()), abs=1e-6)
