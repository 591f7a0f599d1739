"""See the choice (issue 59 item 6): which keys a sparse query read, beside the dense attention it replaced.

The recorded choice is the kernel's own (the layer's ``select`` and ``_select``, called here); the weights the
layers used, spread back by the recorded columns, equal their readable forms' (every key, the others hidden); the
dense mass kept has known answers: 1 with top-k at least the keys, k / (t + 1) on a head spread evenly (its
queries zeroed, so every score is equal) by hand; the marks follow top-k and sit on the key axis (never above the
diagonal); a model with no sparse layer is told so. The page is drawn in headless Chromium in test_selection_page.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import test_compressed as v4
import test_dsa as dsa
from attnlab import Recorder
from attnlab.explain.model_report import model_report
from attnlab.explain.model_view import attention_view
from attnlab.explain.selection import check_sparse, kept_mass, layer_choices, layer_lines, query_lines
from attnlab.explain.selection_report import selection_view
from attnlab.functional.visibility import Visibility
from attnlab.models import GPT, GPTConfig
from attnlab.models.tokenizer import ByteTokenizer
from attnlab.nn.selection_record import spread

SHAPE = dict(vocab_size=256, emb_dim=32, n_heads=4, n_layers=2, context_length=64, rope=True, norm="rmsnorm")
SHAPE |= dict(mlp="swiglu", kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
TEXT = "attention is"  # 12 bytes


def dsa_gpt(topk: int, *, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**SHAPE, index_topk=topk, index_heads=4, index_head_dim=16)).eval()


def choices_of(model: GPT, text: str = TEXT) -> list:  # type: ignore[type-arg]
    tok = ByteTokenizer()
    return layer_choices(model, torch.tensor([tok.encode(text)]), tok.tokens(text))


@torch.no_grad()
def test_the_recorded_choice_is_the_kernels_and_the_used_weights_are_the_readable_forms() -> None:
    """A DSA layer: "selected_keys" equals its own select(); the gathered weights spread onto the keys equal the
    readable form's weights (every key, the unchosen hidden), and are 0 off the choice."""
    m, x = dsa.layer(5), dsa.inputs()
    vis, pos, q_latent, q_nope, q_pe, latents = dsa.parts(m, x)
    kernel = m.select(x, q_latent, m.index_keys(x, pos), pos, vis).indices  # (B, T, K)
    with Recorder() as rec:
        m(x)
    chosen = rec.get("selected_keys")
    assert torch.equal(chosen, kernel)
    used = spread(rec.get("attn_weights"), rec.get("read_slots"), dsa.T)  # (B, H, T, S)
    selection = m.select(x, q_latent, m.index_keys(x, pos), pos, vis)
    with Recorder(names=["attn_weights"]) as readable:
        m.readable(q_nope, q_pe, latents, selection, vis)
    assert float((used - readable.get("attn_weights")).abs().max()) < 1e-6
    off = torch.ones(2, dsa.T, dsa.T + 1, dtype=torch.bool).scatter_(2, torch.where(kernel >= 0, kernel, dsa.T), False)
    assert float(used.masked_select(off[:, None, :, : dsa.T]).abs().max()) == 0.0
    dense = rec.get("dense_weights")  # (B, H, T, S): every key before each query, the selection away
    assert torch.allclose(dense.sum(-1), torch.ones(2, 4, dsa.T), atol=1e-5)
    assert torch.equal(dense > 0, torch.ones(dsa.T, dsa.T, dtype=torch.bool).tril().expand_as(dense))


@torch.no_grad()
def test_a_compressed_layers_record_reads_its_window_then_its_entries() -> None:
    """A V4 compressed-sparse layer: "selected_keys" equals its own _select(); its weights spread onto its tokens
    then its entries equal its readable form's; its dense weights equal the readable weights of the same layer
    reading every entry (top-k 99). The seeds give a margin at the 2nd score (top-k on random weights can tie)."""
    m, x = v4.layer(2, seed=2), v4.inputs(t=21)
    t, n = 21, 21 // 4
    positions = torch.arange(t)
    _, _, q_latent, rows = m._project(x, positions)
    _, index = m._entries(rows, 0, readable=False)
    entries_vis = Visibility(q_pos=positions, k_pos=(torch.arange(n) + 1) * 4 - 1, causal=True)
    assert index is not None and v4.margin(m, x) > 1e-4
    with Recorder() as rec:
        m(x)
    assert torch.equal(rec.get("selected_keys"), m._select(x, q_latent, index, entries_vis).indices)
    read = rec.get("read_slots")  # (B, T, W + K): the window's slots, then T + entry
    assert int(read[..., : m.window].max()) < t <= int(read[..., m.window :].min(dim=-1).values.max())
    with Recorder(names=["attn_weights"]) as readable:
        m.readable(x)
    used = spread(rec.get("attn_weights"), read, t + n)
    assert float((used - readable.get("attn_weights")).abs().max()) < 1e-5
    every = v4.layer(99, seed=2)
    with Recorder(names=["attn_weights"]) as dense:
        every.readable(x)
    assert float((rec.get("dense_weights") - dense.get("attn_weights")).abs().max()) < 1e-5


@torch.no_grad()
def test_the_marks_follow_top_k_on_the_key_axis() -> None:
    """Each query's marks: exactly min(k, t + 1) keys, none after the query (the key axis, not the query's),
    the recorded indices' own; top-k 3 and 6 mark differently."""
    marks = {}
    for k in (3, 6):
        model = dsa_gpt(k)
        for choice in choices_of(model):
            t = choice.selected.shape[0]
            counts = choice.selected.sum(-1)
            assert counts.tolist() == [min(k, q + 1) for q in range(t)]
            assert not bool(choice.selected.triu(1).any())  # no key after its query
            assert torch.equal(choice.selected, choice.read)  # DSA reads what it chose
        marks[k] = choices_of(model)[1].selected
    assert not torch.equal(marks[3], marks[6])


@torch.no_grad()
def test_attention_weights_of_a_sparse_model_are_its_used_weights_on_its_tokens() -> None:
    """GPT.attention_weights on a DSA model: (L, B, H, T, T), each row a distribution over its k chosen keys."""
    model, tok = dsa_gpt(4), ByteTokenizer()
    ids = torch.tensor([tok.encode(TEXT)])
    weights = model.attention_weights(ids)[:, 0]  # (L, H, T, T)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 12), atol=1e-5)
    assert (weights > 0).sum(-1)[0, 0].tolist() == [min(4, q + 1) for q in range(12)]
    for choice in choices_of(model):
        assert torch.equal(weights[choice.layer], choice.sparse)


@torch.no_grad()
def test_top_k_at_least_the_keys_keeps_all_the_dense_mass() -> None:
    """index_topk = 64 >= the 12 keys: every query reads every key, kept 1."""
    for choice in choices_of(dsa_gpt(64)):
        assert torch.allclose(choice.kept(), torch.ones(4, 12), atol=1e-6)
        assert torch.allclose(choice.sparse, choice.dense, atol=1e-6)
    every = v4.layer(99)
    x = v4.inputs(t=21)
    with Recorder() as rec:
        every(x)
    read, dense = rec.get("read_slots"), rec.get("dense_weights")
    on = torch.zeros(2, 21, dense.shape[-1] + 1).scatter_(2, torch.where(read >= 0, read, dense.shape[-1]), 1.0)
    kept = (dense * on[:, None, :, :-1]).sum(-1) / dense.sum(-1)
    assert torch.allclose(kept, torch.ones_like(kept), atol=1e-6)


@torch.no_grad()
def test_an_even_head_keeps_k_over_the_keys_it_sees() -> None:
    """Queries zeroed: every score 0, each query's dense weights 1 / (t + 1) over its t + 1 keys, so its top 3
    keep min(3, t + 1) / (t + 1), written here by hand; the layer's line quotes their mean."""
    model = dsa_gpt(3)
    for block in model.blocks:
        block.att.q_b_proj.weight.zero_()
    by_hand = torch.tensor([min(3, q + 1) / (q + 1) for q in range(12)])
    choices = choices_of(model)
    for choice in choices:
        assert torch.allclose(choice.kept(), by_hand.expand(4, 12), atol=1e-6)
    assert f"kept {float(by_hand.mean()):.3f} of the dense mass" in layer_lines(choices, "en")[0]
    summary = kept_mass(model, torch.tensor([ByteTokenizer().encode(TEXT)]))
    assert [(r.layer, r.queries, r.whole) for r in summary] == [(0, 12, 3), (1, 12, 3)]  # queries 0, 1, 2 see <= 3
    assert [r.least for r in summary] == pytest.approx([3 / 12, 3 / 12], abs=1e-6)
    assert f"{float(by_hand.mean()):.3f} 的稠密份额" in layer_lines(choices, "zh")[0]


@torch.no_grad()
def test_the_query_lines_mark_the_chosen_keys() -> None:
    choice = choices_of(dsa_gpt(3))[0]
    lines = query_lines(choice, -1, "en")
    assert lines[0].startswith("query 11 's' in layer 0: read 3 of 12 keys")
    assert sum(line.startswith("  ✓") for line in lines) == 3 and len(lines) == 13
    for bad in (12, -13, True, "1"):
        with pytest.raises(ValueError, match="query must be a token index in \\[0, 12\\)"):
            query_lines(choice, bad, "en")  # type: ignore[arg-type]


@torch.no_grad()
def test_a_model_without_a_sparse_layer_is_told_so() -> None:
    """Dense MLA: the selection view refuses by saying there is no sparse layer (en and zh); its report has no
    selection section and its view no panel."""
    torch.manual_seed(0)
    dense, tok = GPT(GPTConfig(**SHAPE)).eval(), ByteTokenizer()
    with pytest.raises(ValueError, match="This model has no sparse layer: no layer chooses keys"):
        selection_view(dense, torch.tensor([tok.encode(TEXT)]), tok.tokens(TEXT))
    with pytest.raises(ValueError, match="这个模型没有稀疏层"):
        check_sparse(dense, "zh")
    with pytest.raises(ValueError, match="lang must be one of"):
        check_sparse(dsa_gpt(3), "fr")
    assert "selview" not in attention_view(dense, tok, TEXT).to_fragment()
    assert "selection" not in [s.key for s in model_report(dense, tok, TEXT, name="d", figures=False).sections]


@torch.no_grad()
def test_the_report_and_the_view_carry_the_choice() -> None:
    model, tok = dsa_gpt(3), ByteTokenizer()
    report = model_report(model, tok, TEXT, name="dsa", figures=False, query=5)
    (section,) = [s for s in report.sections if s.key == "selection"]
    assert section.value is not None and "query 5 't' in layer 1: read 3 of 6 keys" in section.value
    zh = model_report(model, tok, TEXT, name="dsa", lang="zh", figures=False)
    assert "选择：稀疏注意力的每个查询读了哪些键" in [s.title for s in zh.sections]
    page = attention_view(model, tok, TEXT).to_fragment()
    assert page.count('class="selview"') == 1 and "selview-data" in page


@pytest.mark.slow  # transformers' config module imported, a V4 model built: the second stage
@torch.no_grad()
def test_a_deepseek_v4_models_report_and_view_show_its_compressed_sparse_layers() -> None:
    """A V4 model (transformers' small config of test_deepseek_v4_family, random weights): its report names the two
    compressed-sparse layers' choice (the sliding and heavily compressed layers choose nothing), its view holds the
    panel, and GPT.attention_weights gives every layer on its tokens (rows short of 1 by the entries and sinks)."""
    from transformers import DeepseekV4Config

    import test_deepseek_v4_family as family
    from attnlab.models.families import config_from_hf

    config = config_from_hf(DeepseekV4Config(**(family.CONFIG | {"vocab_size": 256})).to_dict(), Path("."))
    torch.manual_seed(0)
    model, tok, text = GPT(config).eval(), ByteTokenizer(), "abcdefghijklmnopqrst"
    report = model_report(model, tok, text, name="v4", figures=False)
    (section,) = [s for s in report.sections if s.key == "selection"]
    assert section.value is not None
    assert [line.split(" (")[0] for line in section.value.splitlines() if line.startswith("layer")] == [
        "layer 1",
        "layer 3",
    ]
    assert "entry 4: 12–19" in section.value  # query 19 sees entries 0..4, entry 4 pooling blocks 3 and 4
    weights = model.attention_weights(torch.tensor([tok.encode(text)]))
    assert tuple(weights.shape) == (4, 1, 4, 20, 20) and bool((weights.sum(-1) <= 1 + 1e-5).all())
    assert 'class="selview"' in attention_view(model, tok, text).to_fragment()
