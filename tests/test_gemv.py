"""The decode step's product by a loop torch.compile writes (issue 37, attnlab.linear.gemv): the loop agrees with
the readable product for every weight it reads; a row's numbers never depend on the other rows; the "gemv"
layout and int8 kernel send every product of a decode step through the loop (seen by the profiler) and a
prompt's many rows elsewhere; a machine without torch.compile is refused by name and never chosen."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from attnlab.linear import gemv as gemv_module
from attnlab.linear import inductor, layout, quantized
from attnlab.linear import products as layout_products
from attnlab.linear.gemv import FLOAT_ROWS, INT8_ROWS, gemv, readable_gemv, why_no_gemv
from attnlab.linear.products import GemvLinear
from attnlab.linear.quantized import Int8Linear
from attnlab.models import GPT, GPTConfig
from conftest import python_calls

if why_no_gemv() and os.environ.get("CI") != "true":  # under CI=true the tests run, and fail
    pytest.skip(f"no gemv loop here: {why_no_gemv()}", allow_module_level=True)


def weights(dtype: torch.dtype, out: int, d_in: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator().manual_seed(out * d_in)
    if dtype == torch.int8:
        q = torch.randint(-127, 128, (out, d_in), generator=generator, dtype=torch.int8)
        return q, torch.rand(out, generator=generator) / 50 + 1e-3
    return torch.randn(out, d_in, generator=generator).to(dtype), None


@pytest.mark.slow  # compiles a kernel for each shape it tries (cold: about a second each)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_loop_agrees_with_the_readable_product(dtype: torch.dtype, with_bias: bool) -> None:
    """Odd widths (the loop's vector tails), one row and the most the loop serves, and rows cut from a larger
    tensor at an odd offset (not aligned as a fresh tensor is)."""
    x_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    weight, scale = weights(dtype, 37, 100)
    bias = torch.randn(37).to(x_dtype) if with_bias else None
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
    for n in (1, INT8_ROWS if dtype == torch.int8 else FLOAT_ROWS):
        x = torch.randn(n * 100 + 3, generator=torch.Generator().manual_seed(n)).to(x_dtype)[3:].view(n, 100)
        got = gemv(x, weight, scale, bias)
        assert got.shape == (n, 37) and got.dtype == x_dtype
        torch.testing.assert_close(got, readable_gemv(x, weight, scale, bias), **tol)
    if dtype == torch.float32:  # the readable path is F.linear's product, for float weights
        x = torch.randn(2, 100)
        torch.testing.assert_close(readable_gemv(x, weight, None, bias), F.linear(x, weight, bias))


@pytest.mark.slow  # compiles a kernel for each shape it tries (cold: about a second each)
def test_a_rows_numbers_never_depend_on_the_other_rows_of_the_call() -> None:
    """Bitwise: each row of an 8-row call is what that row gives alone (a prompt lookup's check, a batch of
    prompts and a decode step see the same numbers for a token)."""
    weight, scale = weights(torch.int8, 53, 96)
    x = torch.randn(INT8_ROWS, 96, generator=torch.Generator().manual_seed(5))
    together = gemv(x, weight, scale)
    alone = torch.cat([gemv(row[None], weight, scale) for row in x])
    assert torch.equal(together, alone)
    w, _ = weights(torch.float32, 53, 96)
    assert torch.equal(gemv(x[:2], w), torch.cat([gemv(x[:1], w), gemv(x[1:2], w)]))


def test_what_the_loop_would_broadcast_is_refused_by_name() -> None:
    """Shapes F.linear refuses, and a scale missing or misplaced: a one-feature x would broadcast silently."""
    weight, scale = weights(torch.int8, 8, 16)
    with pytest.raises(ValueError, match=r"gemv got a torch\.float32 weight and a scale \(8,\): pass scale \(out,\)"):
        gemv(torch.randn(1, 16), weight.float(), scale)
    with pytest.raises(ValueError, match=r"gemv got a torch\.int8 weight and no scale: pass scale \(out,\) with"):
        gemv(torch.randn(1, 16), weight)
    with pytest.raises(ValueError, match=r"got x \(1, 1\) and weight \(8, 16\): reshape x to \(-1, 16\)"):
        gemv(torch.randn(1, 1), weight, scale)
    with pytest.raises(ValueError, match=r"gemv's bias must be \(8,\), one a row of the weight, got \(16,\)"):
        gemv(torch.randn(1, 16), weight, scale, torch.zeros(16))
    layer = GemvLinear(16, 8)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"), torch.no_grad():  # F.linear's own
        layer(torch.randn(1, 1))


@pytest.mark.slow  # compiles a kernel for each shape it tries (cold: about a second each)
def test_the_loop_reads_the_weight_as_it_is_now_and_any_view_of_x() -> None:
    """A kernel is compiled once per shape, not per tensor: an in-place edit of the weight is read, a row cut from
    a batch (aligned, then at an odd offset) and a strided x give the readable numbers."""
    weight, _ = weights(torch.float32, 24, 40)
    x = torch.randn(6, 40)
    torch.testing.assert_close(gemv(x[:1], weight), readable_gemv(x[:1], weight))
    weight.mul_(-2)
    torch.testing.assert_close(gemv(x[:1], weight), readable_gemv(x[:1], weight))
    torch.testing.assert_close(gemv(x[3:4], weight), readable_gemv(x[3:4], weight))
    odd = torch.randn(81)[1:].view(2, 40)
    torch.testing.assert_close(gemv(odd, weight), readable_gemv(odd, weight))
    strided = torch.randn(40, 2).t()  # (2, 40), not contiguous
    torch.testing.assert_close(gemv(strided, weight), readable_gemv(strided, weight))


def test_a_gradient_through_gemv_itself_is_kept() -> None:
    """The compiled loop has no backward: a call that wants a gradient runs the loop's own ops instead."""
    weight, _ = weights(torch.float32, 8, 16)
    x = torch.randn(1, 16, requires_grad=True)
    gemv(x, weight).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, weight.sum(0, keepdim=True))


def small() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


def products(model: GPT, idx: torch.Tensor) -> dict[str, int]:
    """How many products of one forward pass (its logits at the last position, as generation asks) ran through
    the compiled loop and how many through a BLAS or oneDNN (torch.profiler, real kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(idx, last_only=True)
    count = {e.key: e.count for e in prof.key_averages()}
    return {
        "loop": sum(n for key, n in count.items() if "CompiledFxGraph" in key),
        "other": sum(count.get(k, 0) for k in ("mkldnn::_linear_pointwise", "aten::linear")),  # F.linear or oneDNN
    }


@pytest.mark.slow  # a few seconds of compiling: each of the model's shapes
def test_the_gemv_layout_sends_a_decode_steps_products_through_the_loop() -> None:
    """The effect: after set_layout("gemv") a one-token forward runs all 9 products (qkv, out_proj, two ff per
    block, out_head) in the loop and none elsewhere; a 10-token prompt's blocks go to oneDNN, its last position's
    logits through the loop. The same greedy tokens as the rows layout, and "rows" puts F.linear back."""
    model = small()
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    tokens = model.generate(idx, 12)
    assert products(model, idx[:, :1]) == {"loop": 0, "other": 9}
    got = model.set_layout("gemv")
    assert set(got.values()) == {"gemv"} and len(got) == 9
    assert all(type(m) is GemvLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert products(model, idx[:, :1]) == {"loop": 9, "other": 0}
    assert products(model, idx) == {"loop": 1, "other": 8}
    assert torch.equal(model.generate(idx, 12), tokens)
    model.set_layout("rows")
    assert products(model, idx[:, :1]) == {"loop": 0, "other": 9}


@pytest.mark.slow  # about 10 s of compiling: each of the model's shapes at 1 and at 8 rows
def test_the_gemv_int8_kernel_runs_the_loop_for_a_few_rows_and_slices_for_many() -> None:
    """quantize(kernel="gemv"): a decode step's 9 products in the loop; a prompt of more than INT8_ROWS tokens
    dequantizes its weights a slice at a time; both are dequantize's numbers to float rounding, and greedy
    decoding keeps the readable kernel's tokens."""
    readable, model = small(), small()
    readable.quantize(kernel="dequantize")
    assert set(model.quantize(kernel="gemv").values()) == {"gemv"}
    idx = torch.randint(0, 96, (1, INT8_ROWS + 4), generator=torch.Generator().manual_seed(2))
    assert products(model, idx[:, :1]) == {"loop": 9, "other": 0}
    assert products(model, idx[:, :INT8_ROWS]) == {"loop": 9, "other": 0}
    assert products(model, idx)["loop"] == 1  # the blocks' products sliced, out_head's one row in the loop
    with torch.no_grad():
        torch.testing.assert_close(model(idx), readable(idx), rtol=1e-4, atol=1e-4)
    assert torch.equal(model.generate(idx, 12), readable.generate(idx, 12))


@pytest.mark.slow  # compiles the decode step, and the loop for each of the model's shapes
@pytest.mark.parametrize("kind", ["layout", "int8"])
def test_a_compiled_step_calls_the_loop_as_one_op_for_each_product(kind: str) -> None:
    """Under generate(compile=True) each of a step's 9 products is the op attnlab::gemv, which the graph calls
    without looking inside, and the loop compiled on its own runs it: traced inline, Inductor fused the norm and
    GELU before each product into the loop and recomputed them for every weight row (docs/benchmarks.md). The
    compiled step keeps the eager tokens."""
    from torch.profiler import ProfilerActivity, profile

    model = small()
    if kind == "layout":
        model.set_layout("gemv")
    else:
        model.quantize(kernel="gemv")
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(3))
    eager = model.generate(idx, 6)
    model.generate(idx, 6, compile=True)  # compiles the step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled = model.generate(idx, 6, compile=True)
    count = {e.key: e.count for e in prof.key_averages()}
    assert count.get("attnlab::gemv", 0) == 9 * 5  # 5 decode steps: the prompt's pass draws the first token
    assert torch.equal(compiled, eager)


@pytest.mark.slow  # compiles the loop for each kind
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_the_op_a_graph_calls_passes_torchs_own_checks(dtype: torch.dtype) -> None:
    """attnlab::gemv under torch.library.opcheck: its schema, its fake (the shape, dtype and strides a graph plans
    for) against what the loop returns, and how it dispatches; with a bias, and int8's scale."""
    weight, scale = weights(dtype, 24, 40)
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(4)).to(
        torch.float32 if dtype == torch.int8 else dtype
    )
    bias = torch.randn(24).to(x.dtype)
    torch.library.opcheck(torch.ops.attnlab.gemv, (x, weight, scale, bias))


def test_slices_of_a_large_weight_give_the_whole_products_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 7 rows (a tiny SLICE_BYTES) for a 37-row weight: the last slice short, every slice placed."""
    linear = torch.nn.Linear(100, 37)
    layer = Int8Linear(linear=linear, kernel="gemv")
    x = torch.randn(INT8_ROWS + 3, 100)
    want = F.linear(x, layer.dequantized(), layer.bias)
    monkeypatch.setattr(quantized, "SLICE_BYTES", 7 * 4 * 100)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)


def test_a_gradient_goes_through_f_linear_and_stays_exact() -> None:
    """A product that needs a gradient is not the loop's (it has no backward): a training step after
    set_layout("gemv") gives a plain model's gradients, bit for bit."""
    plain, fast = small(), small()
    fast.set_layout("gemv")
    idx = torch.randint(0, 96, (1, 1), generator=torch.Generator().manual_seed(2))
    for model in (plain, fast):
        model.train()
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), name


def test_without_torch_compile_gemv_is_refused_by_name_and_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "torch.compile cannot build the loop here (InvalidCxxCompiler: no working C++ compiler found)"
    for module in (gemv_module, layout, layout_products, quantized):
        monkeypatch.setattr(module, "why_no_gemv", lambda: reason)
    model = small()
    with pytest.raises(RuntimeError, match=r"the gemv layout cannot run here: torch.compile cannot build .*'onednn'"):
        model.set_layout("gemv")
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    with pytest.raises(RuntimeError, match=r"the 'gemv' kernel cannot run here: torch.compile cannot build"):
        model.quantize(kernel="gemv")
    assert not model.quantized
    assert "gemv" not in quantized.available_kernels()
    assert "gemv" not in layout.stream_rates(16, 32, repeats=1)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    assert layout.fastest_layout(16, 32) != "gemv"


def test_a_compiler_that_fails_is_reported_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """why_no_gemv's probe, with the compile step failing as it does without a C++ compiler."""

    def fails(*args: object) -> object:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nsecond line")

    monkeypatch.setattr(gemv_module, "_kernel", fails)
    monkeypatch.setattr(inductor, "KERNELS", {})  # as in a new process: nothing compiled yet
    reason = why_no_gemv.__wrapped__()
    assert (
        reason
        == "torch.compile cannot build the loop here (RuntimeError: InvalidCxxCompiler: No working C++ compiler found)"
    )


def test_a_decode_products_loop_is_called_past_the_compilers_wrappers() -> None:
    """The effect: once a loop is built and has agreed with Inductor's wrapped callable bitwise, a product calls
    the compiled graph's own runner, past AOTAutograd's and Dynamo's runtime wrappers (which this graph, with no
    gradient, mutation or view, does not need). Counted in Python functions entered: the layout's whole product
    (its checks, the kernel's spec, the runner) enters 23, and 49 through the wrappers (torch 2.13)."""
    weight, bias = torch.randn(24, 16), torch.randn(24)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        first = layout_products.gemv_linear(x, weight, bias)  # builds the loop, compares its runner once
        again = layout_products.gemv_linear(x, weight, bias)
        assert torch.equal(first, again)
        torch.testing.assert_close(again, F.linear(x, weight, bias))
        entered = python_calls(lambda: layout_products.gemv_linear(x, weight, bias))
    assert entered <= 28, entered


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("bias_shape", [(), (1,)])
def test_a_bias_that_broadcasts_gets_f_linears_numbers_from_every_layout(
    rows: int, bias_shape: tuple[int, ...]
) -> None:
    """F.linear broadcasts a bias of shape () or (1,); the layouts' own products read a bias as one number a row,
    so such a bias goes to F.linear: the same numbers, never another product's (oneDNN's read it as (out,))."""
    torch.manual_seed(0)
    x, weight, bias = torch.randn(1, rows, 16), torch.randn(24, 16), torch.randn(bias_shape)
    want = F.linear(x, weight, bias)
    products = [layout_products.onednn_linear, layout_products.gemv_linear, layout_products.prefetch_linear]
    products += [layout_products.packed_linear]
    with torch.no_grad():
        for product in products:
            torch.testing.assert_close(product(x, weight, bias), want, msg=product.__name__)


def test_the_loops_one_check_is_the_two_it_joins() -> None:
    """products._loop_serves asks once what plain_inference and gemv_applies ask (and one dtype throughout, a
    row-major weight, a bias of one number a row), over calls that each fail one condition, and one that passes."""
    weight, bias = torch.randn(24, 16), torch.randn(24)
    x = torch.randn(1, 1, 16)
    cases = {
        "passes": (x, weight, bias),
        "no bias": (x, weight, None),
        "three rows": (torch.randn(1, 3, 16), weight, bias),
        "a bias of ()": (x, weight, torch.randn(())),
        "bfloat16 x": (x.bfloat16(), weight, bias),
        "float64": (x.double(), weight.double(), bias.double()),
        "columns weight": (x, weight.t().contiguous().t(), bias),
        "x needs grad": (x.clone().requires_grad_(), weight, bias),
        "inner 0": (torch.randn(1, 1, 0), torch.randn(24, 0), bias),
        "int bias": (x, weight, torch.zeros(24, dtype=torch.int64)),
    }
    for name, (xs, w, b) in cases.items():
        flat = xs.reshape(xs.shape[0] * xs.shape[1], xs.shape[-1])  # (B, T, in) -> (N, in)
        same = w.dtype == xs.dtype and (b is None or b.dtype == xs.dtype) and w.is_contiguous()
        joined = same and layout_products.plain_inference(xs, w, b) and gemv_module.gemv_applies(flat, w)
        assert layout_products._loop_serves(xs, flat, w, b) == joined, name
    assert layout_products._loop_serves(x, x.reshape(-1, 16), weight, bias)  # the one that passes, passes


def test_a_runner_that_disagrees_or_cannot_be_found_leaves_the_wrapped_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the first call's comparison fails, or no runner is found (another torch), every call goes through
    Inductor's wrapped callable, with its numbers; the comparison is made once."""
    weight, bias, x = torch.randn(20, 16), torch.randn(20), torch.randn(1, 1, 16)
    want = F.linear(x, weight, bias)
    compared: list[int] = []

    def disagrees(a: object, b: object) -> bool:
        compared.append(1)
        return False

    for patch in ("_same", "_runner"):
        monkeypatch.setattr(inductor, "KERNELS", {})
        if patch == "_same":
            monkeypatch.setattr(inductor, "_same", disagrees)
        else:
            monkeypatch.setattr(inductor, "_runner", lambda built: None)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(layout_products.gemv_linear(x, weight, bias), want)
            assert python_calls(lambda: layout_products.gemv_linear(x, weight, bias)) > 28  # the wrappers, run
    assert compared == [1]


def test_an_empty_inner_dimension_gets_f_linears_answer_from_every_layout() -> None:
    """x (B, T, 0) times a (out, 0) weight is the bias alone, as F.linear gives it; the layouts once asked
    reshape for (-1, 0), which it refuses as ambiguous."""
    x, weight, bias = torch.randn(1, 2, 0), torch.randn(24, 0), torch.randn(24)
    products = [layout_products.onednn_linear, layout_products.gemv_linear, layout_products.prefetch_linear]
    with torch.no_grad():
        for product in [*products, layout_products.packed_linear]:
            torch.testing.assert_close(product(x, weight, bias), F.linear(x, weight, bias), msg=product.__name__)
