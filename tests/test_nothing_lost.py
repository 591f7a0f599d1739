"""Nothing a user made is lost, nothing is silently wrong (issue 21): interrupts, atomic saves, resume that
refuses what contradicts its state, and files whose tensors are the truth."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.models import GPT, GPTConfig
from attnlab.models import checkpoints as ckpt
from attnlab.models.tasks import InductionTask, make_task
from attnlab.models.train import STATE_FILE, TrainConfig, read_log, train

TINY = GPTConfig(vocab_size=128, context_length=32, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


def _interrupt_at(step: int):  # type: ignore[no-untyped-def]
    """A progress callback that sends this process a Ctrl-C (SIGINT) when ``step`` has been taken."""

    def progress(done: int, steps: int, loss: float, speed: float) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGINT)

    return progress


def test_ctrl_c_saves_a_whole_step_and_the_resumed_run_ends_as_one_never_interrupted(tmp_path: Path) -> None:
    task = make_task("induction", seq_len=32)
    config = TrainConfig(steps=12, batch_size=8, eval_every=4)
    whole = tiny_model()
    train(whole, task, config, checkpoint=tmp_path / "whole")
    before = signal.getsignal(signal.SIGINT)  # default_int_handler in a terminal; SIG_IGN under a background job
    cut = tiny_model()
    log = train(cut, task, config, checkpoint=tmp_path / "cut", progress=_interrupt_at(5))
    assert log.interrupted and log.stopped == "interrupted (SIGINT) after 5 of 12 steps"
    assert read_log(tmp_path / "cut").step == [1, 2, 3, 4, 5]  # saved as it stopped
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back, whatever it was
    resumed = GPT.from_pretrained(tmp_path / "cut")
    log = train(resumed, task, config, checkpoint=tmp_path / "cut", resume=True)
    assert not log.interrupted and log.stopped == "" and not read_log(tmp_path / "cut").interrupted  # this run's end
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_a_folder_whose_weights_and_state_disagree_is_refused_on_resume(tmp_path: Path) -> None:
    """Weights from a later save beside the state of an earlier one (a run stopped between two writes)."""
    task = make_task("induction", seq_len=32)
    train(tiny_model(), task, TrainConfig(steps=2, batch_size=8, eval_every=2), checkpoint=tmp_path / "a")
    train(tiny_model(1), task, TrainConfig(steps=3, batch_size=8, eval_every=3), checkpoint=tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").replace(tmp_path / "a" / "model.safetensors")
    with pytest.raises(ValueError, match=r"disagree: model.safetensors is not the one train_state.pt was saved with"):
        train(GPT.from_pretrained(tmp_path / "a"), task, TrainConfig(steps=4), checkpoint=tmp_path / "a", resume=True)


def test_a_save_that_fails_halfway_leaves_the_old_files_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def half_then_fail(tensors: dict, filename: str, metadata: dict) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("no space left on device")

    monkeypatch.setattr(ckpt, "save_file", half_then_fail)
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)
    with pytest.raises(OSError, match="no space left"):
        model.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no partial file, nothing changed


def _run_text(tmp_path: Path, data: Path, steps: int) -> Path:
    out = tmp_path / "run"
    argv = ["train", "text", "--data", str(data), "--out", str(out), "--steps", str(steps)]
    argv += ["--layers", "1", "--emb-dim", "32", "--context", "32", "--batch-size", "4", "--eval-every", str(steps)]
    assert cli.main(argv) == 0
    return out


def test_a_resume_takes_its_task_and_data_from_its_state_and_refuses_what_contradicts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "notes.txt"
    data.write_text("attention is all you need. " * 40)
    out = _run_text(tmp_path, data, 2)
    capsys.readouterr()
    slips = [
        (["train", "induction", "--out", str(out), "--resume", "--steps", "3"], "trains on 'text', not 'induction'"),
        (
            ["train", "text", "--out", str(out), "--resume", "--steps", "3", "--data", str(tmp_path / "x.txt")],
            f"trains on '{data}', not --data",
        ),
    ]
    state = (out / STATE_FILE).read_bytes()
    for argv, message in slips:
        assert cli.main(argv) == 2
        assert message in capsys.readouterr().err
    data.write_text("other text entirely. " * 40)
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 2
    assert "changed since the run" in capsys.readouterr().err
    assert (out / STATE_FILE).read_bytes() == state  # every refusal left the run as it was
    data.write_text("attention is all you need. " * 40)
    assert cli.main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 0  # no task named: the run's own
    assert json.loads((out / "config.json").read_text())["tokenizer"] == "bytes"  # still the text run's
    assert read_log(out).step == [1, 2, 3]


def test_ctrl_c_in_attnlab_train_saves_and_exits_130_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    original = InductionTask.batch

    def batch(self: InductionTask, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C while the third step is being computed
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(InductionTask, "batch", batch)
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--steps", "50", "--layers", "1", "--emb-dim", "32", "--context", "32"]
    assert cli.main([*argv, "--batch-size", "4", "--eval-every", "50"]) == 130
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-1].startswith("interrupted (SIGINT) after 3 of 50 steps; saved to") and "--resume goes on" in said[-1]
    assert read_log(out).step == [1, 2, 3] and (out / STATE_FILE).is_file()
    monkeypatch.undo()  # then the hint, as printed: the resumed run ends as a whole run does, exit 0
    assert cli.main(["train", "--out", str(out), "--resume"]) == 0
    said = capsys.readouterr().out
    assert "50 steps in" in said and "the heads it learned" in said and (out / "loss.png").is_file()
    assert "--resume goes on" not in said


# ---- the file's tensors are the truth; memory is not spent before the file is checked ----


def test_a_bias_trained_in_hugging_face_survives_the_round_trip(tmp_path: Path) -> None:
    """attnlab GPT without q/k/v biases -> GPT2LMHeadModel -> biases changed (as fine-tuning does) -> saved by HF
    (carrying attnlab's config block along) -> GPT.from_pretrained: the trained biases are kept."""
    from transformers import GPT2LMHeadModel

    config = GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.0)
    tiny = GPT(config)
    tiny.save_pretrained(tmp_path / "ours")
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        for block in theirs.transformer.h:
            block.attn.c_attn.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    theirs.save_pretrained(tmp_path / "tuned")
    back = GPT.from_pretrained(tmp_path / "tuned")
    assert back.config.qkv_bias  # corrected from the tensors, not the config block HF carried over
    idx = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(back(idx), theirs(idx).logits, atol=1e-4, rtol=1e-4)


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_config_that_claims_a_huge_model_beside_small_weights_allocates_nothing(tmp_path: Path) -> None:
    GPT(GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1)).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["attnlab"]  # only Hugging Face's sizes, and they are wrong: 64 layers of 4096 (tens of GB)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "n_embd": 4096, "n_layer": 64, "n_head": 32}))
    before = _peak_rss_mib()
    with pytest.raises(ValueError, match=r"config.json says emb_dim=4096 but the tensors hold 32"):
        GPT.from_pretrained(tmp_path)
    assert _peak_rss_mib() - before < 256  # refused from the file's headers, not after allocating the model


def test_tensors_that_are_not_float_weights_are_refused_not_cast(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    GPT(GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1)).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["transformer.ln_f.weight"] = torch.ones(32, dtype=torch.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"transformer.ln_f.weight: dtype torch.int32 is not a float weight"):
        GPT.from_pretrained(tmp_path)


# ---- never a traceback: damaged files and odd flags through the command ----


def _saved(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    GPT(GPTConfig(vocab_size=256, context_length=32, emb_dim=32, n_heads=2, n_layers=1)).save_pretrained(
        where, tokenizer="bytes"
    )
    return where


def _damage(tmp_path: Path) -> list[tuple[list[str], str]]:
    cases: list[tuple[list[str], str]] = []

    def model(name: str) -> Path:
        return _saved(tmp_path / name)

    m = model("list")
    (m / "config.json").write_text("[]")
    cases.append((["heads", "--model", str(m)], "holds a JSON list; expected an object"))
    m = model("novocab")
    raw = json.loads((m / "config.json").read_text())
    del raw["attnlab"], raw["vocab_size"]
    (m / "config.json").write_text(json.dumps(raw))
    cases.append((["heads", "--model", str(m)], "has no 'vocab_size'; a GPT-2 config needs it"))
    m = model("tie")
    raw = json.loads((m / "config.json").read_text())
    del raw["attnlab"]
    (m / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": "false"}))
    cases.append((["heads", "--model", str(m)], "tie_word_embeddings must be true or false, got 'false'"))
    for name, index in (("noweightmap", {}), ("escape", {"weight_map": {"a": "../outside.safetensors"}})):
        m = model(name)
        (m / "model.safetensors").replace(m / "shard.safetensors")
        (m / "model.safetensors.index.json").write_text(json.dumps(index))
        said = "has no weight_map" if not index else "names the shard '../outside.safetensors', outside its folder"
        cases.append((["heads", "--model", str(m)], said))
    pth = tmp_path / "intkey.pth"
    torch.save({1: torch.zeros(2)}, pth)
    cases.append((["heads", "--model", str(pth)], "is not a state dict of named tensors: it holds the key 1"))
    m = model("tokenizer")
    raw = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "tokenizer"}))
    (m / "tokenizer.json").write_text("{not json")
    cases.append((["generate", "--model", str(m), "hi"], "tokenizer.json' cannot be read as a tokenizer"))
    m = model("log")
    (m / "train_log.json").write_text("[1, 2]")
    cases.append((["explain", "hi", "--model", str(m)], "train_log.json' holds a JSON list; expected an object"))
    for name, state in (("truncated", b"PK\x03\x04 truncated"), ("noconfig", None)):
        m = model(name)
        if state is None:
            torch.save({"step": 1, "optimizer": {}, "generator": torch.Generator().get_state()}, m / STATE_FILE)
            said = "is not a complete training state: it lacks ['config']"
        else:
            (m / STATE_FILE).write_bytes(state)
            said = "cannot be read as a training state"
        cases.append((["train", "--out", str(m), "--resume", "--steps", "5"], said))
    return cases


def test_damaged_files_get_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, said in _damage(tmp_path):
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in out + err, (argv, err)
        assert said in err, (argv, err)


def test_a_temperature_that_underflows_float32_is_greedy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab.models.generation import Sampling

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for t in (1e-46, 1e-300):
        assert torch.equal(Sampling(temperature=t).draw(logits), logits.argmax(-1, keepdim=True))
    m = _saved(tmp_path / "m")
    assert cli.main(["generate", "--model", str(m), "ab", "--temperature", "1e-300", "--max-new-tokens", "3"]) == 0
    greedy = capsys.readouterr().out
    assert cli.main(["generate", "--model", str(m), "ab", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out == greedy


def test_argparse_slips_are_one_line_and_a_typo_gets_the_nearest_command(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in (
        (["tuor"], "unknown command 'tuor': did you mean 'tour'?"),
        (["train", "--steps", "x"], "argument --steps: invalid int value: 'x'; see attnlab train --help"),
        (["generate"], "the following arguments are required: prompt, --model"),
        (["train", "bogus"], "argument task: invalid choice: 'bogus'"),
    ):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and said in err, (argv, err)


# ---- heads: scores only on a probe that can tell them apart ----


def test_short_contexts_get_a_probe_that_tells_previous_token_from_induction() -> None:
    from attnlab.explain.heads import default_half, head_scores, scores_from_weights

    for context in range(6, 12):
        model = GPT(GPTConfig(vocab_size=64, context_length=context, emb_dim=16, n_heads=2, n_layers=1))
        n = default_half(model)
        assert 3 <= n and 2 * n <= context
        previous = torch.zeros(1, 1, 2 * n, 2 * n)
        previous[..., 0, 0] = 1
        previous[..., torch.arange(1, 2 * n), torch.arange(0, 2 * n - 1)] = 1  # a pure previous-token head
        scores = scores_from_weights(previous, n)
        assert scores["previous_token"].item() == 1.0 and scores["induction"].item() == 0.0
        head_scores(model)  # runs
    for context in range(1, 6):
        model = GPT(GPTConfig(vocab_size=64, context_length=context, emb_dim=16, n_heads=2, n_layers=1))
        with pytest.raises(ValueError, match=r"need a probe of at least 3 tokens twice .* this model's context is"):
            head_scores(model)


def test_a_context_too_short_to_score_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), "--context", "3", "--steps", "2"]) == 2
    assert "this model's context is 3" in capsys.readouterr().err
    assert not out.exists()  # nothing trained, nothing written


# ---- smaller, each a test ----


def _model(context: int = 16) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, context_length=context, emb_dim=16, n_heads=2, n_layers=1)).eval()


def test_generation_edges() -> None:
    model = _model()
    full = torch.randint(0, 64, (1, 16))
    assert model.generate(full, 1).shape == (1, 17)  # a prompt of exactly context_length: one new token fits
    with pytest.raises(ValueError, match=r"17 positions to run, more than the model's context_length 16"):
        model.generate(full, 2)
    with pytest.raises(ValueError, match=r"eos_id must be a token id, an int >= 0, got -1"):
        model.generate(full[:, :4], 2, eos_id=-1)
    with pytest.raises(ValueError, match=r"eos_id 64 is not a token of this model: its ids are 0..63"):
        model.generate(full[:, :4], 2, eos_id=64)
    right = torch.tensor([[1, 1, 1, 0]])  # right padding: generation appends after the pad
    with pytest.raises(ValueError, match=r"attention_mask must pad on the left"):
        model.generate(full[:, :4], 2, attention_mask=right)
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 1, got 0"):
        model.stream(full[:, :4], 0)  # at the call, not at the first next()


def test_the_shipped_model_continues_the_readmes_prompt_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "the cat sat on the mat. the cat"  # 31 tokens of 64: the default 50 new ones would not fit
    assert cli.main(["generate", "--model", "induction", prompt]) == 0
    assert capsys.readouterr().out.startswith(prompt)


def test_the_streaming_decoder_flushes_a_trailing_partial_character() -> None:
    from attnlab.models.tokenizer import ByteTokenizer, Decoder

    decoder = Decoder(ByteTokenizer())
    shown = "".join(decoder.add(b) for b in "é".encode()[:1])  # the first byte of two
    assert shown == "" and decoder.flush() == "\ufffd"  # held back, then given out at the end, not lost


def test_end_of_text_is_one_token_from_vocab_and_merges_as_from_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from attnlab.models.tokenizer import Tokenizer

    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    bpe.train_from_iterator(["the cat sat on the mat"] * 20, trainer)
    (tmp_path / "files").mkdir()
    bpe.model.save(str(tmp_path / "files"))
    (tmp_path / "json").mkdir()
    bpe.save(str(tmp_path / "json" / "tokenizer.json"))
    text = "the cat<|endoftext|>sat"
    from_files = Tokenizer.from_dir(tmp_path / "files").encode(text)
    assert from_files == Tokenizer.from_dir(tmp_path / "json").encode(text)
    assert from_files.count(bpe.token_to_id("<|endoftext|>")) == 1


def test_bad_sizes_and_positions_are_refused_by_name() -> None:
    from attnlab import Attention
    from attnlab.functional import Visibility

    with pytest.raises(
        ValueError, match=r"q_start must be a position, an int in \[0, 2\*\*40\), got 9223372036854775807"
    ):
        Visibility.from_lengths(2, 4, q_start=2**63 - 1)
    from attnlab.cache import ModelCache

    with pytest.raises(TypeError, match=r"capacity must be an int, got 'x'"):  # checked where a ring does not use it
        ModelCache.build([Attention(d_in=8, num_heads=2, window=4).layer_state()], rows=1, capacity="x")  # type: ignore[arg-type]


def test_flash_refuses_a_double_backward_instead_of_a_silent_none() -> None:
    from attnlab import attention

    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, is_causal=True, backend="flash")
    with pytest.raises(RuntimeError, match=r"the flash backend has no double backward.*use backend='eager'"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_a_nul_from_the_users_text_never_reaches_the_html_raw() -> None:
    from attnlab.explain.render.html import Report, Section

    page = Report(title="a\x00b", intro="c\x01d", lang="en", sections=[Section(key="s", title="t\x00", text="x")])
    text = page.to_html()
    assert "\x00" not in text and "\x01" not in text and "a\ufffdb" in text


def test_a_new_run_refuses_an_out_folder_that_holds_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "loss.png").write_bytes(b"a figure of mine")
    assert cli.main(["train", "--out", str(out), "--steps", "2"]) == 2
    assert "already holds ['loss.png']; give an empty or new --out" in capsys.readouterr().err
    assert (out / "loss.png").read_bytes() == b"a figure of mine"


def test_training_takes_the_free_cores_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.cli.train import free_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 7.0, 7.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    torch.set_num_threads(8)
    try:
        assert free_threads(1) == "8 cores, load 7.5: training on 1 thread per process"
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
        torch.set_num_threads(4)
        assert free_threads(2) is None and torch.get_num_threads() == 4  # 4 free per process: nothing to change
    finally:
        torch.set_num_threads(before)


# ---- through the real console script: signals and a damaged file ----


def _attnlab() -> str:
    import shutil
    import sys

    found = Path(sys.executable).parent / "attnlab"
    return str(found) if found.exists() else str(shutil.which("attnlab"))


@pytest.mark.slow  # slow by nature: console-script processes, signalled
def test_signals_to_the_console_script_save_the_run_and_leave_nothing_behind(tmp_path: Path) -> None:
    """Two real processes at once (their start-ups overlap): Ctrl-C to `attnlab train` saves the steps it took and
    exits 130 with one line; SIGTERM to `attnlab bench --model` removes its temporary folder and its worker."""
    import subprocess
    import time

    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    train = [_attnlab(), "train", "--out", str(out), "--steps", "100000", "--layers", "1", "--emb-dim", "32"]
    trainer = subprocess.Popen([*train, "--context", "32", "--batch-size", "4"], **pipes)
    bench = subprocess.Popen(
        [_attnlab(), "bench", "--model", "gpt2-small", "--quick"], env={**os.environ, "TMPDIR": str(scratch)}, **pipes
    )

    assert trainer.stdout is not None
    line = trainer.stdout.readline()
    while line and not line.startswith("training induction"):  # (a line on threads may come first)
        line = trainer.stdout.readline()
    assert line.startswith("training induction"), line  # the loop is about to start
    deadline = time.monotonic() + 60
    while not list(scratch.glob("attnlab-bench-model-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    folders = list(scratch.glob("attnlab-bench-model-*"))
    assert folders, "the bench never made its folder"
    time.sleep(1.0)  # the training loop has its handler; the bench's first worker is running
    trainer.send_signal(signal.SIGINT)
    bench.send_signal(signal.SIGTERM)

    rest, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 130, (rest, err)
    assert "Traceback" not in rest + err
    last = rest.strip().splitlines()[-1]
    assert last.startswith("interrupted (SIGINT) after ") and "--resume goes on" in last, last
    assert (out / STATE_FILE).is_file() and read_log(out).step  # the steps it took are kept

    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 130 and err.strip() == "error: interrupted", err
    assert not folders[0].exists()  # the weights it wrote are gone
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(folders[0]) not in ps  # no worker left running on them


def test_a_shape_too_big_to_train_is_refused_with_the_figures_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    before = _peak_rss_mib()
    assert cli.main(["train", "--out", str(out), "--layers", "4096", "--emb-dim", "4096", "--heads", "32"]) == 2
    said = capsys.readouterr().err
    assert "this model would need about" in said and "GiB to train (" in said and "GiB is available" in said
    assert _peak_rss_mib() - before < 256 and not out.exists()


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_slips_through_the_console_script_are_one_line(tmp_path: Path) -> None:
    import subprocess

    bad = _saved(tmp_path / "list")
    (bad / "config.json").write_text("[]")
    from concurrent.futures import ThreadPoolExecutor

    slips = [
        (["tuor"], "error: unknown command 'tuor': did you mean 'tour'?"),
        (["heads", "--model", str(bad)], "holds a JSON list; expected an object of settings"),
    ]
    run = lambda argv: subprocess.run([_attnlab(), *argv], capture_output=True, text=True, timeout=120)
    with ThreadPoolExecutor(max_workers=2) as pool:  # two processes at once: their start-ups overlap
        results = list(pool.map(run, [argv for argv, _ in slips]))
    for (_, said), done in zip(slips, results, strict=True):
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done
        assert said in done.stderr and "Traceback" not in done.stderr
