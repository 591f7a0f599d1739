"""The exercises (issue 35, part 2): each reference solution passes its checker, at least three typical wrong
answers per exercise get the hint written for them, the expected values are the book's, and the reader's code
runs in a process of its own, with a time limit."""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.exercises import EXERCISES, Result, check, check_many
from attnlab.exercises.judge import JUDGES, _wrapper_output
from attnlab.exercises.text import HINTS, TASKS

V1_V2 = "import torch\n\n\ndef transfer(sa_v1, sa_v2):\n"
WRAPPER = (
    "from attnlab.book import MultiHeadAttention, MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
)
GPT2 = "from attnlab.book import MultiHeadAttention\n\n\ndef build():\n"
TORCH = "import torch\n\n\n"

# (exercise, the answer's code, the hint it must get): typical mistakes, at least three per exercise
WRONG: list[tuple[str, str, str]] = [
    ("3.1", V1_V2 + "".join(f"    sa_v1.{n} = torch.nn.Parameter(sa_v2.{n}.weight)\n" for n in ("W_query", "W_key", "W_value")), "3.1.transpose"),
    ("3.1", V1_V2 + "    sa_v1.W_query = torch.nn.Parameter(sa_v2.W_query.weight.T)\n"
     "    sa_v1.W_key = torch.nn.Parameter(sa_v2.W_value.weight.T)\n"
     "    sa_v1.W_value = torch.nn.Parameter(sa_v2.W_key.weight.T)\n", "3.1.swapped"),
    ("3.1", V1_V2 + "".join(f"    sa_v2.{n}.weight = torch.nn.Parameter(sa_v1.{n}.T)\n" for n in ("W_query", "W_key", "W_value")), "3.1.direction"),
    ("3.1", V1_V2 + "".join(f"    sa_v1.{n} = torch.nn.Parameter(sa_v2.{n}.weight.reshape(3, 2))\n" for n in ("W_query", "W_key", "W_value")), "3.1.reshape"),
    ("3.1", V1_V2 + "    pass\n", "3.1.unchanged"),  # the template as written
    ("3.2", WRAPPER + "    return MultiHeadAttentionWrapper(d_in, 2, context_length, 0.0, num_heads=2)\n", "3.2.concat"),
    ("3.2", WRAPPER + "    return MultiHeadAttentionWrapper(d_in, 2, context_length, 0.0, num_heads=1)\n", "3.2.heads"),
    ("3.2", WRAPPER + "    return MultiHeadAttention(d_in, 2, context_length, 0.0, num_heads=2)\n", "3.2.class"),
    ("3.2", WRAPPER + "    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.5, num_heads=2)\n", "3.2.dropout"),
    ("3.3", GPT2 + "    return MultiHeadAttention(768, 768, 256, 0.0, num_heads=12)\n", "3.3.context"),
    ("3.3", GPT2 + "    return MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12, qkv_bias=True)\n", "3.3.bias"),
    ("3.3", GPT2 + "    return MultiHeadAttention(768, 768, 1024, 0.0, num_heads=8)\n", "3.3.heads"),
    ("3.3", GPT2 + "    return MultiHeadAttention(768, 64, 1024, 0.0, num_heads=1)\n", "3.3.d_out"),
    ("3.A", TORCH + "def attention_weights(inputs):\n    return inputs @ inputs.T\n", "3.A.no_softmax"),
    ("3.A", TORCH + "def attention_weights(inputs):\n    s = inputs @ inputs.T\n    return s / s.sum(dim=-1, keepdim=True)\n", "3.A.sum_norm"),
    ("3.A", TORCH + "def attention_weights(inputs):\n    return torch.softmax(inputs @ inputs.T, dim=0)\n", "3.A.dim0"),
    ("3.B", TORCH + "def scaled_weights(queries, keys):\n    return torch.softmax(queries @ keys.T, dim=-1)\n", "3.B.no_scale"),
    ("3.B", TORCH + "def scaled_weights(queries, keys):\n    return torch.softmax(queries @ keys.T / keys.shape[-1], dim=-1)\n", "3.B.scale_d_k"),
    ("3.B", TORCH + "def scaled_weights(queries, keys):\n    return torch.softmax(queries @ keys.T / 2**0.5, dim=0)\n", "3.B.dim0"),
    ("3.C", TORCH + "def causal_weights(s):\n    m = torch.tril(torch.ones(6, 6), diagonal=-1).bool()\n"
     "    return torch.softmax(s.masked_fill(m, -torch.inf) / 2**0.5, dim=-1)\n", "3.C.wrong_side"),
    ("3.C", TORCH + "def causal_weights(s):\n    m = torch.triu(torch.ones(6, 6), diagonal=1).bool()\n"
     "    return torch.softmax(s.masked_fill(m, 0.0) / 2**0.5, dim=-1)\n", "3.C.future"),
    ("3.C", TORCH + "def causal_weights(s):\n    return torch.tril(torch.softmax(s / 2**0.5, dim=-1))\n", "3.C.renormalize"),
    ("3.C", TORCH + "def causal_weights(s):\n    m = torch.triu(torch.ones(6, 6), diagonal=1).bool()\n"
     "    return torch.softmax(s.masked_fill(m, -torch.inf), dim=-1)\n", "3.C.no_scale"),
    ("3.B", TORCH + "def scaled_weights(q, k):\n    return torch.softmax(q[1] @ k.T / 2**0.5, dim=0).expand(6, 6)\n", "3.B.one_query"),
    ("3.A", TORCH + "def attention_weight(inputs):\n    return inputs\n", "missing"),
    ("3.A", TORCH + "def attention_weights(inputs):\n    return inputs[10]\n", "error"),  # an IndexError: not "missing"
    ("3.A", TORCH + "def attention_weights(inputs):\n    input()\n", "error"),  # no stdin: EOFError, not a wait
    ("3.B", TORCH + "def scaled_weights(queries, keys):\n    return queries @ keys\n", "error"),
]  # fmt: skip


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Every reference solution and every wrong answer, run once, in one subprocess (each file its own module)."""
    folder = tmp_path_factory.mktemp("answers")
    answers: list[tuple[str, str | Path]] = [
        (e.id, Path(__file__).parents[1] / "src" / "attnlab" / "exercises" / "solutions" / e.solution)
        for e in EXERCISES.values()
    ]
    for n, (exercise, code, _) in enumerate(WRONG):
        path = folder / f"wrong_{n}.py"
        path.write_text(code, encoding="utf-8")
        answers.append((exercise, path))
    return check_many(answers, timeout=120)


def test_each_reference_solution_passes_its_checker(judged: list[Result]) -> None:
    solutions = judged[: len(EXERCISES)]
    assert [r.exercise for r in solutions] == list(EXERCISES)
    for result in solutions:
        assert result.passed, (result.exercise, result.lines("en"))


def test_each_typical_mistake_gets_the_hint_written_for_it(judged: list[Result]) -> None:
    wrong = judged[len(EXERCISES) :]
    per_exercise: dict[str, int] = {}
    for (exercise, _, hint), result in zip(WRONG, wrong, strict=True):
        assert not result.passed, (exercise, hint)
        assert hint in [f.key for f in result.findings if not f.ok], (exercise, hint, result.findings)
        per_exercise[exercise] = per_exercise.get(exercise, 0) + 1
    assert all(per_exercise[e] >= 3 for e in EXERCISES), per_exercise
    # a hint says what differs in the reader's language, with its values filled in
    transposed = wrong[0].lines("zh")[0]
    assert (
        transposed
        == "sa_v1.W_query 的形状是 (2, 3)，这是 nn.Linear 的 (d_out, d_in) 存法；V1 计算 x @ W，需要 (d_in, d_out) = (3, 2)：用 .T 转置"
    )
    assert wrong[5].lines("en") == [
        "2 heads of d_out=2 are concatenated into 4 dimensions: each head adds its d_out, so set d_out=1"
    ]


def test_every_hint_has_both_languages_with_the_same_placeholders() -> None:
    fields = lambda s: sorted(f for _, f, _, _ in string.Formatter().parse(s) if f)
    assert set(HINTS["en"]) == set(HINTS["zh"])
    for key in HINTS["en"]:
        assert fields(HINTS["en"][key]) == fields(HINTS["zh"][key]), key
    assert set(TASKS["en"]) == set(TASKS["zh"]) == set(EXERCISES) == set(JUDGES)
    judged_keys = set(
        re.findall(
            r'Finding\((?:True|False), "([\w.]+)"',
            Path(__file__).parents[1].joinpath("src/attnlab/exercises/judge.py").read_text(),
        )
    )
    assert judged_keys <= set(HINTS["en"]) and len(judged_keys) >= 30


def test_the_expected_values_are_the_books_own() -> None:
    """3.2's expected context vectors are those of the book's package (llms-from-scratch), not attnlab's guess;
    3.1's are the book's printed sa_v2 output, which the book's own SelfAttention_v2 gives with seed 789."""
    from llms_from_scratch.ch03 import MultiHeadAttentionWrapper, SelfAttention_v2

    from attnlab.book import batched_inputs, embedded_inputs, golden

    torch.manual_seed(123)
    with torch.no_grad():
        theirs = MultiHeadAttentionWrapper(3, 1, 6, 0.0, num_heads=2)(batched_inputs()).double()
    assert theirs.shape == (2, 6, 2) and torch.equal(_wrapper_output(), theirs)
    torch.manual_seed(789)
    with torch.no_grad():
        v2 = SelfAttention_v2(3, 2)(embedded_inputs())
    torch.testing.assert_close(v2, torch.tensor(golden.SA_V2_OUTPUT), atol=golden.ATOL, rtol=0)


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_the_readers_code_runs_in_a_process_of_its_own(tmp_path: Path) -> None:
    """An answer that breaks torch and exits, or records where it ran: the checker's process is untouched."""
    marker = tmp_path / "pid.txt"
    answer = tmp_path / "rude.py"
    answer.write_text(
        f"import os, torch\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntorch.softmax = None\n\n\n"
        "def attention_weights(inputs):\n    os._exit(3)\n",
        encoding="utf-8",
    )
    result = check("3.A", answer)
    assert int(marker.read_text()) != os.getpid()
    assert torch.softmax(torch.zeros(2), dim=0).tolist() == [0.5, 0.5]  # our torch is as it was
    assert [f.key for f in result.findings] == ["crashed"] and not result.passed


@pytest.mark.slow  # waits out a time limit
def test_an_answer_that_never_returns_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    answer = tmp_path / "loop.py"
    answer.write_text("def attention_weights(inputs):\n    while True:\n        pass\n", encoding="utf-8")
    result = check("3.A", answer, timeout=5)  # an endless loop outlasts any limit: a short one tests the same
    assert [f.key for f in result.findings] == ["timeout"]
    assert result.lines("en") == ["the answer ran past 5 s and was stopped (an endless loop?)"]


def test_the_command_lists_shows_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["exercise"]) == 0
    listed = capsys.readouterr().out
    assert all(e in listed for e in EXERCISES)
    start = tmp_path / "answer.py"
    assert cli.main(["exercise", "3.A", "--template", str(start)]) == 0
    assert "def attention_weights(inputs):" in start.read_text()
    assert cli.main(["exercise", "3.A", "--template", str(start)]) == 2  # never over a file
    assert "exists already" in capsys.readouterr().err
    start.write_text(WRONG[13][1], encoding="utf-8")  # the attention scores, not yet normalized
    assert cli.main(["exercise", "3.A", "--check", str(start), "--lang", "zh"]) == 1
    out = capsys.readouterr().out
    assert "这是注意力分数 (inputs @ inputs.T)；还要用 softmax 对每行归一化" in out and "还没通过" in out
    assert cli.main(["exercise", "3.9"]) == 2
    assert "no exercise '3.9'; the exercises are 3.1, 3.2, 3.3, 3.A, 3.B, 3.C" in capsys.readouterr().err
    assert cli.main(["exercise", "3.1", "--check", str(tmp_path / "absent.py")]) == 2
    assert "the answer must be a Python file (.py) that exists" in capsys.readouterr().err
    assert cli.main(["exercise", "3.1", "--solution"]) == 0
    assert "sa_v2.W_query.weight.T" in capsys.readouterr().out
