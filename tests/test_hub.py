"""Hub names (issue 58): a model named as on the Hugging Face Hub is read from huggingface_hub's own cache.

Nothing here reaches a hub: each test lays out a cache folder in huggingface_hub's layout (``models--ORG--NAME``,
``refs/<revision>`` holding a commit, ``snapshots/<commit>/`` the files) and points ``HF_HUB_CACHE`` at it, with
``HF_HUB_OFFLINE=1`` (conftest sets it for the whole suite). The oracle is the model saved there: the one read back
gives its logits exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.models import GPT, GPTConfig
from attnlab.models.hub import hub_name

ORG = "attnlab-test"


def tiny(seed: int) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=256, context_length=32, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0)
    return GPT(config).eval()


def put(cache: Path, name: str, model: GPT | None, *, revision: str = "main", commit: str = "a" * 40) -> Path:
    """``model`` saved into the cache as repository ``ORG/name`` at ``revision`` (None: a pickle alone)."""
    repo = cache / f"models--{ORG}--{name}"
    snapshot = repo / "snapshots" / commit
    if model is None:
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text('{"model_type": "gpt2"}')
        (snapshot / "pytorch_model.bin").write_bytes(b"a pickle")
    else:
        model.save_pretrained(snapshot, tokenizer="bytes")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


IDS = torch.tensor([[1, 2, 3, 4]])


def test_a_hub_name_is_read_from_the_cache_at_its_revision(cache: Path) -> None:
    main, tagged = tiny(0), tiny(1)
    put(cache, "tiny", main)
    put(cache, "tiny", tagged, revision="v1", commit="b" * 40)
    with torch.no_grad():
        assert torch.equal(GPT.from_pretrained(f"{ORG}/tiny")(IDS), main(IDS))
        assert torch.equal(GPT.from_pretrained(f"{ORG}/tiny", revision="v1")(IDS), tagged(IDS))
        assert torch.equal(GPT.from_pretrained(f"{ORG}/tiny@v1")(IDS), tagged(IDS))
    with pytest.raises(ValueError, match=r"names revision 'v1' and revision='main' another: give one"):
        GPT.from_pretrained(f"{ORG}/tiny@v1", revision="main")


def test_a_local_folder_of_that_name_comes_first(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put(cache, "tiny", tiny(0))
    local = tiny(2)
    local.save_pretrained(tmp_path / ORG / "tiny")
    monkeypatch.chdir(tmp_path)
    with torch.no_grad():
        assert torch.equal(GPT.from_pretrained(f"{ORG}/tiny")(IDS), local(IDS))


def test_what_cannot_be_had_is_refused_in_one_line_naming_the_fix(cache: Path) -> None:
    put(cache, "pickled", None)
    with pytest.raises(
        ValueError, match=rf"'{ORG}/missing' is not in the Hugging Face cache while HF_HUB_OFFLINE is set: "
    ):
        GPT.from_pretrained(f"{ORG}/missing")
    with pytest.raises(ValueError, match=rf"\(`hf download {ORG}/missing --revision v9`\), or give a local folder"):
        GPT.from_pretrained(f"{ORG}/missing", revision="v9")
    with pytest.raises(
        ValueError, match=r"has no safetensors weights \(only pickles, which attnlab does not load from"
    ):
        GPT.from_pretrained(f"{ORG}/pickled")


def test_paths_are_not_taken_for_hub_names() -> None:
    assert hub_name("Qwen/Qwen3-0.6B") and hub_name("gpt2") and hub_name("gpt2@main")
    for path in ("/abs/model", "./model", "~/model", "a/b/c", "model.pth", "dir/model.safetensors", "a\\b", ""):
        assert not hub_name(path), path


def test_the_command_line_takes_a_hub_name_and_says_where_it_came_from(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = put(cache, "tiny", tiny(0))
    assert cli.main(["generate", "--model", f"{ORG}/tiny", "--max-new-tokens", "3", "hi"]) == 0
    err = capsys.readouterr().err
    assert f"model: {ORG}/tiny from the Hugging Face Hub's cache ({folder})" in err
    assert cli.main(["generate", "--model", f"{ORG}/nothing", "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"--model no folder or file '{ORG}/nothing' here, and '{ORG}/nothing' is not in the Hugging Face cache" in err
    )
