"""attnlab's attention inside a Hugging Face model: one function registered with transformers'
``AttentionInterface`` (and a mask function with its ``AttentionMaskInterface``) under the name "attnlab".

transformers calls ``attention(module, query, key, value, attention_mask, scaling=, dropout=, ...)`` in every
attention layer, with the keys and values its cache returned. Here that call becomes one attnlab call:

- the model's mask, which transformers builds for "attnlab" exactly as for "sdpa" (causal, sliding window,
  padding, packed documents, a model's own overlays), becomes the call's :class:`Visibility`; where transformers
  leaves it out (nothing but causal), the Visibility is causal;
- gpt-oss's learned sinks (``s_aux``) are read off the kernel's row log-sum-exp, Gemma 2's ``softcap`` is a
  score_mod, and the user's ``mask_mod`` / ``score_mod`` for this layer are added to it (a mask_mod restricts
  the model's mask; one that would show keys it hides, ``sees_future``, is refused by ``use``);
- the backend runs (attnlab's flash by default; eager, sdpa, flex by name);
- a :class:`attnlab.Recorder` that chose ``heads=[(layer, head)]`` gets exactly those heads' weights, formed
  from q, k and the kernel's log-sum-exp (:func:`attnlab.functional.eager.head_weights`): the layer still runs
  its fused path and only the chosen heads cost memory.

Shapes: B = batch, H = query heads, Hkv = key/value heads, Tq / Tk = query / key lengths, D = head_dim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.cache.sink import SinkCache
from attnlab.functional import mods
from attnlab.functional.attention import run_kernel
from attnlab.functional.eager import head_weights
from attnlab.functional.mods import MaskMod, chain_scores, mod_name
from attnlab.functional.registry import KERNELS, Backend, check_backend, resolve
from attnlab.functional.visibility import Visibility
from attnlab.hf.sparse_masks import sparse_mask
from attnlab.observe import chosen_heads, is_recording, record, wants_every_head

NAME = "attnlab"  # the attn_implementation transformers knows this bridge by

PerLayer = MaskMod | dict[int, MaskMod] | None


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What ``attnlab.hf.use`` set on one model: the backend, and mods for every layer or by layer index."""

    backend: Backend = "flash"
    mask_mod: Any = None  # a MaskMod, or {layer: MaskMod}
    score_mod: Any = None  # a ScoreMod, or {layer: ScoreMod}


def for_layer(mod: Any, layer: int) -> Any:
    return mod.get(layer) if isinstance(mod, dict) else mod


SETTINGS = "_attnlab_settings"  # the attribute that holds what ``use`` set on a module (a plain one, never saved)
# the attribute of the keys an attnlab cache layer returned (attnlab.hf.layer): a weakref to their positions, held
# by that layer alone, so a finished cache is freed; keys that any other way reaches the bridge do not carry it
RETURNED = "_attnlab_returned"


def settings_of(module: torch.nn.Module) -> Settings:
    """The Settings ``use`` put on ``module``, or the defaults."""
    found: Settings | None = vars(module).get(SETTINGS)
    return found or Settings()


def put(modules: Iterable[torch.nn.Module], settings: Settings | None) -> list[tuple[torch.nn.Module, Settings | None]]:
    """Give each module ``settings`` (None: take them off); returns what each had, for ``put`` to give back."""
    before = [(module, vars(module).pop(SETTINGS, None)) for module in modules]
    for module, _ in before if settings is not None else ():
        vars(module)[SETTINGS] = settings
    return before


def hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract: query (B, H, Tq, D), key and value (B, Hkv, Tk, D) after the cache, the
    mask transformers built for this layer; returns the context (B, Tq, H, Dv) and no weights (a Recorder takes
    them)."""
    settings, cap = settings_of(module), softcap
    attention_mask = sparse_mask(module, attention_mask, kwargs.get("indices"), key.shape[2])  # DSA's, V4's
    layer = getattr(module, "layer_idx", None)
    index = layer if isinstance(layer, int) else -1
    tq = query.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    returned = getattr(key, RETURNED, None)  # what an attnlab cache (attnlab.hf.cache) returned with these keys
    entry = returned() if returned is not None else None
    given_ids = kwargs.get("position_ids")
    sliced = isinstance(given_ids, torch.Tensor) and given_ids.shape[-1] == key.shape[2] > tq
    if entry is None and attention_mask is None and causal and tq > 1 and key.shape[2] > tq and not sliced:
        # transformers left the mask out for a prefill into an empty static cache: sdpa's causal mask is aligned
        # top-left there, so only the first Tq slots are keys (as transformers' sdpa path slices them). Not where
        # the call's positions number every key and the queries are the last of them: Gemma 4 computes its
        # KV-shared layers for the last logits_to_keep tokens alone (assisted generation's first pass keeps 5),
        # its mask left out, a guard it makes for sdpa only (_maybe_slice_kv_shared_inputs)
        key, value = key[:, :, :tq], value[:, :, :tq]
    mask_mod = for_layer(settings.mask_mod, index)
    score_mod = for_layer(settings.score_mod, index)
    positions = None
    if entry is None and (mask_mod is not None or score_mod is not None):
        positions = _positions_for_mods(query, key, attention_mask, kwargs.get("position_ids"), index)
    if cap is not None:
        capped = mods.softcap(float(cap))
        score_mod = capped if score_mod is None else chain_scores(capped, score_mod)
    out = attend(
        query,
        key,
        value,
        settings=settings,
        layer=layer if isinstance(layer, int) else None,
        mask=attention_mask,
        causal=causal,
        scale=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
        dropout=float(dropout),
        score_mod=score_mod,
        mask_mod=mask_mod,
        sinks=s_aux,
        entry=entry,
        positions=positions,
    )
    return out.transpose(1, 2).contiguous(), None  # (B, Tq, H, Dv)


def _positions_for_mods(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    layer: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q_pos (B, Tq), k_pos (B, Tk)): each query's and key's position in its own sequence, for a mod to read
    (left padding taken off, a sliding layer's window placed where it sits). Keys that are the queries' own (no
    cache) or that transformers' dynamic caches hand over (full or sliding) end at the last query, which places
    them, right padding included (its pads are hidden by the mask); a static buffer's keys do not, and it is
    refused: its filled slots cannot be told here. None without position_ids (then no padding is possible to
    tell: the keys are numbered from 0, the queries last)."""
    b, tq, tk = query.shape[0], query.shape[2], key.shape[2]
    # more keys than queries, the last one hidden from every row: the empty end of a static cache's buffer
    if tk > tq and mask is not None and not bool(mask[..., -1].any()):
        raise ValueError(f"layer {layer}: {STATIC_WITH_MODS}")
    if not isinstance(position_ids, torch.Tensor) or position_ids.shape[-1] != tq:
        return None
    q_pos = position_ids.reshape(-1, tq).to(query.device).expand(b, tq)  # (B, Tq): every backend indexes rows
    k_pos = q_pos[:, -1:] - (tk - 1) + torch.arange(tk, device=query.device)  # (B, Tk): ending at the last query
    return q_pos.clamp(min=-1), k_pos.clamp(min=-1)  # a left pad's slot: -1, hidden


STATIC_WITH_MODS = (
    "mask_mod and score_mod read each key's position, and a static cache's buffer (transformers' StaticCache) "
    "does not say which of its slots are filled: use transformers' DynamicCache (the default) or "
    "attnlab.hf.cache('plain')"
)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    settings: Settings,
    layer: int | None,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    dropout: float,
    mask_mod: MaskMod | None,
    score_mod: Any,
    sinks: torch.Tensor | None = None,
    entry: Any = None,
    positions: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One attention call of a model attnlab runs inside: query (B, H, Tq, D), key and value (B, Hkv, Tk, D), a
    bool mask (True = may attend) over the keys as given (or, with a cache ``entry``, over absolute positions), or
    None for causal alone; returns the context (B, H, Tq, Dv). The chosen heads' weights go to the Recorder."""
    index = -1 if layer is None else layer
    tq = query.shape[2]
    b, h, tk = query.shape[0], query.shape[1], key.shape[2]
    if entry is not None and mask is not None and isinstance(entry.cache, SinkCache):
        first = entry.cache.sinks  # a sink cache's first positions, kept for good
        if not bool(mask[..., -1, :first].all()):  # the last query sees every position before it, but a pad's
            raise ValueError(sink_padding(first))
    if entry is not None:  # an attnlab cache returned these keys: each slot's position is known
        vis = Visibility(
            q_pos=entry.q_pos,
            k_pos=entry.k_pos,
            causal=causal,
            mask=None if mask is None else _at_slots(mask, entry.k_pos),
            mask_mod=mask_mod,
            score_mod=score_mod,
            batch=b,
            heads=h,
        )
    else:  # transformers' mask over the keys as given, or causal alone where it left the mask out
        given = dict(causal=mask is None and causal and tq > 1, mask=mask, mask_mod=mask_mod, score_mod=score_mod)
        if positions is not None:  # a mod reads positions: each row's own
            vis = Visibility(q_pos=positions[0], k_pos=positions[1], batch=b, heads=h, **given)
        else:  # keys 0 .. Tk - 1, the queries last (the flash kernel's tiles know this arithmetic)
            vis = Visibility.from_lengths(tq, tk, device=query.device, batch=b, heads=h, **given)
    heads = chosen_heads(index) if layer is not None else ()
    check_heads(index, heads, h)
    backend: Backend = settings.backend
    if backend == "auto" and (heads or sinks is not None) and not wants_every_head():
        backend = "flash"  # the fused path that returns the log-sum-exp the heads and the sinks are read from
    name, kernel = resolve(backend, vis=vis)
    if sinks is not None and not KERNELS[name].has_lse:
        raise ValueError(
            f"this model's learned sinks are read off each row's log-sum-exp, which the {name} backend does not "
            "return: use attnlab.hf.use(model, backend='flash') (or 'eager')"
        )
    # with sinks, the context is the keys' share of it and the Recorder gets "sink_weight" (B, H, Tq)
    out, lse = run_kernel(name, kernel, query, key, value, vis, scale=scale, dropout_p=dropout, sinks=sinks)
    if entry is not None:
        entry.observed = True
        if entry.cache.capabilities.observes:  # an evicting cache weighs its keys by this call's attention
            entry.cache.observe(query, key, value, visibility=vis, scale=scale)
    if heads and is_recording():
        bound = vis.bound_to(b, h, query.device)
        weights = head_weights(query, key, bound, scale=scale, heads=heads, lse=lse, sinks=sinks)  # rows: 1 - sink
        record("attn_weights", weights, source="attnlab.hf", heads=heads, layer=index)  # (B, len(heads), Tq, Tk)
    return out


def sink_padding(sinks: int) -> str:
    return (
        f"left padding (attention_mask) put pad tokens among the sink cache's {sinks} sinks, the first positions "
        "it keeps for good: make one sink cache per prompt (generate the rows one at a time, unpadded)"
    )


def check_heads(layer: int, heads: tuple[int, ...], count: int) -> None:
    """The heads a Recorder chose for ``layer``, against the ``count`` it has."""
    if heads and heads[-1] >= count:
        raise ValueError(
            f"Recorder(heads=...) chose head {heads[-1]} of layer {layer}, which has {count} heads (0 to {count - 1})"
        )


def _at_slots(mask: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """transformers' mask over absolute key positions (B|1, 1, Tq, P), read at each slot's position: (.., Tq, S).
    An empty slot (-1) reads position 0; the Visibility hides it by its position anyway."""
    slots = k_pos.clamp(min=0)
    if slots.dim() == 1:
        return mask[..., slots]
    b, s = slots.shape  # per-sequence positions (an evicting cache): gather each row's own
    full = mask.expand(b, mask.shape[1], mask.shape[2], mask.shape[3])  # (B, 1, Tq, P)
    index = slots[:, None, None, :].expand(b, mask.shape[1], mask.shape[2], s)  # (B, 1, Tq, S)
    return full.gather(3, index)


def check_settings(backend: Backend, mask_mod: PerLayer, score_mod: Any) -> None:
    """The arguments of ``use``, checked before the model changes."""
    check_backend(backend)
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        given = mod.values() if isinstance(mod, dict) else [mod]
        if isinstance(mod, dict) and any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in mod):
            raise ValueError(f"{name} by layer takes {{layer index: mod}} with indices >= 0, got keys {list(mod)}")
        for m in given:
            if m is not None and not callable(m):
                raise TypeError(f"{name} must be a function (or {{layer: function}}), got {type(m).__name__}")
        if name == "mask_mod":
            for layer, m in mod.items() if isinstance(mod, dict) else [(None, mod)]:
                if mods.sees_future(m):
                    where = "" if layer is None else f" (for layer {layer})"
                    raise ValueError(f"mask_mod {mod_name(m)}{where} {SEES_FUTURE}")


# why a mod that declares sees_future (prefix_lm, and_masks/or_masks holding one) is refused here (issue 54 item 3)
SEES_FUTURE = (
    "shows queries keys after them, but the model builds its own causal mask (transformers' models and the "
    "book's alike) and a mask_mod only restricts it (the two are ANDed): the mod cannot widen it, and would change "
    "nothing. Run it on attnlab's own model, GPT(...)(ids, mask_mod=...) on a forward without "
    'a cache, or pass a mod that only restricts (docs/mods.md, "A model\'s own mask and yours")'
)
