"""The poems task (issue 35, part 4): characters as tokens, the corpus read from the chinese-poetry package's
tarball (made here, small: nothing is fetched), converted to simplified characters, whole poems held out
(静夜思 always), and the run end to end from the command line."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.models import GPT, load_tokenizer
from attnlab.models.poems import HELD_OUT_LINE, Poem, PoemsTask, fetch_corpus, held_out, read_poems
from attnlab.models.tokenizer import MISSING, CharTokenizer

JING_YE_SI = {
    "title": "靜夜思",
    "author": "李白",
    "paragraphs": ["牀前看月光，疑是地上霜。", "舉頭望山月，低頭思故鄉。"],
}
POEM_TEXT = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
LINES = ["春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。", "白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓。"]


def records(n: int = 120) -> list[dict[str, object]]:
    """n poems in traditional characters, built from four lines, and 静夜思."""
    poems = [{"title": f"詩{i}", "author": "某", "paragraphs": [LINES[i % 4], LINES[(i + 1) % 4]]} for i in range(n)]
    return [*poems, JING_YE_SI]


def tarball(path: Path, poems: list[dict[str, object]]) -> Path:
    """A tarball laid out as the npm package is: package/dist/quantangshi/poet.tang.N.json."""
    with tarfile.open(path, "w:gz") as tar:
        for n, start in enumerate(range(0, len(poems), 50)):
            data = json.dumps(poems[start : start + 50], ensure_ascii=False).encode()
            info = tarfile.TarInfo(f"package/dist/quantangshi/poet.tang.{n * 1000}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("package/LICENSE")
        tar.addfile(info, io.BytesIO(b""))
    return path


def test_a_character_vocabulary_reads_each_character_as_one_token(tmp_path: Path) -> None:
    chars = CharTokenizer(list("床前明月光，。\n"))
    assert chars.vocab_size == 9 and chars.encode("明月") == [3, 4] and chars.decode([3, 4]) == "明月"
    assert chars.encode("明镜") == [3, 0] and chars.decode([0]) == MISSING  # outside the vocabulary: □, id 0
    assert chars.tokens("明镜") == ["明", "镜?"]
    (tmp_path / "chars.json").write_text(chars.to_json(), encoding="utf-8")
    again = CharTokenizer.from_file(tmp_path / "chars.json")
    assert again.chars == chars.chars
    with pytest.raises(ValueError, match=r"distinct single characters, '□' aside .*\['明'\]"):
        CharTokenizer(["明", "明"])
    with pytest.raises(ValueError, match="is missing: a checkpoint that reads characters keeps its vocabulary there"):
        CharTokenizer.from_file(tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"character ids lie in \[0, 9\), got \[9\]"):
        chars.decode([9])


def test_the_tarball_is_read_in_simplified_characters_and_jing_ye_si_is_held_out(tmp_path: Path) -> None:
    poems = read_poems(tarball(tmp_path / "chinese-poetry.tgz", records()))
    assert len(poems) == 121
    quiet = next(p for p in poems if p.author == "李白")
    assert quiet.title == "静夜思" and quiet.text == "床前看月光，疑是地上霜。举头望山月，低头思故乡。"  # OpenCC t2s
    assert held_out(quiet) and HELD_OUT_LINE in quiet.text
    assert read_poems(tmp_path / "chinese-poetry.tgz") == poems  # the same every time
    (tmp_path / "poems.json").write_text(json.dumps(records(), ensure_ascii=False), encoding="utf-8")
    assert read_poems(tmp_path / "poems.json") == poems  # a JSON file of the same records
    task = PoemsTask(poems, seq_len=16)
    assert quiet in task.held_out
    assert "霜" not in task.tokenizer.index  # only in the held-out poem: the vocabulary never saw it
    inputs, targets = task.batch(4, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (4, 16) and torch.equal(inputs[:, 1:], targets[:, :-1])
    trained = task.tokenizer.decode(task.splits["train"].tolist())
    assert HELD_OUT_LINE not in trained and "疑是" not in trained


def test_a_character_outside_the_vocabulary_is_read_but_never_a_target() -> None:
    """□ (id 0) stands for any character outside the vocabulary: a window may hold it, its target never does (the
    loss skips -100), so the model never learns to write □ where it is unsure."""
    rare = Poem("独", "某", "龘春眠不晓，处处闻啼鸟。")  # seen in one poem only: outside the vocabulary
    poems = [Poem(f"诗{i}", "某", "春眠不觉晓，处处闻啼鸟。") for i in range(60)] + [
        rare,
        Poem("静夜思", "李白", POEM_TEXT),
    ]
    task = PoemsTask(poems, seq_len=16)
    assert "龘" not in task.tokenizer.index and 0 in task.splits["train"].tolist()
    inputs, targets = task.batch(2000, torch.Generator().manual_seed(0))
    assert bool((inputs == 0).any()) and not bool((targets == 0).any()) and bool((targets == -100).any())
    kept = targets[:, :-1] != -100  # every other target is the next input
    assert torch.equal(targets[:, :-1][kept], inputs[:, 1:][kept])
    assert bool((inputs[:, 1:][~kept] == 0).all())  # and a skipped one is exactly where □ came next


def test_bad_corpora_are_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="is not a file; give the chinese-poetry tarball or a JSON file of poems"):
        read_poems(tmp_path / "none.tgz")
    empty = tmp_path / "other.tgz"
    with tarfile.open(empty, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("package/README.md"), io.BytesIO(b""))
    with pytest.raises(ValueError, match=r"holds no package/dist/quantangshi/poet.tang.\*.json: not chinese-poetry"):
        read_poems(empty)
    (tmp_path / "x.json").write_text('{"a": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not a list of poems"):
        read_poems(tmp_path / "x.json")
    (tmp_path / "attnlab").mkdir()
    (tmp_path / "attnlab" / "chinese-poetry-2.0.1.tgz").write_bytes(b"not the package")
    with pytest.raises(ValueError, match=r"has sha256 [0-9a-f]{64}, not chinese-poetry@2.0.1's 25b549e4"):
        fetch_corpus(tmp_path / "attnlab")  # a file in the cache that is not the pinned tarball: never trusted
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match=r"fetches its corpus with npm .* install npm, or pass --data"):
        fetch_corpus(tmp_path / "empty")


def test_train_poems_from_the_command_line_saves_its_vocabulary_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tarball(tmp_path / "chinese-poetry.tgz", records())
    out = tmp_path / "run"
    common = ["--data", str(data), "--out", str(out), "--context", "16", "--emb-dim", "32", "--layers", "1"]
    assert cli.main(["train", "poems", *common, "--steps", "3", "--eval-every", "3"]) == 0
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["tokenizer"] == "chars" and (out / "chars.json").is_file()
    chars = load_tokenizer(out)
    assert isinstance(chars, CharTokenizer) and GPT.from_pretrained(out).config.vocab_size == chars.vocab_size
    assert chars.tokens("春眠") == ["春", "眠"]
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "5"]) == 0
    assert json.loads((out / "train_log.json").read_text(encoding="utf-8"))["step"][-1] == 5
    capsys.readouterr()
    assert cli.main(["explain", "--model", str(out), "春眠不觉晓，霜"]) == 0
    assert "on 7 tokens" in capsys.readouterr().out  # one a character
    from attnlab.explain.model_view import model_weights

    labels, weights = model_weights(GPT.from_pretrained(out), chars, "春眠不觉晓，霜")
    assert labels == ["春", "眠", "不", "觉", "晓", "，", "霜?"] and weights.shape[-1] == 7


def test_the_poem_records_are_poems() -> None:
    poem = Poem("静夜思", "李白", "床前明月光，疑是地上霜。")
    assert held_out(poem)
