"""The ground floor: imports point down, the Recorder names modules, caches compile, explain has no side effects."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from attnlab import Attention, attention
from attnlab.cache import ModelCache
from attnlab.functional import KERNELS, Visibility
from attnlab.models import GPT, GPTConfig
from attnlab.observe import Recorder, TraceStep
from benchmark_scripts import load

structure = load("structure")  # benchmarks/structure.py: LAYOUT.md's floors and the import graph, deferred imports in
SRC: Path = structure.SRC


def test_imports_point_down_the_floors() -> None:
    """A module imports its own floor or lower ones, never a higher one (the package root, which re-exports the
    public names, aside)."""
    up = structure.arrows_up()
    assert not up, "\n".join(up)


def test_no_folders_import_each_other_in_a_circle() -> None:
    """Zero circles, type-only imports included: on one floor too, folders import one way (nn uses the caches,
    so rotary, which a sink cache rotates by, sits a floor below both)."""
    circle = structure.circles(folders=True)
    assert not circle, "folders import each other in a circle: " + " <- ".join(circle)


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Zero circles between modules too (issue 55), an import deferred into a function included: a deferred
    import that closes a circle is still one. The package root, which re-exports, is left out."""
    circle = structure.circles()
    assert not circle, "modules import each other in a circle: " + " <- ".join(circle)


def _id_keyed(path: Path) -> list[str]:
    """Where ``path`` keys a module-level name (assigned or imported) by ``id(...)``: ``NAME[id(x)]``,
    ``NAME.get(id(x))`` and the like."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()  # the module's own names: imported or assigned at its top
    for n in tree.body:
        named = [ast.Name(a.asname or a.name) for a in n.names] if isinstance(n, ast.ImportFrom) else []
        named += n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        top |= {t.id for t in named if isinstance(t, ast.Name)}

    def is_id(n: ast.AST | None) -> bool:
        return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "id"

    found = []
    for node in ast.walk(tree):
        owner, key = None, None
        if isinstance(node, ast.Subscript):
            owner, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner, key = node.func.value, node.args[0]
        if isinstance(owner, ast.Name) and owner.id in top and is_id(key):
            found.append(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_bridge_keeps_nothing_in_a_module_level_table_keyed_by_id() -> None:
    """What the bridge needs travels with the objects of the call (issue 55 item 6): the Settings on the model's
    modules, an attnlab cache's positions on the keys it returned. A table keyed by id() holds them apart from
    their objects, where an id can be reused by another object once the first is freed."""
    found = [hit for path in sorted((SRC / "hf").rglob("*.py")) for hit in _id_keyed(path)]
    assert not found, "module-level tables keyed by id(): " + "; ".join(found)


def test_every_backend_keeps_one_contract() -> None:
    q, k, v = (torch.randn(1, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # grouped-query: 4 query heads, 2 kv heads
    vis = Visibility.from_lengths(5, 5, causal=True, batch=1, heads=4)
    results = {name: info.kernel(q, k, v, vis, scale=8**-0.5, dropout_p=0.0) for name, info in KERNELS.items()}
    for name, (out, lse) in results.items():
        assert out.shape == (1, 4, 5, 8) and out.dtype == q.dtype, name
        assert (lse is not None) == KERNELS[name].has_lse, name
        torch.testing.assert_close(out, results["eager"][0], msg=name)
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1)) * 8**-0.5
    expected_lse = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf")).logsumexp(-1)
    for name in ("eager", "flash"):
        torch.testing.assert_close(results[name][1], expected_lse, msg=name)


def test_recorder_keys_each_layer_by_its_dotted_name() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, context_length=16, emb_dim=32, n_heads=4, n_layers=3)).eval()
    idx = torch.randint(0, 256, (1, 7))
    with Recorder(names=["attn_weights"]) as rec:
        model(idx)
    assert rec.modules("attn_weights") == ["trf_blocks.0.att", "trf_blocks.1.att", "trf_blocks.2.att"]
    maps = rec.all("attn_weights")
    assert not torch.equal(maps["trf_blocks.0.att"], maps["trf_blocks.1.att"])  # three layers, three maps
    assert rec.names() == ["attn_weights"] * 3  # told which names to keep: nothing else
    with pytest.raises(KeyError, match=r"this recorder keeps only names matching \['attn_weights'\]"):
        rec.get("attn_scores")
    with Recorder(modules=["trf_blocks.1.*"]) as only_one:
        model(idx)
    assert only_one.modules() == ["trf_blocks.1.att"]


def test_a_recorder_with_on_step_hands_each_step_over_as_it_comes_and_keeps_none() -> None:
    """on_step gets every step the recorder would keep, in order, each detached, while the forward runs
    (the next layer has not run when the last one's weights arrive); the recorder keeps none and says so."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, context_length=16, emb_dim=32, n_heads=4, n_layers=3)).eval()
    idx = torch.randint(0, 256, (1, 7))
    with Recorder(names=["attn_weights"]) as kept:
        model(idx)
    done = [0]  # blocks finished so far
    for block in model.trf_blocks:
        block.register_forward_hook(lambda *_: done.__setitem__(0, done[0] + 1))
    finished_before: list[int] = []
    handed: list[TraceStep] = []

    def take(step: TraceStep) -> None:
        finished_before.append(done[0])
        handed.append(step)

    with Recorder(names=["attn_weights"], on_step=take) as rec:
        model(idx)
    assert finished_before == [0, 1, 2]  # each layer's weights arrive while that layer runs
    assert [s.module for s in handed] == kept.modules("attn_weights") and rec.steps == [] and rec.handed == 3
    for got, want in zip(handed, kept.steps, strict=True):
        assert torch.equal(got.tensor, want.tensor) and not got.tensor.requires_grad
    with pytest.raises(KeyError, match="3 steps went to on_step as they were recorded; this recorder kept none"):
        rec.get("attn_weights")
    with pytest.raises(TypeError, match="on_step must be a function of one TraceStep, got list"):
        Recorder(on_step=[])  # type: ignore[arg-type]


def test_a_recorder_that_caught_nothing_says_why() -> None:
    attn = Attention(d_in=16, num_heads=2, backend="sdpa")
    block = nn.Sequential(attn)
    with Recorder() as rec:
        block(torch.randn(1, 4, 16))
    with pytest.raises(KeyError, match=r"backend 'sdpa' never forms the attention weights.*\(in module '0'\)"):
        rec.get("attn_weights")
    with Recorder() as empty:
        pass
    with pytest.raises(KeyError, match=r"no attnlab attention ran inside the recorder"):
        empty.get("attn_weights")


def test_under_a_recorder_the_default_backend_records() -> None:
    q = k = v = torch.randn(1, 2, 4, 8)
    with Recorder() as rec:
        out = attention(q, k, v, is_causal=True)  # backend="auto"
    weights = rec.get("attn_weights", module="")
    assert weights.shape == (1, 2, 4, 4)
    torch.testing.assert_close(out, weights @ v)


@pytest.mark.parametrize("window", [None, 4])
def test_a_compiled_decode_loop_makes_at_most_two_graphs(window: int | None) -> None:
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    attn = Attention(d_in=32, num_heads=4, num_kv_heads=2, rope=True, window=window, backend="eager").eval()
    x = torch.randn(1, 8 + 64, 32)
    expected = attn(x)
    counter = CompileCounter()
    torch._dynamo.reset()
    step = torch.compile(attn, backend=counter)
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=72)[0]
    with torch.no_grad():
        outs = [step(x[:, :8], cache=cache)] + [step(x[:, i : i + 1], cache=cache) for i in range(8, 72)]
    assert counter.frame_count <= 2, f"{counter.frame_count} graphs for a prefill and 64 decode steps"
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_fullgraph_compile_with_rope_and_the_eager_backend() -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=32, num_heads=4, rope=True, backend="eager").eval()
    x = torch.randn(2, 9, 32)
    torch._dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), attn(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
def test_explain_sets_no_global_state() -> None:
    """Importing explain picks no matplotlib backend, and building reports leaves torch's generator alone."""
    code = (
        "import matplotlib, sys\n"
        "before = matplotlib.rcParams._get_backend_or_none()\n"
        "import attnlab.explain.report, attnlab.explain.render.heatmap, attnlab.bench.plot\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "assert matplotlib.rcParams._get_backend_or_none() == before, 'backend changed'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    from attnlab.explain.report import explain_report
    from attnlab.explain.tour import build_tour

    torch.manual_seed(42)
    expected = torch.rand(3)
    torch.manual_seed(42)
    build_tour("en")
    explain_report("The cat sat.", seed=7)
    torch.testing.assert_close(torch.rand(3), expected)  # the caller's stream is where it was
