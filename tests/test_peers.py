"""Parity with the implementations people trust, weights copied, float32 to 1e-5.

Peers: SDPA's math kernel, torch.nn.MultiheadAttention, the book's
MultiHeadAttention, and Hugging Face GPT2Attention and LlamaAttention built
from small configs with random weights (nothing is downloaded).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab import book
from attnlab.functional import attention, from_torch_mha_masks
from attnlab.models import from_book_mha, from_hf_gpt2, from_hf_llama, from_torch_mha
from attnlab.observe import Recorder

BACKENDS = ["eager", "sdpa", "flash"]
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h_kv", [4, 2, 1])
def test_functional_matches_sdpa_math_kernel(backend: str, h_kv: int) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, h_kv, 33, 16), torch.randn(2, h_kv, 33, 16)
    bool_mask = torch.rand(2, 1, 33, 33) > 0.1
    bool_mask[..., 0] = True  # SDPA gives NaN on empty rows; keep every row alive for the comparison
    with sdpa_kernel(SDPBackend.MATH):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h_kv != 4)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, enable_gqa=h_kv != 4)
    torch.testing.assert_close(attention(q, k, v, is_causal=True, backend=backend), causal, **TOL)
    torch.testing.assert_close(attention(q, k, v, mask=bool_mask, backend=backend), masked, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_matches_torch_multihead_attention(backend: str) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    attn = from_torch_mha(mha, is_causal=True, backend=backend).eval()
    x = torch.randn(3, 10, 32)
    torch_causal = nn.Transformer.generate_square_subsequent_mask(10).isinf()  # True = masked out
    kpm = torch.zeros(3, 10, dtype=torch.bool)
    kpm[1, 7:] = True  # padding at the end of sequence 1
    expected, _ = mha(x, x, x, attn_mask=torch_causal, key_padding_mask=kpm, need_weights=False)
    got = attn(x, mask=from_torch_mha_masks(key_padding_mask=kpm))
    torch.testing.assert_close(got, expected, **TOL)
    expected_full, _ = mha(x, x, x, need_weights=False)
    attn_full = from_torch_mha(mha, backend=backend, is_causal=False)
    torch.testing.assert_close(attn_full(x), expected_full, **TOL)


def test_weights_match_torch_multihead_attention_averaged_over_heads() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    attn = from_torch_mha(mha, is_causal=True)
    x = torch.randn(2, 6, 16)
    _, expected = mha(x, x, x, attn_mask=torch.ones(6, 6, dtype=torch.bool).triu(1), need_weights=True)
    with Recorder() as rec:  # the module returns a tensor; its weights come from the Recorder
        attn(x)
    torch.testing.assert_close(rec.get("attn_weights").mean(dim=1), expected, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_module_matches_the_books_multihead_attention(backend: str, qkv_bias: bool) -> None:
    torch.manual_seed(123)
    mha = book.MultiHeadAttention(48, 48, 64, 0.0, num_heads=6, qkv_bias=qkv_bias)
    attn = from_book_mha(mha, backend=backend)
    x = torch.randn(2, 40, 48)
    torch.testing.assert_close(attn(x), mha(x), **TOL)


def _hf_causal_mask(b: int, t: int) -> torch.Tensor:
    """Hugging Face's eager convention: an additive (B, 1, T, T) mask, finfo.min above the diagonal."""
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    return torch.zeros(b, 1, t, t).masked_fill(upper, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_matches_hf_gpt2_attention(backend: str) -> None:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    torch.manual_seed(0)
    config = GPT2Config(n_embd=64, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0)
    config._attn_implementation = "eager"
    hf = GPT2Attention(config, layer_idx=0).eval()
    with torch.no_grad():  # HF initializes biases to 0; make them matter
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    x = torch.randn(2, 12, 64)
    expected, _ = hf(x, attention_mask=_hf_causal_mask(2, 12))
    attn = from_hf_gpt2(hf.state_dict(), num_heads=4, backend=backend)
    torch.testing.assert_close(attn(x), expected, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start", [0, 5])
def test_module_matches_hf_llama_attention_with_gqa_and_rope(backend: str, start: int) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=128,
        attention_dropout=0.0,
    )
    config._attn_implementation = "eager"
    hf = LlamaAttention(config, layer_idx=0).eval()
    rope = LlamaRotaryEmbedding(config)
    x = torch.randn(2, 10, 64)
    position_ids = torch.arange(start, start + 10)[None].expand(2, 10)
    cos, sin = rope(x, position_ids)
    expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=_hf_causal_mask(2, 10))
    attn = from_hf_llama(hf.state_dict(), num_heads=8, num_kv_heads=2, head_dim=16, backend=backend)
    assert attn.qkv.weight.shape == ((8 + 2 * 2) * 16, 64)  # only the kv heads are stored
    got = attn(x, positions=position_ids)
    torch.testing.assert_close(got, expected, **TOL)
    # RoPE is relative (q_m . k_n depends on m - n): a uniform shift changes nothing,
    # stretched positions do.
    torch.testing.assert_close(attn(x), expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(attn(x, positions=2 * position_ids), expected, atol=1e-3)
