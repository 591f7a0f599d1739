"""Speculation on the families of issue 56, read from folders transformers saved (issue 57): Qwen3.5's Gated
DeltaNet with its convolution, Gemma 4's sliding and KV-sharing layers, Kimi Linear's KDA beside latent attention,
LFM3's convolution layers, MiMo-V2-Flash's sinks on its sliding layers. Greedy with ``lookup=`` or a draft gives
greedy's tokens on each, and the lookup pass count shows the guesses were kept and taken back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import test_gemma4
import test_hybrids
import test_kimi_linear
import test_lfm3
import test_mimo_v2_flash
from attnlab.cache import PrefixCache
from attnlab.models import GPT
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for

pytestmark = pytest.mark.slow  # a transformers model saved and read for each family

FOLDERS: dict[str, tuple[Callable[[str], Path], torch.Tensor]] = {
    "qwen3.5": (lambda root: test_hybrids.hf_dir(next(iter(test_hybrids.VARIANTS)), root), test_hybrids.IDS),
    "gemma4": (lambda root: test_gemma4.hf_dir(root), test_gemma4.IDS),
    "kimi_linear": (lambda root: test_kimi_linear.hf_dir(root), test_kimi_linear.IDS),
    "lfm3": (lambda root: test_lfm3.hf_dir(next(iter(test_lfm3.VARIANTS)), root), test_lfm3.IDS),
    "mimo_v2_flash": (
        lambda root: test_mimo_v2_flash.hf_dir(next(iter(test_mimo_v2_flash.VARIANTS)), root),
        test_mimo_v2_flash.IDS,
    ),
}


@torch.no_grad()
@pytest.mark.parametrize("family", list(FOLDERS))
def test_each_family_speculates_exactly(family: str, tmp_path: Path) -> None:
    folder, ids = FOLDERS[family]
    model = GPT.from_pretrained(folder(str(tmp_path))).eval()
    prompt = torch.cat([ids[:1, :24], ids[:1, :24]], dim=1)  # (1, 48): past every window here; it repeats
    greedy = model.generate(prompt, 24)
    decoding = decode(model, request_for(model, prompt, 24, {"lookup": 3}))
    assert [t for drawn in decoding for _, t in drawn] == greedy[0, 48:].tolist()
    assert decoding.counts.guessed > 0, decoding.counts  # lookup guessed, so the states went back where refused
    assert torch.equal(model.generate(prompt, 24, draft=model, draft_tokens=3), greedy)


@torch.no_grad()
@pytest.mark.parametrize("family", list(FOLDERS))
def test_each_family_reuses_a_prefix_and_batches_rows_exactly(family: str, tmp_path: Path) -> None:
    """A prefix cache on each family: a second prompt sharing 48 tokens runs only its own (every layer kind: KDA,
    Gated DeltaNet, convolutions, sliding, KV-sharing, latent), and gets the plain cache's tokens; continuous
    batching gives each prompt what it gets alone."""
    folder, ids = FOLDERS[family]
    model = GPT.from_pretrained(folder(str(tmp_path))).eval()
    shared = torch.cat([ids[:1, :24], ids[:1, :24]], dim=1)  # (1, 48): three blocks of 16, past every window
    first, second = torch.cat([shared, ids[:1, :5]], dim=1), torch.cat([shared, ids[:1, 5:12]], dim=1)
    store = PrefixCache.for_model(model, batch_size=1, max_len=80)
    model.generate(first, 4, cache=store)
    seen: list[int] = []
    model.blocks[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].shape[1]))
    warm = model.generate(second, 16, cache=store)
    assert seen[0] == 7  # the shared 48 tokens are run by no layer
    assert torch.equal(warm, model.generate(second, 16))
    prompts = [first[0].tolist(), second[0, :9].tolist(), second[0].tolist()]
    alone = [model.generate(torch.tensor([p]), 5)[0, len(p) :].tolist() for p in prompts]
    assert model.generate_many(prompts, 5, slots=2, cache="prefix") == alone
