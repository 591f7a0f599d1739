"""GPT checkpoints, both ways, safely: Hugging Face GPT-2 directories, the book's state dicts, attnlab's own.

Reading never runs code from a file: safetensors first; a pickle (``.bin``,
``.pth``) goes through ``torch.load(weights_only=True)``, which unpickles
tensors and plain containers only, and a file that asks for anything else is
refused before any of it runs.

Every source is first turned into attnlab's own names (with, for each, the
name it had in the file); then one check compares it with the model the
config describes and lists, in one error, every missing, unexpected and
mis-shaped tensor by its name in the file.

Writing: ``config.json`` + ``model.safetensors`` in Hugging Face's GPT-2
layout, which ``transformers.GPT2LMHeadModel.from_pretrained`` reads; the
config also carries attnlab's own ``GPTConfig`` under ``"attnlab"``. A model
GPT-2 cannot hold (RoPE, grouped-query heads, a window, a score_mod) is
written under attnlab's own names, with ``"format": "attnlab"`` and no
``model_type``, so no GPT-2 reader mistakes it for one.

This module knows configs and tensors, not the model class: ``GPT`` calls
:func:`read_checkpoint` and :func:`fit` (no import circle).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.models import families
from attnlab.models.config import PRESETS, GPTConfig
from attnlab.models.families.rows import Rows
from attnlab.models.locate import locate
from attnlab.models.tokenizer import CHARS_FILE, CharTokenizer

Tensors = dict[str, torch.Tensor]
Weights = abc.Mapping[str, torch.Tensor | Rows]  # in attnlab's names: a Rows stacks several of the file's tensors
# (name in the file, name in attnlab, stored transposed): GPT-2 keeps its Conv1D weights as (in, out).
Mapping = list[tuple[str, str, bool]]


def _hf_names(config: GPTConfig) -> Mapping:
    names: Mapping = [
        ("transformer.wte.weight", "tok_emb.weight", False),
        ("transformer.wpe.weight", "pos_emb.weight", False),
    ]
    for i in range(config.n_layers):
        h, b = f"transformer.h.{i}.", f"trf_blocks.{i}."
        names += [
            (h + "ln_1.weight", b + "norm1.weight", False),
            (h + "ln_1.bias", b + "norm1.bias", False),
            (h + "attn.c_attn.weight", b + "att.qkv.weight", True),
            (h + "attn.c_attn.bias", b + "att.qkv.bias", False),
            (h + "attn.c_proj.weight", b + "att.out_proj.weight", True),
            (h + "attn.c_proj.bias", b + "att.out_proj.bias", False),
            (h + "ln_2.weight", b + "norm2.weight", False),
            (h + "ln_2.bias", b + "norm2.bias", False),
            (h + "mlp.c_fc.weight", b + "ff.0.weight", True),
            (h + "mlp.c_fc.bias", b + "ff.0.bias", False),
            (h + "mlp.c_proj.weight", b + "ff.2.weight", True),
            (h + "mlp.c_proj.bias", b + "ff.2.bias", False),
        ]
    names += [
        ("transformer.ln_f.weight", "final_norm.weight", False),
        ("transformer.ln_f.bias", "final_norm.bias", False),
    ]
    if not config.tie_weights:
        names.append(("lm_head.weight", "out_head.weight", False))
    return names


# ---------------------------------------------------------------------------------------------- reading


def _read_safetensors(path: Path) -> Tensors:
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as err:
        raise ValueError(f"cannot read {str(path)!r} as safetensors: {err}") from None


def _read_pickle(path: Path) -> Any:
    """A pickled state dict, tensors only: anything else in the file is refused and never runs."""
    try:
        with warnings.catch_warnings():
            # torch notes that a plain pickle (not torch.save) uses another protocol; weights_only reads it anyway
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0][:200]
        raise ValueError(
            f"refused to load {str(path)!r}: it holds pickled objects that are not tensors ({first}); "
            "attnlab loads weights only and never runs code from a checkpoint. Save the state dict alone, "
            "or convert it to safetensors"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"cannot read {str(path)!r} as a PyTorch state dict: {err}") from None


def _hf_weights(directory: Path) -> Tensors:
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").is_file():
        return _read_safetensors(directory / "model.safetensors")
    if index.is_file():
        listed = read_json(index).get("weight_map")
        if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
            raise ValueError(f"{str(index)!r} has no weight_map of tensor names to shard files")
        shards = sorted(set(listed.values()))
        for shard in shards:  # a shard is a file in this folder, never a path that leaves it
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise ValueError(f"{str(index)!r} names the shard {shard!r}, outside its folder; refused")
        return {k: v for shard in shards for k, v in _read_safetensors(directory / shard).items()}
    if (directory / "pytorch_model.bin").is_file():
        loaded = _read_pickle(directory / "pytorch_model.bin")
        if not isinstance(loaded, dict):
            raise ValueError(f"{str(directory / 'pytorch_model.bin')!r} is not a state dict")
        return loaded
    raise ValueError(
        f"{str(directory)!r} has a config.json but no weights: expected model.safetensors, "
        "model.safetensors.index.json with its shards, or pytorch_model.bin"
    )


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or an error that names the file."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{str(path)!r} holds a JSON {type(values).__name__}; expected an object of settings")
    return values


def _need(raw: dict[str, Any], key: str, where: Path) -> Any:
    if key not in raw:
        raise ValueError(f"{str(where / 'config.json')!r} has no {key!r}; a GPT-2 config needs it")
    return raw[key]


def _flag(raw: dict[str, Any], key: str, default: bool, where: Path) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):  # "false" is a string, and bool("false") is True
        raise ValueError(f"{str(where / 'config.json')!r}: {key} must be true or false, got {value!r}")
    return value


def _reconcile(config: GPTConfig, tensors: Weights, where: Path) -> GPTConfig:
    """The file's tensors are the truth. Sizes they fix (vocabulary, width, context, layers) that the config
    contradicts are refused, naming both; q/k/v biases the file holds are kept (a config that said there
    were none, carried over by another tool after fine-tuning, is corrected); so is an untied head."""
    found: dict[str, int] = {}
    if "tok_emb.weight" in tensors and len(tensors["tok_emb.weight"].shape) == 2:
        found["vocab_size"], found["emb_dim"] = tensors["tok_emb.weight"].shape
    if "pos_emb.weight" in tensors and len(tensors["pos_emb.weight"].shape) == 2:
        found["context_length"] = tensors["pos_emb.weight"].shape[0]
    layers = {k.split(".")[1] for k in tensors if k.startswith("trf_blocks.")}
    if layers:
        found["n_layers"] = len(layers)
    wrong = [f"{k}={getattr(config, k)} but the tensors hold {v}" for k, v in found.items() if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"{str(where)!r}: config.json says {'; '.join(wrong)}; the file's tensors are the truth")
    biases = [v for k, v in tensors.items() if k.endswith("att.qkv.bias") and isinstance(v, torch.Tensor)]
    if not config.qkv_bias and any(bool(b.any()) for b in biases):
        config = config.with_(qkv_bias=True)  # trained biases: kept, not dropped
    head, embedding = tensors.get("out_head.weight"), tensors.get("tok_emb.weight")
    if (
        config.tie_weights
        and isinstance(head, torch.Tensor)
        and isinstance(embedding, torch.Tensor)
        and not torch.equal(head, embedding)
    ):
        config = config.with_(tie_weights=False)  # a head of its own: kept
    return config


def _config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    if raw.get("model_type") != "gpt2":
        raise ValueError(
            f"{str(where)!r} is a {raw.get('model_type')!r} model; attnlab reads model_type 'gpt2' and "
            f"{sorted(families.READERS)}"
        )
    unsupported = {
        "activation_function": (raw.get("activation_function", "gelu_new"), ("gelu_new", "gelu_pytorch_tanh")),
        "scale_attn_weights": (raw.get("scale_attn_weights", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (raw.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "add_cross_attention": (raw.get("add_cross_attention", False), (False,)),
        "n_inner": (raw.get("n_inner"), (None, 4 * raw.get("n_embd", 768))),
    }
    for key, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise ValueError(f"{str(where)!r}: {key}={value!r} is not supported by attnlab's GPT (it needs {allowed})")
    return GPTConfig(
        vocab_size=_need(raw, "vocab_size", where),
        context_length=raw.get("n_positions", 1024),
        emb_dim=raw.get("n_embd", 768),
        n_heads=raw.get("n_head", 12),
        n_layers=raw.get("n_layer", 12),
        drop_rate=float(raw.get("resid_pdrop", 0.1)),
        qkv_bias=True,
        tie_weights=_flag(raw, "tie_word_embeddings", True, where),
        layer_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
    )


def _from_hf(tensors: Tensors, config: GPTConfig) -> tuple[Tensors, dict[str, str]]:
    """Hugging Face names to attnlab's; returns the tensors and, per attnlab name, the name in the file."""
    plain = {k.removeprefix("transformer."): k for k in tensors}  # a GPT2Model saved without the LM head
    out: Tensors = {}
    origin: dict[str, str] = {}
    for hf, ours, transposed in _hf_names(config):
        key = plain.get(hf.removeprefix("transformer."), hf)
        origin[ours] = key  # also for a missing tensor: the name the file should have had
        if key in tensors:
            out[ours] = tensors[key].T if transposed else tensors[key]
    known = set(origin.values())
    for key in tensors:  # what the file holds beyond the model: buffers GPT-2 once saved are fine, the rest is not
        if key not in known and not key.endswith((".attn.bias", ".attn.masked_bias")) and key != "lm_head.weight":
            out[f"<unexpected>{key}"] = tensors[key]
    return out, origin


def _book_config(tensors: Tensors, overrides: dict[str, Any]) -> GPTConfig:
    """The book's GPTModel stores no config: sizes come from the tensors, heads from the GPT-2 presets."""
    for key in ("tok_emb.weight", "pos_emb.weight"):
        if key not in tensors:
            raise ValueError(
                f"not a state dict of the book's GPTModel: it lacks {key!r}; it holds {sorted(tensors)[:8]}"
            )
    vocab, emb = tensors["tok_emb.weight"].shape
    layers = len({k.split(".")[1] for k in tensors if k.startswith("trf_blocks.")})
    heads = next((p["n_heads"] for n, p in PRESETS.items() if n.startswith("gpt2") and p["emb_dim"] == emb), None)
    if heads is None and "n_heads" not in overrides:
        raise ValueError(
            f"the book's state dict does not say how many heads its attention has (emb_dim {emb} is not a GPT-2 "
            "size): pass n_heads=..."
        )
    values = dict(
        vocab_size=vocab,
        context_length=tensors["pos_emb.weight"].shape[0],
        emb_dim=emb,
        n_heads=heads,
        n_layers=layers,
        qkv_bias="trf_blocks.0.att.W_query.bias" in tensors,
    )
    return GPTConfig(**{**values, **overrides})


def _from_book(tensors: Tensors, config: GPTConfig) -> tuple[Tensors, dict[str, str]]:
    renamed = {"layers.0": "0", "layers.2": "2", "norm1.scale": "norm1.weight", "norm1.shift": "norm1.bias"}
    renamed |= {"norm2.scale": "norm2.weight", "norm2.shift": "norm2.bias"}
    renamed |= {"final_norm.scale": "final_norm.weight", "final_norm.shift": "final_norm.bias"}
    out: Tensors = {}
    origin: dict[str, str] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if key.endswith(".att.mask"):
            continue  # the book's causal mask buffer: attnlab builds its own
        parts = key.split(".")
        if len(parts) == 5 and parts[2] == "att" and parts[3] in ("W_query", "W_key", "W_value"):
            qkv.setdefault(f"{'.'.join(parts[:3])}.qkv.{parts[4]}", {})[parts[3]] = tensor
            continue
        ours = key
        for old, new in renamed.items():
            ours = ours.replace(old, new)
        out[ours] = tensor
        origin[ours] = key
    for ours, pieces in qkv.items():
        missing = [p for p in ("W_query", "W_key", "W_value") if p not in pieces]
        if missing:
            raise ValueError(f"the book's state dict has {sorted(pieces)} but not {missing} for {ours!r}")
        out[ours] = torch.cat([pieces["W_query"], pieces["W_key"], pieces["W_value"]], dim=0)  # rows: q, k, v
        origin[ours] = ours.replace("qkv", "W_query/W_key/W_value")
    return out, origin


def fit(model: nn.Module, checkpoint: Checkpoint, *, check_only: bool = False) -> None:
    """Copy a checkpoint's tensors into ``model`` (a GPT of ``checkpoint.config``) after one check.

    ``check_only``: the check alone, e.g. on a model built on the meta device, so that a config that
    does not fit its file is refused before a single weight is allocated.
    """
    _fit(model, checkpoint.config, checkpoint.tensors, checkpoint.origin, checkpoint.source, check_only)


def _fit(
    model: nn.Module, config: GPTConfig, tensors: Weights, origin: dict[str, str], source: str, check_only: bool
) -> None:
    """Copy tensors into the model after one check that lists every problem by its name in the file."""
    expected = model.state_dict()
    if config.tie_weights:
        expected.pop("out_head.weight", None)
    missing = [f"{origin.get(k, k)} {tuple(v.shape)}" for k, v in expected.items() if k not in tensors]
    unexpected = [origin.get(k, k.removeprefix("<unexpected>")) for k in tensors if k not in expected]
    wrong = [
        f"{origin.get(k, k)}: expected {tuple(expected[k].shape)}, found {tuple(v.shape)}"
        for k, v in tensors.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    wrong += [  # an int, bool or float8 tensor is not a weight: casting it would make one up
        f"{origin.get(k, k)}: dtype {v.dtype} is not a float weight"
        for k, v in tensors.items()
        if k in expected and (not v.is_floating_point() or v.element_size() < 2)
    ]
    if missing or unexpected or wrong:
        c = config
        problems = [
            ("mis-shaped", wrong),
            ("missing", missing),
            ("unexpected", unexpected),
        ]
        detail = "; ".join(f"{kind} ({len(items)}): {', '.join(items[:12])}" for kind, items in problems if items)
        raise ValueError(
            f"the weights in {source} do not fit GPTConfig(vocab_size={c.vocab_size}, context_length="
            f"{c.context_length}, emb_dim={c.emb_dim}, n_heads={c.n_heads}, n_layers={c.n_layers}, "
            f"qkv_bias={c.qkv_bias}, tie_weights={c.tie_weights}): {detail}"
        )
    if check_only:
        return
    with torch.no_grad():  # one tensor at a time from the memory-mapped file: no second copy of the model is held
        for key, tensor in tensors.items():
            if isinstance(tensor, Rows):
                tensor.copy_into(expected[key])
            else:
                expected[key].copy_(tensor)


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds, in attnlab's names: the config, the tensors, each one's name in the file."""

    config: GPTConfig
    tensors: Weights
    origin: dict[str, str]
    source: str


def read_config(path: str | Path, **overrides: Any) -> GPTConfig:
    """The config of a checkpoint folder from its config.json alone, no tensor read (``attnlab memory`` sizes a
    model's cache from it): attnlab's own config when it carries one, else the Hugging Face family's."""
    where = locate(path)
    if not where.is_dir():
        raise ValueError(f"{str(where)!r} is not a checkpoint folder: give one that holds a config.json")
    return _config_json(where, overrides)[0]


def _config_json(where: Path, overrides: dict[str, Any]) -> tuple[GPTConfig, dict[str, Any]]:
    """The folder's config (overrides applied) and its config.json as read."""
    config_file = where / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{str(where)!r} has no config.json: give a Hugging Face or attnlab checkpoint folder")
    raw = read_json(config_file)
    ours = raw.get("attnlab")
    if ours is not None and not isinstance(ours, dict):
        raise ValueError(f"{str(config_file)!r}: 'attnlab' must be an object of GPTConfig fields, got {ours!r:.60}")
    if ours:
        return GPTConfig.from_dict({**ours, **overrides}), raw
    if raw.get("model_type") in families.READERS:
        return families.config_from_hf(raw, where).with_(**overrides), raw
    return _config_from_hf(raw, where).with_(**overrides), raw


def read_checkpoint(path: str | Path, **overrides: Any) -> Checkpoint:
    """A Hugging Face GPT-2 directory, an attnlab directory, or the book's ``.pth`` state dict, read.

    ``overrides`` set GPTConfig fields the checkpoint does not fix (``backend``,
    ``drop_rate``; ``n_heads`` for a book state dict of a size that is not GPT-2's).
    """
    where = locate(path)
    if where.is_dir():
        config, raw = _config_json(where, overrides)
        if raw.get("format") == "attnlab":  # attnlab's own names: a model GPT-2 cannot hold
            tensors = _read_safetensors(where / "model.safetensors")
            return Checkpoint(_reconcile(config, tensors, where), tensors, {k: k for k in tensors}, str(where))
        if raw.get("model_type") in families.READERS:  # Llama, Mistral, Qwen2, Qwen3
            weights, origin = families.from_hf(_hf_weights(where), config)
            config = _reconcile(config, weights, where)
            if config.tie_weights:  # a head equal to the embedding: the same tensor, loaded once
                weights = {k: v for k, v in weights.items() if k != "out_head.weight"}
            return Checkpoint(config, weights, origin, str(where))
        tensors, origin = _from_hf(_hf_weights(where), config)
        config = _reconcile(config, tensors, where)
        if not config.qkv_bias:  # all-zero q/k/v biases (attnlab writes them for Hugging Face): not part of this model
            tensors = {k: v for k, v in tensors.items() if not k.endswith("att.qkv.bias")}
        return Checkpoint(config, tensors, origin, str(where))
    if where.is_file():
        raw_state = _read_pickle(where) if where.suffix != ".safetensors" else _read_safetensors(where)
        if isinstance(raw_state, dict) and "model_state_dict" in raw_state:  # the book's chapter 5 checkpoints
            raw_state = raw_state["model_state_dict"]
        if not isinstance(raw_state, dict):
            raise ValueError(f"{str(where)!r} holds a {type(raw_state).__name__}, not a state dict")
        odd = [k for k, v in raw_state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if odd:
            raise ValueError(f"{str(where)!r} is not a state dict of named tensors: it holds the key {odd[0]!r}")
        config = _book_config(raw_state, overrides)
        tensors, origin = _from_book(raw_state, config)
        return Checkpoint(config, tensors, origin, str(where))
    raise ValueError(
        f"no checkpoint at {str(where)!r}: give a Hugging Face GPT-2 or attnlab directory, or the book's .pth file"
    )


def read_book(source: object, cfg: abc.Mapping[str, Any], **overrides: Any) -> Checkpoint:
    """The book's from-scratch Llama 3 or Qwen3: the model itself, its state dict, or a ``.pth``/``.safetensors``
    file of it, with the config dict it was built from (``families.book``)."""
    from attnlab.models.families import book

    config = book.config_from_book(cfg, **overrides)
    state: abc.Mapping[str, Any]
    if isinstance(source, nn.Module):
        state, where = source.state_dict(), f"the book's {type(source).__name__}"
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"no file at {str(path)!r}: give the book's model, its state dict, or its saved file")
        state, where = _read_safetensors(path) if path.suffix == ".safetensors" else _read_pickle(path), str(path)
    elif isinstance(source, abc.Mapping):
        state, where = source, "the book's state dict"
    else:
        raise TypeError(f"source must be the book's model, its state dict or a path, got {type(source).__name__}")
    if not isinstance(state, abc.Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{where} is not a state dict of named tensors")
    tensors, origin = book.from_book(state)
    return Checkpoint(_reconcile(config, tensors, Path(where)), tensors, origin, where)


# ---------------------------------------------------------------------------------------------- writing


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it over ``path``: a reader, or a
    run stopped halfway, sees the old file or the new one, never a part of one."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes: what ties a training state to the weights it was saved with."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``transformers.GPT2LMHeadModel``, with attnlab's own config alongside."""
    values: dict[str, Any] = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.emb_dim,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.drop_rate,
        "embd_pdrop": config.drop_rate,
        "attn_pdrop": config.drop_rate,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": config.tie_weights,
        "bos_token_id": 50256 if config.vocab_size > 50256 else None,
        "eos_token_id": 50256 if config.vocab_size > 50256 else None,
        "attnlab": config.to_dict(),
    }
    return values


def hf_state_dict(model: nn.Module, config: GPTConfig) -> Tensors:
    """The model's tensors under GPT-2's names and layout (Conv1D weights transposed, zero q/k/v biases if none)."""
    ours = model.state_dict()
    out: Tensors = {}
    for hf, name, transposed in _hf_names(config):
        if name not in ours:  # no q/k/v bias in this model: GPT-2 always has one, so write zeros
            out[hf] = torch.zeros(3 * config.emb_dim, dtype=ours["tok_emb.weight"].dtype)
            continue
        tensor = ours[name].detach()
        out[hf] = (tensor.T if transposed else tensor).contiguous().clone()
    return out


def save_gpt(model: nn.Module, directory: str | Path, *, tokenizer: str | CharTokenizer | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors``; the folder is created, and nothing is half-written on error.

    ``tokenizer="bytes"`` (or ``"ascii"``) records that the model reads bytes, so ``load_tokenizer`` needs no files;
    a ``CharTokenizer`` is written beside them (``chars.json``) and recorded as ``"chars"``.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, GPTConfig):
        raise TypeError(f"save_gpt saves an attnlab GPT, got {type(model).__name__}")
    if isinstance(tokenizer, CharTokenizer):
        if tokenizer.vocab_size != config.vocab_size:
            raise ValueError(
                f"the character vocabulary has {tokenizer.vocab_size} ids and the model {config.vocab_size}: "
                "save the model with the tokenizer it was trained with"
            )
    elif tokenizer not in (None, "bytes", "ascii"):
        raise ValueError(f"tokenizer must be None, 'bytes', 'ascii' or a CharTokenizer, got {tokenizer!r}")
    if getattr(model, "quantized", False):
        raise ValueError(
            "this model's weights were quantized to int8 in memory (GPT.quantize); checkpoints hold float "
            "weights: save the float model, and quantize after from_pretrained"
        )
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{str(target)!r} is a file; give a folder to write config.json and model.safetensors into")
    # everything that can fail runs before the first write
    if config.is_gpt2 and config.family in (None, "gpt2"):
        tensors, described = hf_state_dict(model, config), hf_config(config)
    elif families.holds(config):  # the Hugging Face family it was read as (Llama, Mistral, Qwen2, Qwen3)
        tensors, described = families.to_hf(model.state_dict(), config)
    else:  # attnlab's own names: GPT-2's layout has no place for RoPE, kv heads, a window or a score_mod
        tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        if config.tie_weights:
            tensors.pop("out_head.weight", None)  # the same tensor as tok_emb.weight
        described = {"format": "attnlab", "attnlab": config.to_dict()}
    named = tokenizer.name if isinstance(tokenizer, CharTokenizer) else tokenizer
    text = json.dumps({**described, **({"tokenizer": named} if named else {})}, indent=2)
    target.mkdir(parents=True, exist_ok=True)
    if isinstance(tokenizer, CharTokenizer):  # before config.json names it: a reader never finds it missing
        chars = tokenizer.to_json()
        write_atomic(target / CHARS_FILE, lambda tmp: tmp.write_text(chars, encoding="utf-8"))
    write_atomic(target / "model.safetensors", lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_atomic(target / "config.json", lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"))
    return target


def book_state_dict(model: nn.Module) -> Tensors:
    """The model's tensors under the book's GPTModel names, ready for ``GPTModel.load_state_dict``."""
    c = getattr(model, "config", None)
    if not isinstance(c, GPTConfig) or not c.is_gpt2:
        raise ValueError("the book's GPTModel holds GPT-2's layout only: learned positions, full heads, no window")
    ours = model.state_dict()
    out: Tensors = {"tok_emb.weight": ours["tok_emb.weight"], "pos_emb.weight": ours["pos_emb.weight"]}
    mask = torch.triu(torch.ones(c.context_length, c.context_length), diagonal=1)  # the book's buffer
    for i in range(c.n_layers):
        b = f"trf_blocks.{i}."
        q, k, v = ours[b + "att.qkv.weight"].chunk(3, dim=0)  # rows: W_query, W_key, W_value
        out |= {b + "att.W_query.weight": q, b + "att.W_key.weight": k, b + "att.W_value.weight": v}
        if c.qkv_bias:
            qb, kb, vb = ours[b + "att.qkv.bias"].chunk(3)
            out |= {b + "att.W_query.bias": qb, b + "att.W_key.bias": kb, b + "att.W_value.bias": vb}
        out |= {
            b + "att.out_proj.weight": ours[b + "att.out_proj.weight"],
            b + "att.out_proj.bias": ours[b + "att.out_proj.bias"],
            b + "att.mask": mask,
            b + "ff.layers.0.weight": ours[b + "ff.0.weight"],
            b + "ff.layers.0.bias": ours[b + "ff.0.bias"],
            b + "ff.layers.2.weight": ours[b + "ff.2.weight"],
            b + "ff.layers.2.bias": ours[b + "ff.2.bias"],
            b + "norm1.scale": ours[b + "norm1.weight"],
            b + "norm1.shift": ours[b + "norm1.bias"],
            b + "norm2.scale": ours[b + "norm2.weight"],
            b + "norm2.shift": ours[b + "norm2.bias"],
        }
    out |= {
        "final_norm.scale": ours["final_norm.weight"],
        "final_norm.shift": ours["final_norm.bias"],
        "out_head.weight": ours["out_head.weight"],
    }
    return {k: v.detach().clone() for k, v in out.items()}
