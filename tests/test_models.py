"""Whole models: GPT against Hugging Face's GPT2LMHeadModel and the book's GPTModel, checkpoints, generation."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from llms_from_scratch.ch04 import GPTModel
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
from transformers.utils import logging as hf_logging

from attnlab import cli
from attnlab.models import GPT, ByteTokenizer, GPTConfig, Tokenizer, load_tokenizer
from attnlab.models.families.book import book_state_dict
from attnlab.models.tokenizer import Decoder
from conftest import small

hf_logging.disable_progress_bar()
TEXT = "Your journey starts with one step. Attention is all you need; every step attends to the steps before it. "


def small_hf(vocab: int = 300, *, positions: int = 256, tie: bool = True) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=48,
        n_layer=2,
        n_head=4,
        vocab_size=vocab,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face GPT-2 directory, random weights, with a byte-level BPE trained here on a few sentences."""
    where = tmp_path_factory.mktemp("hf-gpt2")
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    bpe.train_from_iterator([TEXT] * 20, trainer)
    bpe.model.save(str(where))  # vocab.json + merges.txt, as GPT-2 ships them
    small_hf(bpe.get_vocab_size()).save_pretrained(where)
    return where


def hf_model(where: Path) -> GPT2LMHeadModel:
    return GPT2LMHeadModel.from_pretrained(where, attn_implementation="eager").eval()


def test_gpt2_small_has_the_books_parameter_counts() -> None:
    with torch.device("meta"):  # counted, never allocated
        untied = GPT(GPTConfig.preset("gpt2-small"))
        tied = GPT(GPTConfig.preset("gpt2-small", tie_weights=True))
    assert sum(p.numel() for p in untied.parameters()) == 163_009_536
    assert sum(p.numel() for p in tied.parameters()) == 124_412_160
    assert GPTConfig.preset("gpt2-xl").emb_dim == 1600 and GPTConfig.preset("gpt2-large").n_layers == 36
    with pytest.raises(ValueError, match=r"unknown preset 'gpt2-tiny'; known: \['gpt2-small'"):
        GPTConfig.preset("gpt2-tiny")
    with pytest.raises(ValueError, match=r"emb_dim \(100\) must be divisible by n_heads \(12\)"):
        GPTConfig(emb_dim=100)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash"])
def test_hugging_face_checkpoint_gives_the_same_logits(hf_dir: Path, backend: str) -> None:
    ours, theirs = GPT.from_pretrained(hf_dir, backend=backend), hf_model(hf_dir)
    idx = torch.randint(0, ours.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)
    assert not ours.training and ours.config.tie_weights and ours.config.qkv_bias


def test_greedy_generation_equals_hugging_face_token_for_token(hf_dir: Path) -> None:
    ours, theirs = GPT.from_pretrained(hf_dir), hf_model(hf_dir)
    idx = torch.tensor([Tokenizer.from_dir(hf_dir).encode("Your journey")])
    mine = ours.generate(idx, 40)
    ref = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert mine.shape == (1, idx.shape[1] + 40)
    assert mine.tolist() == ref.tolist()


def test_save_pretrained_loads_back_into_hugging_face(hf_dir: Path, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir)
    ours.save_pretrained(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    back = hf_model(tmp_path / "out")
    idx = torch.randint(0, ours.config.vocab_size, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, ours(idx), atol=1e-5, rtol=0)
    # an untied model without q/k/v biases (the book's default) round-trips through Hugging Face's format too
    torch.manual_seed(3)
    book_like = GPT(GPTConfig(vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=2)).eval()
    book_like.save_pretrained(tmp_path / "book-like")
    with torch.no_grad():
        idx = torch.randint(0, 64, (1, 16))
        torch.testing.assert_close(hf_model(tmp_path / "book-like")(idx).logits, book_like(idx), atol=1e-5, rtol=0)
        again = GPT.from_pretrained(tmp_path / "book-like")
        assert again.config == book_like.config.with_(drop_rate=again.config.drop_rate)
        torch.testing.assert_close(again(idx), book_like(idx), atol=0, rtol=0)


def test_pickled_hugging_face_weights_load_with_weights_only(tmp_path: Path) -> None:
    theirs = small_hf(100)  # the older Hugging Face layout: config.json beside a pickled pytorch_model.bin
    theirs.config.save_pretrained(tmp_path)
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    ours = GPT.from_pretrained(tmp_path)
    idx = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def test_the_books_gpt_model_both_ways(tmp_path: Path) -> None:
    cfg = {"vocab_size": 120, "context_length": 40, "emb_dim": 48, "n_heads": 4, "n_layers": 2}
    torch.manual_seed(123)
    book = GPTModel({**cfg, "drop_rate": 0.0, "qkv_bias": True}).eval()
    torch.save(book.state_dict(), tmp_path / "book.pth")
    ours = GPT.from_pretrained(tmp_path / "book.pth", n_heads=4)
    idx = torch.randint(0, 120, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), book(idx), atol=1e-5, rtol=0)
    back = GPTModel({**cfg, "drop_rate": 0.0, "qkv_bias": True}).eval()
    back.load_state_dict(book_state_dict(ours))  # strict: every name the book's class has, and no other
    with torch.no_grad():
        torch.testing.assert_close(back(idx), book(idx), atol=1e-5, rtol=0)
    torch.save({"model_state_dict": book.state_dict(), "optimizer_state_dict": {}}, tmp_path / "ch05.pth")
    assert GPT.from_pretrained(tmp_path / "ch05.pth", n_heads=4).config.qkv_bias
    with pytest.raises(ValueError, match=r"emb_dim 48 is not a GPT-2 size\): pass n_heads=\.\.\."):
        GPT.from_pretrained(tmp_path / "book.pth")


def test_the_books_gpt_model_through_from_book_with_its_config_dict(tmp_path: Path) -> None:
    """One door for the book's models: GPT.from_book reads GPTModel from the dict it was built from, as it reads
    Llama3Model and Qwen3Model; heads come from the dict, so no n_heads= is needed for an odd width."""
    cfg = {"vocab_size": 120, "context_length": 40, "emb_dim": 48, "n_heads": 4, "n_layers": 2}
    cfg |= {"drop_rate": 0.0, "qkv_bias": False}
    torch.manual_seed(7)
    book = GPTModel(cfg).eval()
    idx = torch.randint(0, 120, (2, 30))
    for source in (book, book.state_dict()):
        ours = GPT.from_book(source, cfg)
        assert (ours.config.n_heads, ours.config.qkv_bias, ours.config.tie_weights) == (4, False, False)
        with torch.no_grad():
            torch.testing.assert_close(ours(idx), book(idx), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"the book's config dict lacks \['drop_rate'\]; give the dict GPTModel"):
        GPT.from_book(book, {k: v for k, v in cfg.items() if k != "drop_rate"})
    with pytest.raises(ValueError, match=r"the book's config dict says n_layers=3 but the tensors hold 2"):
        GPT.from_book(book, {**cfg, "n_layers": 3})


class Payload:
    """Unpickling this runs a shell command: what a malicious checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_with_a_code_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump({"tok_emb.weight": Payload(marker)}, f)
    torch.save({"tok_emb.weight": torch.zeros(2, 2), "extra": Payload(marker)}, tmp_path / "evil2.pth")
    (tmp_path / "hf").mkdir()
    torch.save({"transformer.wte.weight": Payload(marker)}, tmp_path / "hf" / "pytorch_model.bin")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    for path in (tmp_path / "evil.pth", tmp_path / "evil2.pth", tmp_path / "hf"):
        with pytest.raises(ValueError, match=r"refused to load .*: it holds pickled objects that are not tensors"):
            GPT.from_pretrained(path)
    assert not marker.exists()


def test_weights_that_do_not_fit_are_listed_by_name_in_one_error(hf_dir: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    config = json.loads((hf_dir / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "n_embd": 64}))  # the weights are 48 wide
    (wrong / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    with pytest.raises(ValueError) as err:
        GPT.from_pretrained(wrong)
    message = str(err.value)  # the tensors are the truth: the config that contradicts them is named with them
    assert "config.json says emb_dim=64 but the tensors hold 48; the file's tensors are the truth" in message
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(hf_dir / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    tensors["transformer.h.7.attn.c_attn.weight"] = torch.zeros(1)
    save_file(tensors, str(wrong / "model.safetensors"))
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing \(1\): transformer\.h\.1\.mlp\.c_fc\.bias \(192,\)") as err:
        GPT.from_pretrained(wrong)
    assert "unexpected (1): transformer.h.7.attn.c_attn.weight" in str(err.value)
    (wrong / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(ValueError, match=r"is a 'falcon' model; attnlab reads model_type 'gpt2' and \[.*'llama'"):
        GPT.from_pretrained(wrong)
    (wrong / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))  # GPT-2's keys, not Llama's
    with pytest.raises(ValueError, match=r"config.json' has no 'num_attention_heads'; a llama config needs it"):
        GPT.from_pretrained(wrong)
    with pytest.raises(ValueError, match=r"no checkpoint at '.*nowhere'"):
        GPT.from_pretrained(tmp_path / "nowhere")


def test_cached_and_uncached_generation_agree_for_200_steps() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, context_length=256, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0))
    model.eval()
    idx = torch.randint(0, 50, (2, 7))
    cached = model.generate(idx, 200)
    assert torch.equal(cached, model.generate(idx, 200, use_cache=False))
    sample = dict(temperature=0.8, top_k=20, top_p=0.9)
    one = model.generate(idx, 30, generator=torch.Generator().manual_seed(5), **sample)
    two = model.generate(idx, 30, generator=torch.Generator().manual_seed(5), **sample)
    other = model.generate(idx, 30, generator=torch.Generator().manual_seed(6), **sample)
    assert torch.equal(one, two) and not torch.equal(one, other)
    greedy = model.generate(idx, 10)
    assert torch.equal(model.generate(idx, 10, temperature=1.0, top_k=1, generator=torch.Generator()), greedy)
    assert torch.equal(model.generate(idx, 10, temperature=1.0, top_p=1e-6, generator=torch.Generator()), greedy)


def test_left_padded_batch_generates_what_each_prompt_would_alone() -> None:
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=40, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)).eval()
    short, long = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 2, 3, 4, 9, 8]])
    batch = torch.tensor([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 9, 8]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = model.generate(batch, 12, attention_mask=mask)
    assert out[0, 3:].tolist() == model.generate(short, 12)[0].tolist()
    assert out[1].tolist() == model.generate(long, 12)[0].tolist()


def test_generation_stops_at_eos_and_refuses_bad_requests() -> None:
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=30, context_length=16, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0)).eval()
    idx = torch.tensor([[3, 4]])
    first = int(model.generate(idx, 1)[0, -1])
    assert model.generate(idx, 8, eos_id=first).tolist() == [[3, 4, first]]
    with pytest.raises(ValueError, match=r"2 tokens and max_new_tokens is 20: 21 positions to run, more than .* 16"):
        model.generate(idx, 20)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\] \(1 keeps every token\), got 1.5"):
        model.generate(idx, 2, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 30\), got \[3, 99\]"):
        model(torch.tensor([[3, 99]]))
    with pytest.raises(ValueError, match=r"position 16 is past the model's context_length 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_tokenizers_read_from_disk_agree_with_hugging_face(hf_dir: Path, tmp_path: Path) -> None:
    ours = Tokenizer.from_dir(hf_dir)
    theirs = GPT2TokenizerFast.from_pretrained(hf_dir)  # reads vocab.json + merges.txt from the folder
    text = "Every step attends to the steps before it. 你好 😀"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text
    labels = ours.tokens(text)
    assert len(labels) == len(ours.encode(text)) and "".join(labels).startswith("Every step attends to the steps")
    assert "你 1/3" in labels and "你 3/3" in labels  # a character of several byte tokens: each part marked
    ours.save(tmp_path)  # tokenizer.json, the other way Hugging Face stores it
    assert Tokenizer.from_dir(tmp_path).encode(text) == ours.encode(text)
    with pytest.raises(ValueError, match=r"it needs tokenizer.json, or vocab.json and merges.txt"):
        Tokenizer.from_dir(tmp_path / "..")
    assert isinstance(load_tokenizer(hf_dir), Tokenizer)
    byte = ByteTokenizer()
    assert byte.encode("注意") == list("注意".encode()) and byte.decode(byte.encode("注意 ok")) == "注意 ok"
    stream = Decoder(byte)
    assert [stream.add(b) for b in "注a".encode()] == ["", "", "注", "a"]  # a character waits for all its bytes


def test_generate_command_streams_and_refuses_slips(hf_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--model", str(hf_dir), "Your journey", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    model, tok = GPT.from_pretrained(hf_dir), Tokenizer.from_dir(hf_dir)
    expected = model.generate(torch.tensor([tok.encode("Your journey")]), 12)[0].tolist()
    assert out == tok.decode(expected) + "\n"
    long = "step " * 300
    assert cli.main(["generate", "--model", str(hf_dir), long, "--max-new-tokens", "8"]) == 2
    assert "more than the model's context of 256 tokens" in capsys.readouterr().err
    assert cli.main(["generate", "--model", str(hf_dir), long, "--max-new-tokens", "8", "--truncate", "left"]) == 0
    capsys.readouterr()
    for argv, message in (
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    ):
        assert cli.main(["generate", "--model", str(hf_dir), "hi", *argv]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["generate", "--model", str(hf_dir / "missing"), "hi"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_layer_and_head_is_observable_and_equals_hugging_faces(
    hf_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours, theirs = GPT.from_pretrained(hf_dir), hf_model(hf_dir)
    idx = torch.tensor([Tokenizer.from_dir(hf_dir).encode("Your journey starts with one step.")])
    weights = ours.attention_weights(idx)  # (L, B, H, T, T)
    with torch.no_grad():
        reference = torch.stack(theirs(idx, output_attentions=True).attentions)
    assert weights.shape == (2, 1, 4, idx.shape[1], idx.shape[1])
    torch.testing.assert_close(weights, reference, atol=1e-5, rtol=0)
    assert cli.main(["explain", "Your journey starts", "--model", str(hf_dir)]) == 0  # the HTML: test_train.py
    said = capsys.readouterr().out
    # every head named, then both layers on the probe and on the text; no training log beside a Hugging Face model
    assert "Every head, named" in said and "layer 1 head 3:" in said and "How it learned" not in said
    assert "Layer 1 on the probe" in said and "Layer 1" in said
    with pytest.raises(ValueError, match=r"backend 'sdpa' never forms the attention weights"):
        GPT.from_pretrained(hf_dir, backend="sdpa").attention_weights(idx)


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
def test_a_book_checkpoint_generates_and_explains_from_the_command_line(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = Tokenizer.from_dir(hf_dir).vocab_size
    cfg = {"vocab_size": vocab, "context_length": 32, "emb_dim": 768, "n_heads": 12, "n_layers": 1}
    torch.manual_seed(4)
    book = GPTModel({**cfg, "drop_rate": 0.0, "qkv_bias": False}).eval()
    torch.save(book.state_dict(), tmp_path / "gpt.pth")  # a GPT-2 width: the heads come from the preset
    argv = ["generate", "--model", str(tmp_path / "gpt.pth"), "Your journey", "--max-new-tokens", "6"]
    assert cli.main(argv) == 2
    assert "is a checkpoint file, which carries no tokenizer: pass --tokenizer DIR" in capsys.readouterr().err
    assert cli.main([*argv, "--tokenizer", str(hf_dir)]) == 0
    ids = Tokenizer.from_dir(hf_dir).encode("Your journey")
    with torch.no_grad():  # the book's own model, greedy, all six tokens (no cache: the whole context each step)
        seq = torch.tensor([ids])
        for _ in range(6):
            seq = torch.cat([seq, book(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    out = capsys.readouterr().out
    assert out.rstrip("\n") == Tokenizer.from_dir(hf_dir).decode(seq[0].tolist())
    page = tmp_path / "book.html"
    explain = ["explain", "Your journey", "--model", str(tmp_path / "gpt.pth"), "--tokenizer", str(hf_dir)]
    assert cli.main([*explain, "--html", str(page)]) == 0
    shown = page.read_text(encoding="utf-8")
    assert shown.count('<section class="step') == 5  # heads named, the interactive view, the sinks, the probe, the text
    assert shown.count('class="attnview"') == 1


@pytest.mark.parametrize("rope", [True, False])
def test_a_compiled_decode_step_is_one_graph_and_gives_the_same_tokens(rope: bool) -> None:
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = GPT(small(rope=rope, context_length=64)).eval()
    counter = CompileCounter()
    torch._dynamo.reset()
    for length, new in ((5, 10), (9, 30)):  # two lengths, one rounded capacity: one graph serves both
        prompt = torch.randint(0, 256, (2, length))
        compiled = model.generate(prompt, new, compile=counter)
        torch.testing.assert_close(compiled, model.generate(prompt, new), rtol=0, atol=0)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs for two calls"


def test_compile_refuses_what_its_one_graph_cannot_hold() -> None:
    model = GPT(small()).eval()
    prompt = torch.randint(0, 256, (1, 5))
    with pytest.raises(ValueError, match="leave out lookup, draft and attention_mask"):
        model.generate(prompt, 3, compile=True, lookup=2)
    with pytest.raises(ValueError, match="decodes with the plain cache, whose shapes never change; got cache='int8'"):
        model.generate(prompt, 3, compile=True, cache="int8")
    with pytest.raises(ValueError, match=r"compile=.nope. is not a torch\.compile backend here"):
        model.generate(prompt, 3, compile="nope")
    with pytest.raises(ValueError, match=r"compile must be True, False or a torch\.compile backend, got 1"):
        model.generate(prompt, 3, compile=1)  # type: ignore[arg-type]


def test_a_blocks_residual_dropout_follows_its_own_training_flag() -> None:
    """In evaluation the residual dropout is not called; Monte-Carlo dropout (the model in eval, the dropouts
    alone switched to training) still drops."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1, drop_rate=0.5)).eval()
    idx = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        plain = m(idx)
        assert torch.equal(m(idx), plain)
        m.trf_blocks[0].drop_resid.train()
        assert not torch.equal(m(idx), plain)
