"""int8 and int4 KV caches go back after a refused guess (issue 57): with ``spare`` exact slots more in their ring,
the tokens a pass's guesses aged out of the exact window are still exact after going back, and the key groups
those guesses re-quantized are quantized again by the next call from the same exact keys.

Oracle: a cache that never saw the guesses, compared bitwise on what the next call reads (every held position),
at every alignment of a pass with the key groups; and greedy with ``lookup=`` gives the quantized cache's own
greedy tokens (not the plain cache's: int4 moves them here, so the test sees a lossy cache kept lossy, exactly).
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab.cache import CACHES
from attnlab.cache.quantized import QuantizedKVCache
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for
from test_going_back import every_kind, repeated


def after_a_refused_pass(prompt: int, *, spare: int, bits: int = 8) -> bool:
    """Whether a cache that took four refused guesses and went back reads, after the next token, exactly what a
    cache that never saw them reads."""
    torch.manual_seed(0)
    k, v = torch.randn(1, 2, prompt + 2, 8), torch.randn(1, 2, prompt + 2, 8)
    made = [
        QuantizedKVCache(
            batch_size=1, num_kv_heads=2, head_dim=8, max_len=64, bits=bits, group_size=4, residual=8, spare=spare
        )
        for _ in range(2)
    ]
    for cache in made:
        cache.update(k[:, :, :prompt], v[:, :, :prompt])
    guessed, clean = made
    junk = torch.randn(1, 2, 4, 8) * 5  # four guesses, refused
    guessed.update(
        torch.cat([k[:, :, prompt : prompt + 1], junk], 2), torch.cat([v[:, :, prompt : prompt + 1], junk], 2)
    )
    guessed._length.fill_(prompt + 1)  # back to the certain token (crop, without its check: spare=0 is the break)
    clean.update(k[:, :, prompt : prompt + 1], v[:, :, prompt : prompt + 1])
    reads = [c.update(k[:, :, prompt + 1 : prompt + 2], v[:, :, prompt + 1 : prompt + 2]) for c in made]
    n = prompt + 2
    return all(torch.equal(a[:, :, :n], b[:, :, :n]) for a, b in zip(reads[0][:2], reads[1][:2], strict=True))


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_cache_with_spare_slots_goes_back_bitwise_at_every_alignment(bits: int) -> None:
    assert all(after_a_refused_pass(prompt, spare=5, bits=bits) for prompt in range(8, 24))
    # without the spare slots the guesses overwrite exact keys a group still needs: three alignments in four differ
    assert sum(not after_a_refused_pass(prompt, spare=0, bits=bits) for prompt in range(8, 24)) >= 8


def test_going_back_further_than_the_spare_slots_is_refused_by_name() -> None:
    cache = QuantizedKVCache(batch_size=1, num_kv_heads=1, head_dim=4, max_len=32, group_size=4, residual=8, spare=2)
    cache.update(torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4))
    with pytest.raises(ValueError, match=r"holds 10 tokens and 2 spare exact slots: it can go back to 8..10, not 7"):
        cache.crop(7)
    with pytest.raises(ValueError, match=r"spare must be an int in \[0, 65536\]"):
        QuantizedKVCache(batch_size=1, num_kv_heads=1, head_dim=4, max_len=32, spare=-1)


@pytest.mark.slow  # three generations of 60 tokens each
@pytest.mark.parametrize("bits", ["int8", "int4"])
@torch.no_grad()
def test_lookup_on_a_quantized_cache_gives_its_own_greedy_tokens_in_fewer_passes(bits: str) -> None:
    m, prompt = every_kind(layer_types=("full",) * 3, n_layers=3), repeated(12)
    cache = functools.partial(CACHES[bits], group_size=4, residual=8)  # groups quantized within the prompt
    greedy = m.generate(prompt, 60, cache=cache)
    decoding = decode(m, request_for(m, prompt, 60, {"lookup": 4, "cache": cache}))
    assert [t for drawn in decoding for _, t in drawn] == greedy[0, prompt.shape[1] :].tolist()
    assert decoding.counts.passes < 60 and decoding.counts.kept > 0
    assert torch.equal(m.generate(prompt, 60, cache=cache, lookup=4), greedy)
    if bits == "int4":  # lossy here: its greedy tokens are not the plain cache's, and lookup keeps them so
        assert not torch.equal(greedy, m.generate(prompt, 60))
