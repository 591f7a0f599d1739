"""A model's state caches rebuilt to go back another way (``going_back="each"`` or ``"mark"``): what compares the
two ways on one model (``benchmarks/going_back.py``, the tests, the tour's state step)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnlab.cache.going_back import check_way
from attnlab.cache.state import ConvolutionCache, StateCache


def going_back_as(layers: Iterable[Any], going_back: str) -> list[Any]:
    """``layers`` (a model's caches, as built) with each state's cache made anew, empty, going back as
    ``going_back`` says, and every other layer's as it is: ``ModelCache(going_back_as(cache, "mark"))`` compares
    the ways on one model (``benchmarks/going_back.py``)."""
    check_way(going_back)
    out: list[Any] = []
    for layer in layers:
        if isinstance(layer, StateCache):
            conv = (int(layer.conv.shape[1]), int(layer.conv.shape[2])) if layer.has_conv else None  # (C, K - 1)
            layer = StateCache(
                batch_size=layer.batch_size,
                num_heads=layer.num_kv_heads,
                key_dim=layer.head_dim,
                value_dim=layer.value_dim,
                normalizer=layer.has_normalizer,
                conv=conv,
                dtype=layer.matrix.dtype,
                device=layer.matrix.device,
                going_back=going_back,
                spare=layer.spare,
            )
        elif isinstance(layer, ConvolutionCache):
            b, c, held = layer.conv.shape
            layer = ConvolutionCache(
                batch_size=b,
                channels=c,
                kernel=held + 1,
                dtype=layer.conv.dtype,
                device=layer.conv.device,
                going_back=going_back,
                spare=layer.spare,
            )
        out.append(layer)
    return out
