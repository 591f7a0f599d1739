"""A call that raises leaves every cache exactly as it was (issue 54, items 8 to 11): every refusal a forward can
meet, on every cache kind, the state of every layer (its tensors, its positions, its bookkeeping) compared
before and after. Everything a call brings is checked and evaluated before the first layer writes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import torch

from _refusals import floats, raises, same
from attnlab.cache import CACHES, ModelCache, PrefixCache
from attnlab.functional import mods
from attnlab.models import GPT, GPTConfig

V = 32


def gpt(*, sliding: bool = False, backend: str = "eager") -> GPT:
    torch.manual_seed(0)
    layers = {"layer_types": ("full", "sliding"), "window": 4} if sliding else {}
    config = GPTConfig(
        vocab_size=V, context_length=32, emb_dim=16, n_heads=2, n_layers=2, rope=True, drop_rate=0.0,
        backend=backend, **layers,
    )  # fmt: skip
    return GPT(config).eval()


def state(obj: Any, seen: set[int] | None = None) -> Any:
    """Everything a cache holds, as plain values: tensors cloned, numbers, lists, a block table's bookkeeping,
    every layer of a model cache (a layer's RoPE tables are the model's, not the cache's: left out)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (int, float, str, bool, type(None))):
        return obj
    if id(obj) in seen:
        return "<seen>"
    seen.add(id(obj))
    if isinstance(obj, (list, tuple, deque)):
        return [state(x, seen) for x in obj]
    if isinstance(obj, dict):
        return {str(k): state(v, seen) for k, v in obj.items()}
    if isinstance(obj, torch.nn.Module):
        buffers = {name: b.detach().clone() for name, b in obj.named_buffers()}
        plain = {k: v for k, v in vars(obj).items() if not k.startswith("_") and k not in ("rotary", "training")}
        return {"buffers": buffers, **{k: state(v, seen) for k, v in plain.items()}}
    if hasattr(obj, "__dict__"):
        return {k: state(v, seen) for k, v in vars(obj).items() if k != "rotary"}
    return repr(obj)


SHORT = torch.arange(8)  # a table of 8 positions: a mod that reads it past position 7 fails there only


def past_its_table(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return SHORT[kv_idx] >= 0


def score_raises(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    raise RuntimeError("a bug in the user's score_mod")


def score_shape(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    return score.sum(dim=-1)


# (what the call brings, the message it is refused with); each runs one token after a prompt of 9
REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "mask_mod raises": ({"mask_mod": raises}, r"mask_mod raises raised RuntimeError: a bug in the user's mod"),
    "mask_mod gives floats": ({"mask_mod": floats}, r"mask_mod floats must return a bool tensor"),
    "mask_mod fails at a later key": ({"mask_mod": past_its_table}, r"mask_mod past_its_table raised IndexError"),
    "score_mod raises": ({"score_mod": score_raises}, r"score_mod score_raises raised RuntimeError"),
    "score_mod's shape": ({"score_mod": score_shape}, r"score_mod score_shape returned shape"),
    "prefix_lm with a cache": ({"mask_mod": mods.prefix_lm(3)}, r"mask_mod prefix_lm\(prefix_len=3\) shows queries"),
    "attention_mask's shape": ({"attention_mask": torch.ones(2, 4)}, r"attention_mask must be \(batch, cached"),
    "document_ids": ({"document_ids": torch.zeros(2, 1, dtype=torch.long)}, r"document_ids pack documents"),
    "a token past the vocabulary": ({"idx": torch.full((2, 1), V)}, r"token ids must lie in \[0, 32\)"),
}


def caches_for(m: GPT, name: str) -> Any:
    if name == "prefix":
        return PrefixCache.for_model(m, batch_size=2, max_len=16)
    return m.make_caches(batch_size=2, max_len=16, cache=name)


def kinds() -> list[tuple[str, bool]]:
    named = [(name, False) for name in CACHES]
    return [*named, ("plain", True), ("int8", True), ("h2o", True), ("paged", True)]  # beside sliding layers


@pytest.mark.parametrize("refusal", list(REFUSALS))
@pytest.mark.parametrize(("name", "sliding"), kinds(), ids=lambda x: str(x))
@torch.no_grad()
def test_a_refused_forward_leaves_every_layer_as_it_was(name: str, sliding: bool, refusal: str) -> None:
    m = gpt(sliding=sliding)
    caches = caches_for(m, name)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 9, dtype=torch.long)
    padding[0, :2] = 0  # left padding: every cache takes it
    m(ids, attention_mask=padding, caches=caches)
    before = state(caches)
    brought, message = REFUSALS[refusal]
    call = {"idx": ids[:, -1:], "attention_mask": torch.ones(2, 10, dtype=torch.long), "caches": caches, **brought}
    with pytest.raises((ValueError, TypeError), match=message):
        m(call.pop("idx"), **call)
    same(before, state(caches), f"{name}: {refusal}")
    # and the cache goes on as if nothing happened: the next step equals a cache that never met the refusal
    fresh = caches_for(m, name)
    m(ids, attention_mask=padding, caches=fresh)
    step = {"attention_mask": torch.ones(2, 10, dtype=torch.long)}
    torch.testing.assert_close(m(ids[:, -1:], caches=caches, **step), m(ids[:, -1:], caches=fresh, **step))


@pytest.mark.parametrize("name", ["plain", "paged", "h2o"])
@torch.no_grad()
def test_a_backend_that_cannot_take_the_call_refuses_it_before_the_first_write(name: str) -> None:
    """sdpa adds only a bias to the scores: a softcap score_mod is refused before layer 0 writes."""
    m = gpt(backend="sdpa")
    caches = caches_for(m, name)
    ids = torch.randint(0, V, (2, 5))
    m(ids, caches=caches)
    before = state(caches)
    with pytest.raises(ValueError, match=r"score_mod softcap\(cap=5.0\) is not declared an additive bias"):
        m(ids[:, -1:], caches=caches, score_mod=mods.softcap(5.0))
    same(before, state(caches), name)


@torch.no_grad()
def test_a_layer_called_alone_refuses_before_it_writes() -> None:
    """``Attention.forward`` with a cache, directly: each refusal leaves the cache's length and buffers as they
    were (the refusals used to come after ``cache.update``)."""
    m = gpt()
    layer = m.blocks[0].att
    cache = ModelCache.build([layer.layer_state()], "plain", rows=2, capacity=16)[0]
    x = torch.randn(2, 3, 16)
    layer(x, cache=cache)
    before = state(cache)
    bad: list[Callable[[], Any]] = [
        lambda: layer(x[:, :1], cache=cache, mask_mod=raises),
        lambda: layer(x[:, :1], cache=cache, mask_mod=floats),
        lambda: layer(x[:, :1], cache=cache, score_mod=score_raises),
        lambda: layer(x[:, :1], cache=cache, mask_mod=mods.prefix_lm(2)),
        lambda: layer(x[:, :1], cache=cache, visibility=layer.visibility_for(x[:, :1], cache=cache, mask_mod=raises)),
        lambda: layer(x[:, :1], cache=cache, visibility=layer.visibility_for(x[:, :1])),  # bound already: no cache
    ]
    for call in bad:
        with pytest.raises((ValueError, TypeError)):
            call()
        same(before, state(cache))
