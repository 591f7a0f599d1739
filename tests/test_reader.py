"""The reader's experience: Chinese and emoji that render, explain's words that are true, a CLI that never throws."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab import cli
from attnlab.explain import report as report_module
from attnlab.explain.render import fonts
from attnlab.explain.render.figure_output import png_bytes
from attnlab.explain.render.heatmap import heatmap
from attnlab.explain.report import explain_report, tour_report, word_vector

ATTNLAB = Path(sys.executable).with_name("attnlab")  # the console script pip installed


def _need_cjk() -> None:
    if not fonts.has_cjk():
        message = "no CJK font on this machine (make setup installs fonts-wqy-zenhei with apt-get; it needs root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _glyph(text: str) -> np.ndarray:
    """The pixels of one string drawn alone with the heatmaps' fonts."""
    with fonts.fonts():
        fig = Figure(figsize=(0.6, 0.6), dpi=60)
        canvas = FigureCanvasAgg(fig)
        fig.text(0.1, 0.2, text, fontsize=24)  # raw: a missing glyph would warn, and the warning fails the test
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., 0].copy()


@pytest.mark.slow  # slow by nature: the whole Chinese tour drawn with its fonts found afresh
def test_a_stale_font_cache_still_draws_chinese_without_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib's cache built before the CJK font was installed: attnlab finds the font by file."""
    _need_cjk()
    stale = [f for f in font_manager.fontManager.ttflist if "WenQuanYi" not in f.name and "Symbola" not in f.name]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", stale)
    fonts.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would raise here
            report = tour_report("zh")
            png_bytes(heatmap(torch.rand(3, 3), ["注意力", "权重", "😀"], title="注意力权重", axes=("键", "查询")))
        assert any("WenQuanYi" in name for name in fonts.font_family())
        assert sum(len(s.figures) for s in report.sections) >= 8
        # Drawn glyphs, not boxes: a missing glyph is the same empty box for every character.
        drawn = [_glyph(ch) for ch in "注意力"]
        assert all(g.min() < 128 for g in drawn)  # ink on the page
        assert not np.array_equal(drawn[0], drawn[1]) and not np.array_equal(drawn[1], drawn[2])
    finally:
        monkeypatch.undo()
        fonts.reset()


def test_a_glyph_no_font_has_is_written_as_its_name() -> None:
    missing = next(chr(c) for c in range(0x1FA70, 0x1FB00) if not fonts.drawable(chr(c)) == chr(c))
    name = unicodedata.name(missing, f"U+{ord(missing):04X}")
    assert fonts.drawable(f"a{missing}b") == f"a[{name}]b"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png_bytes(heatmap(torch.rand(2, 2), ["x", missing], title=missing))


def test_the_same_word_gets_the_same_vector_in_every_sentence() -> None:
    cat = word_vector("cat", seed=123, d_model=16)
    torch.testing.assert_close(cat, word_vector("cat", seed=123, d_model=16))
    vectors = [word_vector(w, seed=123, d_model=16) for w in ("The", "the", "你好", "😀", "cat")]
    assert all(not torch.equal(a, b) for i, a in enumerate(vectors) for b in vectors[i + 1 :])
    assert not torch.equal(cat, word_vector("cat", seed=124, d_model=16))
    one = explain_report("the cat sat", figures=False).sections[0].value or ""
    two = explain_report("a big cat", figures=False).sections[0].value or ""
    assert [line.split("[")[1] for line in one.splitlines() if "'cat'" in line] == [
        line.split("[")[1] for line in two.splitlines() if "'cat'" in line
    ]


def test_context_vectors_are_drawn_against_feature_dimensions(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    real = report_module.heatmap

    def spy(*args: object, **kwargs: object) -> Figure:
        seen.append(kwargs["axes"])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(report_module, "heatmap", spy)
    explain_report("a b c", heads=1, lang="zh")
    assert ("特征维度 (头.维度)", "Token") in seen and ("键 (keys)", "查询 (queries)") in seen
    assert all("keys" not in x or "queries" in y for x, y in seen)


def test_explain_without_a_report_takes_more_than_64_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab import cli

    sentence = " ".join(f"w{i}" for i in range(80))
    assert cli.main(["explain", sentence, "--no-causal"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^79  \[.*\]  'w79'$", shown, flags=re.MULTILINE) and "'w0'" in shown  # all 80, the last too
    assert cli.main(["explain", sentence, "--html", "x.html"]) == 2
    assert "the sentence has 80 tokens; the HTML report's heatmaps show at most 64" in capsys.readouterr().err


SLIPS = [
    (["explain", "hi", "--html", "/no/such/folder/r.html"], "the folder '/no/such/folder' does not exist"),
    (["explain", "hi", "--html", "{tmp}"], "should end in .html or .htm"),
    (["explain", "hi", "--html", "{tmp}/folder.html"], "is a folder; give a file name"),
    (["tour", "--html", "/proc/r.html"], "cannot write '/proc/r.html'"),
    (["explain", "hi", "--heads", "0"], "heads must be >= 1, got 0"),
    (["explain", "hi", "--d-model", "0"], "d_model must be >= 1, got 0"),
    (["explain", "hi", "--d-model", "-3"], "d_model must be >= 1, got -3"),
    (["explain", "hi", "--d-model", "999999999"], "d_model must be <= 4096, got 999999999"),
    (["explain", "hi", "--seed", str(2**64)], "seed must be in [0, 2**63 - 1]"),
    (["bench", "--plot", "out.txt"], "'out.txt' should end in .png or .svg or .pdf"),
    (["bench", "--batch", "0"], "batch must be >= 1, got 0"),
    (["bench", "--impls", "nope"], "unknown implementations ['nope']; known: ['book-wrapper'"),
    (["bench", "--longest", "--plot", "p.png"], "--plot draws the sweep against T"),
    (["bench", "--model", "gpt9"], "--model takes a preset, one of ['gpt2-small'"),
    (["bench", "--model", "--new-tokens", "2000"], "exceeds the context of 1024"),
    (["generate", "--model", "/no/such/model", "hi"], "--model '/no/such/model' does not exist"),
    (["generate", "--model", "{tmp}", "hi", "--top-k", "0"], "--top-k must be >= 1, got 0"),
]  # the slips of train and heads, in process: tests/test_train.py


# The first slip of each command goes through the installed console script (a process each, seconds each);
# every slip, those too, goes through the same main() in process.


@pytest.mark.slow  # slow by nature: a console-script process per slip
def test_every_slip_gets_one_line_and_status_2_from_the_console_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "folder.html").mkdir()
    monkeypatch.chdir(tmp_path)
    fill = lambda argv: [a.replace("{tmp}", str(tmp_path)) for a in argv]
    firsts = {}
    for argv, message in SLIPS:
        firsts.setdefault(argv[0], (argv, message))

    def attempt(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ATTNLAB), *fill(argv)], capture_output=True, text=True, cwd=tmp_path, timeout=120)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(attempt, [argv for argv, _ in firsts.values()]))
    for (argv, message), proc in zip(firsts.values(), results, strict=True):
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert proc.stdout == "", (argv, proc.stdout)  # nothing ran, nothing printed
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (argv, proc.stderr)
        assert message in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
    for argv, message in SLIPS:
        assert cli.main(fill(argv)) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, out, err)
        assert message in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.html"]  # nothing written


@pytest.mark.slow  # slow by nature: a console-script process per subcommand
def test_the_command_alone_helps_and_every_subcommand_says_what_it_does() -> None:
    def attempt(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ATTNLAB), *argv], capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=3) as pool:  # the three processes at once: each waits on its start-up alone
        alone, version, bench = list(pool.map(attempt, [[], ["--version"], ["bench", "--help"]]))
    assert alone.returncode == 0 and "usage: attnlab" in alone.stdout
    for name in ("tour", "explain", "bench"):
        assert f"    {name} " in alone.stdout  # listed with its one-line description
    assert version.returncode == 0 and version.stdout.startswith("attnlab 0.")
    assert "Time and measure every attention implementation" in bench.stdout
    assert "attnlab-flash" in bench.stdout and "book-wrapper" in bench.stdout  # --impls lists the names


def test_wide_characters_shift_no_column_of_the_token_table(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.cells import cell_len

    from attnlab import cli

    assert cli.main(["explain", "你好 世界 attention is 全部"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^ ?\d  \[", line)]
    assert len(rows) == 5
    assert len({cell_len(row[: row.index("]")]) for row in rows}) == 1  # the vectors end in one column
