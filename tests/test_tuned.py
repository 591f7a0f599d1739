"""The default path: the first generate lays a model's weights out and decides on compile by what this machine
measured, once per machine and version, kept on disk (attnlab.measured, attnlab.models.generation.tuned).

Timing itself is not what these tests check (benchmarks/first_generate.py and benchmarks/engines.py measure
it); they check the rules: what is measured when, what is kept, what a later call or process pays, the margin
a choice must win by, and that a training step and a user's own choice are left alone. The probes' timings are
replaced where only the rule is under test; tests/test_tuned_real.py runs them for real."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import measured
from attnlab.linear import layout
from attnlab.linear.products import OneDNNLinear, onednn_available
from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import request_for, tuned

IDX = torch.tensor([[5, 17, 3, 60, 9, 41]])
ONE_COPY = layout.ONE_COPY  # as shipped, before a fixture narrows it


def small() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """A machine with nothing measured yet, measuring on; the probes counted and given fixed rates: "onednn" 20%
    faster than "rows" in every repeat (where this build has it), and a compile that never wins."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MEASURE", "1")
    monkeypatch.setattr(layout, "ONE_COPY", ("rows", "onednn"))
    calls = {"layout": 0, "compile": 0}

    def passes(d_in: int, d_out: int, dtype: torch.dtype, layouts: list[str], repeats: int) -> dict[str, list[float]]:
        calls["layout"] += 1
        return {name: [12.0 if name == "onednn" else 10.0] * repeats for name in layouts}

    def compile_probe(model: Any) -> dict[str, Any]:
        calls["compile"] += 1
        return {"wins": False, "why": "1.01x the eager step, not a win by 5% in every repeat"}

    monkeypatch.setattr(layout, "stream_passes", passes)
    monkeypatch.setattr(tuned, "_measure", compile_probe)
    monkeypatch.setattr(tuned, "why_no_gemv", lambda: None)  # the toolchain's probe: tests/test_gemv.py
    return calls


def measuring_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnlab" and "measuring" in r.getMessage()]


def test_the_first_generate_measures_once_and_the_next_pays_nothing(
    store: dict[str, int], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="attnlab")
    model = small()
    model.set_layout("rows")  # a user's own choice: nothing measured, the eager reference
    expected = model.generate(IDX, 5, compile=False)
    assert store == {"layout": 0, "compile": 0} and model.tuning is not None and "named" in model.tuning.why
    model = small()
    assert torch.equal(model.generate(IDX, 5), expected)  # the same tokens, laid out as measured
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert store == {"layout": len(shapes), "compile": 1}  # each weight shape timed once, the compile once
    lines = measuring_lines(caplog)
    assert len(lines) == 2 and "ATTNLAB_MEASURE=0 skips it" in lines[0] and str(tmp_path) in lines[0]
    kept = json.loads(next((tmp_path / "measured").glob("*.json")).read_text())
    assert kept["fingerprint"] == measured.fingerprint() and set(kept["entries"]) == {"layout", "compile"}
    want = "onednn" if onednn_available() else "rows"
    assert {e["choice"] for e in kept["entries"]["layout"].values()} == {want}
    assert model.tuning is not None and model.tuning.why.startswith("eager: 1.01x the eager step")

    caplog.clear()  # a later process: a new model, the same machine, only the file kept between
    again = small()
    assert torch.equal(again.generate(IDX, 5), expected)
    assert store == {"layout": len(shapes), "compile": 1} and measuring_lines(caplog) == []
    assert again.tuning == model.tuning


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN inner product")
def test_a_training_step_after_the_default_path_sees_the_plain_weights(store: dict[str, int]) -> None:
    """A layout that keeps the weight itself changes the routine, not the storage (no copy), and a product that
    needs a gradient goes through F.linear: a training step's gradients are a fresh model's."""
    model, fresh = small(), small()
    storages = {name: p.untyped_storage().data_ptr() for name, p in model.named_parameters()}
    model.generate(IDX, 3)
    assert isinstance(model.trf_blocks[0].ff[0], OneDNNLinear)  # the layout changed the routine...
    assert storages == {name: p.untyped_storage().data_ptr() for name, p in model.named_parameters()}  # ...not a copy
    for m in (model, fresh):
        m.train()
        logits = m(IDX)
        torch.nn.functional.cross_entropy(logits[0, :-1], IDX[0, 1:]).backward()
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6, msg=name)


def test_another_machine_or_version_measures_again(store: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    small().generate(IDX, 2)
    first = measured.store_file()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another thread count: another file, measured anew
    try:
        assert measured.store_file() != first
        small().generate(IDX, 2)
    finally:
        torch.set_num_threads(threads)
    assert store["compile"] == 2
    data = json.loads(first.read_text())  # a file whose fingerprint is not this one's (copied, or a new torch)
    data["fingerprint"]["torch"] = "1.0"
    first.write_text(json.dumps(data))
    small().generate(IDX, 2)
    assert store["compile"] == 3


def test_measuring_off_uses_what_is_kept_and_times_nothing(
    store: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ATTNLAB_MEASURE", "0")
    model = small()
    model.generate(IDX, 2)
    assert store == {"layout": 0, "compile": 0} and not (tmp_path / "measured").exists()
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.tuning is not None and model.tuning.why == "eager: nothing measured and ATTNLAB_MEASURE=0"
    monkeypatch.setenv("ATTNLAB_MEASURE", "maybe")
    with pytest.raises(ValueError, match=r"ATTNLAB_MEASURE must be 1 \(measure once per machine\) or 0 .*'maybe'"):
        small().generate(IDX, 2)


def test_a_folder_that_cannot_be_written_costs_a_measurement_not_the_call(
    store: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_CACHE", str(blocked))
    model = small()
    assert model.generate(IDX, 3).shape == (1, 9)
    assert any("could not keep a measurement" in r.getMessage() for r in caplog.records)


def test_a_write_keeps_what_another_process_kept_and_leaves_no_partial_file(store: dict[str, int]) -> None:
    measured.remember("layout", "a", {"choice": "rows"})
    path = measured.store_file()
    other = json.loads(path.read_text())
    other["entries"]["layout"]["b"] = {"choice": "onednn"}  # another process's entry, written between
    path.write_text(json.dumps(other))
    measured.remember("compile", "c", {"wins": False, "why": "x"})
    kept = json.loads(path.read_text())["entries"]
    assert set(kept["layout"]) == {"a", "b"} and set(kept["compile"]) == {"c"}
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_users_own_choice_is_left_as_it_is(store: dict[str, int]) -> None:
    model = small()
    model.set_layout("rows")
    model.generate(IDX, 2)
    assert store["layout"] == 0
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    model.generate(IDX, 2, compile=False)
    assert model.tuning is not None and model.tuning.why == "compile= was named by the call" and store["compile"] == 1


def test_compile_is_chosen_only_where_the_call_repays_it(
    store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = small()
    entry = {"wins": True, "why": "1.50x", "eager_s": 0.003, "compiled_s": 0.002, "compile_s": 5.0}
    monkeypatch.setattr(tuned, "_measure", lambda m: entry)
    short = tuned.settle(model, request_for(model, IDX, 8, {}), compile_named=False)
    assert short.compile is None and model.tuning is not None and not model.tuning.compiled
    assert model.tuning.why.startswith("eager: compiling takes 5.0 s here and saves 1.00 ms a token, so it repays")
    assert "after 5001 new tokens" in model.tuning.why
    long = tuned.settle(model, request_for(model, IDX, 6000, {}), compile_named=False)  # 6 s saved: repaid
    assert long.compile == "inductor" and model.tuning.compiled
    again = tuned.settle(model, request_for(model, IDX, 8, {}), compile_named=False)  # compiled in this process
    assert again.compile == "inductor"


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"cache": "paged"}, "a compiled step decodes with the plain cache, this call keeps 'paged'"),
        ({"lookup": 2}, "a compiled step decodes one token of unpadded rows a step"),
        ({"attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])}, "unpadded rows"),
    ],
)
def test_a_call_that_cannot_compile_decodes_eager_and_says_why(
    store: dict[str, int], options: dict[str, Any], why: str
) -> None:
    model = small()
    idx = IDX if "attention_mask" not in options else torch.cat([IDX, IDX])
    request = tuned.settle(model, request_for(model, idx, 4, options), compile_named=False)
    assert request.compile is None and model.tuning is not None and why in model.tuning.why
    assert store["compile"] == 0


def test_a_refused_call_leaves_the_weights_as_they_were(store: dict[str, int]) -> None:
    model = small()
    with pytest.raises(ValueError, match="eos_id 500 is not a token of this model"):
        model.generate(IDX, 4, eos_id=500)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert store == {"layout": 0, "compile": 0} and model.tuning is None


def test_the_command_line_measures_by_default_says_why_and_skips_on_request(
    store: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab import cli

    assert cli.main(["generate", "--model", "text", "--max-new-tokens", "3", "--no-measure", "The sea"]) == 0
    assert "speed:" not in capsys.readouterr().err  # nothing measured, nothing to say
    assert store == {"layout": 0, "compile": 0}
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("ATTNLAB_MEASURE", "1")  # --no-measure set it for its own process; this test's is back on
    try:
        assert cli.main(["generate", "--model", "text", "--max-new-tokens", "3", "The sea"]) == 0
    finally:
        monkeypatch.undo()
    assert "speed: eager: 1.01x the eager step" in capsys.readouterr().err
    assert store["layout"] > 0 and store["compile"] == 1


def test_the_default_never_keeps_a_second_copy_of_a_weight(
    store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "packed" (oneDNN's reordered copy beside each weight) is never timed for the default, however fast: the
    default holds one copy; set_layout("auto") may take it."""
    # the shipped set, but the loops that need a build to be offered (timed by tests/test_gemv.py, test_prefetch.py)
    monkeypatch.setattr(layout, "ONE_COPY", tuple(name for name in ONE_COPY if name not in ("gemv", "prefetch")))
    timed: list[list[str]] = []

    def passes(d_in: int, d_out: int, dtype: torch.dtype, layouts: list[str], repeats: int) -> dict[str, list[float]]:
        timed.append(layouts)
        return {name: [99.0 if name == "columns" else 10.0] * repeats for name in layouts}

    monkeypatch.setattr(layout, "stream_passes", passes)
    model = small()
    model.generate(IDX, 2)
    assert timed and all("packed" not in names and "columns" in names for names in timed)
    assert model.tuning is not None and model.tuning.layouts == {"rows": 9}  # columns: nn.Linear, counted as rows
    strides = {n: m.weight.stride() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert all(s[0] == 1 for s in strides.values()), strides  # stored column by column


def test_the_first_generate_section_is_what_the_script_renders_from_its_result_file() -> None:
    """docs/benchmarks.md's first-generate table, its verdicts and its reasons come from the run's committed file."""
    from benchmark_scripts import load

    root = Path(__file__).resolve().parents[1]
    script = load("first_generate")
    text = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    runs = sorted((root / "benchmarks" / "results").glob("first_generate-*.json"))
    assert runs, "no result file of benchmarks/first_generate.py in benchmarks/results/"
    for run in runs:
        assert script.render(json.loads(run.read_text(encoding="utf-8"))) in text, f"docs do not quote {run.name}"


def test_a_kept_compile_entry_missing_its_figures_is_measured_again(store: dict[str, int]) -> None:
    model = small()
    model.generate(IDX, 2)
    assert store["compile"] == 1
    path = measured.store_file()
    data = json.loads(path.read_text())
    (key,) = data["entries"]["compile"]
    data["entries"]["compile"][key] = {"wins": True, "why": "an older attnlab's entry"}  # no seconds to read
    path.write_text(json.dumps(data))
    small().generate(IDX, 2)
    assert store["compile"] == 2


def test_a_batch_repays_a_compile_by_its_steps_not_its_rows(
    store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row of a batch decodes in the same step: 4 rows of 3,000 tokens save what one row saves."""
    entry = {"wins": True, "why": "1.50x", "eager_s": 0.003, "compiled_s": 0.002, "compile_s": 5.0}
    monkeypatch.setattr(tuned, "_measure", lambda m: entry)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=4096, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)
    model = GPT(config).eval()
    rows = torch.cat([IDX] * 4)
    assert tuned.settle(model, request_for(model, rows, 3000, {}), compile_named=False).compile is None


def test_a_context_too_short_to_time_says_so() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=10, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)
    got = tuned._measure(GPT(config).eval())
    assert got == {"wins": False, "why": "a context of 10 tokens is too short to time a decode"}
