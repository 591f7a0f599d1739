"""The "packed" layout (issue 37, attnlab.linear.packed): oneDNN's product over a copy of each weight reordered once
into oneDNN's blocked format. It keeps the readable product's values and tokens; a decode step reads the copies
made by set_layout and packs nothing (seen by a count of packs, and by a write the copy cannot see); any change
to a weight is followed, eagerly and in a compiled step; a gradient, a tracer, an inference tensor and another
layout take the plain weight."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.linear import layout, packed, probe
from attnlab.linear.products import LAYOUTS, PackedLinear
from attnlab.models import GPT, GPTConfig
from conftest import compiled_op_calls

if "packed" not in LAYOUTS and os.environ.get("CI") != "true":  # under CI=true the tests run, and fail
    pytest.skip("this PyTorch build cannot reorder weights for oneDNN", allow_module_level=True)


def small(dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval().to(dtype)


def linears(model: GPT) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


IDX = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_layout_keeps_the_readable_products_values_and_tokens(dtype: torch.dtype) -> None:
    readable, fast = small(dtype), small(dtype)
    got = fast.set_layout("packed")
    assert set(got.values()) == {"packed"} and len(got) == 9
    assert all(type(m) is PackedLinear for m in linears(fast))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        torch.testing.assert_close(fast(IDX), readable(IDX), rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(fast(IDX[:, :1]), readable(IDX[:, :1]), rtol=tolerance, atol=tolerance)
    if dtype == torch.float32:
        assert torch.equal(fast.generate(IDX, 12), readable.generate(IDX, 12))
    for a, b in zip(readable.state_dict().values(), fast.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the parameters are the plain weights, as they were


@pytest.fixture
def packs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shape of every weight packed from here on, in order."""
    made: list[tuple[int, ...]] = []
    reorder = packed.reorder

    def counted(weight: torch.Tensor) -> torch.Tensor:
        made.append(tuple(weight.shape))
        return reorder(weight)

    monkeypatch.setattr(packed, "reorder", counted)
    return made


def test_a_decode_step_reads_the_copies_set_layout_made(packs: list[tuple[int, ...]]) -> None:
    """Every weight is packed once, by set_layout, and never during generate. Then the plain weights are zeroed
    through numpy, a write no version counter sees: the products still read the copies, so the logits stay.
    With the copies unused (F.linear on the weights) they would be the bias alone; with a pack per call they
    would follow the zeros."""
    model = small(torch.bfloat16)
    model.set_layout("packed")
    assert len(packs) == 9
    with torch.no_grad():
        before = model(IDX)
        model.generate(IDX, 8)
        assert len(packs) == 9  # nothing packed again: the copies were kept
        for m in linears(model):
            np.asarray(m.weight.view(torch.int16).numpy())[...] = 0  # bfloat16 through its bits: 0 is +0.0
        assert all(not m.weight.any() for m in linears(model))
        torch.testing.assert_close(model(IDX), before, rtol=0, atol=0)


def test_any_change_to_a_weight_is_followed() -> None:
    """An edit in place, load_state_dict, and a new storage each give the new weight's products, never the
    old copy's."""
    model, other = small(), small()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
        plain = small()
        plain.load_state_dict(other.state_dict())
        model.set_layout("packed")
        model.load_state_dict(other.state_dict())
        torch.testing.assert_close(model(IDX), plain(IDX), rtol=1e-5, atol=1e-5)
        model.out_head.weight.mul_(2)
        plain.out_head.weight.mul_(2)
        torch.testing.assert_close(model(IDX), plain(IDX), rtol=1e-5, atol=1e-5)
        fresh = torch.randn_like(model.out_head.weight)
        model.out_head.weight.data, plain.out_head.weight.data = fresh, fresh.clone()
        torch.testing.assert_close(model(IDX), plain(IDX), rtol=1e-5, atol=1e-5)


def test_a_write_no_version_sees_is_read_after_set_layout_again() -> None:
    """A write through .data has a version counter of its own, so the copy cannot see it (the documented limit):
    set_layout("packed") again packs every weight anew, and the products follow the write."""
    model, plain = small(), small()
    model.set_layout("packed")
    with torch.no_grad():
        for m in (model, plain):
            m.out_head.weight.data.mul_(2)
        model.set_layout("packed")
        torch.testing.assert_close(model(IDX), plain(IDX), rtol=1e-5, atol=1e-5)


def test_converting_or_quantizing_frees_the_copies() -> None:
    """.to() frees each copy before it converts (the next product packs the converted weight), and quantize frees
    the copies of the float weights it replaces: none is held beside what took its place."""
    model = small()
    model.set_layout("packed")
    model.to(torch.bfloat16)
    assert all(packed._PACKED.get(m.weight) is None for m in linears(model))
    with torch.no_grad():
        torch.testing.assert_close(model(IDX), small(torch.bfloat16)(IDX), rtol=2e-2, atol=2e-2)
    assert all(packed._PACKED.get(m.weight) is not None for m in linears(model))
    model = small()
    model.set_layout("packed")
    weights = [m.weight for m in linears(model)]  # kept alive here, as a tied weight would be
    model.quantize("int8", kernel="dequantize")
    assert all(packed._PACKED.get(w) is None for w in weights)


def test_the_ops_refuse_a_call_that_needs_a_gradient() -> None:
    """attnlab::packed_linear and attnlab::gemv have no backward: called on a weight that needs a gradient, they
    say so (autograd's fallback would only warn, and the gradient would be missing)."""
    weight = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(1, 16)
    with pytest.raises(RuntimeError, match=r"attnlab::packed_linear has no backward.*F\.linear"):
        torch.ops.attnlab.packed_linear(x, weight, None)
    with pytest.raises(RuntimeError, match=r"attnlab::gemv has no backward.*F\.linear"):
        torch.ops.attnlab.gemv(x, weight, None, None)
    with torch.no_grad():
        torch.testing.assert_close(torch.ops.attnlab.packed_linear(x, weight, None), F.linear(x, weight))


def test_where_onednn_cannot_reorder_a_dtype_it_is_refused_and_never_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without AVX-512: oneDNN refuses to reorder bfloat16. set_layout("packed") says so with the way out;
    "auto" never times packed for bfloat16, and still lays the weights out."""
    monkeypatch.setattr(packed, "packing_available", lambda dtype=torch.float32: dtype == torch.float32)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    model = small(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"oneDNN cannot reorder \['torch.bfloat16'\] weights here.*'auto'"):
        model.set_layout("packed")
    assert "packed" not in layout.stream_rates(32, 96, dtype=torch.bfloat16, repeats=1)
    assert "packed" in layout.stream_rates(32, 96, dtype=torch.float32, repeats=1)


def test_auto_takes_packed_only_when_it_streams_clearly_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its copy doubles the weights' memory: "packed" is chosen at more than PACKED_GAIN times the best other
    layout's rate, not at a little more."""
    gain = {96: 1.05, 128: 1.5}  # by d_out

    def rates(d_in: int, d_out: int, *, dtype: torch.dtype) -> dict[str, float]:
        return {"rows": 10.0, "columns": 9.0, "packed": 10.0 * gain[d_out]}

    monkeypatch.setattr(layout, "stream_rates", rates)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    assert layout.fastest_layout(32, 96) == "rows" and layout.fastest_layout(32, 128) == "packed"


def test_the_probe_interleaves_the_layouts_pass_by_pass() -> None:
    """Each layout's passes take turns with the others', so a machine that slows midway favours none."""
    order: list[str] = []
    calls = {name: [lambda name=name: order.append(name)] for name in ("rows", "columns", "packed")}
    probe.interleaved_seconds(calls, 3)  # type: ignore[arg-type]
    assert order == ["rows", "columns", "packed"] * 4  # a pass that warms up, then 3


def test_a_weight_made_under_inference_mode_is_multiplied_as_it_is() -> None:
    """An inference tensor keeps no version, so an edit to it cannot be seen: it gets no copy, and an edit made
    under inference_mode shows in the next product."""
    with torch.inference_mode():
        model, plain = small(), small()
        model.set_layout("packed")
        assert all(packed._PACKED.get(m.weight) is None for m in linears(model))
        model.out_head.weight.mul_(3)
        plain.out_head.weight.mul_(3)
        torch.testing.assert_close(model(IDX), plain(IDX), rtol=1e-5, atol=1e-5)


def test_a_gradient_another_layout_and_a_tracer_take_the_plain_weight() -> None:
    """A training step gives a plain model's gradients bit for bit; set_layout("rows") frees the copies; a
    tracer (make_fx) records the weight, not a copy baked in as a constant, so an edit after tracing is
    followed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    plain, fast = small(), small()
    fast.set_layout("packed")
    for model in (plain, fast):
        model.train()
        F.cross_entropy(model(IDX).flatten(0, 1), IDX.flatten()).backward()
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), name
    fast.eval().zero_grad()
    layer = fast.out_head
    with torch.no_grad():
        x = torch.randn(3, 32)
        traced = make_fx(layer)(x)
        layer.weight.mul_(2)
        torch.testing.assert_close(traced(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    fast.set_layout("rows")
    assert all(packed._PACKED.get(m.weight) is None for m in linears(fast))


def test_a_dtype_oneDNN_does_not_take_is_refused_by_name() -> None:
    model = small(torch.float16)
    with pytest.raises(TypeError, match=r"the packed layout takes float32 or bfloat16 weights.*torch.float16"):
        model.set_layout("packed")
    assert all(type(m) is torch.nn.Linear for m in linears(model))


@pytest.mark.slow  # compiles the decode step
def test_a_compiled_step_calls_one_op_per_product_and_follows_an_edit(packs: list[tuple[int, ...]]) -> None:
    """Under generate(compile=True) each of a step's 9 products is the op attnlab::packed_linear, which finds
    the copy when it runs: the eager tokens, and after an edit in place the edited model's tokens, with no
    copy from the time the step was traced (against the readable product's tokens)."""
    model, plain = small(), small()
    model.set_layout("packed")
    calls, compiled, eager = compiled_op_calls(model, "attnlab::packed_linear", IDX)
    assert calls == 9 * 5  # 5 decode steps: the prompt's pass draws the first token
    assert torch.equal(compiled, eager)
    assert len(packs) == 9  # set_layout's: the compiled steps read those copies
    with torch.no_grad():
        for m, p in zip(linears(model), linears(plain), strict=True):
            m.weight.mul_(-1)
            p.weight.mul_(-1)
    assert torch.equal(model.generate(IDX, 6, compile=True), plain.generate(IDX, 6))
    assert len(packs) == 18  # each edited weight packed once again


@pytest.mark.slow  # torch.library.opcheck runs the op many ways
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_op_a_graph_calls_passes_torchs_own_checks(dtype: torch.dtype) -> None:
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(3)).to(dtype)
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(4)).to(dtype)
    torch.library.opcheck(torch.ops.attnlab.packed_linear, (x, weight, torch.randn(24).to(dtype)))
