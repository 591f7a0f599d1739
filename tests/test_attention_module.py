"""attnlab.Attention: backends agree, dtypes, RoPE, memory, torch.compile."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention
from attnlab.bench.memory import PeakMemory
from attnlab.functional import attention
from attnlab.nn import RotaryEmbedding, apply_rotary
from attnlab.observe import Recorder


def make(backend: str = "auto", **kw: object) -> Attention:
    torch.manual_seed(0)
    return Attention(d_in=32, num_heads=4, num_kv_heads=2, rope=True, backend=backend, **kw).eval()


def test_backends_agree_in_the_module_with_gradients() -> None:
    x = torch.randn(2, 17, 32)
    ref = make("eager")
    expected = ref(x)
    expected.sum().backward()
    for backend in ("sdpa", "flash", "auto"):
        m = make(backend)
        got = m(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        got.sum().backward()
        torch.testing.assert_close(m.qkv.weight.grad, ref.qkv.weight.grad, atol=1e-4, rtol=1e-4)


def test_recorder_gives_per_head_causal_weights_and_forward_a_tensor() -> None:
    m = make("auto")
    with Recorder() as rec:
        out = m(torch.randn(2, 6, 32))
    weights = rec.get("attn_weights")
    assert isinstance(out, torch.Tensor) and out.shape == (2, 6, 32) and weights.shape == (2, 4, 6, 6)
    assert (weights[..., torch.ones(6, 6, dtype=torch.bool).triu(1)] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))


def test_dropout_only_in_training() -> None:
    m, plain = make("sdpa", dropout=0.5), make("sdpa")  # the same weights (seed 0), one without dropout
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(m.eval()(x), plain(x))  # eval: dropout is the identity
    m.train()
    assert not torch.allclose(m(x), plain(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_module(dtype: torch.dtype) -> None:
    m = make("auto")
    x = torch.randn(2, 9, 32)
    expected = m(x)
    got = m.to(dtype)(x.to(dtype))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, atol=5e-2, rtol=5e-2)


def test_rotary_matches_complex_rotation() -> None:
    """RoFormer eq. 34 as complex numbers: pair (i, i + D/2) rotates by pos * base^(-2i/D)."""
    d, t = 8, 5
    x = torch.randn(1, 1, t, d, dtype=torch.float64)
    cos, sin = RotaryEmbedding(head_dim=d)(torch.arange(t), dtype=torch.float64)
    got = apply_rotary(x, cos, sin)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * theta  # (T, D/2)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], dim=-1))


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
def test_flash_memory_stays_linear_and_far_below_the_score_matrix() -> None:
    torch.manual_seed(0)
    peaks = {}
    for t in (2048, 4096):
        q, k, v = (torch.randn(1, 4, t, 32, requires_grad=True) for _ in range(3))
        with PeakMemory() as mem:
            out = attention(q, k, v, is_causal=True, backend="flash")
            out.sum().backward()
        peaks[t] = mem.peak_bytes
    score_matrix = 4 * 4096 * 4096 * 4  # one float32 (H, T, T) matrix at 4096 tokens: 256 MiB
    assert peaks[4096] < score_matrix / 8
    assert peaks[4096] < 2.5 * peaks[2048]  # doubling T roughly doubles memory; T^2 would quadruple
    with torch.no_grad(), PeakMemory() as eager_mem:
        attention(q, k, v, is_causal=True, backend="eager")
    assert eager_mem.peak_bytes > score_matrix  # the readable path does hold the T^2 matrix


@pytest.mark.slow  # a real inductor compile: half a minute on 2 cores
def test_works_under_torch_compile() -> None:
    m = make("auto")
    x = torch.randn(2, 8, 32)
    expected = m(x)
    compiled = torch.compile(m)
    torch.testing.assert_close(compiled(x), expected, atol=1e-5, rtol=1e-5)
