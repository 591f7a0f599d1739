"""The exercise checker against shortcuts (issue 54, items 4 and 12): answers that compute nothing fail and say
why, honest answers written unlike the reference solution pass, and two mistakes get the hint that names them.

The shortcuts are a learner's, not an attacker's: the book's numbers typed in, the reference solution or the
book's own function imported, the record the checker reads written by the answer's own process (torch.save, an
atexit hook, the collector's module reached through sys.modules['__main__']).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.book import golden
from attnlab.exercises import Result, check, check_many

TORCH = "import os\nimport sys\n\nimport torch\n\n\n"
# the book's printed numbers, as a learner would type them in
GOLD_A = f"torch.tensor({golden.ATTN_WEIGHTS!r})"
GOLD_C = f"torch.tensor({golden.CAUSAL_WEIGHTS!r})"


def _gold_b() -> str:
    """3.B's (6, 6) weights on the book's inputs, by plain torch in float64, typed in to 4 decimals."""
    from attnlab.book import embedded_inputs

    x = embedded_inputs().double()
    q, k = x @ torch.tensor(golden.W_QUERY).double(), x @ torch.tensor(golden.W_KEY).double()
    weights = torch.exp(q @ k.T / 2**0.5)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return f"torch.tensor({[[round(float(v), 4) for v in row] for row in weights]!r})"


def _gold_3_1() -> str:
    """3.1 typed in: SelfAttention_v2's weights for seed 789 (the book's own class), transposed, as printed."""
    from llms_from_scratch.ch03 import SelfAttention_v2

    torch.manual_seed(789)
    v2 = SelfAttention_v2(3, 2)
    return "".join(
        f"    sa_v1.{n} = torch.nn.Parameter(torch.tensor({getattr(v2, n).weight.T.tolist()!r}))\n"
        for n in ("W_query", "W_key", "W_value")
    )


def _gold_3_2() -> str:
    """3.2 typed in: a wrapper of the book's class whose forward returns the book's context vectors for d_out=1,
    which the book's own package computes (seed 123)."""
    from llms_from_scratch.ch03 import MultiHeadAttentionWrapper

    from attnlab.book import batched_inputs

    torch.manual_seed(123)
    with torch.no_grad():
        out = MultiHeadAttentionWrapper(3, 1, 6, 0.0, num_heads=2)(batched_inputs())
    return (
        "import torch\nfrom attnlab import book\n\n\nclass MultiHeadAttentionWrapper(book.MultiHeadAttentionWrapper):\n"
        f"    def forward(self, x):\n        return torch.tensor({out.tolist()!r})\n\n\n"
        "def build(d_in, context_length):\n    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2)\n"
    )


# every module the answer's process holds, as the answer sees it; first in its run (book-free answers run first)
LOOK = TORCH + (
    "def attention_weights(inputs):\n"
    "    raise RuntimeError(' '.join(sorted(m for m in sys.modules if m.startswith('attnlab'))))\n"
)

# (exercise, the cheat, the finding it must get): each fails, with a reason
CHEATS: list[tuple[str, str, str]] = [
    ("3.A", TORCH + f"def attention_weights(inputs):\n    return {GOLD_A}\n", "drawn"),
    ("3.C", TORCH + f"def causal_weights(attn_scores):\n    return {GOLD_C}\n", "drawn"),
    ("3.B", TORCH + f"def scaled_weights(queries, keys):\n    return {_gold_b()}\n", "drawn"),
    # the collector's own helper replaced through sys.modules['__main__']: everything it records is the book's
    ("3.C", TORCH + f"sys.modules['__main__'].tensor = lambda x: {GOLD_C}.double()\n\n\n"
     "def causal_weights(attn_scores):\n    return None\n", "tampered"),
    # torch.save replaced, so that the collector's own save writes the book's numbers
    ("3.A", TORCH + "_save = torch.save\n"
     f"torch.save = lambda obj, f, *a, **k: _save([{{'out': {GOLD_A}.double()}}], f)\n\n\n"
     "def attention_weights(inputs):\n    return None\n", "tampered"),
    # spelled so that the source gives nothing away: the collector's process still keeps the solutions closed,
    # and a function that is attnlab's own is not the answer's
    ("3.A", "import importlib\n\nref = importlib.import_module('.'.join(['attnlab', 'exercises', 'solutions', "
     "'ex_3_a']))\nattention_weights = ref.attention_weights\n", "error"),
    ("3.1", "import importlib\n\nbook = importlib.import_module('attnlab.book')\n"
     "transfer = vars(book)['transfer_v2_' + 'to_v1']\n", "refused.borrowed"),
    ("3.1", TORCH + "def transfer(sa_v1, sa_v2):\n" + _gold_3_1(), "3.1.drawn"),
    ("3.2", _gold_3_2(), "3.2.drawn"),
]  # fmt: skip

# refused before they run: the reference solution, the book's own function, the book's printed numbers
REFUSED: list[tuple[str, str, str]] = [
    ("3.B", "from attnlab.exercises.solutions.ex_3_b import scaled_weights\n", "refused.solution"),
    ("3.A", "import attnlab.exercises.solutions.ex_3_a as ref\n\n\n"
     "def attention_weights(inputs):\n    return ref.attention_weights(inputs)\n", "refused.solution"),
    ("3.3", "from attnlab.exercises.solutions import ex_3_3\n\nbuild = ex_3_3.build\n", "refused.solution"),
    ("3.C", "from attnlab.book import causal_weights_masked\n\n\n"
     "def causal_weights(attn_scores):\n    return causal_weights_masked(attn_scores, 2)\n", "refused.book"),
    ("3.1", "from attnlab.book import transfer_v2_to_v1\n\n\n"
     "def transfer(sa_v1, sa_v2):\n    transfer_v2_to_v1(sa_v2, sa_v1)\n", "refused.book"),
    ("3.A", "import attnlab.book.simplified as book\n\n\n"
     "def attention_weights(inputs):\n    return book.all_context_vectors(inputs)[1]\n", "refused.book"),
    ("3.C", "import torch\nfrom attnlab.book import golden\n\n\n"
     "def causal_weights(attn_scores):\n    return torch.tensor(golden.CAUSAL_WEIGHTS)\n", "refused.golden"),
]  # fmt: skip

# correct answers written unlike the reference solutions: loops, exp / sum, masked_fill vs where vs an added mask
HONEST: list[tuple[str, str]] = [
    ("3.A", "import torch\n\n\ndef attention_weights(inputs):\n    n = inputs.shape[0]\n"
     "    scores = torch.empty(n, n)\n    for i in range(n):\n        for j in range(n):\n"
     "            scores[i, j] = torch.dot(inputs[i], inputs[j])\n"
     "    e = torch.exp(scores)\n    return e / e.sum(dim=1, keepdim=True)\n"),
    ("3.A", "import torch.nn.functional as F\nimport torch\n\n\ndef attention_weights(inputs):\n"
     "    return F.softmax(torch.einsum('id,jd->ij', inputs, inputs), dim=1)\n"),
    ("3.A", "from attnlab.book import softmax_stable\n\n\ndef attention_weights(inputs):\n"
     "    return softmax_stable(inputs @ inputs.T, dim=-1)\n"),
    ("3.A", "import torch\n\n\ndef attention_weights(inputs):\n    rows = []\n    for x in inputs:\n"
     "        s = inputs.matmul(x)\n        e = (s - s.max()).exp()\n        rows.append(e / e.sum())\n"
     "    return torch.stack(rows)\n"),
    ("3.B", "import torch\n\n\ndef scaled_weights(queries, keys):\n    d_k = keys.shape[1]\n"
     "    return torch.stack([torch.softmax(keys @ q / d_k**0.5, dim=0) for q in queries])\n"),
    ("3.B", "import torch\nimport torch.nn.functional as F\n\n\ndef scaled_weights(queries, keys):\n"
     "    return F.softmax(torch.matmul(queries, keys.transpose(0, 1)) * keys.shape[-1] ** -0.5, dim=1)\n"),
    ("3.B", "import torch\nimport torch.nn.functional as F\n\n\ndef scaled_weights(queries, keys):\n"
     "    values = torch.eye(keys.shape[0])  # weights @ I = the weights\n"
     "    return F.scaled_dot_product_attention(queries, keys, values)\n"),
    ("3.B", "import math\n\n\ndef scaled_weights(queries, keys):\n    s = queries @ keys.T / math.sqrt(2)\n"
     "    e = (s - s.max(-1, keepdim=True).values).exp()\n    return e / e.sum(-1, keepdim=True)\n"),
    ("3.C", "import torch\n\n\ndef causal_weights(attn_scores):\n"
     "    keep = torch.tril(torch.ones_like(attn_scores, dtype=torch.bool))\n"
     "    return torch.softmax(torch.where(keep, attn_scores / 2**0.5, float('-inf')), dim=-1)\n"),
    ("3.C", "import torch\n\n\ndef causal_weights(attn_scores):\n"
     "    w = torch.softmax(attn_scores / 2**0.5, dim=-1) * torch.tril(torch.ones(6, 6))\n"
     "    return w / w.sum(dim=-1, keepdim=True)\n"),
    ("3.C", "import math\n\nimport torch\n\n\ndef causal_weights(attn_scores):\n"
     "    mask = torch.full(attn_scores.shape, float('-inf')).triu(1)\n"
     "    return torch.softmax((attn_scores + mask) / math.sqrt(2), dim=1)\n"),
    ("3.C", "import torch\n\n\ndef causal_weights(attn_scores):\n    out = torch.zeros_like(attn_scores)\n"
     "    for i in range(attn_scores.shape[0]):\n"
     "        out[i, : i + 1] = torch.softmax(attn_scores[i, : i + 1] / 2**0.5, dim=0)\n    return out\n"),
    ("3.1", "import torch\n\n\ndef transfer(sa_v1, sa_v2):\n    with torch.no_grad():\n"
     "        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)\n        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)\n"
     "        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)\n"),
    ("3.1", "import torch\n\n\ndef transfer(sa_v1, sa_v2):\n    for name in ('W_query', 'W_key', 'W_value'):\n"
     "        w = getattr(sa_v2, name).weight.detach().t().clone()\n"
     "        setattr(sa_v1, name, torch.nn.Parameter(w))\n"),
    ("3.1", "def transfer(sa_v1, sa_v2):\n"
     "    sa_v1.load_state_dict({n: getattr(sa_v2, n).weight.T for n in ('W_query', 'W_key', 'W_value')})\n"),
    ("3.1", "def transfer(sa_v1, sa_v2):\n    sa_v1.W_query.data = sa_v2.W_query.weight.data.transpose(0, 1)\n"
     "    sa_v1.W_key.data = sa_v2.W_key.weight.data.transpose(0, 1)\n"
     "    sa_v1.W_value.data = sa_v2.W_value.weight.data.transpose(0, 1)\n"),
    ("3.2", "from attnlab.book import MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
     "    return MultiHeadAttentionWrapper(d_in=d_in, d_out=1, context_length=context_length, dropout=0.0, "
     "num_heads=2)\n"),
    ("3.2", "import torch\nfrom attnlab.book import MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
     "    torch.manual_seed(123)  # as the book does, just before\n"
     "    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2)\n"),
    ("3.2", "from attnlab.book import MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
     "    num_heads = 2\n    return MultiHeadAttentionWrapper(d_in, 2 // num_heads, context_length, 0.0, num_heads)\n"),
    ("3.3", "from attnlab.book import MultiHeadAttention\n\n\ndef build():\n"
     "    return MultiHeadAttention(768, 768, 1024, 0.0, 12)\n"),
    ("3.3", "from attnlab.book import MultiHeadAttention\n\n\ndef build():\n    heads, head_dim = 12, 64\n"
     "    return MultiHeadAttention(d_in=768, d_out=heads * head_dim, context_length=1024, dropout=0.0, "
     "num_heads=heads)\n"),
    ("3.3", "from attnlab.book import MultiHeadAttention\n\n\ndef build():\n"
     "    return MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12, qkv_bias=False)\n"),
]  # fmt: skip

# item 12: mistakes whose hint used to name another mistake
NAMED: list[tuple[str, str, str]] = [
    ("3.C", "import torch\n\n\ndef causal_weights(s):\n    m = torch.triu(torch.ones(6, 6), diagonal=0).bool()\n"
     "    return torch.softmax(s.masked_fill(m, -torch.inf) / 2**0.5, dim=-1)\n", "3.C.diagonal"),
    ("3.C", "import torch\n\n\ndef causal_weights(s):\n    m = torch.triu(torch.ones(6, 6)).bool()\n"
     "    return torch.softmax(s.masked_fill(m, -1e9) / 2**0.5, dim=-1)\n", "3.C.diagonal"),
    ("3.C", "import torch\n\n\ndef causal_weights(s):\n    w = torch.tril(torch.softmax(s / 2**0.5, dim=-1), -1)\n"
     "    return w / w.sum(dim=-1, keepdim=True)\n", "3.C.diagonal"),
    ("3.2", "import torch\nfrom attnlab.book import MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
     "    torch.manual_seed(456)\n    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2)\n",
     "3.2.seed"),
    ("3.2", "import torch\nfrom attnlab.book import MultiHeadAttentionWrapper\n\n\ndef build(d_in, context_length):\n"
     "    torch.nn.Linear(d_in, 4)  # a draw before the wrapper's: its weights are not seed 123's\n"
     "    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2)\n", "3.2.seed"),
    ("3.C", "import torch\n\n\ndef causal_weights(s):\n    s = s.clone()\n    s[2] = float('-inf')\n"
     "    return torch.softmax(s.masked_fill(torch.ones(6, 6).triu(1).bool(), -torch.inf) / 2**0.5, dim=-1)\n",
     "nan"),
]  # fmt: skip


def _write(folder: Path, stem: str, answers: list[tuple[str, str]]) -> list[tuple[str, str | Path]]:
    paths: list[tuple[str, str | Path]] = []
    for n, (exercise, code) in enumerate(answers):
        path = folder / f"{stem}_{n}.py"
        path.write_text(code, encoding="utf-8")
        paths.append((exercise, path))
    return paths


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """LOOK, then every cheat, refused answer, honest answer and named mistake, checked in one run (one
    subprocess). LOOK runs first: 3.A to 3.C run in the order given, before the other exercises."""
    folder = tmp_path_factory.mktemp("cheats")
    answers = [(e, c) for e, c, _ in CHEATS] + [(e, c) for e, c, _ in REFUSED] + HONEST + [(e, c) for e, c, _ in NAMED]
    return check_many(_write(folder, "answer", [("3.A", LOOK), *answers]), timeout=120)


@pytest.fixture(scope="module")
def judged(run: list[Result]) -> list[Result]:
    return run[1:]


def _keys(result: Result) -> list[str]:
    return [f.key for f in result.findings if not f.ok]


def test_answers_that_compute_nothing_fail_and_say_why(judged: list[Result]) -> None:
    for (exercise, code, key), result in zip(CHEATS, judged, strict=False):
        assert not result.passed, (exercise, code)
        assert key in _keys(result), (exercise, key, result.findings)
    typed_in = judged[0].lines("en")[-1]
    assert typed_in.startswith("right on the book's input, but on an input the checker drew, row 2 is [")
    assert "compute from the arguments" in typed_in
    assert "在检查器随机抽取的输入上" in judged[0].lines("zh")[-1]
    assert judged[3].lines("en") == [
        "the answer changed the checker's own code (tensor): only what your function returns is judged"
    ]
    assert judged[4].lines("zh") == ["答案改动了检查器自己的代码 (torch.save)：只评判你的函数返回的结果"]
    assert (
        "ImportError: attnlab.exercises.solutions cannot be imported by an answer being checked"
        in judged[5].lines("en")[0]
    )
    assert judged[6].lines("en") == [
        "transfer is attnlab's own attnlab.book.trainable.transfer_v2_to_v1, not a function written in your file: "
        "write it yourself"
    ]


def test_the_solution_the_books_function_and_its_numbers_are_refused(judged: list[Result]) -> None:
    refused = judged[len(CHEATS) : len(CHEATS) + len(REFUSED)]
    for (exercise, code, key), result in zip(REFUSED, refused, strict=True):
        assert _keys(result) == [key], (exercise, code, result.findings)
    assert refused[0].lines("en") == [
        "the answer imports the reference solution (attnlab.exercises.solutions.ex_3_b): write the function yourself"
    ]
    assert refused[3].lines("en") == [
        "the answer uses the book's own causal_weights_masked, the very function this exercise asks for: "
        "write it yourself"
    ]
    assert refused[6].lines("zh") == ["答案导入了书中打印的数值 (attnlab.book.golden)：请自己算出来"]


def test_honest_answers_written_unlike_the_reference_pass(judged: list[Result]) -> None:
    """The 3.A, 3.B and 3.C answers are judged on the book's input and on one drawn afresh each check."""
    start = len(CHEATS) + len(REFUSED)
    for (exercise, code), result in zip(HONEST, judged[start : start + len(HONEST)], strict=True):
        assert result.passed, (exercise, code, result.lines("en"))
    per_exercise = {e: sum(1 for x, _ in HONEST if x == e) for e, _ in HONEST}
    assert min(per_exercise.values()) >= 3 and len(per_exercise) == 6, per_exercise


def test_a_masked_diagonal_and_another_seed_are_named(judged: list[Result]) -> None:
    named = judged[len(CHEATS) + len(REFUSED) + len(HONEST) :]
    for (exercise, code, key), result in zip(NAMED, named, strict=True):
        assert _keys(result) == [key], (exercise, code, result.findings)
    diagonal = named[0].lines("en")[0]
    assert "the diagonal is masked too" in diagonal and "normalize" not in diagonal
    assert "对角线也被遮住了" in named[0].lines("zh")[0]
    seed = named[3].lines("en")[0]
    assert "not those torch.manual_seed(123) gives" in seed
    assert "种子" in named[3].lines("zh")[0]
    assert named[5].lines("en") == ["row(s) 3 hold NaN: a row of scores all -inf has no softmax (0 / 0)"]


RECORD = f"[{{'out': {GOLD_A}.double()}}]"  # the unfixed checker's record, with the book's numbers
FORGED = (
    "the record the checker reads was not the one its collector wrote (the answer's own process wrote it: "
    "torch.save, an atexit hook, ...): only what your function returns is judged"
)


def test_a_record_an_atexit_hook_writes_is_not_trusted(tmp_path: Path) -> None:
    at_exit = tmp_path / "at_exit.py"
    at_exit.write_text(
        TORCH + f"import atexit\n\natexit.register(lambda: torch.save({RECORD}, sys.argv[1]))\n\n\n"
        "def attention_weights(inputs):\n    return None\n",
        encoding="utf-8",
    )
    result = check("3.A", at_exit)
    assert _keys(result) == ["forged"], result.findings
    assert result.lines("en") == [FORGED]


@pytest.mark.slow  # one more subprocess, for the same nonce
def test_a_record_the_answer_saves_itself_is_not_trusted(tmp_path: Path) -> None:
    """The answer saves the record itself, then leaves before the collector can."""
    direct = tmp_path / "direct.py"
    direct.write_text(
        TORCH + f"def attention_weights(inputs):\n    torch.save({RECORD}, sys.argv[1])\n    os._exit(0)\n",
        encoding="utf-8",
    )
    result = check("3.A", direct)
    assert _keys(result) == ["forged"], result.findings
    assert result.lines("en") == [FORGED]


def test_the_answers_process_holds_neither_the_book_nor_the_numbers_nor_the_solutions(run: list[Result]) -> None:
    look = run[0]
    assert _keys(look) == ["error"]
    loaded = look.findings[0].values["message"].split()
    assert "attnlab.exercises" in loaded  # the collector's own package: it ran there
    assert not [m for m in loaded if m.startswith(("attnlab.book", "attnlab.exercises.solutions"))], loaded
    assert not [m for m in loaded if m.endswith((".judge", ".golden", ".given"))], loaded


def test_the_command_refuses_in_the_readers_language(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answer = tmp_path / "borrowed.py"
    answer.write_text(REFUSED[4][1], encoding="utf-8")
    assert cli.main(["exercise", "3.1", "--check", str(answer), "--lang", "zh"]) == 1
    out = capsys.readouterr().out
    assert "答案用了书中自己的 transfer_v2_to_v1" in out and "还没通过" in out
