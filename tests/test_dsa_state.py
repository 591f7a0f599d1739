"""DeepSeek Sparse Attention's state (issue 59, step 1): the indexer's keys kept beside each latent, planned by
``ModelCache.build``'s one table, with its bytes a token counted as the KV bytes meter counts every kind, and going
back by the latent cache's crop, so speculation and prefix reuse give greedy's tokens on DeepSeek-V3.2 and GLM-5
(the folders and the margins at the 8th index score of ``test_dsa_families``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import test_dsa_families as folders
from attnlab.bench.kv_bytes import layer_kinds
from attnlab.cache import ModelCache, PrefixCache, stored_bytes
from attnlab.cache.indexed import IndexedCache, PagedIndexedCache
from attnlab.cache.plan import LayerState
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for

STATE = LayerState(kind="indexed", kv_heads=1, head_dim=16 + 8, value_dim=16, index_dim=12)


def test_the_plan_gives_an_indexed_layer_its_rows_and_their_bytes_a_token() -> None:
    """'plain' an IndexedCache, 'paged' and 'prefix' paged rows; each token costs (R + P + Di) values, 36 float32
    values here: 4 x 36 x 64 bytes for 64 tokens, and the length counter's 8 bytes."""
    made = ModelCache.build([STATE], "plain", rows=1, capacity=64)
    assert isinstance(made[0], IndexedCache) and made.capabilities.crop
    assert stored_bytes(made[0]) == 4 * (16 + 8 + 12) * 64 + 8
    for name in ("paged", "prefix"):
        assert isinstance(ModelCache.build([STATE], name, rows=2, capacity=64)[0], PagedIndexedCache)
    with pytest.raises(ValueError, match="index_dim is the width of an indexed layer's indexer keys"):
        LayerState(kind="indexed", kv_heads=1, head_dim=24, value_dim=16)
    with pytest.raises(ValueError, match="index_dim is the width"):
        LayerState(kind="latent", kv_heads=1, head_dim=24, value_dim=16, index_dim=12)


def test_the_kv_bytes_meter_counts_the_indexer_keys_beside_the_latent() -> None:
    """DeepSeek-V3.2's shape in bfloat16: (512 + 64 + 128) x 2 = 1,408 bytes a token and layer, against MLA's
    1,152: the indexer's keys are 18% of its state."""
    shape = dict(vocab_size=128, emb_dim=64, n_heads=4, n_layers=2, rope=True, norm="rmsnorm", mlp="swiglu")
    shape |= dict(kv_lora_rank=512, q_lora_rank=64, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    dsa = GPTConfig(**shape, index_topk=2048, index_heads=64, index_head_dim=128)
    (kind,) = layer_kinds(dsa)
    assert (kind.kind, kind.layers, kind.bytes_per_token) == ("indexed", 2, 1408)
    assert layer_kinds(GPTConfig(**shape))[0].bytes_per_token == 1152


@pytest.mark.slow  # transformers' models saved and read
@torch.no_grad()
@pytest.mark.parametrize("family", list(folders.FAMILIES))
def test_lookup_speculation_gives_greedys_tokens(family: str, tmp_path: Path) -> None:
    """Greedy with prompt lookup (3 guesses) gives greedy's 16 tokens: refused guesses cropped from every layer's
    latents and indexer keys alike; a draft model (itself) too."""
    model = GPT.from_pretrained(folders.hf_dir(family, str(tmp_path))).eval()
    prompt = torch.cat([folders.PROMPTS[:1, :20], folders.PROMPTS[:1, :20]], dim=1)  # (1, 40): it repeats
    greedy = model.generate(prompt, 16)
    assert folders.margins(family, str(tmp_path), greedy) > 1e-5  # no tie at the 8th index score: well defined
    decoding = decode(model, request_for(model, prompt, 16, {"lookup": 3}))
    assert [t for drawn in decoding for _, t in drawn] == greedy[0, 40:].tolist()
    assert decoding.counts.guessed > decoding.counts.kept, decoding.counts  # some guesses were taken back
    assert torch.equal(model.generate(prompt, 16, draft=model, draft_tokens=3), greedy)


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("family", list(folders.FAMILIES))
def test_a_prefix_cache_reuses_whole_blocks_of_latents_and_indexer_keys(family: str, tmp_path: Path) -> None:
    """The same 40-token prompt a second time on a prefix cache: its first two blocks of 16 (latents and indexer
    keys) reused, 8 tokens run, and transformers' greedy tokens (the margins of test_dsa_families); paged rows of
    continuous batching give each prompt what it gets alone."""
    model = GPT.from_pretrained(folders.hf_dir(family, str(tmp_path))).eval()
    prompt = folders.PROMPTS[:1]
    store = PrefixCache.for_model(model, batch_size=1, max_len=64)
    cold = model.generate(prompt, 16, cache=store)
    seen: list[int] = []
    model.blocks[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].shape[1]))
    warm = model.generate(prompt, 16, cache=store)
    assert seen[0] == 8
    expected = folders.hf(family, str(tmp_path)).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False
    )
    assert warm.tolist() == cold.tolist() == expected.tolist()
    prompts = [folders.PROMPTS[0].tolist(), folders.PROMPTS[1, :30].tolist()]
    alone = [model.generate(torch.tensor([p]), 6)[0, len(p) :].tolist() for p in prompts]
    assert model.generate_many(prompts, 6, slots=2, cache="paged") == alone
