"""Weight-only int8 (attnlab.nn.quantized, GPT.quantize): the kernels agree with the readable path."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

from attnlab.models import GPT
from attnlab.nn.quantized import Int8Linear, available_kernels, quantize_rows
from conftest import small


def test_each_weight_is_within_half_a_step_of_its_row() -> None:
    torch.manual_seed(0)
    w = torch.randn(6, 10) * torch.tensor([1e-3, 1, 5, 0, 2, 1])[:, None]  # a row of zeros among them
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (6,)
    error = (w - q.float() * scale[:, None]).abs()
    assert bool((error <= scale[:, None] / 2 + 1e-7).all())
    assert scale[3] == 1.0 and bool((q[3] == 0).all())  # zeros stay zeros, no division by zero
    assert int(q.abs().max()) == 127


@pytest.mark.parametrize("kernel", available_kernels())
def test_every_kernel_agrees_with_the_readable_path(kernel: str) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 40)
    x = torch.randn(2, 5, 48)
    readable = Int8Linear(linear=linear, kernel="dequantize")
    got = Int8Linear(linear=linear, kernel=kernel)(x)  # type: ignore[arg-type]
    want = readable(x)
    assert got.shape == (2, 5, 40)
    if kernel == "dynamic":  # it also rounds the activations to 8 bits: close, not equal
        assert float((got - want).abs().max()) < 0.02 * float(want.abs().max())
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the readable path is the float layer with the int8 weight: off from the original by the rounding alone
    bound = (x.abs().sum(-1, keepdim=True) * readable.scale / 2).amax()
    with torch.no_grad():
        assert float((want - linear(x)).abs().max()) <= float(bound)


def test_gpt_quantize_replaces_every_linear_and_stays_close() -> None:
    torch.manual_seed(0)
    model = GPT(small(n_kv_heads=4)).eval()
    idx = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        before = model(idx)
    chosen = model.quantize(kernel="int8pack")
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert linears == [] and model.quantized
    assert set(chosen) == {
        f"trf_blocks.{i}.{n}" for i in range(2) for n in ("att.qkv", "att.out_proj", "ff.0", "ff.2")
    } | {"out_head"}
    with torch.no_grad():
        after = model(idx)
        assert float((after - before).abs().max()) < 0.05 * float(before.abs().max())
        out = model.generate(idx[:1], 5)
    assert out.shape == (1, 17)


def test_quantize_refuses_what_it_cannot_do_and_leaves_the_model_as_it_was(tmp_path: object) -> None:
    model = GPT(small()).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="kind must be 'int8'"):
        model.quantize("int4")
    with pytest.raises(ValueError, match="kernel must be one of"):
        model.quantize(kernel="fast")
    half = GPT(small()).eval().to(torch.bfloat16)
    with pytest.raises(TypeError, match=r"starts from a float32 model.*call model.float\(\) first"):
        half.quantize()
    assert not model.quantized
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    model.quantize(kernel="dequantize")
    with pytest.raises(ValueError, match="quantized already"):
        model.quantize()
    with pytest.raises(ValueError, match="save the float model, and quantize after from_pretrained"):
        model.save_pretrained(tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes float32 activations, got torch\.float64"):
        model.out_head(torch.zeros(1, 64, dtype=torch.float64))


def test_a_compiled_step_refuses_the_kernel_it_would_break_at() -> None:
    if "dynamic" not in available_kernels():
        message = "this PyTorch build has no x86 dynamic int8 kernel: nothing here to refuse"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # in CI a missing prerequisite is a failure, never a silent skip
        pytest.skip(message)
    model = GPT(small()).eval()
    model.quantize(kernel="dynamic")
    with pytest.raises(ValueError, match="cannot hold int8 weights on the 'dynamic' kernel in one graph"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, compile=True)
