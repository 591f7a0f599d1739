"""The models benchmarks/engines.py decodes (``--shape``), each written once as a Hugging Face folder with a
byte-level BPE tokenizer the converters accept, and the engines' own forms of it.

* ``gpt2-small``: a seeded GPT-2 of gpt2-small's shape, written by attnlab (GPT-2's names and config): the rows of
  every run since issue 37.
* ``qwen3-0.6b``: Qwen3-0.6B's config (28 layers of 1024, 16 query heads over 8 key-value heads of 128, QK-norm,
  an MLP of 3072, 151,936 tokens, tied embeddings), a transformers ``Qwen3ForCausalLM`` with its own random
  initialization at the real size.
* ``qwen3.5-0.8b``: Qwen3.5-0.8B's text config (attnlab's table of published shapes, read by transformers 5.24's
  ``Qwen3_5TextConfig``): 24 layers, three Gated DeltaNet layers to one gated softmax layer, 248,320 tokens.

``--smoke`` writes a tiny config of the same family (a few layers of 64), every feature of the family kept.

CTranslate2's converter writes its float32 and int8 forms; llama.cpp's ``convert_hf_to_gguf.py`` (``--llama-cpp
DIR``, llama.cpp's source tree) its f32, f16 and q8_0 GGUF files. A converter that refuses the model leaves a
``<form>.error`` file with its reason in one line, which that engine's rows report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SHAPES = ("gpt2-small", "qwen3-0.6b", "qwen3.5-0.8b")
BATCHED = {"gpt2-small"}  # the shapes that also run the rows of 8 and 32 prompts
GGUF_TYPES = ("f32", "f16", "q8_0")
GGUF_ARGS = {"qwen3.5-0.8b": ["--no-mtp"]}  # the text model is written without the hub's multi-token-prediction head
CONVERT_SECONDS = 1800

_QWEN3 = {  # Qwen3-0.6B's config.json, the fields that fix its shape
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": True,
}
_QWEN3_SMOKE = _QWEN3 | {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
_QWEN3_SMOKE |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256}
_QWEN35_SMOKE = {  # three Gated DeltaNet layers, then one gated softmax layer; partial RoPE, tied
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": True,
}


def hf_config(name: str, smoke: bool) -> dict[str, Any]:
    """The shape's config.json fields (transformers' names): the real ones, or the smoke's tiny ones."""
    if name == "gpt2-small":
        if smoke:
            return {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 256}
        return {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    if name == "qwen3-0.6b":
        return dict(_QWEN3_SMOKE if smoke else _QWEN3)
    if name == "qwen3.5-0.8b":
        if smoke:
            return json.loads(json.dumps(_QWEN35_SMOKE))
        from attnlab.models.families.shapes import SHAPES as PUBLISHED

        wrapper = PUBLISHED["qwen3.5-0.8b"]  # the hub's multimodal folder: its text model, tied as the wrapper says
        return json.loads(json.dumps(wrapper["text_config"])) | {"tie_word_embeddings": wrapper["tie_word_embeddings"]}
    raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")


def vocab_size(name: str, smoke: bool) -> int:
    return int(hf_config(name, smoke)["vocab_size"])


def described(name: str, smoke: bool) -> str:
    """The model in one phrase, for the table's note."""
    c = hf_config(name, smoke)
    if name == "gpt2-small":
        return f"a seeded GPT-2 of {c['n_layer']} layers x {c['n_embd']}, {c['vocab_size']} tokens"
    heads = f"{c['num_attention_heads']} query heads over {c['num_key_value_heads']} key-value heads of {c['head_dim']}"
    common = f"{c['num_hidden_layers']} layers x {c['hidden_size']}, {heads}, an MLP of {c['intermediate_size']}"
    tied = "tied embeddings" if c["tie_word_embeddings"] else "an untied head"
    if name == "qwen3-0.6b":
        return f"Qwen3-0.6B's shape{' (smoke: tiny)' if smoke else ''}: {common}, QK-norm, {c['vocab_size']} tokens, {tied}, random weights"
    delta = sum(t == "linear_attention" for t in c["layer_types"])
    return (
        f"Qwen3.5-0.8B's text shape{' (smoke: tiny)' if smoke else ''}: {common}, {delta} of the layers Gated DeltaNet "
        f"({c['linear_num_value_heads']} value heads of {c['linear_value_head_dim']}), {c['vocab_size']} tokens, {tied}, "
        "random weights"
    )


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A GPT-2 style byte-level BPE of exactly ``vocab_size`` tokens: the 256 bytes (as GPT-2 maps them to
    printable characters), then one merge of two byte characters a token, then (past 65,792 tokens) of a
    two-byte token and a byte; the last token <|endoftext|>."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2's bytes_to_unicode
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    merges = []
    base = [chars[b] for b in range(256)]
    pairs = [first + second for first in base for second in base]  # two byte characters: each a distinct string
    for left, right in [(p[0], p[1]) for p in pairs] + [(p, c) for p in pairs for c in base]:
        if len(vocab) >= vocab_size - 1:
            break
        vocab[left + right] = len(vocab)
        merges.append(f"{left} {right}")
    vocab["<|endoftext|>"] = len(vocab)
    if len(vocab) != vocab_size:
        raise ValueError(f"made {len(vocab)} tokens for a vocabulary of {vocab_size}")
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    eos = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": eos, "eos_token": eos}
    config["unk_token"] = eos
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def write_hf(name: str, smoke: bool, where: Path) -> None:
    """The seeded model as a Hugging Face folder, and its tokenizer."""
    import torch

    torch.manual_seed(0)
    fields = hf_config(name, smoke)
    if name == "gpt2-small":  # attnlab writes it, as every run since issue 37 (the same seeded weights)
        from attnlab.models import GPT, GPTConfig

        ours = {"n_layers": fields["n_layer"], "emb_dim": fields["n_embd"], "n_heads": fields["n_head"]}
        ours |= {"vocab_size": fields["vocab_size"], "context_length": fields["n_positions"]}
        GPT(GPTConfig.from_dict(ours | {"drop_rate": 0.0, "qkv_bias": True})).eval().save_pretrained(where)
        written = json.loads((where / "config.json").read_text(encoding="utf-8"))
        written["n_ctx"] = written["n_positions"]  # GPT-2's own config.json has both; llama.cpp's converter reads n_ctx
        (where / "config.json").write_text(json.dumps(written, indent=2), encoding="utf-8")
    else:
        import transformers

        config_class, model_class = {
            "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM"),
            "qwen3.5-0.8b": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
        }[name]
        eos = {"bos_token_id": fields["vocab_size"] - 1, "eos_token_id": fields["vocab_size"] - 1}
        config = getattr(transformers, config_class)(**fields, **eos)
        model = getattr(transformers, model_class)(config).eval()
        model.save_pretrained(where)
        del model
    write_tokenizer(where, fields["vocab_size"])


def write_ct2(hf: Path, folder: Path) -> None:
    """CTranslate2's float32 and int8 forms, or for each a ``ct2-<q>.error`` saying why its converter refused."""
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return  # the rows say it is not installed
    for quantization in ("float32", "int8"):
        try:
            TransformersConverter(str(hf)).convert(str(folder / f"ct2-{quantization}"), quantization=quantization)
        except Exception as error:  # the converter's reason is the row's
            (folder / f"ct2-{quantization}.error").write_text(one_line(error), encoding="utf-8")


# llama.cpp's converter names a BPE tokenizer's pre-tokenizer by hashing how it splits a test text, and refuses
# one it does not know, as the benchmark's own: GPT-2's split, which this tokenizer follows, is named instead (the
# rows feed llama.cpp token ids, so its tokenizer never runs)
_CONVERT = (
    "import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]\n"
    "import conversion.base as base\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
    "import convert_hf_to_gguf\n"
    "convert_hf_to_gguf.main()\n"
)


def write_gguf(name: str, hf: Path, folder: Path, llama_cpp: Path) -> None:
    """llama.cpp's f32, f16 and q8_0 files (``gguf-<type>.gguf``) by its ``convert_hf_to_gguf.py``, with the
    ``gguf`` package of its own tree; a refusal leaves ``gguf-<type>.error`` with the converter's last line, a
    module it needs and cannot import ``gguf-<type>.missing`` with what to install."""
    for outtype in GGUF_TYPES:
        out = folder / f"gguf-{outtype}.gguf"
        argv = [sys.executable, "-c", _CONVERT, str(llama_cpp), str(llama_cpp / "gguf-py")]
        argv += [str(hf), "--outtype", outtype, "--outfile", str(out), *GGUF_ARGS.get(name, [])]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONVERT_SECONDS)
        if done.returncode != 0 or not out.is_file():
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            reason = lines[-1][:300] if lines else f"exit {done.returncode}"
            kind, said = gguf_failure(reason)
            (folder / f"gguf-{outtype}.{kind}").write_text(said, encoding="utf-8")


def gguf_failure(reason: str) -> tuple[str, str]:
    """("error", the converter's refusal) from its last line; ("missing", what to install) where that line says a
    module the converter imports for this model is not installed here: not a refusal of the model."""
    missing = re.fullmatch(r"ModuleNotFoundError: No module named '([\w.]+)'", reason)
    if not missing:
        return "error", f"convert_hf_to_gguf.py: {reason}"
    module = missing.group(1)
    fix = (
        "pip install sentencepiece (pip install 'attnlab[engines]' brings it)"
        if module == "sentencepiece"
        else "install the package that provides it"  # a module's name is not always its package's (yaml: PyYAML)
    )
    return "missing", (
        f"llama.cpp's converter imports the Python module {module!r} for this model, and it is not installed: {fix}"
    )


def write_model(name: str, smoke: bool, folder: Path, llama_cpp: Path | None) -> None:
    """Every form the rows read: ``hf/``, ``ct2-float32/``, ``ct2-int8/`` and, given llama.cpp's tree, the GGUF
    files."""
    write_hf(name, smoke, folder / "hf")
    write_ct2(folder / "hf", folder)
    if llama_cpp is not None:
        write_gguf(name, folder / "hf", folder, llama_cpp)


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (less a list of what is supported,
    which CTranslate2's refusal appends)."""
    first = (str(error).strip().splitlines() or [""])[0].split(" (supported ")[0]
    return f"{type(error).__name__}: {first[:300]}"
