"""The zoo's models as benchmarks/sparse.py measures them: a variant's repeating period of layers, its first
layers, and a twin on the flash kernel that fills its caches."""

from __future__ import annotations

from typing import Any

CHUNK = 512  # a prompt's tokens a call, filling a cache


def period(config: Any) -> int:
    """The fewest leading layers whose pattern repeats to make every layer (1: all alike)."""
    v4 = config.deepseek_v4
    kinds = [(config.layer_type(i), v4.layer_kinds[i] if v4 else None) for i in range(config.n_layers)]
    return next(
        p
        for p in range(1, config.n_layers + 1)
        if config.n_layers % p == 0 and kinds == kinds[:p] * (config.n_layers // p)
    )


def first_layers(config: Any, layers: int) -> Any:
    """The config cut to its first ``layers`` layers (the same layer shapes, fewer of them)."""
    from dataclasses import replace

    cut: dict[str, Any] = {"n_layers": layers}
    if config.layer_types is not None:
        cut["layer_types"] = config.layer_types[:layers]
    if config.deepseek_v4 is not None:
        cut["deepseek_v4"] = replace(config.deepseek_v4, layer_kinds=config.deepseek_v4.layer_kinds[:layers])
    return config.with_(**cut)


def one_period(config: Any) -> Any:
    return first_layers(config, period(config))


def build(config: Any) -> tuple[Any, Any]:
    """The model (its default kernels: what is metered and timed) and what fills its caches: a twin with the
    same weights on the flash kernel (the default kernels' prompt over a cache would take minutes at 32k tokens;
    V4's layers take no backend: the model itself)."""
    import torch

    from attnlab.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT(config).eval()
    if config.deepseek_v4 is not None:  # V4's layers take no backend
        return model, model
    twin = GPT(config.with_(backend="flash")).eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def fill(twin: Any, caches: Any, ids: Any) -> None:
    import torch

    with torch.no_grad():
        for start in range(0, ids.shape[1], CHUNK):
            twin(ids[:, start : start + CHUNK], caches=caches, last_only=True)
