"""What a call through the bridge would be refused, refused before anything changes (issue 54, items 3, 8 to 11).

transformers writes each layer's keys into the cache inside that layer, before its attention runs: an error the
bridge raised in layer 0's attention left layer 0 written and the others not. So the checks run earlier:

- ``check_model``, when ``attnlab.hf.use`` is called, before the model changes: what no forward could run (a
  backend without the log-sum-exp for a model with learned sinks, sdpa with a score_mod that is not a bias);
- ``before_forward``, a forward pre-hook on the module that runs the layers (``model.get_decoder()``), which
  ``use`` and ``attnlab.hf.cache`` give a model once: it sees the call whole (its rows and tokens, its
  attention_mask, position_ids and cache) and, before any layer, evaluates every layer's mods on every
  (query, key position) pair the call may ask (``Visibility.check_mods``), checks the heads a Recorder chose,
  refuses mods on a static cache's buffer, and asks an attnlab cache what it would refuse
  (``AttnlabCacheForHF.check_call``). The hook does nothing for a model that runs neither.

The same refusals stay where they were (the bridge, each cache layer), for a forward that reaches the layers
another way.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch

from attnlab.functional.mods import is_bias
from attnlab.functional.registry import KERNELS, Backend
from attnlab.functional.sdpa import check_sdpa
from attnlab.functional.visibility import Visibility
from attnlab.hf.bridge import NAME, STATIC_WITH_MODS, Settings, check_heads, for_layer, settings_of
from attnlab.observe import chosen_heads

_WATCHED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # modules that have the pre-hook


def check_model(model: torch.nn.Module, text: Any, settings: Settings, layers: int | None) -> None:
    """What every forward of ``model`` under ``settings`` would refuse in its first layer, refused now."""
    backend: Backend = settings.backend
    has_sinks = any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in model.modules())
    if has_sinks and isinstance(backend, str) and backend in KERNELS and not KERNELS[backend].has_lse:
        raise ValueError(
            f"this model's learned sinks are read off each row's log-sum-exp, which the {backend} backend does not "
            "return: use attnlab.hf.use(model, backend='flash') (or 'eager' or 'auto')"
        )
    if backend != "sdpa":
        return
    cap = getattr(text, "attn_logit_softcapping", None)
    if cap:
        raise ValueError(
            f"this model caps its attention scores (attn_logit_softcapping={cap}), a score_mod sdpa cannot take: "
            "use attnlab.hf.use(model, backend='flash') (or 'eager' or 'auto')"
        )
    for layer in range(layers or 1):
        mod = for_layer(settings.score_mod, layer)
        if mod is not None and not is_bias(mod):
            check_sdpa(Visibility(q_pos=torch.zeros(1, dtype=torch.long), score_mod=mod))  # its message


class CheckedCache:
    """A cache that refuses a call before any layer writes (:class:`attnlab.hf.caches.AttnlabCacheForHF`): the
    pre-hook asks it, knowing it by this base alone, so this module needs nothing of caches.py."""

    def check_call(self, batch: int, tokens: int, attention_mask: torch.Tensor | None) -> None:
        raise NotImplementedError


def watch(model: torch.nn.Module) -> None:
    """Give the module that runs ``model``'s layers the pre-hook, once."""
    get_decoder = getattr(model, "get_decoder", None)
    found = get_decoder() if callable(get_decoder) else None
    target = found if isinstance(found, torch.nn.Module) else model
    if target not in _WATCHED:
        target.register_forward_pre_hook(before_forward, with_kwargs=True)
        _WATCHED.add(target)


def before_forward(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The pre-hook: refuse now what a layer would refuse after the layers before it wrote their caches."""
    names = inspect.signature(module.forward).parameters if args else {}  # a call that passed some by position
    given = dict(zip(names, args, strict=False))
    given.update(kwargs)
    ids, embeds = given.get("input_ids"), given.get("inputs_embeds")
    x = ids if isinstance(ids, torch.Tensor) else embeds
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return
    batch, tokens = x.shape[0], x.shape[1]
    cache = given.get("cache", given.get("past_key_values"))
    config = getattr(module, "config", None)
    if getattr(config, "_attn_implementation", None) == NAME:
        _check_settings(module, x, cache, given.get("position_ids"))
    if isinstance(cache, CheckedCache):  # an attnlab cache's own refusals
        mask = given.get("attention_mask")
        cache.check_call(batch, tokens, mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None)


def _check_settings(module: torch.nn.Module, x: torch.Tensor, cache: Any, position_ids: Any) -> None:
    """The heads a Recorder chose and every layer's mods (``use`` put them on the module), on the pairs this call
    of ``x`` (B, T, ...) may ask."""
    settings, config, (batch, tokens) = settings_of(module), getattr(module, "config", None), x.shape[:2]
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    if heads:
        for layer in range(layers):
            check_heads(layer, chosen_heads(layer), heads)
    chosen = {}
    for layer in range(layers or 1):
        pair = (for_layer(settings.mask_mod, layer), for_layer(settings.score_mod, layer))
        if pair != (None, None):
            chosen[(id(pair[0]), id(pair[1]))] = pair
    if not chosen:
        return
    from transformers.cache_utils import StaticLayer

    if any(isinstance(layer, StaticLayer) for layer in getattr(cache, "layers", ())):
        raise ValueError(STATIC_WITH_MODS)
    q_pos = _query_positions(batch, tokens, cache, position_ids, x.device)
    for mask_mod, score_mod in chosen.values():  # every key a query may see lies at a position up to its own
        Visibility(q_pos=q_pos, mask_mod=mask_mod, score_mod=score_mod, batch=batch, heads=heads or 1).check_mods()


def _query_positions(batch: int, tokens: int, cache: Any, position_ids: Any, device: torch.device) -> torch.Tensor:
    """The positions the bridge will give this call's queries: an evicting or sink cache's own, else each row's
    (position_ids), else the cache's length onwards. (T,) or (B, T)."""
    own = getattr(cache, "mod_positions", None)
    held = own(tokens) if callable(own) else None
    if isinstance(held, torch.Tensor):
        return held.to(device)
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 2 and position_ids.shape[-1] == tokens:
        return position_ids.to(device).expand(batch, tokens).clamp(min=0)
    length = getattr(cache, "get_seq_length", None)
    past = int(length()) if callable(length) else 0
    return torch.arange(past, past + tokens, device=device)
