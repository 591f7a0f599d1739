"""Weight layout (issue 24, part 2): rows or columns, chosen by measuring; the same values, shapes and files;
"auto" picks what its own probe measured fastest, for each weight's shape (issue 30); "onednn" keeps the rows
and computes the product with oneDNN's inner product where it applies (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab.linear import layout, probe
from attnlab.linear.products import LAYOUTS, GemvLinear, OneDNNLinear, PrefetchLinear, onednn_available
from attnlab.models import GPT, GPTConfig

needs_onednn = pytest.mark.skipif(
    not onednn_available() and __import__("os").environ.get("CI") != "true",
    reason="this PyTorch build has no oneDNN inner product (under CI=true the test runs, and fails)",
)


def small() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


def test_columns_store_the_same_matrix_and_generate_the_same_tokens(tmp_path: Path) -> None:
    model = small()
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(idx)
    tokens = model.generate(idx, 12)
    got = model.set_layout("columns")
    head = model.out_head.weight
    assert got["out_head.weight"] == "columns" and head.shape == (96, 32)
    assert not head.is_contiguous() and head.t().is_contiguous()  # (in, out) storage: Conv1D's
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(idx, 12), tokens)
    model.save_pretrained(tmp_path)  # files hold values, not strides
    again = GPT.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    model.set_layout("rows")
    assert model.out_head.weight.is_contiguous()


@pytest.mark.slow  # "auto" times the gemv loop too: a compile for each shape
def test_auto_measures_each_shape_and_a_wrong_layout_is_refused() -> None:
    model = small()
    got = model.set_layout("auto")
    assert len(got) == 2 * 4 + 1 and set(got.values()) <= set(LAYOUTS)  # qkv, out_proj, two ff per block; out_head
    with pytest.raises(
        ValueError,
        match="layout must be one of \\('rows', 'columns', 'onednn', 'gemv', 'packed', 'prefetch', 'auto', 'measured'\\), got 'diagonal'",
    ):
        model.set_layout("diagonal")


def test_auto_picks_the_layout_its_probe_measured_fastest_for_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates injected where the probe reports them, the fastest never listed first: wider than tall streams
    fastest by columns, the others by rows. Each weight must be stored as its own shape's pick."""
    probed: list[tuple[int, int, torch.dtype]] = []

    def rates(d_in: int, d_out: int, *, dtype: torch.dtype) -> dict[str, float]:
        probed.append((d_in, d_out, dtype))
        return {"rows": 3.0, "columns": 7.0} if d_out > d_in else {"columns": 3.0, "rows": 7.0}

    monkeypatch.setattr(layout, "stream_rates", rates)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    assert layout.fastest_layout(32, 96) == "columns" and layout.fastest_layout(128, 32) == "rows"
    model = small()  # qkv 32 -> 96, out_proj 32 -> 32, ff 32 -> 128 -> 32, out_head 32 -> 96
    values = {name: w.clone() for name, w in model.state_dict().items()}
    got = model.set_layout("auto")
    weights = {f"{name}.weight": m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(got) == set(weights) and len(weights) == 9
    for name, w in weights.items():
        out_f, in_f = w.shape
        want = "columns" if out_f > in_f else "rows"
        assert got[name] == want, name
        assert w.stride() == ((1, out_f) if want == "columns" else (in_f, 1)), name  # where its numbers lie
        assert torch.equal(w, values[name]), name  # the same values
    assert {"rows", "columns"} == set(got.values())
    assert sorted(probed, key=str) == sorted(
        [(32, 96, torch.float32), (128, 32, torch.float32), (32, 32, torch.float32), (32, 128, torch.float32)],
        key=str,
    )  # each shape measured once


def linear_ops(model: GPT, idx: torch.Tensor) -> dict[str, int]:
    """How many times each product op ran in one forward pass of ``model`` (torch.profiler, real kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(idx)
    names = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear")
    return {name: sum(e.count for e in prof.key_averages() if e.key == name) for name in names}


@needs_onednn
def test_onednn_computes_every_product_with_onednn_and_the_same_tokens(tmp_path: Path) -> None:
    """The effect: after set_layout("onednn") every linear of a forward pass runs oneDNN's inner product and
    none goes through F.linear's BLAS (addmm/mm); "rows" puts it back. The values: logits to float rounding,
    the same greedy tokens, the same files, tied weights still tied."""
    model = small()
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(idx)
    tokens = model.generate(idx, 12)
    blas = linear_ops(model, idx)
    assert blas["mkldnn::_linear_pointwise"] == 0 and blas["aten::linear"] == 9
    got = model.set_layout("onednn")
    assert set(got.values()) == {"onednn"} and len(got) == 9
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(type(m) is OneDNNLinear for m in linears)
    ops = linear_ops(model, idx)
    assert ops["mkldnn::_linear_pointwise"] == 9  # qkv, out_proj, two ff per block, out_head
    assert ops["aten::addmm"] == 0 and ops["aten::mm"] == 0 and ops["aten::linear"] == 0
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(idx, 12), tokens)
    model.save_pretrained(tmp_path)
    again = GPT.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    model.set_layout("rows")
    assert all(type(m) is torch.nn.Linear for m in linears) and linear_ops(model, idx)["mkldnn::_linear_pointwise"] == 0


@needs_onednn
def test_onednn_leaves_training_to_f_linear_and_its_gradients_exact() -> None:
    """A product that needs a gradient goes through F.linear (oneDNN's op here is for inference): a training
    step after set_layout("onednn") gives the gradients a plain model gives, bit for bit."""
    plain, fast = small(), small()
    fast.set_layout("onednn")
    idx = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    for model in (plain, fast):
        model.train()
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), name


@needs_onednn
def test_onednn_in_bfloat16_and_a_half_model_is_refused_by_name() -> None:
    model = small().to(torch.bfloat16)
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(idx)
    model.set_layout("onednn")
    assert linear_ops(model, idx)["mkldnn::_linear_pointwise"] == 9
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before, rtol=2e-2, atol=2e-2)
    half = small().to(torch.float16)
    with pytest.raises(TypeError, match=r"onednn layout takes float32 or bfloat16 weights, .*\['torch.float16'\]"):
        half.set_layout("onednn")
    assert all(type(m) is torch.nn.Linear for m in half.modules() if isinstance(m, torch.nn.Linear))


@needs_onednn  # torch's own forward-mode AD (make_dual) calls torch.jit.script, which torch 2.13 deprecates
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_onednn_hands_anything_beyond_plain_inference_to_f_linear() -> None:
    """Each case where oneDNN's op would be wrong or lose a gradient, against F.linear: a bias that alone trains,
    a strided bias, autocast, forward-mode AD, an empty inner dimension."""
    import torch.autograd.forward_ad as fwAD

    from attnlab.linear.products import onednn_linear

    x, w = torch.randn(3, 4), torch.randn(6, 4)
    strided = torch.randn(12)[::2]
    torch.testing.assert_close(onednn_linear(x, w, strided), F.linear(x, w, strided))
    bias = torch.randn(6, requires_grad=True)  # the weight frozen, the bias trained
    onednn_linear(x, w, bias).sum().backward()
    assert bias.grad is not None and torch.equal(bias.grad, torch.full((6,), 3.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert onednn_linear(x, w).dtype == F.linear(x, w).dtype == torch.bfloat16
    ones = torch.ones_like(x)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(onednn_linear(fwAD.make_dual(x, ones), w)).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, ones @ w.T)
    assert onednn_linear(torch.randn(3, 0), torch.randn(5, 0)).shape == (3, 5)


@pytest.mark.parametrize("linear", [GemvLinear, PrefetchLinear])
def test_a_tracer_records_the_plain_product_of_a_loop_layout(linear: type[torch.nn.Linear]) -> None:
    """Under make_fx (a dispatch mode, as torch.export's is) a loop compiled apart from the graph (gemv's kernel,
    prefetch's C++) would run unseen and its output be baked in as a constant: the layout hands the tracer plain
    ops, so the graph follows new inputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    layer = linear(16, 8).eval()
    layer.requires_grad_(False)
    with torch.no_grad():
        graph = make_fx(layer)(torch.randn(1, 16))
        x = torch.randn(1, 16)
        torch.testing.assert_close(graph(x), F.linear(x, layer.weight, layer.bias))


def lscpu_last_level_cache() -> int:
    """The outermost cache's bytes, all instances together, as util-linux's lscpu reads them from the OS."""
    import shutil
    import subprocess

    lscpu = shutil.which("lscpu")
    if lscpu is None:
        return 0
    listing = subprocess.run([lscpu, "-B", "-C=LEVEL,ALL-SIZE"], capture_output=True, text=True, check=False)
    rows = [line.split() for line in listing.stdout.splitlines()[1:] if len(line.split()) == 2]
    levels = [(int(level), int(size)) for level, size in rows if level.isdigit() and size.isdigit()]
    return max(levels, default=(0, 0))[1] if levels else 0


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
def test_the_stream_probe_cycles_through_more_distinct_memory_than_the_last_level_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the probe streams, not only what it reports: every layout's calls read weights of their own memory
    (distinct storages), as many bytes as the rate is computed from, and more than the last-level cache the OS
    reports (lscpu), so the rate is memory's and not a cached copy's. Timing is replaced by 1 s a pass."""
    calls_seen: dict[str, list[object]] = {}

    def one_second(calls: dict[str, list[object]], repeats: int) -> dict[str, list[float]]:
        calls_seen.update(calls)
        return {name: [1.0] * repeats for name in calls}

    monkeypatch.setattr(layout, "interleaved_passes", one_second)
    cache = lscpu_last_level_cache()
    if cache == 0 and __import__("os").environ.get("CI") != "true":
        pytest.skip("the OS reports no cache sizes here (lscpu)")
    d_in = 4096  # a float32 row of 16 KiB: enough rows that the copies reach the bytes wanted, at most 1,024 copies
    d_out = max(16, -(-2 * max(cache, probe.STREAM_BYTES) // (d_in * 4 * probe.MAX_COPIES)))
    rates = layout.stream_rates(d_in, d_out, repeats=1)
    assert set(rates) == set(calls_seen) and {"rows", "columns"} <= set(rates)
    for name, calls in calls_seen.items():
        weights = [call.args[1] for call in calls]  # type: ignore[attr-defined]  # partial(product, x, weight)
        storages = {w.untyped_storage().data_ptr(): w.untyped_storage().nbytes() for w in weights}
        streamed = sum(storages.values())
        assert streamed == round(rates[name] * 1e9), name  # the bytes the rate claims are the bytes read (GB/s x 1e9)
        assert len(storages) == len(weights) and streamed > cache, (name, len(storages), streamed, cache)
