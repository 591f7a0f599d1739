"""Bad input to attention() and Attention gets an error naming the values and the fix."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention, attention
from attnlab.functional import Visibility
from attnlab.models import from_hf_gpt2
from attnlab.nn import RotaryEmbedding

q4 = torch.randn(2, 4, 5, 8)
kv2 = torch.randn(2, 2, 5, 8)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            dict(q=torch.randn(4, 5, 8)),
            ValueError,
            r"q must be 4-D \(batch, heads, seq, head_dim\), got 3-D shape \(4, 5, 8\).*transpose",
        ),
        (
            dict(k=torch.randn(2, 3, 5, 8), v=torch.randn(2, 3, 5, 8)),
            ValueError,
            r"q heads \(4\) must be a multiple of kv heads \(3\).*\[1, 2, 4\]",
        ),
        (dict(k=torch.randn(2, 2, 5, 6)), ValueError, r"q and k must have the same head_dim, got 8 and 6"),
        (dict(v=torch.randn(2, 2, 6, 8)), ValueError, r"k and v must have the same sequence length, got 5 and 6"),
        (dict(k=torch.randn(3, 2, 5, 8), v=torch.randn(3, 2, 5, 8)), ValueError, r"batch sizes differ: q 2, k 3, v 3"),
        (
            dict(k=kv2.double()),
            TypeError,
            r"q, k, v must share a dtype, got torch.float32, torch.float64, torch.float32",
        ),
        (
            dict(q=torch.ones(2, 4, 5, 8, dtype=torch.long)),
            TypeError,
            r"q must be floating point, got dtype torch.int64",
        ),
        (
            dict(mask=torch.ones(5, 4, dtype=torch.bool)),
            ValueError,
            r"mask of shape \(5, 4\) does not broadcast to \(batch, heads, Tq, Tk\) = \(2, 4, 5, 5\)",
        ),
        (
            dict(mask=torch.ones(5, 5, dtype=torch.long)),
            TypeError,
            r"mask must be bool.*got dtype torch.int64.*mask.bool\(\)",
        ),
        (dict(window=0), ValueError, r"window must be >= 1.*got 0"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\), got 1.0"),
        (dict(dropout_p=-0.1), ValueError, r"got -0.1"),
        (dict(scale=0.0), ValueError, r"scale must be a positive finite number.*got 0.0"),
        (
            dict(backend="cuda"),
            ValueError,
            r"backend must be one of \['auto', 'eager', 'sdpa', 'flash', 'flex'\] or a configured Flash\(\.\.\.\), "
            r"got 'cuda'",
        ),
        (
            dict(backend="sdpa", return_weights=True),
            ValueError,
            r"return_weights=True needs the eager backend; backend='sdpa'",
        ),
        (dict(backend="flash", return_weights=True), ValueError, r"backend='flash' never forms the weights"),
        (
            dict(is_causal=True, visibility=Visibility.from_lengths(4, 4)),
            ValueError,
            r"pass either visibility= or is_causal, not both",
        ),
        (dict(visibility="causal"), TypeError, r"visibility must be an attnlab.functional.Visibility, got str"),
    ],
)
def test_functional_errors(kwargs: dict, error: type, pattern: str) -> None:
    args = dict(q=q4, k=kv2, v=kv2)
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=pattern):
        attention(q, k, v, **args)


def test_flash_refuses_a_float_mask_that_needs_gradients() -> None:
    bias = torch.zeros(5, 5, requires_grad=True)
    with pytest.raises(ValueError, match=r"flash backend treats float masks as constants.*'eager' or 'sdpa'"):
        attention(q4, kv2, kv2, mask=bias, backend="flash")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (
            dict(d_in=32, num_heads=5),
            r"d_out \(32\) must be divisible by num_heads \(5\); each head gets d_out // num_heads dimensions. Try num_heads in \[1, 2, 4, 8, 16, 32\]",
        ),
        (
            dict(d_in=32, num_heads=4, num_kv_heads=3),
            r"num_heads \(4\) must be a multiple of num_kv_heads \(3\).*\[1, 2, 4\]",
        ),
        (dict(d_in=32, num_heads=4, dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (dict(d_in=32, num_heads=4, window=0), r"window must be >= 1"),
        (dict(d_in=32, num_heads=4, backend="fast"), r"backend must be one of .* got 'fast'"),
        (dict(d_in=32, num_heads=4, scale=-1.0), r"scale must be a positive finite number or None.*got -1.0"),
        (dict(d_in=32, num_heads=4, head_dim=0), r"head_dim must be >= 1, got 0"),
        (dict(d_in=32, num_heads=10**9), r"num_heads must be <= 65536, got 1000000000; is it a typo\?"),
        (dict(d_in=-3, num_heads=4), r"d_in must be >= 1, got -3"),
        (dict(d_in=30, num_heads=6, rope=True), r"rotary embedding needs an even head_dim >= 2, got 5"),
        (dict(d_in=0, num_heads=4), r"d_in must be >= 1, got 0"),
    ],
)
def test_module_constructor_errors(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        Attention(**kwargs)


def test_module_forward_errors() -> None:
    m = Attention(d_in=32, num_heads=4)
    with pytest.raises(ValueError, match=r"\(batch, tokens, d_in\) with 3 dims, got shape \(5, 32\).*unsqueeze\(0\)"):
        m(torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"d_in=32, got 16"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(TypeError, match=r"input dtype torch.float64 differs from the module's torch.float32"):
        m(torch.randn(2, 5, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"takes 1 positional argument"):  # keyword-only
        Attention(32, 4)


def test_rotary_position_errors() -> None:
    rope = RotaryEmbedding(head_dim=8)
    with pytest.raises(ValueError, match=r"positions must be >= 0, got a minimum of -1"):
        rope(torch.tensor([-1, 0, 1]))
    with pytest.raises(ValueError, match=r"integer tensor of shape \(T,\) or \(B, T\), got torch.float32"):
        rope(torch.arange(3.0))


def test_loader_rejects_wrong_shapes() -> None:
    sd = {
        "c_attn.weight": torch.randn(16, 40),
        "c_attn.bias": torch.zeros(40),
        "c_proj.weight": torch.randn(16, 16),
        "c_proj.bias": torch.zeros(16),
    }
    with pytest.raises(ValueError, match=r"c_attn.weight should be \(E, 3E\), got \(16, 40\)"):
        from_hf_gpt2(sd, num_heads=2)
