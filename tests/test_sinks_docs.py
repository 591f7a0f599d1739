"""docs/sinks.md holds to the committed runs: its reports are what the report code renders from the result files
in benchmarks/results, in both languages, and what its prose says of them is so in the files."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from attnlab.bench.sinks_report import (
    backcopy_report,
    massive_report,
    sigmoid_report,
    streaming_report,
    variants_report,
)
from attnlab.bench.sinks_result import BackcopyResult, MassiveResult, StreamingResult, VariantsResult
from attnlab.bench.sinks_sigmoid import SigmoidResult

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "sinks.md").read_text(encoding="utf-8")


def _latest(name: str) -> Path:
    runs = sorted((ROOT / "benchmarks" / "results").glob(f"{name}-*.json"))
    assert runs, f"no {name} run in benchmarks/results"
    return runs[-1]


def test_the_reports_are_rendered_from_the_committed_runs_in_both_languages() -> None:
    streamed = StreamingResult.read(_latest("sinks_streaming"))
    trained = BackcopyResult.read(_latest("sinks_backcopy"))
    compared = VariantsResult.read(_latest("sinks_variants"))
    with_sink = StreamingResult.read(_latest("sinks_streaming_backcopy"))
    for lang in ("en", "zh"):
        assert streaming_report(streamed, lang) in PAGE, lang
        assert streaming_report(with_sink, lang) in PAGE, lang
        assert backcopy_report(trained, lang) in PAGE, lang
        assert variants_report(compared, lang) in PAGE, lang
        assert massive_report(MassiveResult.read(_latest("sinks_massive")), lang) in PAGE, lang
        assert sigmoid_report(SigmoidResult.read(_latest("sinks_sigmoid")), lang) in PAGE, lang


def test_what_the_prose_says_of_the_runs_is_in_the_files() -> None:
    streamed = {v.claim: v.status for v in StreamingResult.read(_latest("sinks_streaming")).verdicts()}
    run = StreamingResult.read(_latest("sinks_streaming"))
    assert run.first_token < run.uniform  # "the shipped text model has no sink"
    assert streamed["window_fails"] != "held" and streamed["sinks_recover"] != "held"
    assert streamed["dense_fails"] == "held"
    trained = BackcopyResult.read(_latest("sinks_backcopy"))
    status = {v.claim: v.status for v in trained.verdicts()}
    assert all(status[c] == "held" for c in ("dormant_sink", "relu_sink", "relu_drain", "relu_peak"))
    assert all(status[c] != "held" for c in ("sgd_sink", "sgd_drain", "sgd_peak"))  # "SGD did not"
    assert min(trained.final("softmax-adam", "sink")) > 0.5  # "most of each row onto BOS"
    assert max(trained.final("softmax-adam", "sink_triggers")) < 0.05  # "almost nothing on BOS there"
    assert max(trained.final("softmax-adam", "value_ratio")) < 0.5  # "well below the others'"
    assert status["sigmoid_sink"] == "held"  # "much less on BOS than softmax"
    ordinary, triggers = trained.final("sigmoid-adam", "sink"), trained.final("sigmoid-adam", "sink_triggers")
    assert all(abs(o - t) < 0.05 for o, t in zip(ordinary, triggers, strict=True))  # "about as much from triggers"


def test_what_the_prose_says_of_the_model_with_a_sink_is_in_its_file() -> None:
    run = StreamingResult.read(_latest("sinks_streaming_backcopy"))
    assert run.first_token > 1.5 * run.uniform  # "well above an even head's"
    for arm in ("window", "sinks-1", "sinks-2", "sinks-4"):  # "agree within a tenth of a percent"
        assert all(abs(a - r) < 1e-3 * r for a, r in zip(run.ppl[arm], run.ppl["recompute"], strict=True)), arm
    dense = next(v for v in run.verdicts() if v.claim == "dense_fails")
    assert min(dense.gaps) > 0 and dense.status == "within the noise"  # "in every sequence, but within the noise"


def test_what_the_prose_says_of_the_variants_is_in_the_file() -> None:
    result = VariantsResult.read(_latest("sinks_variants"))
    status = {v.claim: v.status for v in result.verdicts()}
    gated = next(v for v in result.verdicts() if v.claim == "gated_sink")
    assert min(gated.gaps) > 0 and status["gated_sink"] == "within the noise"  # "in every seed, but by less"
    assert status["gated_peak"] == "held" and status["learned_sink"] == "held"
    assert status["gated_drain"] == "held"  # "the gate's smaller drain is a finding"
    m = result.measures
    assert all(s > f for s, f in zip(m["sinks"]["learned_sink"], m["sinks"]["first_token"], strict=True))
    assert max(m["mha"]["value_ratio"]) < min(m["gated"]["value_ratio"] + m["sinks"]["value_ratio"])


def test_what_the_prose_says_of_the_massive_run_is_in_the_file() -> None:
    result = MassiveResult.read(_latest("sinks_massive"))
    assert all(f["peak_ratio"] < 100 for f in result.found)  # "about ten times, not orders of magnitude"
    assert sum(f["peak_position"] != 0 for f in result.found) * 2 > len(result.found)  # "in most seeds not on it"
    assert result.loss["mean"] == result.loss["base"]  # "to the last digit"
    status = {v.claim: v for v in result.verdicts()}
    assert min(status["zero_vs_control"].gaps) > 0 and status["zero_vs_control"].status == "within the noise"
    assert min(status["zero_breaks"].gaps) > 0 and max(status["zero_breaks"].gaps) < 0.01  # "a few thousandths"


def test_what_the_prose_says_of_the_sigmoid_run_is_in_the_file() -> None:
    result = SigmoidResult.read(_latest("sinks_sigmoid"))
    status = {v.claim: v.status for v in result.verdicts()}
    assert status == {"softmax_text_sink": "reversed", "sigmoid_text_sink": "within the noise"}
    soft, sig = result.measures["softmax"], result.measures["sigmoid"]
    assert all(0.4 < s / result.uniform < 0.6 for s in soft["first_token"])  # "about half an even head's"
    assert max(soft["sink_rate"] + sig["sink_rate"]) == 0  # "no head is above Gu et al.'s threshold"
    assert all(g > s for g, s in zip(sig["loss"], soft["loss"], strict=True))  # "a higher held-out loss"
    ratios = [g / s for g, s in zip(sig["peak_ratio"], soft["peak_ratio"], strict=True)]
    assert min(ratios) > 4 and max(ratios) < 6.5  # "about five times further above its median"
    assert result.settings["steps"] == 300  # "after 300 steps"


def test_the_pages_example_prints_what_it_says() -> None:
    block = re.search(r"```python\n(.*?)```", PAGE, flags=re.S)
    assert block is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), "docs/sinks.md", "exec"), {"__name__": "__main__"})
    assert out.getvalue().split("\n")[:2] == ["tensor(1.)", "tensor(0.1667)"]
