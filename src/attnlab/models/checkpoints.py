"""Checkpoint files, both ways, safely: folders of the Hugging Face families, the book's state dicts, attnlab's own.

Reading never runs code from a file: safetensors first; a pickle (``.bin``,
``.pth``) goes through ``torch.load(weights_only=True)``, which unpickles
tensors and plain containers only, and a file that asks for anything else is
refused before any of it runs.

This module reads and writes files; the names are the families' (``families/``: GPT-2, the book's models, Llama
and the rest), and the check against the model is ``weights.py``'s.

Writing: ``config.json`` + ``model.safetensors`` in the layout of the family the model was read as (GPT-2's for
attnlab's default decoder), which transformers' ``from_pretrained`` reads; the config also carries attnlab's own
``GPTConfig`` under ``"attnlab"``. A model no family holds (RoPE on GPT-2's block, a window, a score_mod) is
written under attnlab's own names, with ``"format": "attnlab"`` and no ``model_type``, so no family's reader
mistakes it for one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from collections import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.linear.quantized import Int8Linear
from attnlab.models import families
from attnlab.models.config import GPTConfig
from attnlab.models.families import book
from attnlab.models.locate import locate
from attnlab.models.tokenizer import CHARS_FILE, CharTokenizer
from attnlab.models.weights import Checkpoint, settled

Tensors = dict[str, torch.Tensor]


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
    return families.config_from_hf(raw, where).with_(**overrides), raw


def read_checkpoint(path: str | Path, *, revision: str | None = None, **overrides: Any) -> Checkpoint:
    """A Hugging Face GPT-2 directory, an attnlab directory, or the book's ``.pth`` state dict, read; a hub name
    from huggingface_hub's cache at ``revision`` (``attnlab.models.locate``).

    ``overrides`` set GPTConfig fields the checkpoint does not fix (``backend``,
    ``drop_rate``; ``n_heads`` for a book state dict of a size that is not GPT-2's).
    """
    where = locate(path, revision=revision)
    if where.is_dir():
        config, raw = _config_json(where, overrides)
        if raw.get("format") == "attnlab":  # attnlab's own names: a model no family holds
            tensors = _read_safetensors(where / "model.safetensors")
            return settled(config, tensors, {k: k for k in tensors}, str(where))
        return settled(config, *families.from_hf(_hf_weights(where), config), str(where))
    if where.is_file():
        raw_state = _read_pickle(where) if where.suffix != ".safetensors" else _read_safetensors(where)
        if isinstance(raw_state, dict) and "model_state_dict" in raw_state:  # the book's chapter 5 checkpoints
            raw_state = raw_state["model_state_dict"]
        if not isinstance(raw_state, dict):
            raise ValueError(f"{str(where)!r} holds a {type(raw_state).__name__}, not a state dict")
        odd = [k for k, v in raw_state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if odd:
            raise ValueError(f"{str(where)!r} is not a state dict of named tensors: it holds the key {odd[0]!r}")
        return settled(book.config_from_tensors(raw_state, overrides), *book.from_book_names(raw_state), str(where))
    raise ValueError(
        f"no checkpoint at {str(where)!r}: give a Hugging Face GPT-2 or attnlab directory, or the book's .pth file"
    )


def read_book(source: object, cfg: abc.Mapping[str, Any], **overrides: Any) -> Checkpoint:
    """The book's GPTModel, Llama 3 or Qwen3: the model itself, its state dict, or a ``.pth``/``.safetensors``
    file of it, with the config dict it was built from (``families.book``)."""
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
    return settled(config, *book.from_book_names(state), where, "the book's config dict")


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
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        raise ValueError(
            "this model's weights were quantized to int8 in memory (GPT.quantize); checkpoints hold float "
            "weights: save the float model, and quantize after from_pretrained"
        )
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{str(target)!r} is a file; give a folder to write config.json and model.safetensors into")
    # everything that can fail runs before the first write
    if families.holds(config):  # the Hugging Face family it was read as, or GPT-2's for attnlab's default
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
