"""Weight-only int8 (attnlab.linear.quantized, GPT.quantize): the kernels agree with the readable path; on the dynamic
kernel a token's numbers never depend on the other tokens of the call, and a packed weight follows its sources;
"auto" picks what its own probe measured fastest (issue 30)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab import measured
from attnlab.linear import int8_choice, int8_rows, quantized
from attnlab.linear.int8_choice import quantize_linears
from attnlab.linear.quantized import Int8Linear, available_kernels, quantize_rows
from attnlab.models import GPT, GPTConfig
from conftest import small


@pytest.fixture
def one_thread() -> Iterator[None]:
    """fbgemm's threads wait on each other on a busy 2-core machine (15 ms a call, 0.06 ms on one thread);
    its numbers do not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def needs_dynamic() -> None:
    if "dynamic" not in available_kernels():
        message = "this PyTorch build has no x86 dynamic int8 kernel"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # in CI a missing prerequisite is a failure, never a silent skip
        pytest.skip(message)


def test_each_weight_is_within_half_a_step_of_its_row() -> None:
    torch.manual_seed(0)
    w = torch.randn(6, 10) * torch.tensor([1e-3, 1, 5, 0, 2, 1])[:, None]  # a row of zeros among them
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (6,)
    error = (w - q.float() * scale[:, None]).abs()
    assert bool((error <= scale[:, None] / 2 + 1e-7).all())
    assert scale[3] == 1.0 and bool((q[3] == 0).all())  # zeros stay zeros, no division by zero
    assert int(q.abs().max()) == 127


# the dynamic kernel's compiled rounding takes about 10 s cold: the second stage
@pytest.mark.parametrize(
    "kernel", [pytest.param(k, marks=pytest.mark.slow) if k == "dynamic" else k for k in available_kernels()]
)
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
    needs_dynamic()
    model = GPT(small()).eval()
    model.quantize(kernel="dynamic")
    with pytest.raises(ValueError, match="cannot hold int8 weights on the 'dynamic' kernel in one graph"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, compile=True)


# ---- the dynamic kernel: each token quantized on its own ----


def rows_of_every_kind(d_in: int) -> torch.Tensor:
    """(8, d_in): ranges a thousandfold apart, all positive, all negative, zeros, a range so small that PyTorch
    snaps its scale (a per-call scale would round the small rows to a few steps of the large one), and a row
    of near-ties: -64..63 is a scale of 1 and a zero point of 64, where x + 64 rounds to a half in float32
    before it rounds to a step (fbgemm's fma), so rounding x first and adding 64 after gives other steps."""
    x = torch.randn(8, d_in, generator=torch.Generator().manual_seed(1))
    x = x * torch.tensor([0.01, 1.0, 10.0, 1.0, 1.0, 0.0, 1e-4, 0.0])[:, None]
    x[3], x[4] = x[3].abs(), -x[4].abs()
    x[7, 0::2], x[7, 1::2], x[7, :2] = 0.5 + 2**-20, -1.5 - 2**-20, torch.tensor([-64.0, 63.0])
    return x


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
@pytest.mark.parametrize("fast", [True, False])
def test_a_rows_output_in_a_call_is_its_output_alone_bitwise(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """fast: several rows rounded and multiplied here at once (what this x86 build does); else one by one (where
    that would not be bitwise linear_dynamic's numbers)."""
    needs_dynamic()
    monkeypatch.setattr(quantized, "_ROWS_MATCH", {torch.backends.quantized.engine: fast})
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(100, 37), kernel="dynamic")  # odd widths: the kernel's tails too
    x = rows_of_every_kind(100)
    with torch.no_grad():
        alone = torch.cat([layer(row[None]) for row in x])  # (8, 37): one row a call, the decode step's kernel
        assert torch.equal(layer(x), alone)
        assert torch.equal(layer(x.reshape(8, 1, 100)).reshape(8, 37), alone)  # (B, T, in) the same
        assert torch.equal(layer(x[[6, 2, 0]]), alone[[6, 2, 0]])  # in any company
        if fast:  # the fast path runs: every row but zeros and the tiny one rounded here, bitwise linear_dynamic's
            got, plain = int8_rows._per_row(x, layer.weight_int8, layer.scale, layer.bias)
            assert plain.tolist() == [True] * 5 + [False] * 2 + [True] and torch.equal(got[plain], alone[plain])
        want = F.linear(x[:7], layer.dequantized(), layer.bias)  # the readable path: 7-bit activations stay close
        assert float((alone[:7] - want).abs().amax(dim=1).div(want.abs().amax(dim=1) + 1e-3).max()) < 0.03


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_many_rows_are_rounded_by_one_compiled_kernel_with_the_readable_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The effect: several rows on the dynamic kernel are rounded to 7 bits by one kernel Inductor compiled (no
    aminmax or round among the call's ops, torch.profiler), where the readable rounding takes about 25 ops; its
    codes, scales and plain rows are the readable ones bitwise, and the call's output too."""
    from torch.profiler import ProfilerActivity, profile

    needs_dynamic()
    if quantized.why_no_gemv() and os.environ.get("CI") != "true":
        pytest.skip(f"no compiler here: {quantized.why_no_gemv()}")
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(100, 37), kernel="dynamic")
    x = rows_of_every_kind(100)
    for rows in (x, x[:5], x[:1]):  # 8 rows, and 5 and 1 padded to the kernels of 8 and 2 rows
        assert int8_rows._same_rounding(rounded(rows), int8_rows._rounded_rows(rows))

    def rounding_ops() -> int:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            out = layer(x)
        names = [e.name for e in prof.events()]
        return out, sum(names.count(op) for op in ("aten::aminmax", "aten::round"))

    with torch.no_grad():
        layer(x)  # the first call checks the compiled rounding against the readable one, once per process
    fast, ops = rounding_ops()
    assert ops == 0
    monkeypatch.setattr(int8_rows, "_round", int8_rows._rounded_rows)
    readable, ops = rounding_ops()
    assert ops == 1 + 2  # aminmax once; round for the zero points and for the codes
    assert torch.equal(fast, readable)


def test_the_rounding_reads_every_value_once_for_its_row_range() -> None:
    """The effect: a row's scale, zero point and whether it is plain come from one reduction over its values
    (aminmax), which carries a NaN or an inf into the scale; no second reduction over the (N, in) values asks
    whether they are finite. Rows with a NaN or an inf anywhere are still found not plain."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reductions(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if (
                args
                and isinstance(args[0], torch.Tensor)
                and args[0].dim() == 2
                and func.__name__.split(".")[0]
                in ("aminmax", "isfinite", "all", "any", "isnan", "isinf", "amax", "amin")
            ):
                self.seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    x[1, 17], x[2, 39], x[3, 0], x[4, 5] = float("nan"), float("inf"), -float("inf"), float("nan")
    x[4, 30] = float("inf")
    with Reductions() as mode:
        _, _, plain = int8_rows._activation_qparams(x)
    assert mode.seen == ["aminmax"]
    assert plain.tolist() == [True, False, False, False, False, True]


def test_a_compiled_rounding_that_disagrees_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each compiled rounding is checked against the readable one on rows of every kind before its first use: one
    that differs (here a kernel made to move the codes by one) is set aside, and the readable numbers stay."""
    needs_dynamic()
    monkeypatch.setattr(int8_rows, "_ROUNDING_SAME", {})

    real = int8_rows.compiled

    def off_by_one(key: object, fn: object, inputs: list[torch.Tensor], *, contract: bool = False) -> object:
        if key[0] != "int8 rows":  # type: ignore[index]  # the epilogue's kernel is the real one
            return real(key, fn, inputs, contract=contract)  # type: ignore[arg-type]
        return lambda flat: (lambda c, s, p: (c // 2, s, p))(*int8_rows._rounded_rows(flat))

    monkeypatch.setattr(int8_rows, "compiled", off_by_one)
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(100, 37), kernel="dynamic")
    x = rows_of_every_kind(100)
    assert int8_rows._same_rounding(rounded(x), int8_rows._rounded_rows(x))
    assert list(int8_rows._ROUNDING_SAME.values()) == [False]
    with torch.no_grad():
        assert torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))


def rounded(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rounding of x's rows, its padded rows dropped."""
    return tuple(t[: len(x)] for t in int8_rows._round(x))


def without_fma(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The kernels of ``kind`` ("int8 rows", "int8 epilogue") compiled for real but without contraction from now on,
    the others as they are; both kinds' verdicts forgotten, so each kernel is probed afresh."""
    monkeypatch.setattr(int8_rows, "_ROUNDING_SAME", {})
    monkeypatch.setattr(int8_rows, "_FINISH_SAME", {})
    real = int8_rows.compiled

    def uncontracted(key: object, fn: object, inputs: list[torch.Tensor], *, contract: bool = False) -> object:
        if key[0] != kind:  # type: ignore[index]
            return real(key, fn, inputs, contract=contract)  # type: ignore[arg-type]
        return real(("without fma", key), fn, inputs, contract=False)  # type: ignore[arg-type]

    monkeypatch.setattr(int8_rows, "compiled", uncontracted)


def test_a_compiled_rounding_without_fma_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled rounding computes fbgemm's fma(x, 1 / scale, zero) in float32, one fma only where the C++
    compiler contracts it. Compiled without contraction, the probe's ties tell it from the readable (float64)
    numbers before its first use, and it is set aside."""
    needs_dynamic()
    if quantized.why_no_gemv() and os.environ.get("CI") != "true":
        pytest.skip(f"no compiler here: {quantized.why_no_gemv()}")
    without_fma(monkeypatch, "int8 rows")
    x = rows_of_every_kind(100)
    assert int8_rows._same_rounding(rounded(x), int8_rows._rounded_rows(x))
    assert list(int8_rows._ROUNDING_SAME.values()) == [False]


def test_many_rows_are_finished_by_one_compiled_fma_kernel_with_the_readable_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The effect: the int32 products of several rows become floats by one kernel Inductor compiled, fma(float(acc),
    x_scale * scale, bias), with no cast, product or addcmul over (N, out) among the call's ops (the readable
    epilogue's three passes), and the readable numbers bitwise, rows of every kind and a count of rows padded."""
    from torch.profiler import ProfilerActivity, profile

    needs_dynamic()
    if quantized.why_no_gemv() and os.environ.get("CI") != "true":
        pytest.skip(f"no compiler here: {quantized.why_no_gemv()}")
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(100, 37), kernel="dynamic")
    x = rows_of_every_kind(100)[:5]  # padded to the kernels of 8 rows

    def epilogue_ops() -> tuple[torch.Tensor, int]:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            out = layer(x)
        wide = [e.name for e in prof.events() if e.input_shapes and list(e.input_shapes[0])[-1:] == [37]]
        return out, sum(wide.count(op) for op in ("aten::addcmul", "aten::mul", "aten::_to_copy"))

    fast, ops = epilogue_ops()
    assert ops == 0
    monkeypatch.setattr(int8_rows, "_finish", int8_rows._finished)
    readable, ops = epilogue_ops()
    assert ops >= 2  # the product and the addcmul (the cast's shape is the int32 products')
    assert torch.equal(fast, readable)
    assert torch.equal(fast, torch.cat([layer(row[None]) for row in x]))  # linear_dynamic's, row by row


def test_a_compiled_epilogue_without_fma_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An epilogue compiled without contraction (a product rounded before its sum: what Inductor's C++ makes by
    default) differs from fbgemm's fma in the last bit; the probe's ties catch it before first use, and the
    readable numbers stay."""
    needs_dynamic()
    if quantized.why_no_gemv() and os.environ.get("CI") != "true":
        pytest.skip(f"no compiler here: {quantized.why_no_gemv()}")
    monkeypatch.setattr(quantized, "_ROWS_MATCH", {torch.backends.quantized.engine: True})  # the rows' own path
    without_fma(monkeypatch, "int8 epilogue")
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(100, 37), kernel="dynamic")
    x = rows_of_every_kind(100)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))
    assert list(int8_rows._FINISH_SAME.values()) == [False] and all(int8_rows._ROUNDING_SAME.values())


def tiny_lm(seed: int, *, layers: int = 2, dim: int = 32) -> GPT:
    """test_speculative's model, quantized on the dynamic kernel."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=64, context_length=128, emb_dim=dim, n_heads=4, n_layers=layers, rope=True, drop_rate=0.0
    )
    model = GPT(config).eval()
    model.quantize(kernel="dynamic")
    return model


@pytest.mark.slow  # compiles the int8 rounding for each count of rows the paths use: about 20 s cold
@pytest.mark.usefixtures("one_thread")
def test_every_exact_decoding_path_gives_plain_greedys_tokens_on_the_dynamic_kernel() -> None:
    """Lookup and a draft check several tokens in one pass, a batch and generate_many run rows together, and
    use_cache=False runs the whole text each step: each token must still get the numbers it gets alone."""
    needs_dynamic()
    m, draft = tiny_lm(0), tiny_lm(3, layers=1)  # the draft at m's width: its products take m's compiled kernels
    part = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    prompts = torch.cat([part, part, part[:, :8]], dim=1)  # (2, 48): texts that repeat, so lookup guesses
    with torch.no_grad():  # the logits first: a row's in a batch are its own
        assert torch.equal(m(prompts)[1], m(prompts[1:])[0])
    plain = [m.generate(prompts[b : b + 1], 16) for b in range(2)]  # (per-call scales fail all five below)
    assert torch.equal(m.generate(prompts[:1], 16, lookup=4), plain[0])
    assert torch.equal(m.generate(prompts[:1], 16, draft=draft, draft_tokens=3), plain[0])
    assert torch.equal(m.generate(prompts[:1], 16, use_cache=False), plain[0])
    assert torch.equal(m.generate(prompts, 16), torch.cat(plain))
    many = m.generate_many([p.tolist() for p in prompts], 16, slots=2)
    assert many == [p[0, 48:].tolist() for p in plain]


# ---- a packed weight follows what it was packed from ----


def test_a_packed_weight_follows_load_state_dict_in_place_edits_and_new_tensors() -> None:
    needs_dynamic()
    torch.manual_seed(0)
    layer = Int8Linear(linear=nn.Linear(48, 40), kernel="dynamic")
    x = rows_of_every_kind(48)[:5]

    def agrees_with_the_readable_path() -> bool:  # what its buffers hold now, by F.linear: no packed weight
        want = F.linear(x, layer.dequantized(), layer.bias)
        alone = torch.cat([layer(row[None]) for row in x])  # (5, 40): the decode step's kernel, one row a call
        return all(
            bool(((got - want).abs().amax(dim=1) < 0.03 * want.abs().amax(dim=1)).all()) for got in (alone, layer(x))
        )

    other = Int8Linear(linear=nn.Linear(48, 40), kernel="dynamic")
    with torch.no_grad():
        assert agrees_with_the_readable_path()
        edits = [  # a new tensor first, while every version is still 0: only its identity tells it apart
            lambda: setattr(layer, "weight_int8", layer.weight_int8.flip(1).contiguous()),
            lambda: layer.weight_int8.neg_(),
            lambda: layer.scale.mul_(3),
            lambda: layer.bias.add_(5),  # type: ignore[union-attr]
        ]
        for edit in edits:
            before = layer(x)
            edit()
            assert not torch.allclose(layer(x), before, atol=0.5)  # the edit moved every output far
            assert agrees_with_the_readable_path()
        layer.load_state_dict(other.state_dict())
        assert torch.equal(layer(x), other(x)) and torch.equal(layer(x[:1]), other(x[:1]))


@pytest.mark.slow  # loads, quantizes and compiles a whole model, about 10 s: the second stage
@pytest.mark.usefixtures("one_thread")
def test_a_model_loaded_into_an_int8_model_gives_the_loaded_models_logits() -> None:
    needs_dynamic()
    target, source = tiny_lm(0), tiny_lm(1)
    # 8, 4 and 2 rows: counts the decoding paths above compiled the int8 kernels for (a loaded weight is not a shape)
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        target(idx), target(idx[:1, :1])  # packed: a stale packed weight would keep these numbers
        target.load_state_dict(source.state_dict())
        assert torch.equal(target(idx), source(idx)) and torch.equal(target(idx[:1, :1]), source(idx[:1, :1]))
    assert torch.equal(target.generate(idx[:1], 6), source.generate(idx[:1], 6))
    with torch.inference_mode():  # tensors made here keep no version: loading must still be seen
        target = tiny_lm(0)
        target(idx)
        target.load_state_dict(source.state_dict())
        assert torch.equal(target(idx), source(idx)) and torch.equal(target(idx[:1, :1]), source(idx[:1, :1]))


# ---- "auto": what its own probe measured fastest, for each weight's shape ----


def test_auto_picks_the_kernel_its_probe_measured_fastest_for_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates injected where the probe reports them, the fastest never listed first: wider than tall streams
    fastest with int8pack, the others with dequantize. Each weight must get its own shape's pick."""
    if "int8pack" not in available_kernels():
        pytest.skip("this PyTorch build has no _weight_int8pack_mm: one kernel to pick from besides the readable")
    probed: list[tuple[int, int]] = []

    def rates(d_in: int, d_out: int) -> dict[str, list[float]]:
        probed.append((d_in, d_out))
        best = "int8pack" if d_out > d_in else "dequantize"
        slow = [k for k in available_kernels() if k != best]
        return {slow[0]: [2.0] * 5, best: [9.0] * 5, **{k: [1.0] * 5 for k in slow[1:]}}

    monkeypatch.setattr(int8_choice, "int8_stream_passes", rates)
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})
    assert int8_choice.fastest_int8_kernel(64, 256) == "int8pack"
    assert int8_choice.fastest_int8_kernel(256, 64) == "dequantize"
    torch.manual_seed(0)
    model = GPT(small()).eval()  # qkv 64 -> 128, out_proj 64 -> 64, ff 64 -> 256 -> 64, out_head 64 -> 256
    chosen = quantize_linears(model, "auto")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert set(layers) == set(chosen) and len(layers) == 9
    for name, m in layers.items():
        want = "int8pack" if m.out_features > m.in_features else "dequantize"
        assert m.kernel == chosen[name] == want, name
    assert {"int8pack", "dequantize"} == set(chosen.values())
    assert sorted(probed) == [(64, 64), (64, 128), (64, 256), (256, 64)]  # each shape measured once


def test_rows_of_fewer_than_3_values_take_the_readable_rounding() -> None:
    """A row of 2 values holds only the ends of its range, where no probe can tell an fma from a product rounded
    first: such rows are rounded by the readable ops (their R is their N, unpadded); rows of 3 by the kernel."""
    needs_dynamic()
    if quantized.why_no_gemv() and os.environ.get("CI") != "true":
        pytest.skip(f"no compiler here: {quantized.why_no_gemv()}")
    two, three = torch.randn(5, 2), torch.randn(5, 3)
    assert int8_rows._round(two)[0].shape == (5, 2)
    assert int8_rows._round(three)[0].shape == (8, 3)  # padded to the kernel of 8 rows
    assert int8_rows._same_rounding(rounded(three), int8_rows._rounded_rows(three))


def test_auto_keeps_its_choice_on_disk_and_a_new_process_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process (the in-process choices forgotten) reads the kept kernel and times nothing; a kept kernel this
    build cannot run is measured again. (The suite's ATTNLAB_CACHE is a temporary folder, conftest.py.)"""
    timed: list[tuple[int, int]] = []

    def rates(d_in: int, d_out: int) -> dict[str, list[float]]:
        timed.append((d_in, d_out))
        return {"dequantize": [9.0, 9.2, 8.8], **{k: [1.0, 1.0, 1.0] for k in available_kernels() if k != "dequantize"}}

    monkeypatch.setattr(int8_choice, "int8_stream_passes", rates)
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})
    assert int8_choice.fastest_int8_kernel(48, 80) == "dequantize" and timed == [(48, 80)]
    medians = {"dequantize": 9.0, **{k: 1.0 for k in available_kernels() if k != "dequantize"}}
    kept = {"kernel": "dequantize", "gb_s": medians, "passes": rates(48, 80), "settled": True, "tries": 1}
    assert measured.recall("int8", "48x80") == kept
    timed.clear()
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})  # a new process
    assert int8_choice.fastest_int8_kernel(48, 80) == "dequantize" and timed == []
    measured.remember("int8", "48x80", {"kernel": "a kernel gone from this build"})
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})
    assert int8_choice.fastest_int8_kernel(48, 80) == "dequantize" and timed == [(48, 80)]
