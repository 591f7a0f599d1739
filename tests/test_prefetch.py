"""The "prefetch" layout (issue 37, attnlab.linear.prefetch): a decode step's product by attnlab's C++ loop that asks
memory for the next rows of the weight before it reads them. It agrees with the readable product in both dtypes
it reads; a prefetch changes no number (ahead=0 is bitwise the same); a row's numbers never depend on the other
row; what the C++ would read wrongly is refused by name; set_layout("prefetch") sends a decode step's products
through the C++ (counted), a prompt's to oneDNN and a gradient to F.linear; a compiled step calls it as one op;
a machine that cannot build it is told why and never given it. Where each ask points is read off a build that
records the asks (ATTNLAB_PREFETCH_PROBE). What the prefetch gains is speed, which only a benchmark measures:
benchmarks/stream_rates.py times the loop with and without it, side by side."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from attnlab.linear import layout, prefetch
from attnlab.linear import products as layout_products
from attnlab.linear.gemv import readable_gemv
from attnlab.linear.prefetch import ROWS, why_no_prefetch
from attnlab.linear.products import PrefetchLinear, prefetch_linear
from attnlab.models import GPT, GPTConfig
from conftest import compiled_op_calls

if why_no_prefetch() and os.environ.get("CI") != "true":  # under CI=true the tests run, and fail
    pytest.skip(f"no prefetch loop here: {why_no_prefetch()}", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16]


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """float32: the order of a float32 sum; bfloat16: that, then one rounding to bfloat16 (2^-8 relative)."""
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_loop_agrees_with_the_readable_product(dtype: torch.dtype, with_bias: bool) -> None:
    """Widths that leave tails everywhere: 100 inputs (a vector's tail), 37 and 13 outputs (a block of 4 rows cut
    short, and a weight too small to ask ahead); one row and two; rows cut at an odd offset, and a strided x."""
    generator = torch.Generator().manual_seed(0)
    for d_out in (37, 13, 2):
        weight = torch.randn(d_out, 100, generator=generator).to(dtype)
        bias = torch.randn(d_out, generator=generator).to(dtype) if with_bias else None
        for n in range(1, ROWS + 1):
            x = torch.randn(n * 100 + 3, generator=generator).to(dtype)[3:].view(n, 100)
            got = prefetch.gemv(x, weight, bias)
            assert got.shape == (n, d_out) and got.dtype == dtype
            torch.testing.assert_close(got, readable_gemv(x, weight, None, bias), **tolerance(dtype))
    strided = torch.randn(100, 2, generator=generator).to(dtype).t()  # (2, 100), not contiguous
    torch.testing.assert_close(prefetch.gemv(strided, weight), readable_gemv(strided, weight), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prefetch_changes_no_number_and_a_row_never_depends_on_the_other(dtype: torch.dtype) -> None:
    """Bitwise: asking 0, 1 or 3 blocks ahead gives the same numbers (a prefetch only asks memory early), and each
    row of a 2-row call is what that row gives alone (a prompt lookup's check and a decode step agree)."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(203, 96, generator=generator).to(dtype)
    bias = torch.randn(203, generator=generator).to(dtype)
    x = torch.randn(2, 96, generator=generator).to(dtype)
    want = prefetch.gemv(x, weight, bias)
    for ahead in (0, 3):
        assert torch.equal(prefetch.gemv(x, weight, bias, ahead=ahead), want)
    assert torch.equal(torch.cat([prefetch.gemv(x[:1], weight, bias), prefetch.gemv(x[1:], weight, bias)]), want)


def test_the_built_loop_asks_memory_ahead() -> None:
    """The technique itself, which no number shows (a prefetch changes none) and only a benchmark times: the
    library built from prefetch.cpp holds prefetch instructions (x86's prefetch*, Arm's prfm), read off its
    disassembly by binutils' objdump, at both cache levels it asks for. Without the C++'s __builtin_prefetch, it
    holds none."""
    import shutil
    import subprocess

    objdump = shutil.which("objdump")
    if objdump is None and os.environ.get("CI") != "true":  # under CI=true the test runs, and fails
        pytest.skip("no objdump (binutils) to read the built loop")
    assert objdump is not None, "objdump (binutils) is missing: install binutils, which gcc brings"
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", prefetch._library()._name], capture_output=True, text=True, check=True
    ).stdout
    # an instruction line is "address:<tab>name operands" (x86) or "address:<tab>name<tab>operands" (Arm)
    asks = [line.split(":\t", 1)[1].strip() for line in listing.splitlines() if ":\t" in line]
    asks = [ask for ask in asks if ask.startswith(("prefetch", "prfm"))]
    assert asks, "the built loop holds no prefetch instruction"
    # the two levels: the next block into the first-level cache, the one further on into the outer ones (GCC's
    # locality 3 and 1: x86's prefetcht0 and prefetcht2, Arm's pldl1keep and pldl3keep)
    assert any(ask.startswith("prefetcht0") or "pldl1" in ask for ask in asks), f"no first-level ask: {asks}"
    far = ("prefetcht1", "prefetcht2", "pldl2", "pldl3")
    assert any(level in ask for ask in asks for level in far), f"no outer-level ask: {asks}"


@pytest.mark.slow  # builds prefetch.cpp a second time, as a probe
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_ask_points_at_the_block_ahead_and_the_one_further_on(dtype: torch.dtype) -> None:
    """Where the asks point, which no number and no instruction count shows: prefetch.cpp built with
    ATTNLAB_PREFETCH_PROBE records each ask's address and locality instead of asking. On one thread, block b
    (rows 4b to 4b + 3) asks, at each cache line of a row, for the same line of the 4 rows `ahead` blocks on
    (locality 3, the first level) and of the 4 rows kFar = 2 blocks further (locality 1), while whole blocks lie
    there; never for the rows it sums. ahead=0 asks for nothing."""
    import ctypes

    from torch._inductor.codecache import CppCodeCache

    library = CppCodeCache.load("#define ATTNLAB_PREFETCH_PROBE 1\n" + prefetch.SOURCE.read_text())
    run = library.attnlab_prefetch_gemv
    run.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 4, ctypes.c_int]
    library.attnlab_prefetch_probe.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    library.attnlab_prefetch_probe_count.restype = ctypes.c_int64
    d_out, d_in, line = 40, 96, 64  # 10 blocks of 4 rows; a cache line is 64 bytes
    weight = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(4)).to(dtype)
    x = torch.randn(1, d_in, generator=torch.Generator().manual_seed(5)).to(dtype)
    size = weight.element_size()
    for ahead in (0, 1, 3):
        asks = torch.zeros(1000, 2, dtype=torch.int64)
        out = torch.empty(1, d_out, dtype=dtype)
        library.attnlab_prefetch_probe(asks.data_ptr(), asks.shape[0])
        code = run(
            prefetch.PREFETCH_DTYPES[dtype],
            x.data_ptr(),
            weight.data_ptr(),
            None,
            out.data_ptr(),
            1,
            d_out,
            d_in,
            ahead,
            1,
        )
        count = library.attnlab_prefetch_probe_count()
        assert code == 0 and torch.equal(out, prefetch.gemv(x, weight, ahead=ahead))  # the same numbers
        got = []
        for address, locality in asks[:count].tolist():
            row, column = divmod((address - weight.data_ptr()) // size, d_in)
            got.append((row, column, locality))
        want = []
        for block in range(d_out // 4):
            whole = d_out // 4 - block  # whole blocks from this one to the weight's end
            for column in range(0, d_in, line // size):  # each cache line of a row
                for on, locality in ((ahead, 3), (ahead + 2, 1)):
                    if 0 < ahead and on < whole:
                        want += [(4 * (block + on) + r, column, locality) for r in range(4)]
        assert got == want, (ahead, got[:8], want[:8])
        assert (count > 0) == (ahead > 0)


def test_what_the_c_plus_plus_would_read_wrongly_is_refused_by_name() -> None:
    """The C++ trusts shapes, dtypes, strides and devices: each mismatch is a clear error before it runs."""
    w, x = torch.randn(8, 16), torch.randn(1, 16)
    cases: list[tuple[Callable[[], object], type[Exception], str]] = [
        (lambda: prefetch.gemv(torch.randn(1, 15), w), ValueError, r"got x \(1, 15\) and weight \(8, 16\): reshape"),
        (lambda: prefetch.gemv(torch.randn(3, 16), w), ValueError, r"serves 1 to 2 rows \(a decode step\), got 3"),
        (lambda: prefetch.gemv(torch.randn(0, 16), w), ValueError, r"serves 1 to 2 rows \(a decode step\), got 0"),
        (lambda: prefetch.gemv(x.bfloat16(), w), TypeError, r"all float32 or all bfloat16, got \{'x': torch\.bf"),
        (lambda: prefetch.gemv(x.half(), w.half()), TypeError, r"got \{'x': torch\.float16, 'weight': torch\.f"),
        (lambda: prefetch.gemv(x, w, torch.zeros(8).double()), TypeError, r"'bias': torch\.float64\}: convert"),
        (lambda: prefetch.gemv(x, w, torch.zeros(16)), ValueError, r"bias must be \(8,\), got \(16,\)"),
        (lambda: prefetch.gemv(x, torch.randn(16, 8).t()), ValueError, r"row-major weight, got strides \(1, 8\)"),
        (lambda: prefetch.gemv(x.to("meta"), w), ValueError, r"runs on the CPU, got \{'x': 'meta', 'weight': 'cpu'"),
        (
            lambda: prefetch.gemv(x, w, ahead=-1),
            ValueError,
            r"blocks of 4 rows .* from 0 to the weight's 8 rows, got -1",
        ),
        (
            lambda: prefetch.gemv(x, w, ahead=2**62),
            ValueError,
            r"from 0 to the weight's 8 rows, got 4611686018427387904",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    with pytest.raises(RuntimeError, match=r"attnlab::prefetch_gemv has no backward"):
        prefetch.gemv(x.requires_grad_(), w)


def small(dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval().to(dtype)


IDX = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))


def products(model: GPT, idx: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many products of one forward pass (its logits at the last position, as generation asks) ran through the
    C++ loop (its calls counted) and how many through a BLAS or oneDNN (torch.profiler, real kernels)."""
    from torch.profiler import ProfilerActivity, profile

    calls = []
    run = prefetch.product

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return run(*args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(prefetch, "product", counted)
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model(idx, last_only=True)
    count = {e.key: e.count for e in prof.key_averages()}
    other = sum(count.get(k, 0) for k in ("mkldnn::_linear_pointwise", "aten::linear"))  # F.linear or oneDNN
    return {"loop": len(calls), "other": other}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_layout_sends_a_decode_steps_products_through_the_loop(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The effect: after set_layout("prefetch") a one-token forward runs all 9 products (qkv, out_proj, two ff a
    block, out_head) in the C++ loop and none elsewhere; a 10-token prompt's blocks go to oneDNN, its last
    position's logits through the loop. The readable model's logits (and, in float32, its greedy tokens); the
    parameters untouched; "rows" puts F.linear back."""
    readable, model = small(dtype), small(dtype)
    assert products(model, IDX[:, :1], monkeypatch) == {"loop": 0, "other": 9}
    got = model.set_layout("prefetch")
    assert set(got.values()) == {"prefetch"} and len(got) == 9
    assert all(type(m) is PrefetchLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert products(model, IDX[:, :1], monkeypatch) == {"loop": 9, "other": 0}
    assert products(model, IDX, monkeypatch) == {"loop": 1, "other": 8}
    with torch.no_grad():
        for idx in (IDX[:, :1], IDX[:, :2], IDX):
            torch.testing.assert_close(model(idx), readable(idx), **tolerance(dtype))
    if dtype == torch.float32:
        assert torch.equal(model.generate(IDX, 12), readable.generate(IDX, 12))
    for a, b in zip(readable.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    model.set_layout("rows")
    assert products(model, IDX[:, :1], monkeypatch) == {"loop": 0, "other": 9}


def test_a_gradient_goes_through_f_linear_and_stays_exact() -> None:
    """The loop has no backward: a training step after set_layout("prefetch") gives a plain model's gradients,
    bit for bit."""
    plain, fast = small(), small()
    fast.set_layout("prefetch")
    idx = IDX[:, :1]
    for model in (plain, fast):
        model.train()
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), name


def test_the_op_a_graph_calls_passes_torchs_own_checks() -> None:
    """attnlab::prefetch_gemv under torch.library.opcheck: its schema, its fake against what the loop returns, and
    how it dispatches; both dtypes, with a bias and without."""
    for dtype in DTYPES:
        weight = torch.randn(24, 40).to(dtype)
        x = torch.randn(2, 40).to(dtype)
        torch.library.opcheck(torch.ops.attnlab.prefetch_gemv, (x, weight, torch.randn(24).to(dtype)))
        torch.library.opcheck(torch.ops.attnlab.prefetch_gemv, (x[:1], weight, None))


@pytest.mark.slow  # compiles the decode step
def test_a_compiled_step_calls_the_loop_as_one_op_for_each_product() -> None:
    """Under generate(compile=True) each of a step's 9 products is the op attnlab::prefetch_gemv, which the graph
    calls without looking inside; the compiled step keeps the eager tokens."""
    model = small()
    model.set_layout("prefetch")
    calls, compiled, eager = compiled_op_calls(model, "attnlab::prefetch_gemv", IDX)
    assert calls == 9 * 5  # 5 decode steps: the prompt's pass draws the first token
    assert torch.equal(compiled, eager)


def test_without_a_compiler_the_layout_is_refused_by_name_and_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> object:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nsecond line")

    monkeypatch.setattr(prefetch, "_library", fails)
    reason = why_no_prefetch.__wrapped__()
    assert reason == (
        "the prefetch loop cannot be built here (RuntimeError: InvalidCxxCompiler: No working C++ compiler found)"
    )
    for module in (prefetch, layout, layout_products):
        monkeypatch.setattr(module, "why_no_prefetch", lambda: reason)
    model = small()
    with pytest.raises(RuntimeError, match=r"the prefetch layout cannot run here: the prefetch loop cannot be built"):
        model.set_layout("prefetch")
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert "prefetch" not in layout.stream_rates(16, 32, repeats=1)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    assert layout.fastest_layout(16, 32) != "prefetch"
    layer = PrefetchLinear(16, 8).eval()  # a layer made before: F.linear's numbers, by oneDNN
    with torch.no_grad():
        x = torch.randn(1, 16)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_a_loop_that_disagrees_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build whose numbers are off (a wrong flag, a broken compiler) is caught by the probe, in one line."""
    run = prefetch.product
    monkeypatch.setattr(prefetch, "product", lambda x, w, b=None, **k: run(x, w, b, **k) * 1.5)
    assert why_no_prefetch.__wrapped__() == (
        "the prefetch loop built here disagrees with the readable product (torch.float32, rows: 1, no bias)"
    )


def test_a_probe_under_a_fake_mode_still_judges_the_loop_itself() -> None:
    """The verdict is made on real CPU tensors whatever the caller's context: under a fake-tensor mode and
    autocast it is the same one line ("" here), not an error raised on every call."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert why_no_prefetch.__wrapped__() == ""


def test_a_compiled_graph_never_runs_a_loop_the_probe_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer given the layout before the verdict (or unpickled) and then compiled: the graph's op finds the
    verdict when it runs and multiplies by F.linear, never by the loop."""
    layer = PrefetchLinear(16, 8).eval()
    compiled = torch.compile(layer, backend="eager")
    x = torch.randn(1, 16)

    def refused(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the loop ran")

    monkeypatch.setattr(prefetch, "why_no_prefetch", lambda: "the prefetch loop built here disagrees (a test)")
    monkeypatch.setattr(prefetch, "gemv", refused)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_the_layouts_product_reads_views_as_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unchecked path the layout takes (counted): a weight that starts inside a larger storage, a strided
    bias, and a negative view (memory that holds the values unnegated) give F.linear's numbers."""
    calls = []
    run = prefetch.product
    monkeypatch.setattr(prefetch, "product", lambda *a, **k: calls.append(1) or run(*a, **k))
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(20, 16, generator=generator)[3:11]  # (8, 16), storage offset 48
    bias = torch.randn(16, generator=generator)[::2]  # (8,), stride 2
    x = torch.randn(1, 16, generator=generator)
    with torch.no_grad():
        for a, w in ((x, weight), (torch._neg_view(x), weight), (x, torch._neg_view(weight))):
            torch.testing.assert_close(prefetch_linear(a, w, bias), F.linear(a, w, bias), rtol=1e-5, atol=1e-5)
    assert len(calls) == 3
