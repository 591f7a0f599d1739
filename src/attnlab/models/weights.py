"""A checkpoint's tensors, in attnlab's names, checked against a model and copied in.

``checkpoints.py`` reads files and the families (``families/``) rename what they hold; here the file's tensors
meet the config: :func:`reconcile` lets the tensors correct what a config.json could get wrong, and :func:`fit`
compares them with the model the config describes, listing in one error every missing, unexpected and
mis-shaped tensor by its name in the file, before a single weight is copied.
"""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass

import torch
import torch.nn as nn

from attnlab.models.config import GPTConfig
from attnlab.models.families.rows import Rows

Weights = abc.Mapping[str, torch.Tensor | Rows]  # in attnlab's names: a Rows stacks several of the file's tensors


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds, in attnlab's names: the config, the tensors, each one's name in the file."""

    config: GPTConfig
    tensors: Weights
    origin: dict[str, str]
    source: str


def settled(
    config: GPTConfig, tensors: Weights, origin: dict[str, str], where: str, said: str = "config.json"
) -> Checkpoint:
    """The checkpoint once :func:`reconcile` has read the tensors, without what the settled config has no place
    for: the head of a tied model (the embedding again) and the all-zero q/k/v biases attnlab writes for GPT-2."""
    config = reconcile(config, tensors, where, said)
    dropped = ("out_head.weight",) if config.tie_weights else ()
    kept = {k: v for k, v in tensors.items() if k not in dropped and (config.qkv_bias or not k.endswith("qkv.bias"))}
    return Checkpoint(config, kept, origin, where)


def reconcile(config: GPTConfig, tensors: Weights, where: str, said: str = "config.json") -> GPTConfig:
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
        raise ValueError(f"{where!r}: {said} says {'; '.join(wrong)}; the file's tensors are the truth")
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


def fit(model: nn.Module, checkpoint: Checkpoint, *, check_only: bool = False) -> None:
    """Copy a checkpoint's tensors into ``model`` (a GPT of ``checkpoint.config``) after one check.

    ``check_only``: the check alone, e.g. on a model built on the meta device, so that a config that
    does not fit its file is refused before a single weight is allocated.
    """
    config, tensors, origin = checkpoint.config, checkpoint.tensors, checkpoint.origin
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
        if k in expected
        and (not v.is_floating_point() or v.element_size() < 2)
        and (expected[k].is_floating_point() or v.dtype != expected[k].dtype)  # a table of ints kept as ints: as is
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
            f"the weights in {checkpoint.source} do not fit GPTConfig(vocab_size={c.vocab_size}, context_length="
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
