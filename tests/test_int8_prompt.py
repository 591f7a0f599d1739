"""A prompt's rows through an int8 weight (issue 58, item 4): ``quantize("int8")``'s "auto" sends a call of more
rows than a decode step's to the dynamic kernel's int8 x int8 products, while a decode step keeps the weight's
one-row kernel; a named kernel keeps its own numbers for every call. The prompt's numbers are linear_dynamic's on
each row alone, bitwise, and within the activations' rounding of the readable dequantized product."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from attnlab.linear import int8_choice
from attnlab.linear.gemv import INT8_ROWS
from attnlab.linear.int8_choice import quantize_linears
from attnlab.linear.quantized import Int8Linear, available_kernels
from attnlab.models import GPT
from conftest import small


def needs_dynamic() -> None:
    if "dynamic" not in available_kernels():
        message = "this PyTorch build has no x86 dynamic int8 kernel"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # in CI a missing prerequisite is a failure, never a silent skip
        pytest.skip(message)


def int_mm_calls(fn: object) -> int:
    """How many int8 x int8 products (``aten::_int_mm``) ``fn()`` ran, called once before it is counted (the
    first call checks the rows' path once per process, by products of its own)."""
    with torch.no_grad():
        fn()  # type: ignore[operator]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()  # type: ignore[operator]
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_int_mm")


def layer(prompt: str, kernel: str = "dequantize") -> Int8Linear:
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.utils.skip_init(nn.Linear, 96, 40)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=generator))
        linear.bias.copy_(torch.randn(40, generator=generator))
    return Int8Linear(linear=linear, kernel=kernel, prompt=prompt)  # type: ignore[arg-type]


@pytest.mark.slow  # compiles the rows' rounding (Inductor), seconds
def test_a_prompts_rows_take_the_int8_products_and_a_decode_steps_rows_the_weights_kernel() -> None:
    needs_dynamic()
    fast, own = layer("dynamic"), layer("dequantized")
    prompt, step = torch.randn(INT8_ROWS + 1, 96), torch.randn(1, 96)
    assert int_mm_calls(lambda: fast(prompt)) == 1  # the prompt: int8 x int8
    assert int_mm_calls(lambda: own(prompt)) == 0  # a named kernel's own path
    assert int_mm_calls(lambda: fast(torch.randn(INT8_ROWS, 96))) == 0  # as many rows as a decode step's loop takes
    with torch.no_grad():
        assert torch.equal(fast(step), F.linear(step, fast.dequantized(), fast.bias))  # the one-row kernel's numbers


@pytest.mark.slow  # compiles the rows' rounding (Inductor), seconds
def test_the_prompts_numbers_are_linear_dynamics_row_by_row_and_near_the_dequantized_product() -> None:
    """Bitwise what ``linear_dynamic`` gives each row alone; off the readable dequantized product by no more than
    rounding each activation to its row's 7-bit step moves it: |x - x~| <= step / 2 with step = (max(x, 0) -
    min(x, 0)) / 127 (reduce_range), so |y - y~| <= step / 2 * sum |W| a row of the weight."""
    needs_dynamic()
    fast = layer("dynamic")
    x = torch.randn(24, 96, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.1, 4, 24)[:, None]
    with torch.no_grad():
        got = fast(x)
        assert torch.equal(got, fast._alone(x))
        readable = F.linear(x.double(), fast.dequantized().double(), fast.bias.double())  # (N, out)
    step = (x.clamp(min=0).amax(dim=1) - x.clamp(max=0).amin(dim=1)).double() / 127  # (N,)
    bound = step[:, None] / 2 * fast.dequantized().double().abs().sum(dim=1)[None, :]  # (N, out)
    error = (got.double() - readable).abs()
    assert (error <= bound + 1e-4).all()
    assert error.max() > 1e-4  # the activations were rounded: not the float product


@pytest.mark.slow  # compiles the rows' rounding (Inductor), seconds
def test_auto_gives_every_weight_the_int8_prompt_and_a_named_kernel_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill through a model quantized by "auto" runs one int8 x int8 product per block linear (the head
    reads the last row alone); its decode steps run none. A named kernel's prefill runs none."""
    needs_dynamic()
    monkeypatch.setattr(int8_choice, "fastest_int8_kernel", lambda d_in, d_out: "dequantize")  # the one-row choice
    idx = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    auto, named = GPT(small()).eval(), GPT(small()).eval()
    quantize_linears(auto)
    quantize_linears(named, "dequantize")
    blocks = sum(isinstance(m, Int8Linear) for m in auto.trf_blocks.modules())
    assert {m.prompt for m in auto.modules() if isinstance(m, Int8Linear)} == {"dynamic"}
    assert int_mm_calls(lambda: auto.generate(idx, 1)) == blocks  # the prompt's pass
    assert int_mm_calls(lambda: auto.generate(idx, 4)) == blocks  # and three decode steps: none more
    assert int_mm_calls(lambda: named.generate(idx, 4)) == 0


@pytest.mark.slow  # compiles the rows' rounding (Inductor), seconds
def test_a_gradient_or_a_graph_keeps_the_kernels_own_path() -> None:
    """``_int_mm`` has no backward: a prompt that wants a gradient takes the dequantized product, exactly."""
    needs_dynamic()
    fast = layer("dynamic")
    x = torch.randn(INT8_ROWS + 4, 96, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fast(x)
    assert not any(e.key == "aten::_int_mm" for e in prof.key_averages())
    assert torch.equal(out, F.linear(x, fast.dequantized(), fast.bias))
    out.sum().backward()
    assert x.grad is not None


def test_a_prompt_path_it_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"prompt must be 'dequantized' or 'dynamic', got 'int4'"):
        layer("int4")
