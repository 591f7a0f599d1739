"""GLM-5's "shared" indexer layers (issue 59): a layer marked "shared" in ``indexer_types`` has no indexer and reads
the keys the layer before it chose (attnlab.nn.indexed_shared). Exact against transformers' GlmMoeDsaForCausalLM on
tests/test_dsa_families.py's small config made 4 layers deep, indexer_types full, shared, full, shared (a shared
layer after each full one: the source changes), top-k 8 of prompts of 40 tokens.

Top-k choices on random weights can tie and flip under any change of summation order: ``margins`` recomputes the
full layers' index scores in float64 from the inputs transformers hands each indexer (a hook) and asserts a gap
between the 8th and 9th score of every query (a shared layer's choice is its source's: no scores of its own).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

from attnlab.models import GPT
from attnlab.models.families import config_from_hf
from attnlab.nn.indexed import IndexedAttention
from attnlab.nn.indexed_shared import SharedIndexAttention, link_indexers
from test_dsa_families import CONFIG, TOPK, _turn

pytestmark = pytest.mark.slow  # family parity: the second stage
KINDS = ["full", "shared", "full", "shared"]
IDS = torch.randint(0, CONFIG["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("glm5_shared"))


@functools.cache
def hf_dir(root: str) -> Path:
    """Weights drawn off their inits (norms around 1, the indexer's LayerNorm bias and the router's bias not 0)."""
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**{**CONFIG, "num_hidden_layers": 4, "indexer_types": KINDS}))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("inv_freq"):
                continue
            draw = torch.randn(p.shape, generator=g)
            if name.endswith(("e_score_correction_bias", "k_norm.bias")):
                p.copy_(draw * 0.3)
            elif p.dim() == 1:
                p.copy_(1 + 0.3 * draw)
            else:
                p.copy_(draw * (0.05 if name.endswith(("lm_head.weight", "embed_tokens.weight")) else 0.15))
    where = Path(root) / "glm5_shared"
    model.eval().save_pretrained(where)
    return where


@functools.cache
def hf(root: str) -> Any:
    return GlmMoeDsaForCausalLM.from_pretrained(hf_dir(root)).eval()


def margins(root: str, ids: torch.Tensor) -> float:
    """The least gap between the 8th and 9th float64 index score of any query, over the full layers' indexers."""
    model, gaps = hf(root), []

    def hook(indexer: Any, args: tuple[Any, ...]) -> None:
        x, q_resid, (cos, sin) = args[0][0].double(), args[1][0].double(), args[2]
        t, hi, di = x.shape[0], indexer.n_heads, indexer.head_dim
        q = (q_resid @ indexer.wq_b.weight.double().T).view(t, hi, di).transpose(0, 1)  # (Hi, T, Di)
        k = torch.nn.functional.layer_norm(
            x @ indexer.wk.weight.double().T, (di,), indexer.k_norm.weight.double(), indexer.k_norm.bias.double(), 1e-6
        )
        q, k = _turn(q, cos[0], sin[0], True), _turn(k, cos[0], sin[0], True)
        w = x @ indexer.weights_proj.weight.double().T / math.sqrt(hi)  # (T, Hi)
        scores = torch.einsum("th,hts->ts", w, torch.relu(q @ k.T / math.sqrt(di)))  # (T, S)
        for row in range(TOPK, t):
            top = scores[row, : row + 1].sort(descending=True).values
            gaps.append(float(top[TOPK - 1] - top[TOPK]))

    handles = [m.register_forward_pre_hook(hook) for n, m in model.named_modules() if n.endswith("indexer")]
    try:
        with torch.no_grad():
            for row in ids:
                model(row[None])
    finally:
        for h in handles:
            h.remove()
    return min(gaps)


@torch.no_grad()
def test_shared_layers_read_and_equal_transformers(root: str) -> None:
    """Read as shared (no indexer weights), linked to the full layer before each; logits within 1e-4 of
    transformers'; 16 greedy tokens as its generate gives them, on attnlab's plain and paged caches."""
    ours = GPT.from_pretrained(hf_dir(root))
    assert ours.config.index_shared == (1, 3)
    atts = [b.att for b in ours.blocks]
    assert [type(a) for a in atts] == [IndexedAttention, SharedIndexAttention] * 2
    assert atts[1].source[0] is atts[0] and atts[3].source[0] is atts[2]  # type: ignore[union-attr]
    assert not any(".1.att.indexer" in n or ".3.att.indexer" in n for n in ours.state_dict())
    theirs = hf(root)
    assert float((ours(IDS) - theirs(IDS).logits).abs().max()) < 1e-4
    prompt = IDS[:1]
    expected = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert margins(root, torch.cat([IDS, expected[:, 40:].expand(2, 16)], 1)) > 1e-5
    assert ours.generate(prompt, 16, compile=False).tolist() == expected.tolist()
    assert ours.generate(prompt, 16, cache="paged").tolist() == expected.tolist()


@torch.no_grad()
def test_a_shared_layer_reads_its_sources_choice_its_own_would_move_the_logits(root: str) -> None:
    """Effect: each shared layer made to read every key (its source's choice replaced by all it may see) moves the
    logits, so the choice it shares acts; and it is its source's, not another layer's: sharing the other full
    layer's choice moves them too."""
    ours = GPT.from_pretrained(hf_dir(root))
    shared = ours(IDS)
    atts = [b.att for b in ours.blocks]
    for layer in (1, 3):
        att = atts[layer]
        assert isinstance(att, SharedIndexAttention)
        choice = att.choice
        att.choice = lambda b, t: choice(b, t).__class__(  # type: ignore[method-assign]
            torch.arange(t).expand(b, t, t).tril().where(torch.ones(t, t, dtype=torch.bool).tril(), -1), t
        )
        assert float((ours(IDS) - shared).abs().max()) > 1e-3, layer
        del att.choice
    atts[3].source = (atts[0],)  # type: ignore[assignment]
    assert float((ours(IDS) - shared).abs().max()) > 1e-3


def test_a_first_layer_marked_shared_is_refused_by_name(root: str, tmp_path: Path) -> None:
    raw = json.loads((hf_dir(root) / "config.json").read_text())
    with pytest.raises(ValueError, match="the first has none before it to share"):
        config_from_hf({**raw, "indexer_types": ["shared", "full", "full", "shared"]}, tmp_path)
    ours = GPT.from_pretrained(hf_dir(root))
    with pytest.raises(ValueError, match="layer 1 reads an earlier layer's indexer choice, and no layer before"):
        link_indexers([torch.nn.Identity(), ours.blocks[1].att])


def test_save_pretrained_writes_the_shared_layers_back(root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir(root))
    ours.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["indexer_types"] == KINDS
    again = GlmMoeDsaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert float((again(IDS).logits - hf(root)(IDS).logits).abs().max()) == 0.0


@torch.no_grad()
def test_the_bridge_runs_transformers_shared_layers_with_the_choice_they_share(root: str) -> None:
    """attnlab.hf.use: a shared layer hands attnlab its source's choice as ``indices``; logits within 1e-4."""
    import attnlab.hf

    model = hf(root)
    reference = model(IDS).logits
    with attnlab.hf.use(model):
        assert float((model(IDS).logits - reference).abs().max()) < 1e-4
