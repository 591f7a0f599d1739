"""attnlab generate checks every flag before any output: one line naming the flag, exit 2, nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab import cli
from attnlab.cli.generate import CACHE_NAMES


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny byte-level checkpoints: one attending in a window of 8 tokens, one with learned positions."""
    from attnlab.models import GPT, GPTConfig

    root = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for name, extra in (("windowed", {"window": 8}), ("learned", {})):
        config = GPTConfig(vocab_size=256, context_length=32, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0, **extra)
        made[name] = GPT(config).save_pretrained(root / name, tokenizer="bytes")
    return made


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a run that must stop before printing anything."""
    assert cli.main(["generate", *argv]) == 2, argv
    out, err = capsys.readouterr()
    assert out == "", (argv, out)  # not the prompt, not a token: nothing before the error
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    return err


@pytest.mark.parametrize("cache", [c for c in CACHE_NAMES if c not in ("plain", "paged", "prefix")])
def test_a_cache_that_cannot_keep_a_window_is_refused_by_its_flag_before_the_prompt_prints(
    cache: str, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--model", str(checkpoints["windowed"]), "--cache", cache, "hello"], capsys)
    assert f"--cache {cache} " in err and "window of 8 tokens: use --cache plain" in err, err
    assert "or paged or prefix (its keys in blocks)" in err, err


@pytest.mark.parametrize("cache", ["paged", "prefix"])
def test_paged_and_prefix_keep_a_window_in_blocks_on_the_command_line(
    cache: str, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(checkpoints["windowed"])
    assert cli.main(["generate", "--model", model, "--cache", cache, "--max-new-tokens", "12", "hello"]) == 0
    blocks = capsys.readouterr().out
    assert cli.main(["generate", "--model", model, "--max-new-tokens", "12", "hello"]) == 0
    assert blocks == capsys.readouterr().out  # the ring's text: greedy, the same tokens


def test_the_windowed_model_still_generates_with_the_plain_cache(
    checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", str(checkpoints["windowed"]), "hello", "--max-new-tokens", "3"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello") and err == ""


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--max-new-tokens", "50000000"], "--max-new-tokens must be <= 1000000, got 50000000; is it a typo?"),
        (["--max-new-tokens", "33"], "--max-new-tokens 33 is more than the model's context of 32 tokens"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0 = greedy), got -1.0"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
        (["--temperature", "1", "--top-k", "0"], "--top-k must be >= 1, got 0"),
        (["--temperature", "1", "--top-p", "0"], "--top-p must be in (0, 1] (1 keeps every token), got 0.0"),
        (["--temperature", "1", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--top-k", "5"], "--top-k 5 samples, but --temperature 0 is greedy"),
        (["--top-p", "0.9"], "--top-p 0.9 samples, but --temperature 0 is greedy"),
        (["--seed", "-1"], "--seed must be in [0, 2**63 - 1], got -1"),
        (["--seed", str(2**64)], "--seed must be in [0, 2**63 - 1]"),
        (["--max-new-tokens", "30", "hello"], "or pass --truncate left"),  # 5 + 30 - 1 > 32: the prompt's own line
    ],
)
def test_each_flag_is_named_when_wrong_and_nothing_is_printed_before(
    argv: list[str], said: str, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = [] if "hello" in argv else ["hi"]
    err = _refused(["--model", str(checkpoints["learned"]), *prompt, *argv], capsys)
    assert said in err, err


def test_truncate_takes_only_left_and_says_so_before_anything(
    checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:  # argparse's choices, one line through the parser
        cli.main(["generate", "--model", str(checkpoints["learned"]), "hi", "--truncate", "right"])
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "argument --truncate: invalid choice: 'right'" in err and err.count("\n") == 1
    argv = ["generate", "--model", str(checkpoints["learned"]), "x" * 40, "--max-new-tokens", "4"]
    assert cli.main([*argv, "--truncate", "left"]) == 0  # 40 + 4 - 1 > 32: the start dropped, then it runs
    assert capsys.readouterr().out.startswith("x" * 29)  # 32 + 1 - 4 = 29 tokens of the prompt kept


def test_model_and_tokenizer_slips_say_which_flag_and_what_to_give(
    checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.models import GPT, GPTConfig

    (tmp_path / "notes.md").write_text("# not a model\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    untokenized = GPT(GPTConfig(vocab_size=256, context_length=16, emb_dim=16, n_heads=2, n_layers=1))
    untokenized.save_pretrained(tmp_path / "no-tokenizer")
    learned = str(checkpoints["learned"])
    cases = [
        (["--model", learned, "--tokenizer", "nope", "hi"], "--tokenizer 'nope' is not a folder; give the folder"),
        (["--model", str(tmp_path / "notes.md"), "hi"], "is a file but not a checkpoint (.pth, .pt, .bin)"),
        (["--model", str(tmp_path / "empty"), "hi"], "the folder has no config.json; give the folder that"),
        (
            ["--model", str(tmp_path / "no-tokenizer"), "hi"],
            "pass --tokenizer DIR, or, for a model whose ids are bytes, save it with "
            "model.save_pretrained(folder, tokenizer='bytes')",
        ),
        (["--model", learned, "  \n "], "is only whitespace; give some text to continue"),
    ]
    for argv, said in cases:
        assert said in _refused(argv, capsys), argv


def test_a_ring_run_shorter_than_its_check_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ring", "--seq-len", "3"]) == 2
    assert "--seq-len 3 is shorter than the check (--check-len 512)" in capsys.readouterr().err
