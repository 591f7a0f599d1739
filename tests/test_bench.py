"""attnlab bench: the smoke run in the suite, the refusal of a wrong implementation, the planner."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import cli
from attnlab.bench.impls import IMPLEMENTATIONS, build, reference_weights
from attnlab.bench.longest import LongestPlan
from attnlab.bench.runner import (
    DECODE_IMPLS,
    PREFILL_IMPLS,
    QUICK,
    BenchConfig,
    _slope,
    nominal_flops,
    run,
)
from attnlab.bench.worker import run_case
from attnlab.models.loaders import from_book_mha


@pytest.mark.slow  # a whole benchmark run, each case in its own process
def test_quick_run_checks_and_times_every_implementation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert cli.main(["bench", "--quick", "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "the practical roofline" in printed and "attnlab-flash" in printed
    data = json.loads(out.read_text())
    assert data["schema"] == "attnlab.bench/2"
    assert set(data["machine"]) >= {"torch", "threads", "available_bytes", "matmul_gflops"}
    assert data["machine"]["matmul_gflops"] > 0
    cases = data["cases"]
    assert [(c["impl"], c["mode"]) for c in cases] == [(i, "forward") for i in PREFILL_IMPLS] + [
        (i, "decode") for i in DECODE_IMPLS
    ]
    for c in cases:
        assert c["status"] == "ok", c
        assert c["agrees"] is True and c["max_rel_error"] < 1e-4
        assert c["median_ms"] > 0 and len(c["samples_ms"]) == QUICK.repeats
        assert c["peak_allocated_bytes"] > 0 and c["peak_rss_bytes"] > 0 and c["threads"] >= 1
        assert c["gflops"] > 0 and 0 < c["roofline_fraction"]
        assert c["spread"] == pytest.approx((max(c["samples_ms"]) - min(c["samples_ms"])) / c["median_ms"])
    for mode in ("forward", "decode"):  # each ratio is against the fastest median of the same run and mode
        fastest = min(c["median_ms"] for c in cases if c["mode"] == mode)
        for c in (c for c in cases if c["mode"] == mode):
            assert c["ratio_to_fastest"] == pytest.approx(c["median_ms"] / fastest)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_an_implementation_that_disagrees_is_refused_not_timed() -> None:
    """The bonus notebook's trap: a variant that claims to be causal and is not."""
    spec = dict(
        impl="claims-causal",
        seq=32,
        batch=1,
        d_model=32,
        heads=4,
        dtype="float32",
        mode="forward",
        repeats=2,
        warmup=0,
        check_len=32,
    )
    not_causal = from_book_mha(reference_weights(32, 4, 33), is_causal=False)
    result = run_case(spec, model_override=not_causal)
    assert result["status"] == "refused: its output differs from the reference"

    assert result["agrees"] is False and result["max_rel_error"] > 1e-2
    assert "median_ms" not in result
    honest = run_case(spec, model_override=from_book_mha(reference_weights(32, 4, 33)))
    assert honest["status"] == "ok" and honest["agrees"] is True


class _HalfGradient(torch.nn.Module):
    """The right output with half the gradient: what a timed backward that is never checked would let through."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        return out.detach() + 0.5 * (out - out.detach())


def test_a_backward_that_is_timed_is_checked_first() -> None:
    spec = dict(
        impl="half-gradient",
        seq=16,
        batch=1,
        d_model=32,
        heads=4,
        dtype="float32",
        mode="forward+backward",
        repeats=1,
        warmup=0,
        check_len=16,
    )
    wrong = _HalfGradient(from_book_mha(reference_weights(32, 4, 18)))
    assert run_case(spec, model_override=wrong)["status"] == "refused: its input gradient differs from the reference"
    right = from_book_mha(reference_weights(32, 4, 18))
    assert run_case(spec, model_override=right)["status"] == "ok"


def test_every_implementation_computes_the_same_function() -> None:
    ref = reference_weights(48, 6, 40)
    x = torch.randn(2, 40, 48)
    with torch.no_grad():
        expected = ref(x)
        for name in IMPLEMENTATIONS:
            torch.testing.assert_close(build(name, ref).eval()(x), expected, atol=1e-5, rtol=1e-5, msg=name)


def test_cases_that_would_not_fit_are_skipped_without_running() -> None:
    calls: list[dict[str, Any]] = []

    def fake_worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        calls.append(spec)
        if spec["mode"] == "matmul":
            return {"matmul_gflops": 100.0}
        if "impls" in spec:  # the interleaved timing of the cases that ran
            return {"samples_ms": {impl: [1.0 * spec["seq"]] * 3 for impl in spec["impls"]}}
        return {
            **spec,
            "status": "ok",
            "median_ms": 1.0 * spec["seq"],
            "peak_allocated_bytes": spec["seq"] ** 2,
            "peak_rss_bytes": 1,
            "samples_ms": [1.0],
        }

    config = BenchConfig(seq_lens=(1024, 2048, 1 << 20), impls=("book-mha", "attnlab-flash"), decode=False)
    result = run(config, worker=fake_worker)
    status = {(c.impl, c.seq): c.status for c in result.cases}
    assert status[("book-mha", 1 << 20)].startswith("skipped: predicted")  # 12 heads x 2^40 scores: never run
    assert status[("book-mha", 1024)] == "ok"
    assert not any(c.get("impl") == "book-mha" and c["seq"] == 1 << 20 for c in calls)
    assert result.fits["book-mha forward"].time_exponent == pytest.approx(1.0)  # the fake's 1.0 * seq
    assert result.fits["book-mha forward"].memory_exponent == pytest.approx(2.0)  # the fake's seq ** 2


def test_scaling_exponent_and_flop_count() -> None:
    assert _slope([1, 2, 4, 8], [3, 12, 48, 192]) == pytest.approx(2.0)
    assert _slope([1024, 2048], [10.0, 20.0]) == pytest.approx(1.0)
    assert nominal_flops("forward", 1, 1024, 768) == 8 * 1024 * 768**2 + 2 * 1024**2 * 768
    assert nominal_flops("backward", 1, 10, 4) == 3 * nominal_flops("forward", 1, 10, 4)


def test_bad_configs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"unknown implementations \['nope'\]"):
        BenchConfig(impls=("nope",)).validate()
    with pytest.raises(ValueError, match=r"d_model \(100\) must be divisible by heads \(12\)"):
        BenchConfig(d_model=100).validate()
    with pytest.raises(ValueError, match=r"repeats must be >= 1, got 0"):
        BenchConfig(repeats=0).validate()
    assert cli.main(["bench", "--impls", "nope"]) == 2
    assert "unknown implementations" in capsys.readouterr().err
    assert cli.main(["bench", "--quick", "--longest", "book-mha", "nope"]) == 2
    assert "unknown implementations ['nope']" in capsys.readouterr().err
    # output paths are checked before minutes of timing, not after
    assert cli.main(["bench", "--quick", "--json", "/no/such/folder/out.json"]) == 2
    assert (
        "cannot write '/no/such/folder/out.json': the folder '/no/such/folder' does not exist"
        in capsys.readouterr().err
    )
    assert cli.main(["bench", "--quick", "--plot", "out.txt"]) == 2
    assert "'out.txt' should end in .png or .svg or .pdf" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--caches", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["--caches", "int8", "--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--caches", "--model", "text", "--prompt-len", "-3"], "--prompt-len must be >= 1, got -3"),
        (["--caches", "--new-tokens", "0"], "--new-tokens must be >= 1, got 0"),
        (
            ["--caches", "--quick", "--full"],
            "--quick and --full ask for two sizes: give one (--quick: a smoke run; --full: the long run)",
        ),
        (["--full", "--quick"], "--full goes with --caches (the cache lab's long run); the sweep's sizes are flags"),
        (["--model", "--threads", "5000"], "--threads must be <= 4096, got 5000; is it a typo?"),
        (["--model", "--quick", "--new-tokens", "0"], "--new-tokens must be >= 1, got 0"),
        (["--quick", "--seq-lens", "64", "0"], "--seq-lens must be >= 1, got 0"),
        (["--quick", "--batch", "0"], "--batch must be >= 1, got 0"),
        (["--quick", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["--quick", "--d-model", "0"], "--d-model must be >= 1, got 0"),
    ],
)
def test_every_bench_flag_is_checked_by_name_before_any_model_loads(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --caches --threads 0` once loaded both models, then died in torch.set_num_threads."""
    from attnlab.bench import cache_table, models, runner

    started: list[str] = []
    monkeypatch.setattr(cache_table, "load", lambda *a, **k: started.append("a cache model loaded"))
    monkeypatch.setattr(models, "run_models", lambda *a, **k: started.append("the model bench ran"))
    monkeypatch.setattr(runner, "measure_machine", lambda *a, **k: started.append("the sweep started"))
    assert cli.main(["bench", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {said}\n" and captured.out == ""
    assert started == []


def test_interleaved_rounds_give_paired_ratio_spreads_and_flag_noisy_findings() -> None:
    """A fake machine: flash is steadily 2x faster; book-mha has one slow round at T=2048."""
    groups: list[dict[str, Any]] = []

    def fake_worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        if spec["mode"] == "matmul":
            return {"matmul_gflops": 100.0}
        if "impls" in spec:
            groups.append(spec)
            t = spec["seq"] / 1024
            book = [2.0 * t * t, 2.0 * t * t, 2.0 * t * t * (3 if t == 2 else 1)]
            return {"samples_ms": {"book-mha": book, "attnlab-flash": [1.0 * t * t] * 3}}
        return {**spec, "status": "ok", "median_ms": 1.0, "peak_allocated_bytes": 1, "peak_rss_bytes": 1}

    config = BenchConfig(seq_lens=(1024, 2048), impls=("book-mha", "attnlab-flash"), decode=False, repeats=3)
    result = run(config, worker=fake_worker)
    assert [g["impls"] for g in groups] == [["book-mha", "attnlab-flash"]] * 2 and groups[0]["repeats"] == 3
    by = {(c.impl, c.seq): c for c in result.cases}
    steady, wobbly = by[("book-mha", 1024)], by[("book-mha", 2048)]
    assert steady.ratio_to_fastest == pytest.approx(2.0) and steady.ratio_spread == pytest.approx(0.0)
    assert not steady.ratio_noisy
    assert wobbly.ratio_spread == pytest.approx((6 - 2) / 2) and wobbly.ratio_noisy  # rounds: 2, 2, 6
    flash = result.fits["attnlab-flash forward"]
    assert flash.time_exponent == pytest.approx(2.0) and not flash.time_noisy
    assert result.fits["book-mha forward"].time_noisy  # per-round slopes 2, 2 and log2(24 / 2) = 3.58
    assert result.to_json()["cases"][1]["ratio_noisy"] is False


def test_longest_alone_runs_only_the_search(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.bench import longest, runner
    from attnlab.bench.results import Longest, Machine

    swept: list[object] = []
    monkeypatch.setattr(runner, "measure_machine", lambda config: (Machine("t", 2, 2, 2**30, 10.0), 0.1))
    monkeypatch.setattr(runner, "run", lambda *a, **k: swept.append(a))
    monkeypatch.setattr(
        longest, "longest", lambda plan, progress: [Longest(plan.impls[0], 8192, 1.0, 1, "T=16384: time")]
    )
    assert cli.main(["bench", "--longest", "attnlab-flash"]) == 0
    out = capsys.readouterr().out
    assert swept == [] and "longest attnlab-flash: T=8192" in out
    assert out.startswith("the longest search about ")  # the forecast comes first


def test_the_longest_search_says_each_step_on_a_pipe_and_keeps_what_it_found_on_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --longest` printed nothing for over 10 minutes into a pipe, and Ctrl-C threw the search away: here
    Ctrl-C comes in book-mha's third run (T=4096), with T=1024 and 2048 done; flash is never reached."""
    from attnlab.bench import longest, runner
    from attnlab.bench.results import Machine

    monkeypatch.setattr(runner, "measure_machine", lambda config: (Machine("t", 2, 2, 2**34, 10.0), 0.1))
    ran: list[int] = []

    def worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        ran.append(spec["seq"])
        if spec["seq"] == 4096:
            raise KeyboardInterrupt
        return {**spec, "status": "ok", "median_ms": 1.0, "peak_rss_bytes": 1}

    monkeypatch.setattr(longest, "longest", functools.partial(longest.longest, worker=worker))
    out = tmp_path / "longest.json"
    assert cli.main(["bench", "--longest", "book-mha", "attnlab-flash", "--json", str(out)]) == 130
    said = capsys.readouterr()
    lines = said.out.splitlines()
    assert lines[0].startswith("the longest search about ") and " by a rough forecast " in lines[0]
    assert [line.split(" (")[0] for line in lines[1:4]] == [f"[0/2] longest book-mha T={t}" for t in (1024, 2048, 4096)]
    assert "longest book-mha: T=2048 (interrupted at T=4096, the longest so far)" in said.out
    assert "attnlab-flash: T=" not in said.out and ran == [1024, 2048, 4096]
    assert said.err == "error: interrupted; left unmeasured: longest book-mha, longest attnlab-flash\n"
    data = json.loads(out.read_text())
    assert data["longest"][0]["longest_seq"] == 2048 and data["left"] == ["longest book-mha", "longest attnlab-flash"]


def test_the_sweep_says_each_step_on_a_pipe_and_names_what_ctrl_c_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep's bar is not drawn on a pipe: each case finished is a line; a run that Ctrl-C cut short prints
    its rows, then one line naming what was left, and exits 130."""
    from attnlab.bench import runner
    from attnlab.bench.results import BenchResult, Case, Machine

    machine = Machine("t", 2, 2, 2**30, 10.0)
    monkeypatch.setattr(runner, "measure_machine", lambda config: (machine, 0.1))

    def fake_run(config: BenchConfig, *, progress: Any, machine: Any) -> BenchResult:
        progress(1.0, 4.0, "attnlab-flash forward T=64")
        progress(2.0, 4.0, "interleaved timing, forward T=64")
        done = Case(impl="attnlab-flash", seq=64, mode="forward", batch=2, d_model=64, heads=4, dtype="float32")
        done.status, done.median_ms = "ok", 1.0
        left = Case(impl="attnlab-flash", seq=128, mode="forward", batch=2, d_model=64, heads=4, dtype="float32")
        left.status = runner.INTERRUPTED
        return BenchResult(machine[0], {}, cases=[done, left], left=["attnlab-flash forward T=128"])

    monkeypatch.setattr(runner, "run", fake_run)
    assert cli.main(["bench", "--quick", "--impls", "attnlab-flash"]) == 130
    said = capsys.readouterr()
    lines = said.out.splitlines()
    assert lines[0].startswith("attnlab-flash forward T=64 (25% of the forecast, ")
    assert lines[1].startswith("interleaved timing, forward T=64 (50% of the forecast, ")
    table = [line for line in lines if line.startswith("│ attnlab-flash")]
    assert len(table) == 1 and table[0].split("│")[2].strip() == "64"  # the case finished; T=128 is not a row
    assert said.err == "error: interrupted; left unmeasured: attnlab-flash forward T=128\n"


def test_the_sweep_keeps_the_cases_finished_on_ctrl_c() -> None:
    """Ctrl-C during the interleaved timing of the second length: the first length's cases are rows; the others
    are left, named (not timed together, so not comparable), not dropped silently."""
    timed: list[int] = []

    def worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        if spec["mode"] == "matmul":
            return {"matmul_gflops": 100.0}
        if "impls" in spec:
            timed.append(spec["seq"])
            if spec["seq"] == 128:
                raise KeyboardInterrupt
            return {"samples_ms": {name: [1.0, 1.0, 1.0] for name in spec["impls"]}}
        return {**spec, "status": "ok", "median_ms": 1.0, "peak_allocated_bytes": 1, "peak_rss_bytes": 1}

    config = BenchConfig(seq_lens=(64, 128, 256), impls=("book-mha", "attnlab-flash"), decode=False, repeats=3)
    result = run(config, worker=worker)
    status = {(c.impl, c.seq): c.status for c in result.cases}
    assert timed == [64, 128]
    assert status[("book-mha", 64)] == status[("attnlab-flash", 64)] == "ok"
    assert result.left == [f"{i} forward T={t}" for t in (128, 256) for i in ("book-mha", "attnlab-flash")]

    def stopped_in_its_own_run(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        if spec.get("seq") == 128 and "impls" not in spec:
            raise KeyboardInterrupt
        return worker(spec, timeout)

    timed.clear()
    result = run(replace(config, impls=("attnlab-flash",)), worker=stopped_in_its_own_run)
    assert timed == []  # stopped before any length was timed together: no rows, each case named
    assert result.left == [f"attnlab-flash forward T={t}" for t in (64, 128, 256)]


@pytest.mark.slow  # a whole benchmark run, each case in its own process
def test_model_bench_runs_each_generator_on_the_same_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.json"
    code = cli.main(["bench", "--model", "--quick", "--json", str(out)])
    said = capsys.readouterr().out
    assert "[0/4] attnlab, round 1" in said and "[4/4] done" in said  # piped: progress as lines, not a silent bar
    data = json.loads(out.read_text())
    status = {c["impl"]: c["status"] for c in data["cases"]}
    # exit 0 unless attnlab failed or a peer's tokens were refused: a peer failing on its own side is a row
    assert code == (1 if status["attnlab"] != "ok" or any(v.startswith("refused") for v in status.values()) else 0)
    assert code == 0 and any(s != "ok" for s in status.values()), status  # the book's cached GPT fails upstream
    for impl in ("attnlab", "hf-generate", "book-ch05"):  # same greedy tokens as attnlab's, or they would be refused
        assert status[impl] == "ok", status
    for c in data["cases"]:
        if c["status"] == "ok":
            assert len(c["prefill_ms"]) == 1 and c["prefill_ms"][0] > 0 and c["decode_tokens_per_s"][0] > 0
            assert c["peak_rss_bytes"] > 0
    assert data["config"]["gpt"]["emb_dim"] == 64
    # the roofline: the bytes a step reads are the model's own parameters, less the embedding tables but a row each
    from attnlab.models import GPT, GPTConfig

    gpt = GPT(GPTConfig.from_dict(data["config"]["gpt"]))
    assert gpt.pos_emb is not None
    tables = gpt.tok_emb.weight.numel() + gpt.pos_emb.weight.numel()
    assert data["roofline"]["weight_bytes"] == 4 * (sum(p.numel() for p in gpt.parameters()) - tables + 2 * 64)
    assert data["roofline"]["fraction_of_floor"]["attnlab"] > 0 and "GB/s" in said and "fraction of that floor" in said


def test_model_bench_refuses_a_generator_whose_tokens_differ() -> None:
    from attnlab.bench.models import QUICK_MODEL, run_models

    def fake_spawn(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        tokens = [1, 2, 3] if spec["impl"] != "book-ch05" else [1, 2, 4]
        return {"tokens": tokens, "prefill_ms": 1.0, "decode_tokens_per_s": 10.0, "peak_rss_bytes": 1}

    cases = {c.impl: c for c in run_models(QUICK_MODEL, spawn=fake_spawn)}
    assert cases["book-ch05"].status.startswith("refused: its greedy tokens differ from attnlab's")
    from attnlab.bench.models import ModelBenchConfig, forecast_seconds

    assert 60 < forecast_seconds(ModelBenchConfig()) < 300  # the default run: said before it starts, under 5 min
    assert cases["hf-generate"].ok and cases["attnlab"].ok and cases["book-ch05"].prefill_ms == []


def test_the_longest_search_doubles_until_time_memory_or_a_failure_stops_it() -> None:
    """longest.longest with the real case runner in process, on tiny sizes: the stop reasons it reports."""
    from attnlab.bench.longest import longest
    from attnlab.bench.worker import run_case

    def in_process(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        return run_case(spec)

    tiny = LongestPlan(impls=("attnlab-flash",), start=16, d_model=32, heads=4, time_limit_s=1e-6)
    by_time = longest(tiny, worker=in_process)
    assert by_time[0].longest_seq == 16 and "over the 0 s limit" in by_time[0].stopped

    def fails_at_64(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        return run_case(spec) if spec["seq"] < 64 else {**spec, "status": "failed: MemoryError"}

    by_failure = longest(replace(tiny, impls=("attnlab-sdpa",), time_limit_s=300.0), worker=fails_at_64)
    assert by_failure[0].longest_seq == 32 and by_failure[0].stopped == "T=64: failed: MemoryError"
    by_memory = longest(replace(tiny, impls=("book-mha",), start=2**20), worker=fails_at_64)
    assert by_memory[0].longest_seq is None and "predicted to need" in by_memory[0].stopped


def test_the_longest_forecast_follows_the_same_stops() -> None:
    """The forecast doubles T as the search does: a machine twice as fast forecasts less time per length but one
    more length before the time limit; memory stops it where the memory model says the search would stop."""
    from attnlab.bench.longest import longest_forecast
    from attnlab.bench.results import Machine

    plan = LongestPlan(impls=("attnlab-flash",), time_limit_s=300.0)
    slow, fast = Machine("t", 2, 2, 2**40, 10.0), Machine("t", 2, 2, 2**40, 20.0)
    assert 0 < longest_forecast(plan, fast, 0.0) and longest_forecast(plan, slow, 0.0) > 0
    # each length at a quarter of the matmul rate; stops once 4x the last run would pass the limit
    rate = 10.0 * 1e9 * 0.25
    expected, t, last = 0.0, 1024, 0.0
    while not last or 4 * last <= 300.0:
        last = nominal_flops("forward", 1, t, 768) / rate
        expected, t = expected + 3 * last, 2 * t
    assert longest_forecast(plan, slow, 0.0) == pytest.approx(expected)
    tight = Machine("t", 2, 2, 2**20, 10.0)  # 1 MiB: not even T=1024 of book-mha's score matrix fits
    assert longest_forecast(replace(plan, impls=("book-mha",)), tight, 5.0) == 0.0
