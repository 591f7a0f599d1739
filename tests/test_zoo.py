"""Issue 36: the attention zoo. Every variant within 5% of mha's parameters; MLA's and the hybrid's caches by
their formulas, counted by hand and read off the caches the models build; a smoke run of `attnlab zoo` whose
table and plot come from its file; the shipped run quoted by docs/zoo.md; the CLI's refusals in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.bench.zoo import StepCost, evaluations, forecast, measure_decode, plan_steps, probe, run_zoo
from attnlab.bench.zoo_result import SHIPPED_RUN, ZooResult, findings, markdown, rows, verdict
from attnlab.cli import main
from attnlab.models import GPT
from attnlab.models.gpt import count_parameters
from attnlab.models.zoo import BASE, BUDGET, VARIANTS, zoo_config

ROOT = Path(__file__).resolve().parents[1]


def test_every_variant_has_mhas_parameters_within_five_percent_and_changes_what_it_says() -> None:
    target = count_parameters(BASE)
    assert target == 232_064  # 4 layers of 64: 4 x (4 x 64 x 64 + 64 + 2 x 64 x 256 + 256 + 64 + 4 x 64) + ...
    for name in VARIANTS:
        config = zoo_config(name)
        assert abs(count_parameters(config) - target) <= BUDGET * target, name
    assert zoo_config("gqa").n_kv_heads == 2 and zoo_config("mqa").n_kv_heads == 1
    assert zoo_config("hybrid").layer_types == ("delta", "delta", "delta", "full")
    assert zoo_config("gated").ff_dim < BASE.ff_dim < zoo_config("mqa").ff_dim  # weights moved, not added
    with pytest.raises(ValueError, match="unknown variant 'gpa'"):
        zoo_config("gpa")


def test_mla_and_the_hybrid_keep_what_their_formulas_say() -> None:
    """MLA: (kv_lora_rank + qk_rope_head_dim) values a token and layer, 4 layers x (32 + 8) x 4 B = 640 B a token
    in float32. The hybrid: one full layer's 2 x 4 heads x 16 x 4 B = 512 B a token, and 3 DeltaNet states of
    4 heads x 16 x 16 x 4 B = 4 KiB each. The caches the models build hold exactly that for N tokens."""
    from attnlab.bench.kv_bytes import kv_report

    mla, hybrid = zoo_config("mla"), zoo_config("hybrid")
    assert kv_report(mla, name="mla", tokens=(1024,), dtype="float32").per_token == 4 * (32 + 8) * 4 == 640
    report = kv_report(hybrid, name="hybrid", tokens=(131072,), dtype="float32")
    assert report.per_token == 2 * 4 * 16 * 4 == 512
    assert report.at[0].total == 131072 * 512 + 3 * 4 * 16 * 16 * 4
    for config, held in ((mla, lambda n: n * 640), (hybrid, lambda n: n * 512 + 3 * 4096)):
        torch.manual_seed(0)
        model = GPT(config).eval()
        _, _, measured = measure_decode(model, rounds=1)  # the caches after 1024 + 32 tokens
        lengths = torch.tensor(1056)  # every position cache keeps a length counter too: one int64 a layer
        assert measured == held(1056) + 4 * lengths.element_size(), config.layer_types


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
def test_a_smoke_run_writes_a_file_its_table_and_plot_are_drawn_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_zoo(["mha", "deltanet"], minutes=5, seeds=2, smoke=True, models=tmp_path / "models")
    assert [v.name for v in result.variants] == ["mha", "deltanet"]
    for v in result.variants:
        assert [c.seed for c in v.curves] == [0, 1] and all(c.steps[-1] == result.steps for c in v.curves)
        assert v.decode_tokens_per_s > 0 and set(v.heads) >= {"previous_token", "induction", "in_context_gain"}
    assert result.variants[1].kv_bytes_per_token == 0 and result.variants[1].state_bytes == 4 * 4 * 16 * 16 * 4
    path = result.write(tmp_path / "zoo.json")
    again = ZooResult.read(path)
    assert markdown(again) == markdown(result) and rows(again)[1]["variant"] == "deltanet"
    gaps = [d.loss[-1] - m.loss[-1] for d, m in zip(again.variants[1].curves, again.variants[0].curves, strict=True)]
    mean, spread = sum(gaps) / 2, abs(gaps[0] - gaps[1])  # two seeds, paired by seed
    assert findings(again) == [
        f"deltanet: {mean:+.3f} against mha ({'lower' if mean < 0 else 'higher'}; spread {spread:.3f} over 2 seeds: "
        f"{'a finding' if abs(mean) > spread else 'within the noise'})"
    ]
    from attnlab.bench.zoo_result import plot

    assert plot(again, tmp_path / "zoo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # each variant's seed-0 model is saved, the one whose heads were measured (seed 1 trained after it)
    from attnlab.explain.heads import head_scores
    from attnlab.models.train import read_log

    for v in result.variants:
        saved = GPT.from_pretrained(tmp_path / "models" / v.name)
        assert saved.config == zoo_config(v.name)
        assert head_scores(saved).best("induction")[2] == pytest.approx(v.heads["induction"], abs=1e-6)
        log = read_log(tmp_path / "models" / v.name)
        assert log is not None and log.eval_loss == v.curves[0].loss and log.task == "text"
    # and explain finds it by name, with ATTNLAB_ZOO naming the run (runs/zoo when not set)
    monkeypatch.setenv("ATTNLAB_ZOO", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["explain", "--model", "zoo:deltanet", "the cat"]) == 0
    out = capsys.readouterr().out
    assert "Layer 3 · Gated DeltaNet: a state of 1,024 values, whatever the length" in out  # 4 heads of 16 x 16
    assert "How it learned" in out  # its training log, beside it


def test_zoo_models_are_named_and_a_missing_one_says_how_to_train_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv("ATTNLAB_ZOO", str(run))
    assert main(["explain", "--model", "zoo:gqa", "the cat"]) == 2
    err = capsys.readouterr().err  # the command that saves it where this lookup looks
    assert f"--model zoo:gqa: no trained model in '{run / 'models' / 'gqa'}'" in err
    assert f"train it with attnlab zoo gqa --minutes 2 --out {run} " in err
    assert main(["heads", "--model", "zoo:gpa"]) == 2
    assert "the zoo has no variant 'gpa'; it holds mha, gqa" in capsys.readouterr().err
    assert main(["memory", "--model", "zoo:mla"]) == 2  # memory reads the same folder
    assert "--model zoo:mla: no trained model in" in capsys.readouterr().err
    run.write_text("not a folder")
    assert main(["explain", "--model", "zoo:mla", "x"]) == 2
    assert f"ATTNLAB_ZOO={str(run)!r} is a file; set it to the --out folder of a zoo run" in capsys.readouterr().err
    monkeypatch.delenv("ATTNLAB_ZOO")
    monkeypatch.chdir(tmp_path)  # without ATTNLAB_ZOO: the zoo's default --out, runs/zoo, said in full
    assert main(["explain", "--model", "zoo:mla", "x"]) == 2
    err = capsys.readouterr().err
    assert f"no trained model in '{tmp_path / 'runs' / 'zoo' / 'models' / 'mla'}'" in err
    assert "train it with attnlab zoo mla --minutes 2 (every zoo run" in err


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
def test_a_smoke_run_never_replaces_a_trained_model(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "mqa").mkdir(parents=True)
    (models / "mqa" / "config.json").write_text('{"trained": "by a real run"}')
    result = run_zoo(["mqa"], minutes=5, smoke=True, models=models)  # that it saves where none is: the test above
    assert (models / "mqa" / "config.json").read_text() == '{"trained": "by a real run"}'  # kept as it was
    assert [v.name for v in result.variants] == ["mqa"] and result.variants[0].final_losses  # and still trained


def test_a_difference_is_a_finding_only_past_its_spread_over_seeds() -> None:
    assert verdict([-0.05, -0.03]) == pytest.approx((-0.04, 0.02, True))  # both seeds lower, by more than 0.02
    assert verdict([-0.05, 0.01])[2] is False  # the seeds disagree on the side
    assert verdict([-0.05])[2] is False  # one seed: no spread, no finding


def test_a_variant_stopped_early_is_not_set_against_mha() -> None:
    """A seed where a variant ran out of time saw fewer tokens than mha's: it is left out of the pairs."""
    from attnlab.bench.zoo_result import Curve, VariantResult

    def variant(name: str, losses: list[float], stopped: str = "") -> VariantResult:
        curves = [Curve(seed, [10], [loss], 1.0, stopped if seed == 1 else "") for seed, loss in enumerate(losses)]
        return VariantResult(name, "", "", "", 1, 1, ["full"], 1, 0, {}, curves)

    mha = variant("mha", [1.30, 1.40])
    assert variant("x", [1.20, 1.31]).against(mha) == pytest.approx([-0.10, -0.09])
    assert variant("x", [1.20, 1.31], stopped="out of time at step 5").against(mha) == pytest.approx([-0.10])
    assert verdict(variant("x", [1.20, 1.31], stopped="out of time at step 5").against(mha))[2] is False


def test_a_budget_too_small_for_the_curves_is_refused_with_what_would_do() -> None:
    cheap = StepCost(step=0.1, evaluation=0.15)  # an evaluation of 1.5 steps
    with pytest.raises(ValueError, match=r"--minutes 1 leaves 24 training steps .* give --minutes 2 or more"):
        plan_steps({"mha": cheap, "gqa": cheap}, minutes=1, seeds=1, reserve=50)  # 24 x 0.2 + 12 x 0.3 <= 8.5
    # 5083 x 0.1 + 11 evaluations x 0.15 <= 0.85 x 600, and 5084 steps would not fit
    assert plan_steps({"mha": cheap}, minutes=10, seeds=1, reserve=0) == 5083


def test_the_plan_pays_each_variants_own_evaluations_and_fits_the_budget() -> None:
    """A variant that spends its time choosing keys pays it again in each evaluation's 4 forward passes: here an
    evaluation costs 10 of its steps. Planned as 1.5 steps (the old arithmetic: 2,407 steps) the two seeds would
    train 494 s of the 484.5 planned; planned with its own cost, they fit, and one step more would not."""
    costs = {"mha": StepCost(step=0.05, evaluation=0.075), "nsa": StepCost(step=0.05, evaluation=0.5)}
    steps = plan_steps(costs, minutes=10, seeds=2, reserve=30)
    assert steps == 2_360  # 2 x (2360 x 0.1 + 10 evaluations x 0.575) = 483.5 <= 0.85 x 570
    assert [evaluations(n) for n in (steps, steps + 1, 59, 100, 3)] == [10, 11, 12, 10, 3]  # as train() evaluates
    budget = 30 + 0.85 * (600 - 30)
    assert forecast(costs, steps=steps, seeds=2, reserve=30) <= budget
    assert forecast(costs, steps=steps + 1, seeds=2, reserve=30) > budget
    assert forecast(costs, steps=10, seeds=2, reserve=30) == pytest.approx(30 + 2 * (10 * 0.1 + 10 * 0.575))


def test_the_probe_times_an_evaluation_in_the_training_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs train() itself and reads its clock, so an evaluation as slow as the variant makes it is what
    it measures, apart from the steps. On a clock that moves 0.1 s a reading and 5 s an evaluation (no timing)."""
    from attnlab.models import train as training
    from attnlab.models.tasks import TextTask, stdlib_text
    from attnlab.models.zoo import SEQ_LEN

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            self.now += 0.1
            return self.now

    clock = Clock()

    def evaluate(*args: object, **kwargs: object) -> float:
        clock.now += 5.0
        return 1.0

    monkeypatch.setattr(training, "time", clock)  # the loop's clock: time.perf_counter
    monkeypatch.setattr(training, "evaluate", evaluate)
    task = TextTask(stdlib_text(), seq_len=SEQ_LEN)
    cost = probe("mha", task, steps=2)
    assert cost.step == pytest.approx(0.1) and 5.0 <= cost.evaluation <= 5.5
    with pytest.raises(ValueError, match="steps must be a whole number >= 1 to time, got 0"):
        probe("mha", task, steps=0)


def test_the_cli_refuses_in_one_line_before_training(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["zoo", "gpa"]) == 2
    assert "unknown variant(s) ['gpa']; the zoo holds ['mha'" in capsys.readouterr().err
    assert main(["zoo", "--seeds", "0"]) == 2
    assert "--seeds must be in [1, 10], got 0" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["zoo", "--out", str(tmp_path / "f")]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_the_shipped_run_is_shown_and_docs_quote_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped = ZooResult.read(SHIPPED_RUN)
    shipped_variants = list(VARIANTS)  # every variant, in the zoo's order
    assert [v.name for v in shipped.variants] == shipped_variants and not shipped.interrupted
    assert all(not c.stopped for v in shipped.variants for c in v.curves)
    assert len(shipped.seeds) >= 2  # a spread, so that the docs may call a difference a finding
    assert main(["zoo", "--show", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert "留出损失" in out and "门控 DeltaNet" in out
    assert "| deltanet | " in out  # through a pipe (as here): one whole line a row, never folded
    docs = (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8")
    assert markdown(shipped) in docs
    for line in findings(shipped):
        assert line in docs
    assert json.loads(SHIPPED_RUN.read_text(encoding="utf-8"))["schema"] == "attnlab.zoo/1"


def test_a_zoo_model_explained_names_its_recurrent_layers_and_checks_only_what_holds() -> None:
    """explain on the hybrid: each layer named by its kind (en, zh); the causal check holds on every layer, and a
    DeltaNet layer's implicit weights are not claimed to sum to 1 (they need not: not a softmax)."""
    from attnlab.explain.model_report import model_report
    from attnlab.models.tokenizer import ByteTokenizer

    torch.manual_seed(0)
    model = GPT(zoo_config("hybrid")).eval()
    for lang, delta in (("en", "Gated DeltaNet"), ("zh", "门控 DeltaNet")):
        report = model_report(model, ByteTokenizer(), "the cat sat", name="hybrid", lang=lang, figures=False)
        named = [s for s in report.sections if delta in s.title]
        assert len(named) == 6, [s.title for s in report.sections]  # 3 DeltaNet layers, on the probe and the text
        for section in report.sections:
            if delta in section.title:
                assert all(check.ok for check in section.checks) and len(section.checks) == 1  # the causal one
