"""The transformers bridge (attnlab.hf.use) on DeepSeek-V4: transformers' own DeepseekV4ForCausalLM, its attention run
by attnlab, gives transformers' eager logits and greedy tokens.

A V4 compressed layer concatenates its entries after the window's keys and appends their bias (an entry visible
once its block has closed and, in a compressed-sparse layer, chosen by the indexer: 0, else -inf) to the mask it was
handed, cast to that mask's dtype. sdpa's boolean mask (what "attnlab" gets elsewhere) would turn -inf into True and
0 into False, inverting the choice (1.65 off on these weights, seen when register() handed sdpa's mask), so
``attnlab.hf.register`` builds eager's float mask for this model; a boolean 4-D mask of the user's own is refused by
name. The model is tests/test_deepseek_v4_family.py's (every V4 part acts; its margins asserted there and here).
"""

from __future__ import annotations

import pytest
import torch

import attnlab.hf
from attnlab.functional import mods
from test_deepseek_v4_family import IDS, T, hf, margins

pytestmark = pytest.mark.slow  # transformers' model, built, saved and run: the second stage


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("v4_bridge"))


@torch.no_grad()
def test_use_gives_transformers_logits_and_greedy_tokens(root: str) -> None:
    """30 tokens (blocks closed and open), 4 (the first entry closing at the last token) and one: within 1e-4 of
    transformers' eager attention; 16 greedy tokens as its generate gives them (a decode step's mask is eager's
    too, the heavily compressed layer's entries padded visible, the sparse layer's choice appended)."""
    model = hf(root)
    prompt = IDS[:1]
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert margins(root, torch.cat([IDS, expected[:, T:].expand(2, 16)], 1)) > 1e-5
    theirs = [model(IDS[:, :t]).logits for t in (T, 4, 1)]
    with attnlab.hf.use(model):
        ours = [model(IDS[:, :t]).logits for t in (T, 4, 1)]
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    for a, b in zip(ours, theirs, strict=True):
        assert float((a - b).abs().max()) < 1e-4
    assert got.tolist() == expected.tolist()


@torch.no_grad()
def test_attnlab_runs_every_layer_a_score_mod_on_each_moves_the_logits(root: str) -> None:
    """Squashing one layer's scores moves the logits only if attnlab ran that layer (sliding, compressed-sparse,
    heavily compressed)."""
    model = hf(root)
    with attnlab.hf.use(model):
        ours = model(IDS).logits
    for layer in range(len(model.model.layers)):
        with attnlab.hf.use(model, score_mod={layer: mods.softcap(0.5)}):
            assert float((model(IDS).logits - ours).abs().max()) > 1e-3, layer


@torch.no_grad()
def test_a_boolean_mask_that_would_invert_the_entries_bias_is_refused_by_name(root: str) -> None:
    model = hf(root)
    causal = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()  # the user's own 4-D mask, boolean
    with attnlab.hf.use(model), pytest.raises(ValueError, match="layer 1: a DeepSeek-V4 compressed layer hands"):
        model(IDS[:1, :8], attention_mask=causal)


def test_an_attnlab_cache_is_refused_naming_the_compressed_layers(root: str) -> None:
    with pytest.raises(ValueError, match="layers \\[1, 3\\] are 'compressed_sparse_attention', a type it does not"):
        attnlab.hf.cache("plain", hf(root), max_len=64)
