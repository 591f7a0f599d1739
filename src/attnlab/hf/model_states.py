"""What a transformers model keeps between calls, read off its config before ``attnlab.hf.cache`` builds anything.

``attnlab.hf.cache`` gives transformers' ``generate`` a cache of keys and values: one of attnlab's caches on each
full-attention layer, transformers' own ring on each sliding one, and transformers' own layer
(``LinearAttentionLayer``) on a short convolution's layer (LFM's), whose state is its last inputs. The decoders of
2026 keep other state beside them (Qwen3.5's and OLMo-Hybrid's Gated DeltaNet, Kimi Linear's Kimi Delta Attention,
DeepSeek's and Kimi's latent attention), and some keep values of another width than their keys (MiMo-V2-Flash).
What such a cache cannot hold is refused here by name, with the way that works, before any layer is written; what
it can hold is shaped per layer by the layer's own keys and values (:class:`attnlab.hf.layer.AttnlabLayer`).

A recurrent state is refused for assisted generation too, where no cache could serve it: transformers' layer hands
its cache the state after a pass's last token alone (``Cache.update_recurrent_state``), and ``_assisted_decoding``
cuts refused guesses off with ``Cache.crop(-n)`` and never runs the kept ones again.
"""

from __future__ import annotations

from typing import Any

import torch

try:  # transformers' heterogeneous configs (5.24): a field that differs between layers raises on a global read
    from transformers.integrations.heterogeneity.configuration_utils import (
        AmbiguousGlobalPerLayerAttributeError as PerLayerField,
    )
except ImportError:  # an older transformers: no per-layer fields
    PerLayerField = AttributeError  # type: ignore[misc,assignment]  # getattr's default answers it already

KEYS_AND_VALUES = ("full_attention", "sliding_attention")  # the layer types whose state is keys and values
# kept by transformers' own LinearAttentionLayer: a short convolution's last inputs, which it keeps whole through a
# pass while assisted generation records the past (activate_past_recording) and cuts back in crop(-n)
HELD = ("conv",)
RECURRENT = ("linear_attention", "mamba")  # a state that sums every token: the layer hands the cache its last one
STATES = {  # the layer types of transformers' configs that are not softmax attention, and what they keep
    "linear_attention": "a recurrent state and a short convolution's (Gated DeltaNet, Kimi Delta Attention)",
    "conv": "a short convolution's state (LFM's gated convolutions)",  # held (HELD); named for use()'s mods
    "mamba": "a state space model's recurrent and convolution states",
}
INSTEAD = (
    "leave the cache to transformers (generate without cache= or past_key_values=: attnlab.hf.use(model) still "
    "runs its attention layers), or load the folder with attnlab.models.GPT.from_pretrained(path), whose caches "
    "plan each layer's own state and go back on it for speculation (its generate(..., lookup=k) or draft=)"
)
# why a recurrent state cannot be held for transformers' assisted generation either, by what transformers calls
NO_GOING_BACK = (
    "nor could any cache take a recurrent state back to an earlier token, which transformers' assisted "
    "generation asks: the layer hands its cache only the state after a pass's last token "
    "(Cache.update_recurrent_state), and _assisted_decoding cuts refused guesses off with Cache.crop(-n) and never "
    "runs the kept ones again, so neither a state per token nor a copy to re-run from can serve it (transformers' "
    "own cache answers is_croppable=False there and refuses after its prefill)"
)


def field(config: Any, name: str) -> Any:
    """A config's ``name``, or None where it has none or holds one per layer (transformers' heterogeneous configs,
    Gemma 4's, raise on a field that differs between layers rather than answer for the first)."""
    try:
        return getattr(config, name, None)
    except PerLayerField:  # a per-layer field: the caller reads it per layer instead
        return None


def check_states(kinds: list[str], *, latent: bool) -> None:
    """Refuse a model whose layers keep state that is neither keys and values nor a short convolution's inputs
    (transformers' own layer holds those), naming the layers and what they keep; a recurrent state is named as
    what no cache can take back for assisted generation (``NO_GOING_BACK``).

    Args:
        kinds: each layer's type (the config's ``layer_types``).
        latent: the model's attention is latent (``kv_lora_rank``): transformers hands its cache each head's full
            keys and values, of different widths, where attnlab's latent cache keeps the latent.
    """
    others: dict[str, list[int]] = {}
    for layer, kind in enumerate(kinds):
        if kind not in KEYS_AND_VALUES + HELD:
            others.setdefault(kind, []).append(layer)
    reasons = [
        f"layers {layers} are {kind!r}, which keep {STATES[kind]}"
        if kind in STATES
        else f"layers {layers} are {kind!r}, a type it does not give a cache to"
        for kind, layers in others.items()
    ]
    if latent:
        reasons.append(
            "its latent attention (DeepSeek's MLA) hands transformers' cache full keys and values of different "
            "widths, not the latent attnlab's latent cache keeps (kv_lora_rank + rope values a token)"
        )
    if any(kind in RECURRENT for kind in others):
        reasons.append(NO_GOING_BACK)
    if reasons:
        raise ValueError(f"attnlab.hf.cache gives a model keys and values alone, and {'; '.join(reasons)}: {INSTEAD}")


def check_widths(config: Any, layer: Any) -> None:
    """Ask ``layer``'s cache (an AttnlabLayer, one value wide and empty) whether it keeps values of the width the
    config gives beside keys of its head size, where they differ (MiMo-V2-Flash's ``v_head_dim``): a cache that
    cannot (a quantized one codes keys and values alike) refuses now, by its own message, not in the first full
    layer of the first forward, after the layers before it wrote their state."""
    head, value = field(config, "head_dim"), field(config, "v_head_dim")
    if isinstance(head, int) and isinstance(value, int) and value != head:
        layer._made(1, 1, head, torch.float32, torch.device("cpu"), value_dim=value)
