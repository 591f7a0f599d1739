"""Issue 37, part 1, and issue 58, items 3-4: benchmarks/engines.py, decoding beside CTranslate2 and llama.cpp on
gpt2-small's shape and today's. Its tokenizer is one the converters and Hugging Face accept; a float row whose
tokens differ from Hugging Face's fails the run; the docs quote its result file for every shape. (`make smoke`
runs the script end to end on a tiny model, every engine in its process.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]


def script() -> ModuleType:
    return load("engines")


@pytest.mark.parametrize("vocab_size", [512, 50257, pytest.param(151936, marks=pytest.mark.slow)])  # Qwen3's: 3 s
def test_the_tokenizer_made_for_the_model_has_its_size_and_reads_any_text(tmp_path: Path, vocab_size: int) -> None:
    from transformers import AutoTokenizer

    load("_engines_shapes").write_tokenizer(tmp_path, vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == vocab_size and tokenizer.eos_token_id == vocab_size - 1
    for text in ("The for statement", "床前明月光 🙂", "\x00\x01 tabs\tand\nnewlines"):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text and max(ids) < vocab_size - 1
    assert tokenizer.encode("\x00\x00") == [256]  # the first merge: two zero bytes, one token


def test_a_float_row_whose_tokens_differ_fails_and_a_quantized_one_reports_its_agreement() -> None:
    engines = script()

    def row(engine: str, precision: str, same: bool) -> dict[str, object]:
        return {"engine": engine, "precision": precision, "tokens_identical": same, "agreement": 1.0 if same else 0.5}

    result = {"rows": [row("hf", "float32", True), row("ctranslate2", "float32", False), row("attnlab", "int8", False)]}
    assert engines.check_quality(result) == ["ctranslate2 float32: its greedy tokens differ from HF float32's"]
    result["rows"].append({"engine": "llama.cpp", "precision": "f32", "error": "not installed"})
    assert len(engines.check_quality(result)) == 1  # a row that did not run says so in the table, not here


def latest_runs() -> dict[str, dict[str, object]]:
    """Each shape's latest result file (engines-DATE[-SHAPE].json; a run before --shape is gpt2-small's)."""
    found = {}
    for path in sorted((ROOT / "benchmarks" / "results").glob("engines-*.json")):  # by date
        result = json.loads(path.read_text(encoding="utf-8"))
        found[result.get("shape", "gpt2-small")] = result
    return found


def test_the_docs_quote_each_shapes_latest_run_with_its_cpu() -> None:
    engines = script()
    runs = latest_runs()
    assert "gpt2-small" in runs and set(runs) <= set(load("_engines_shapes").SHAPES)
    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for shape, result in runs.items():
        assert result["schema"] == engines.SCHEMA and result["rounds"] >= 3
        assert engines.check_quality(result) == []  # its float rows gave Hugging Face's tokens
        assert engines.render(result) in docs and f"### {shape}" in docs
        if "shape" in result:  # runs since issue 58 name their shape and CPU
            assert result["shape"] == shape and result["cpu"] in docs and "(smoke" not in result["described"]
    gpt2 = runs["gpt2-small"]["model"]
    assert gpt2.get("n_layer", gpt2.get("n_layers")) == 12  # gpt2-small's shape, not the smoke's


def test_a_file_that_is_not_a_run_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    monkeypatch.setattr("sys.argv", ["engines.py", "--render", str(bad)])
    with pytest.raises(SystemExit) as ended:
        script().main()
    assert ended.value.code == 2
    assert f"--render {str(bad)!r} is not a result of this script" in capsys.readouterr().err


def test_ctrl_c_in_a_saved_run_script_is_one_line_and_130(capsys: pytest.CaptureFixture[str]) -> None:
    runs = load("_runs")

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        runs.exit_with(interrupted)
    assert done.value.code == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("interrupted: nothing written")


def test_the_targets_are_judged_from_the_rows_and_the_noise_rule() -> None:
    """A ratio is judged only where both rows ran and spread at most 25%; a margin inside the spread is said."""
    engines = script()

    def row(name: str, rate: float, spread: float = 0.1, prefill: float = 100.0) -> dict[str, object]:
        engine, precision = name.split(" ", 1)
        return {
            "engine": engine,
            "precision": precision,
            "decode_tokens_per_s": rate,
            "spread": spread,
            "prefill_ms": prefill,
            "prefill_spread": 0.05,
        }

    result = {
        "rows": [
            row("attnlab int8", 60.0),
            row("ctranslate2 int8", 50.0, prefill=50.0),
            row("attnlab float32", 20.0),
            row("attnlab float32 layout-auto", 30.0, spread=0.4),  # the faster eager row, but too noisy
            row("ctranslate2 float32", 40.0),
            row("attnlab int8 batch 8", 100.0),
            row("attnlab int8 static batch 8", 90.0),  # the slower of attnlab's two ways: not the one judged
            row("ctranslate2 int8 batch 8", 98.0),
            row("attnlab int8 batch 32", 150.0),
            row("attnlab int8 static batch 32", 210.0),  # the faster: judged
            row("ctranslate2 int8 batch 32", 200.0),
            {"engine": "llama.cpp", "precision": "f16", "error": "not installed"},
        ]
    }
    said = engines.verdicts(result)
    assert said[0] == "int8 decode (attnlab int8 against ctranslate2 int8): 1.20x, target 1x: met"
    assert said[1] == "bfloat16 decode against llama.cpp: not established (a row did not run)"
    assert said[3] == (
        "float32 eager decode (attnlab float32 layout-auto against ctranslate2 float32): 0.75x, target 1x: "
        "not established (a spread too wide to trust)"
    )
    assert said[5] == (
        "int8 at 8 prompts (attnlab int8 batch 8 against ctranslate2 int8 batch 8): 1.02x, target 1x: met (by 2%, "
        "inside the rows' 10% spread: another run may say otherwise)"
    )
    assert said[6] == (
        "int8 at 32 prompts (attnlab int8 static batch 32 against ctranslate2 int8 batch 32): 1.05x, target 1x: met "
        "(by 5%, inside the rows' 10% spread: another run may say otherwise)"
    )
    assert "int8 prefill (attnlab int8 against ctranslate2 int8): 0.50x, target 1x: not met" in said
    result["rows"].append(row("attnlab float32 compiled", 30.0) | {"floor_fraction": 0.6})
    assert engines.verdicts(result)[4] == (  # 1.3x the peer's 40 tok/s is 52, 0.6 * 52 / 30 of the floor
        "float32 compiled decode (attnlab float32 compiled against ctranslate2 float32): 0.75x, target 1.3x: not "
        "met; it asks attnlab float32 compiled for 104% of its floor, where it runs at 60%"
    )
    names = ("int8", "int8 batch 8", "float32 layout-auto", "int8 static batch 32")
    assert [engines.batch_of(p) for p in names] == [1, 8, 1, 32]


def test_a_round_that_fails_late_keeps_the_rows_good_rounds_and_is_said() -> None:
    """A crash in round 3 (llama.cpp's q8_0 segfaulted here once) once lost a whole run's figures."""
    engines = script()
    tried = [{"decode_tokens_per_s": 50.0}, {"decode_tokens_per_s": 52.0}, {"error": "exit -11"}]
    runs, failed = engines.good_rounds(tried)
    assert runs == tried[:2] and failed == ["exit -11"]
    assert engines.good_rounds([{"error": "not installed"}]) == ([], ["not installed"])
    row = {
        "engine": "llama.cpp",
        "precision": "q8_0",
        "decode_tokens_per_s": 51.0,
        "spread": 0.04,
        "floor_fraction": 0.5,
        "prefill_ms": 100.0,
        "tokens_identical": False,
        "agreement": 0.8,
        "kernel": "ggml q8_0",
        "failed_rounds": failed,
    }
    assert (
        load("_engines_table")
        .row_line(row, ["llama.cpp", "q8_0"], None)
        .endswith("| ggml q8_0; 1 round(s) failed: exit -11 |")
    )


def test_a_reader_that_stops_early_ends_the_script_quietly() -> None:
    """``... --render run.json | head``: the script's output past what the reader took goes nowhere, with no
    traceback (more than a pipe holds, so the reader's close is met)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); from _runs import exit_with\n"
        "def main():\n    print('row ' * 200_000)\n    return 0\n"
        "exit_with(main)"
    )
    done = subprocess.run(
        f'{sys.executable} -c "{code}" | head -c 10', shell=True, capture_output=True, text=True, cwd=ROOT
    )
    assert done.stdout == "row row ro" and done.stderr == ""


@pytest.mark.slow  # a real row process (imports torch)
def test_a_row_that_fails_says_why_in_the_runs_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row that fails on purpose (an engine the script does not know), in its own process as every row runs:
    the run's progress line names the row and its reason, the exception's type and message in one line, and the
    row's result keeps the same reason for the table (a smoke run that failed once under load said only
    "round 1/1: attnlab bfloat16")."""
    engines = script()
    spec = {"folder": str(tmp_path), "prompt": [1, 2], "others": [], "new_tokens": 2, "threads": 1}
    result = engines.attempt({**spec, "engine": "nonesuch", "precision": "float32"}, 0, 1)
    reason = "ValueError: unknown engine 'nonesuch'"
    assert result == {"error": reason}
    assert capsys.readouterr().err.splitlines() == [f"round 1/1: nonesuch float32: failed: {reason}"]


def test_the_int8_perplexity_is_judged_through_the_kernels_the_timed_int8_rows_ran() -> None:
    """int8's perplexity depends on its kernel ("dynamic" quantizes the activations too). A run that measured it
    through other kernels than its timed int8 rows ran says "not established", never "met"; a run that measured
    every kernel judges those the rows ran, the worst of them deciding."""
    engines = script()
    timing = {"decode_tokens_per_s": 50.0, "spread": 0.1, "prefill_ms": 100.0, "prefill_spread": 0.1}
    rows = [
        {"engine": "attnlab", "precision": "int8", "kernel": "dynamic x49"} | timing,
        {"engine": "attnlab", "precision": "int8 compiled", "kernel": "gemv x49, torch.compile"} | timing,
        {"engine": "attnlab", "precision": "int8 batch 8", "kernel": "dynamic x49, generate_many of 8"} | timing,
        {"engine": "ctranslate2", "precision": "int8", "kernel": "ctranslate2 int8"} | timing,
    ]
    quality = {"tokens": 2040, "float32": 4.0, "bfloat16": 4.01, "int8": 4.001, "int8_kernel": "int8pack x9"}
    said = [line for line in engines.verdicts({"rows": rows, "quality": quality}) if "perplexity" in line]
    assert said[0] == (
        "int8 perplexity within 1.0% of float32: not established for the kernels the timed int8 rows ran (dynamic, "
        "gemv): this run measured it through int8pack x9 only (the shipped text model, 2040 held-out tokens: 4.0010 "
        "against 4.0000, +0.025%)"
    )
    assert said[1].endswith("4.0100 against 4.0000, +0.250%: met")
    quality["int8_by_kernel"] = {"dynamic": 4.06, "gemv": 4.002, "int8pack": 4.001, "dequantize": 4.001}
    said = [line for line in engines.verdicts({"rows": rows, "quality": quality}) if "perplexity" in line]
    assert said[0] == (
        "int8 perplexity within 1.0% of float32, through the kernels the timed int8 rows ran (the shipped text "
        "model, 2040 held-out tokens): dynamic 4.0600 (+1.500%), gemv 4.0020 (+0.050%), against 4.0000: not met"
    )


def test_issue_58s_targets_are_judged_per_shape_and_a_row_that_did_not_run_says_so() -> None:
    """Qwen3-0.6B's shape: the default float32 row against CTranslate2 (1x) and Hugging Face (1.5x); a run of
    some rows only (``--rows``) judges what it has and says "not established" for the rest. gpt2-small's: the
    default row against its floor."""
    engines = script()

    def row(name: str, rate: float, floor: float = 0.5) -> dict[str, object]:
        engine, precision = name.split(" ", 1)
        timing = {"decode_tokens_per_s": rate, "spread": 0.05, "prefill_ms": 100.0, "prefill_spread": 0.05}
        return {"engine": engine, "precision": precision, "floor_fraction": floor, "batch": 1} | timing

    rows = [row("attnlab float32", 30.0), row("ctranslate2 float32", 25.0), row("hf float32", 15.0)]
    said = engines.verdicts({"shape": "qwen3-0.6b", "rows": rows})
    assert (
        "default float32 against CTranslate2 (attnlab float32 against ctranslate2 float32): 1.20x, target 1x: met"
        in said
    )
    assert "default float32 against Hugging Face (attnlab float32 against hf float32): 2.00x, target 1.5x: met" in said
    assert "bfloat16 against llama.cpp: not established (a row did not run)" in said
    said = engines.verdicts({"shape": "gpt2-small", "rows": rows})
    assert "attnlab float32 at 80% of its floor: 50%: not met" in said
    assert not any("perplexity" in line for line in said)  # a run of some rows measured no trained model


def test_the_int8_kernels_a_row_ran_are_read_off_its_kernel_column_prompts_included() -> None:
    quality = load("_engines_quality")
    row = {"engine": "attnlab", "precision": "int8", "kernel": "gemv x12, int8pack x37; a prompt's rows: dynamic x49"}
    assert quality.timed_int8_kernels({"rows": [row]}) == ["dynamic", "gemv", "int8pack"]


def test_rows_a_shape_lacks_are_refused_in_one_line_naming_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["engines.py", "--shape", "qwen3-0.6b", "--rows", "attnlab int8 batch 8"])
    with pytest.raises(SystemExit) as ended:
        script().main()
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "--rows: no row ['attnlab int8 batch 8'] on --shape qwen3-0.6b; the rows are: hf float32, " in err


def test_the_floors_rate_is_the_median_of_the_rounds_and_its_spread_judges_a_verdict_against_the_floor() -> None:
    """The floor divides by the median of the rates measured once a round; a fraction of the floor is judged with
    the wider of the row's spread and the rate's: a rate that moved 30% between rounds is no finding, however
    steady the row."""
    floor = load("_engines_floor")
    stream = floor.summarized_rates([30.0, 40.0, 35.0])
    assert stream == {"stream_gb_s": 35.0, "stream_spread": 10.0 / 35.0, "stream_rounds": [30.0, 40.0, 35.0]}
    engines = script()

    def row(stream_spread: float | None) -> dict[str, object]:
        timing = {"decode_tokens_per_s": 50.0, "spread": 0.05, "prefill_ms": 100.0, "prefill_spread": 0.05}
        kept = {} if stream_spread is None else {"stream_spread": stream_spread}
        return {"engine": "attnlab", "precision": "float32", "floor_fraction": 0.82, "batch": 1} | timing | kept

    def said(stream_spread: float | None) -> str:
        lines = engines.verdicts({"shape": "gpt2-small", "rows": [row(stream_spread)]})
        return next(line for line in lines if line.startswith("attnlab float32 at 80% of its floor"))

    assert said(0.30).endswith("82%: not established (a spread too wide to trust)")
    assert said(0.10).endswith("82%: met (by 2%, inside the floor's rate's 10% spread: another run may say otherwise)")
    assert said(0.01).endswith("82%: met (by 2%, inside the row's 5% spread: another run may say otherwise)")
    assert said(None).endswith("82%: met (by 2%, inside the row's 5% spread: another run may say otherwise)")


def test_a_rows_floor_is_its_bytes_at_the_rounds_median_rate() -> None:
    """summarized: the row's fraction of its floor divides by the rounds' median rate, and carries the rate's
    spread for the verdict; the bytes a step are roofline's (a model of 2 layers x 64, float32 and int8)."""
    engines = script()
    from attnlab.bench.roofline import decode_bytes
    from attnlab.models import GPTConfig

    config = GPTConfig(vocab_size=100, context_length=64, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0)
    stream = load("_engines_floor").summarized_rates([1.0, 2.0, 4.0])  # GB/s: the median 2
    tried = [{"decode_tokens_per_s": rate, "prefill_s": 0.1, "tokens": [1, 2]} for rate in (100.0, 110.0, 90.0)]
    for precision, width in (("float32", 4), ("int8", 1)):
        got = engines.summarized("attnlab", precision, tried, [1, 2], (config, 10, stream))
        step = decode_bytes(config, 10, element=4)
        want = (step.weights / 4 * width + step.kv) / 2e9 * 100.0  # the floor's seconds a step x the median rate
        assert got["floor_fraction"] == pytest.approx(want, rel=1e-12)
        assert got["stream_gb_s"] == 2.0 and got["stream_spread"] == 1.5


def test_a_module_the_gguf_converter_lacks_is_said_as_what_to_install_not_as_a_refusal(tmp_path: Path) -> None:
    """The converter's last line when Qwen3's conversion imports sentencepiece and it is not installed (seen in a
    run on this machine): the row says what to install; any other last line stays the converter's refusal."""
    shapes, rows = load("_engines_shapes"), load("_engines_rows")
    kind, said = shapes.gguf_failure("ModuleNotFoundError: No module named 'sentencepiece'")
    assert kind == "missing" and said == (
        "llama.cpp's converter imports the Python module 'sentencepiece' for this model, and it is not installed: "
        "pip install sentencepiece (pip install 'attnlab[engines]' brings it)"
    )
    kind, said = shapes.gguf_failure("ModuleNotFoundError: No module named 'google.protobuf'")
    assert kind == "missing" and said.endswith(
        "module 'google.protobuf' for this model, and it is not installed: install the package that provides it"
    )  # not "pip install google"
    said = shapes.gguf_failure("ModuleNotFoundError: No module named 'sentencepiece'")[1]
    (tmp_path / "gguf-f16.missing").write_text(said, encoding="utf-8")
    with pytest.raises(RuntimeError) as raised:
        rows.refused(tmp_path, "gguf-f16")
    assert str(raised.value) == said
    kind, said = shapes.gguf_failure("NotImplementedError: Architecture 'Foo' not supported!")
    assert kind == "error" and said == "convert_hf_to_gguf.py: NotImplementedError: Architecture 'Foo' not supported!"
    (tmp_path / "gguf-f32.error").write_text(said, encoding="utf-8")
    with pytest.raises(RuntimeError) as raised:
        rows.refused(tmp_path, "gguf-f32")
    assert str(raised.value) == f"the converter refused this model: {said}"


def test_a_floor_whose_rate_spread_too_wide_is_not_used_to_say_how_far_a_target_is() -> None:
    """A missed target between two steady rows says how far it is in floor terms, unless the floor's own rate
    spread past the noise rule (then the run's note says no verdict against the floor is a finding)."""
    engines = script()

    def rows(stream_spread: float) -> list[dict[str, object]]:
        timing = {"spread": 0.05, "prefill_ms": 100.0, "prefill_spread": 0.05, "stream_spread": stream_spread}
        ours = {"engine": "attnlab", "precision": "bfloat16 compiled", "decode_tokens_per_s": 20.0}
        theirs = {"engine": "llama.cpp", "precision": "f16", "decode_tokens_per_s": 40.0}
        return [r | timing | {"floor_fraction": 0.6, "batch": 1} for r in (ours, theirs)]

    def said(stream_spread: float) -> str:
        lines = engines.verdicts({"shape": "qwen3-0.6b", "rows": rows(stream_spread)})
        return next(line for line in lines if line.startswith("bfloat16 against llama.cpp"))

    assert said(0.10).endswith(
        "0.50x, target 1x: not met; it asks attnlab bfloat16 compiled for 120% of its floor, where it runs at 60%"
    )
    assert said(0.30).endswith("0.50x, target 1x: not met")
